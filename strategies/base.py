"""The one server-side base every method shares.

:class:`StrategyBase` is a mixin over Flower's Message-API ``FedAvg`` family
(``flwr.serverapp.strategy``). It overrides only ``configure_train``/``aggregate_train`` (and
the evaluate pair) and adds what every method needs:

- participants chosen by the participation model from client-reported partition ids
  (:class:`strategies.nodes.NodeRegistry`), with a per-node config record and optional
  payload arrays;
- validation of every reply (:mod:`strategies.replies`): a bad result is dropped with a
  logged reason and counted, the round goes on with the rest;
- method payloads moved out of each reply before ``FedAvg.aggregate_train`` (which accepts
  exactly one ArrayRecord), so any aggregator combines with any client;
- per-round diagnostics from the client deltas ``Δ_k = w_k − W``
  (:func:`core.diagnostics.update_diagnostics`: the update deviation of PMFL Def. 1 and
  cos(global update, Δ_k) of FedRANE Fig. 3, from the Gram matrix shared with GNE);
- :meth:`run`: the round loop (train → federated eval → central eval → record →
  checkpoint), which unlike ``Strategy.start`` can resume from a checkpointed round.

An aggregator (a subclass: FedAvg, FedAvgM and FedAdam in :mod:`strategies.fedavg`; GNE, FedAU,
PMFL in their modules)
overrides hooks: ``Params``, ``aggregate``, ``aggregate_empty``, ``state_dict``/
``load_state_dict``. What a client sends besides its model is not the aggregator's business:
the strategy holds the client's payload exchange (:mod:`strategies.exchange`; FedCCL's signals)
and delegates ``round_config``, ``payload_for``, ``check_payload``, ``after_aggregate`` and its
part of the checkpoint to it, so any aggregator takes any client (composition).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import MessageType
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from core.diagnostics import delta_gram, update_diagnostics
from core.params import Config, params_from
from strategies.exchange import PayloadExchange
from strategies.nodes import NodeRegistry, send_and_receive
from strategies.replies import (
    ClientResult,
    RejectedResult,
    cast_like,
    check_arrays,
    check_count,
    check_evaluation,
    check_identity,
    check_metrics,
    check_update_norm,
    collect_replies,
    missing,
    ray_actor_lost,
    reply_pids,
    reply_place,
)

log = logging.getLogger("fl_app")

EvaluateFn = Callable[[int, ArrayRecord], dict[str, Any]]

# Flower's error codes for a ClientApp that raised (not for a node that went away)
_RAISED = {ErrorCode.LOAD_CLIENT_APP_EXCEPTION, ErrorCode.CLIENT_APP_RAISED_EXCEPTION}


class AllClientsFailedError(RuntimeError):
    """Every participant of a round raised an exception: a client that fails on its code,
    data or config fails the same way every round, so the run stops instead of finishing
    "completed" with a global model that never moved. (Rejected updates and nodes that went
    away do not stop a run: the server's defences and the federation's churn.)"""

    def __init__(self, server_round: int, failures: list[dict[str, Any]]) -> None:
        first = failures[0]
        super().__init__(
            f"round {server_round}: all {len(failures)} participants failed"
            f" ({first['kind']} from partition {first['pid']}: {first['reason']});"
            " fix the cause, then resume=true (make: RESUME=1; deploy/run.sh --resume)"
            " continues from the last checkpoint"
        )


class RayNodeLostError(RuntimeError):
    """A simulated client's Ray actor is gone (a node of the Ray cluster was lost, or the
    actor's process killed): Flower's Ray backend keeps sending clients to it, so every
    later round would train on fewer clients than configured. The run stops instead, with
    its last checkpoint kept for a resume on the nodes still alive."""

    def __init__(self, server_round: int, failure: dict[str, Any]) -> None:
        super().__init__(
            f"round {server_round}: partition {failure['pid']}'s Ray actor is gone "
            f"({failure['reason'][:300]}): a Ray node was lost or the actor's process killed."
            " The run stops rather than train on fewer clients in every later round;"
            " resume=true (make: RESUME=1) continues from the last checkpoint on the Ray"
            " nodes still alive"
        )


@dataclasses.dataclass(frozen=True)
class NoParams:
    """Plain averaging has no server hyperparameters."""


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """``Σ w·v / Σ w`` (0 when the weights sum to 0), as ``Σ (w/Σw)·v``: a convex
    combination, so finite values give a finite mean however large they are."""
    w = np.asarray(weights, dtype=np.float64)
    total = w.sum()
    return float(np.dot(np.asarray(values, dtype=np.float64), w / total)) if total else 0.0


class StrategyBase:
    """Mixin that turns a Flower FedAvg-family strategy into a project strategy."""

    Params: ClassVar[type] = NoParams

    def __init__(
        self,
        cfg: Config,
        nodes: NodeRegistry,
        participation: Any,
        template: ArrayRecord,
        evaluate_fn: EvaluateFn | None = None,
        recorder: Any = None,
        exchange: PayloadExchange | None = None,
    ) -> None:
        """The aggregator over ``nodes`` with ``cfg``'s server hyperparameters (its
        ``Params``), the model ``template`` (array names, shapes, dtypes), the participation
        model, optional central evaluation and results recorder, and the payload
        ``exchange`` the run's client brings (``None``: the clients send and receive no
        payload; see :mod:`strategies.exchange`)."""
        super().__init__(  # type: ignore[call-arg]
            fraction_train=1.0,
            fraction_evaluate=cfg["evaluation"]["fraction"],
            min_train_nodes=1,
            min_evaluate_nodes=1,
            min_available_nodes=1,
            weighted_by_key="num-examples",
        )
        self.cfg = cfg
        self.hp = params_from(self.Params, cfg["server"])
        self.nodes = nodes
        self.participation = participation
        self.keys = list(template.keys())
        self.template = [template[k].numpy() for k in self.keys]
        self.evaluate_fn = evaluate_fn
        self.recorder = recorder
        self.current: list[np.ndarray] = self.template
        self.record: dict[str, Any] = {}
        self.train_config: dict[str, Any] = {}
        # the Gram matrix of this round's deltas, when aggregation computed it (GNE): the
        # update diagnostics reuse it instead of computing it again
        self.gram_cache: np.ndarray | None = None
        self.gram_round: int | None = None
        self.exchange = exchange

    # ------------------------------------------------------------------ hooks
    def round_config(self, server_round: int) -> dict[str, Any]:
        """Extra scalar config values sent to every participant this round: the
        exchange's (:meth:`PayloadExchange.round_config`); none without one."""
        return self.exchange.round_config(server_round) if self.exchange else {}

    def payload_for(self, server_round: int, pid: int) -> dict[str, np.ndarray]:
        """Named arrays sent to client ``pid`` this round: the exchange's (e.g. FedCCL
        signals); none without one."""
        return self.exchange.payload_for(server_round, pid) if self.exchange else {}

    def check_payload(self, pid: int, payload: dict[str, Array]) -> dict[str, np.ndarray]:
        """Validate a client's payload, still undecoded (Flower ``Array``s: declared dtype
        and shape, and the raw bytes), and return it decoded (:func:`decode_payload`);
        raise RejectedResult to drop the result. With an exchange, its
        :meth:`PayloadExchange.check_payload` decides; without one no payload is expected."""
        if self.exchange is not None:
            return self.exchange.check_payload(pid, payload)
        if payload:
            raise RejectedResult(f"unexpected payload arrays {sorted(payload)}")
        return {}

    def aggregate(self, server_round: int, results: list[ClientResult]) -> list[np.ndarray]:
        """The new global arrays; default: Flower's aggregation (weighted mean for FedAvg,
        with the server optimiser for FedAvgM/FedAdam)."""
        arrays, _ = super().aggregate_train(  # type: ignore[misc]
            server_round, [r.message for r in results]
        )
        return [arrays[k].numpy() for k in self.keys]

    def aggregate_empty(self, server_round: int) -> list[np.ndarray] | None:
        """A round without valid results (nobody selected, or every reply failed or was
        rejected): the new global arrays, or None to keep the model (default). PMFL/FedAU
        still count the round (Algorithm 2) and mix in the historical globals."""
        return None

    def after_aggregate(
        self, server_round: int, results: list[ClientResult], new: list[np.ndarray]
    ) -> None:
        """Update server state after aggregation (``new``: the new global arrays): the
        exchange's (:meth:`PayloadExchange.after_aggregate`; FedCCL's signals), whose record
        entries join the round's record."""
        if self.exchange is not None:
            self.record.update(self.exchange.after_aggregate(server_round, results))

    def state_dict(self) -> dict[str, Any]:
        """Server state to checkpoint (JSON-friendly or numpy arrays); aggregators add
        theirs to this. The exchange's state sits under ``"exchange"``."""
        return {} if self.exchange is None else {"exchange": self.exchange.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned. A checkpoint written before exchanges
        were composed (a ``fedccl``/``fedcclm``/... strategy class) has the exchange's keys
        at the top level, beside the aggregator's: the exchange reads them there."""
        if self.exchange is not None:
            self.exchange.load_state_dict(state.get("exchange", state))

    @classmethod
    def fixed_on_resume(cls, cfg: Config) -> frozenset[str]:
        """Config keys a resume may change in general (``fl_app.rundir.RESUME_MAY_CHANGE``)
        that this strategy trains differently with, so a resume may not change them."""
        return frozenset()

    # ------------------------------------------------------- Flower Strategy API
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.current = [arrays[k].numpy() for k in self.keys]
        connected = self.connected(server_round, grid)
        pids = self.participation.select(server_round, connected)
        self.record["participants"] = pids
        base_cfg = {**dict(config), "server-round": server_round, **self.round_config(server_round)}
        messages = []
        for pid in pids:
            content = RecordDict({"arrays": arrays, "config": ConfigRecord(base_cfg)})
            payload = self.payload_for(server_round, pid)
            if payload:
                content["payload"] = ArrayRecord({k: Array(v) for k, v in payload.items()})
            messages.append(
                Message(
                    content,
                    dst_node_id=self.nodes.by_pid[pid].node_id,
                    message_type=MessageType.TRAIN,
                )
            )
        # the Grid stamps message ids in place when it sends them: see _reply_pids
        self._sent = list(zip(messages, pids, strict=True))
        return messages

    def connected(self, server_round: int, grid: Grid) -> list[int]:
        """:meth:`NodeRegistry.wait_connected` with ``server.round_timeout`` and
        ``server.wait_for_nodes``."""
        s = self.cfg["server"]
        return self.nodes.wait_connected(
            grid, server_round, float(s["round_timeout"]), float(s["wait_for_nodes"])
        )

    def _reply_pids(
        self, replies: list[Message], sent: list[tuple[Message, int]] | None = None
    ) -> list[int | None]:
        """:func:`strategies.replies.reply_pids` of ``replies``; ``sent``: the exchange's
        (message, partition) pairs (default: this round's train messages)."""
        return reply_pids(
            replies, getattr(self, "_sent", []) if sent is None else sent, self.nodes.node_of
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        expected = self._reply_pids(replies)
        results, failures = self.collect(replies, expected)
        lost = missing(
            self.record.get("participants", []),
            set(expected),
            "no reply before server.round_timeout",
            self.nodes.node_of,
        )
        for f in lost:
            log.warning("round %d: no reply from partition %d", server_round, f["pid"])
        failures += lost
        self.record["failures"] = failures
        self.record["num_results"] = len(results)
        if lost_actor := ray_actor_lost(failures):
            raise RayNodeLostError(server_round, lost_actor)
        if not results and failures and all(f.get("code") in _RAISED for f in failures):
            raise AllClientsFailedError(server_round, failures)
        if not results:
            empty = self.aggregate_empty(server_round)
            moved = empty is not None and not all(
                np.array_equal(a, b) for a, b in zip(empty, self.current, strict=True)
            )
            n = len(self.record.get("participants", []))
            log.warning(
                "round %d: %s; the global model is %s",
                server_round,
                f"no valid results from {n} participants" if n else "no participants",
                "changed without client updates" if moved else "kept",
            )
            return (None, None) if empty is None else (self.to_record(empty), MetricRecord())
        new = self.aggregate(server_round, results)
        self.after_aggregate(server_round, results, new)
        client_arrays = [r.arrays for r in results]
        gram = (
            self.gram_cache
            if self.gram_cache is not None and self.gram_round == server_round
            else delta_gram(self.current, client_arrays)
        )
        diagnostics = update_diagnostics(self.current, new, client_arrays, gram)
        diagnostics["cos_global_client"] = {  # keyed by partition, as the round log has it
            str(r.pid): c for r, c in zip(results, diagnostics["cos_global_client"], strict=True)
        }
        self.record.update(diagnostics)
        metrics = self.train_metrics(results)
        self.record["train"] = metrics
        self.record["clients"] = {
            str(r.pid): {"num_examples": r.num_examples, **r.metrics, **r.place} for r in results
        }
        return self.to_record(new), (
            MetricRecord({k: v for k, v in metrics.items() if isinstance(v, float)})
        )

    def to_record(self, arrays: list[np.ndarray]) -> ArrayRecord:
        """Global arrays (in ``self.keys`` order) as the ArrayRecord Flower sends, each in its
        model dtype (:func:`cast_like`): aggregation may compute in float64 (Flower's FedAdam
        returns float64 arrays), but the wire and the checkpoints carry what the model holds
        (float32 for float32 models: half the bytes)."""
        return ArrayRecord(
            {
                k: Array(cast_like(a, t))
                for k, a, t in zip(self.keys, arrays, self.template, strict=True)
            }
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        ev = self.cfg["evaluation"]
        if not ev["federated"] or server_round % ev["every"]:
            return []
        connected = self.nodes.connected_pids(grid.get_node_ids())
        n = max(1, int(round(ev["fraction"] * len(connected))))
        rng = np.random.default_rng(self.cfg["seed"] * 7919 + server_round)
        pids = sorted(rng.choice(connected, size=min(n, len(connected)), replace=False).tolist())
        cfg = ConfigRecord({**dict(config), "server-round": server_round})
        messages = [
            Message(
                RecordDict({"arrays": arrays, "config": cfg}),
                dst_node_id=self.nodes.by_pid[p].node_id,  # p is connected, so known
                message_type=MessageType.EVALUATE,
            )
            for p in pids
        ]
        self._sent_eval = list(zip(messages, pids, strict=True))  # see _reply_pids
        return messages

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Sample-weighted federated accuracy and loss over the valid evaluation replies.

        Each reply gets the training side's identity and count checks (see
        :meth:`check_identity` and :meth:`check_count`; the bound is the test-set size the
        node reported, when it did) and must carry an accuracy in [0, 1] and a finite loss
        >= 0. Errors, rejected replies (with their reason) and partitions that did not
        answer go to ``record["federated_failures"]``, as training's go to ``failures``.
        A client whose local test split is empty (0 examples, NaN metrics) is left out."""
        replies = list(replies)
        sent = getattr(self, "_sent_eval", [])
        expected = self._reply_pids(replies, sent)
        # (pid, accuracy, loss, examples), summed in partition order
        good, failures = collect_replies(
            replies, expected, self.validate_eval_reply, lambda g: g[0], "evaluation"
        )
        failures += missing(
            [pid for _, pid in sent],
            set(expected),
            "no evaluation reply before server.round_timeout",
            self.nodes.node_of,
        )
        self.record["federated_failures"] = failures
        if not good:
            return None
        good.sort()
        accs, losses, ns = [g[1] for g in good], [g[2] for g in good], [g[3] for g in good]
        per_client = {str(g[0]): g[1] for g in good}
        out = {
            "federated_accuracy": weighted_mean(accs, ns),
            "federated_loss": weighted_mean(losses, ns),
        }
        self.record.update(out)
        self.record["federated_clients"] = per_client
        return MetricRecord({**out})

    def validate_eval_reply(
        self, reply: Message, expected: int | None
    ) -> tuple[int, float, float, int] | None:
        """(pid, accuracy, loss, num-examples) of an evaluation reply, ``None`` for an empty
        local test split, or raise RejectedResult naming the problem."""
        try:
            m = reply.content["metrics"]
        except (KeyError, TypeError) as err:
            raise RejectedResult(f"reply lacks metrics ({err})") from err
        if not isinstance(m, MetricRecord):
            raise RejectedResult("'metrics' must be a MetricRecord")
        pid = check_identity(reply.content, expected, self.nodes.num_clients)
        if type(m.get("num-examples")) is int and m.get("num-examples") == 0:
            return None  # an empty local test split: nothing was evaluated
        info = self.nodes.by_pid.get(pid)
        n = check_count(m.get("num-examples"), pid, info.num_test if info else None, "test")
        acc, loss = check_evaluation(m)
        return pid, acc, loss, n

    # ------------------------------------------------------------- validation
    def collect(
        self, replies: list[Message], expected: list[int | None] | None = None
    ) -> tuple[list[ClientResult], list[dict[str, Any]]]:
        """Validate replies; return the good results, in partition order, and a reason for
        each dropped one. Partition order makes aggregation independent of the order the
        replies arrive in (float sums are not associative), so seeded runs repeat exactly.
        ``expected``: :meth:`_reply_pids` of ``replies``, when the caller has it."""
        if expected is None:
            expected = self._reply_pids(replies)
        results, failures = collect_replies(
            replies, expected, self.validate_reply, lambda r: r.pid, "training"
        )
        return sorted(results, key=lambda r: r.pid), failures

    def validate_reply(self, reply: Message, expected: int | None) -> ClientResult:
        """Turn a reply into a ClientResult or raise RejectedResult naming the problem
        (``expected``: the partition its message was sent to, from :meth:`_reply_pids`).

        Besides the arrays, a reply's identity (:meth:`check_identity`) and its
        num-examples are checked: the clients report their partition's training-set size
        (``BaseClient.fit`` returns ``len(train)``, not the samples seen, so neither
        ``client.epochs`` nor ``client.steps`` changes it), hence the exact bound is the
        ``num-train`` the node reported at its query (none for a partition the registry does
        not know, as in evaluation: ``None``, not a bound of 0). Every metric must be a
        finite scalar: an honest client never sends a non-finite one
        (``BaseClient.train_local`` raises on a non-finite loss) nor a list (arrays travel
        as the payload), so such a reply is rejected with its reason, rather than
        aggregated with the metric left out of the round's mean (which would then be over a
        different set of clients than the model)."""
        content = reply.content
        try:
            arrays_rec = content["arrays"]
            metrics_rec = content["metrics"]
        except (KeyError, TypeError) as err:
            raise RejectedResult(f"reply lacks arrays/metrics ({err})") from err
        if not isinstance(arrays_rec, ArrayRecord) or not isinstance(metrics_rec, MetricRecord):
            raise RejectedResult("'arrays' must be an ArrayRecord and 'metrics' a MetricRecord")
        pid = check_identity(content, expected, self.nodes.num_clients)
        place = reply_place(content)
        arrays = check_arrays(arrays_rec, self.keys, self.template)
        info = self.nodes.by_pid.get(pid)
        n = check_count(
            metrics_rec.get("num-examples"), pid, info.num_examples if info else None, "training"
        )
        metrics = check_metrics(metrics_rec)
        check_update_norm(arrays, self.current, self.cfg["server"]["max_update_norm"])
        records = content.array_records
        raw = dict(records["payload"].items()) if "payload" in records else {}
        payload = self.check_payload(pid, raw)
        # FedAvg.aggregate_train accepts exactly one ArrayRecord and one MetricRecord; its
        # "num-examples" is the weight Flower's mean gives the result (server.weighting)
        weight = MetricRecord({"num-examples": self.aggregation_weight(n)})
        reply.content = RecordDict({"arrays": arrays_rec, "metrics": weight})
        return ClientResult(
            pid, reply.metadata.src_node_id, arrays, n, metrics, payload, reply, place
        )

    def aggregation_weight(self, num_examples: int) -> int:
        """The weight of a result of ``num_examples`` samples in the server's mean:
        ``num_examples`` (``server.weighting: samples``, FedAvg's ``Σ n_k w_k / Σ n_k``) or 1
        (``uniform``: the plain mean ``Σ w_k / K`` of FedRCL's server, skynbe/FedRCL
        ``servers/base.py``). Flower's FedAvg/FedAvgM/FedAdam aggregation reads it as the
        result's num-examples; GNE starts from (and falls back to) these weights, normalised.
        The clients' metrics stay sample-weighted (:meth:`train_metrics`)."""
        return num_examples if self.cfg["server"]["weighting"] == "samples" else 1

    def client_weights(self, results: list[ClientResult]) -> np.ndarray:
        """:meth:`aggregation_weight` of each result (float64, not normalised)."""
        return np.array([self.aggregation_weight(r.num_examples) for r in results], np.float64)

    def train_metrics(self, results: list[ClientResult]) -> dict[str, Any]:
        """Sample-weighted means of the clients' scalar metrics (all finite: see
        :meth:`validate_reply`), each over the clients that report it."""
        keys = sorted({k for r in results for k in r.metrics})
        out: dict[str, Any] = {}
        for k in keys:
            vals = [(r.metrics[k], r.num_examples) for r in results if k in r.metrics]
            out[k] = weighted_mean([v for v, _ in vals], [n for _, n in vals])
        return out

    # ------------------------------------------------------------- run loop
    def run(
        self,
        grid: Grid,
        arrays: ArrayRecord,
        num_rounds: int,
        start_round: int = 1,
        on_round_end: Callable[[int, ArrayRecord, dict[str, Any]], None] | None = None,
    ) -> ArrayRecord:
        """Rounds ``start_round..num_rounds``: train, federated evaluation, central
        evaluation, then ``on_round_end(round, arrays, record)`` (results, checkpoint).

        The round record times its phases: ``exchange_seconds`` (train messages out until
        the last reply is in), ``aggregate_seconds`` (validation, aggregation, diagnostics)
        and ``round_seconds`` (the whole round before ``on_round_end``)."""
        timeout = float(self.cfg["server"]["round_timeout"])
        t_start = time.monotonic()
        for rnd in range(start_round, num_rounds + 1):
            t0 = time.monotonic()
            self.record = {"round": rnd}
            train_cfg = ConfigRecord(dict(self.train_config))
            messages = list(self.configure_train(rnd, arrays, train_cfg, grid))
            t1 = time.monotonic()
            replies = send_and_receive(grid, messages, timeout) if messages else []
            t2 = time.monotonic()
            # a round without participants goes through the same path (FedAU counts it)
            new, _ = self.aggregate_train(rnd, replies)
            self.record["exchange_seconds"] = t2 - t1
            self.record["aggregate_seconds"] = time.monotonic() - t2
            if new is not None:
                arrays = new
            eval_msgs = list(self.configure_evaluate(rnd, arrays, ConfigRecord(), grid))
            if eval_msgs:
                self.aggregate_evaluate(rnd, send_and_receive(grid, eval_msgs, timeout))
            ev = self.cfg["evaluation"]
            if self.evaluate_fn and (rnd % ev["every"] == 0 or rnd == num_rounds):
                self.record.update(self.evaluate_fn(rnd, arrays))
            self.record["round_seconds"] = time.monotonic() - t0
            done = rnd - start_round + 1
            eta = (time.monotonic() - t_start) / done * (num_rounds - rnd)
            acc = self.record.get("accuracy")
            log.info(
                "round %d/%d: %d/%d results, %s%.1fs (ETA %.0fs)",
                rnd,
                num_rounds,
                self.record.get("num_results", 0),
                len(self.record.get("participants", [])),
                f"accuracy {acc:.4f}, " if acc is not None else "",
                self.record["round_seconds"],
                eta,
            )
            if on_round_end:
                on_round_end(rnd, arrays, self.record)
        return arrays
