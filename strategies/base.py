"""The one server-side base every method shares.

:class:`StrategyBase` is a mixin over Flower's Message-API ``FedAvg`` family
(``flwr.serverapp.strategy``). It overrides only ``configure_train``/``aggregate_train`` (and
the evaluate pair) and adds what every method needs:

- participants chosen by the participation model from client-reported partition ids
  (``NodeRegistry``), with a per-node config record and optional method payload arrays;
- validation of every reply (error replies, missing records, partition id: an integer, the
  partition the message was sent to, once; num-examples bounded by the split size the node
  reported; array names, shapes, dtypes, finite values, update norm; finite scalar metrics;
  payload): a bad result is dropped with a logged reason and counted, the round goes on
  with the rest; federated evaluation replies get the same identity and count checks plus
  accuracy in [0, 1] and a finite loss >= 0;
- method payloads moved out of each reply before ``FedAvg.aggregate_train`` (which accepts
  exactly one ArrayRecord), so FedAvgM/FedAdam servers combine with any client;
- per-round diagnostics from the client deltas ``Δ_k = w_k − W``: the Gram matrix (shared
  with GNE), the update deviation (PMFL Def. 1) and cos(global update, Δ_k) (FedRANE Fig. 3);
- :meth:`run`: the round loop (train → federated eval → central eval → record →
  checkpoint), which unlike ``Strategy.start`` can resume from a checkpointed round.

An aggregator (a subclass: FedAvg, FedAvgM, FedAdam here; GNE, FedAU, PMFL in their modules)
overrides hooks: ``Params``, ``aggregate``, ``aggregate_empty``, ``state_dict``/
``load_state_dict``. What a client sends besides its model is not the aggregator's business:
the strategy holds the client's payload exchange (:mod:`strategies.exchange`; FedCCL's signals)
and delegates ``round_config``, ``payload_for``, ``check_payload``, ``after_aggregate`` and its
part of the checkpoint to it, so any aggregator takes any client (composition).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import MessageType
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM

from fl_app.config import Config, below_one, params_from, positive
from strategies.exchange import PayloadExchange

log = logging.getLogger("fl_app")

POLL_FIRST_S, POLL_MAX_S = 0.002, 0.05  # reply polling: first wait, longest wait
#: How long a node already serving a partition gets to answer when another node claims it
PROBE_TIMEOUT_S = 10.0


def send_and_receive(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and pull their replies until all arrived or ``timeout`` seconds passed.

    Same contract as ``Grid.send_and_receive``, but polls every 2 ms growing to 50 ms instead
    of Flower's fixed sleep between pulls (0.1 s in simulation, 3 s in deployment), which
    otherwise adds up to that much idle time to every train and evaluate exchange. A grid
    without push/pull (the tests' in-process grid) is used as is."""
    if not hasattr(grid, "push_messages"):
        return list(grid.send_and_receive(messages, timeout=timeout))
    pending = {mid for mid in grid.push_messages(messages) if mid}
    replies: list[Message] = []
    deadline, wait = time.monotonic() + timeout, POLL_FIRST_S
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0:
            break
        time.sleep(min(wait, remaining))
        wait = min(2 * wait, POLL_MAX_S)
    return replies


EvaluateFn = Callable[[int, ArrayRecord], dict[str, Any]]


class RejectedResult(ValueError):
    """A client result that must not be aggregated; the message says why."""


@dataclass
class ClientResult:
    """One validated training result."""

    pid: int
    node_id: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, float]
    payload: dict[str, np.ndarray]
    message: Message


@dataclass
class NodeInfo:
    """A node as its start-up query described it: partition id, node id, its training-set
    size (``num-train``: the most a training reply may claim as num-examples), label counts
    and, when the node reports ``num-test``, its local test-set size (bounds federated
    evaluation counts; ``None``: not reported, unbounded)."""

    pid: int
    node_id: int
    num_examples: int = 0
    label_counts: list[int] = field(default_factory=list)
    num_test: int | None = None


class NodeRegistry:
    """Partition id ↔ node id. Partition ids are what the clients report (a restarted
    SuperNode without a key comes back with a new node id but the same partition id; with
    an authentication key it keeps its node id)."""

    def __init__(self, num_clients: int, num_classes: int | None = None) -> None:
        self.num_clients, self.num_classes = num_clients, num_classes
        self.by_pid: dict[int, NodeInfo] = {}
        self.asked: set[int] = set()  # accepted nodes: not asked again
        self.refused: dict[int, str] = {}  # node id -> why; asked again at every refresh
        # node id -> (refreshes to skip, silent answers so far): a node that does not answer
        # its query is asked again after 1, 2, 4, ... 32 refreshes, not every round
        self.silent: dict[int, tuple[int, int]] = {}

    def add(self, info: NodeInfo) -> None:
        self.by_pid[info.pid] = info

    def node_of(self, pid: int) -> int | None:
        """The node that serves partition ``pid`` (None: no node has reported it)."""
        info = self.by_pid.get(pid)
        return info.node_id if info else None

    def known_pids(self) -> list[int]:
        return sorted(self.by_pid)

    def connected_pids(self, node_ids: Iterable[int]) -> list[int]:
        alive = set(node_ids)
        return sorted(p for p, i in self.by_pid.items() if i.node_id in alive)

    def refresh(self, grid: Grid, timeout: float, strict: bool = False) -> int:
        """Ask nodes not seen before for their identity (QUERY); returns how many were added.

        A SuperNode that restarts with a new node id is found here and mapped to its
        partition again. A node whose identity does not fit this federation (another number
        of partitions, a partition id outside ``0..num_clients-1``, a new node for a known
        partition with other data) is not used: a ValueError at start-up (``strict``), later
        a warning (once per reported identity), and it is asked again at every refresh, so
        that the node restarted with the right ``--node-config`` (with an authentication key
        it keeps its node id) is taken. An error reply or a malformed one leaves the node
        unregistered, to be asked again next time; with ``strict`` either is a
        RuntimeError."""
        node_ids = list(grid.get_node_ids())
        listed = set(node_ids)
        for gone in [n for n in (*self.silent, *self.refused) if n not in listed]:
            self.silent.pop(gone, None)
            self.refused.pop(gone, None)
        new = [n for n in node_ids if n not in self.asked and not self._skip_silent(n)]
        if not new:
            return 0
        added = 0
        replies = send_and_receive(grid, [_identity_query(n) for n in new], timeout)
        self._note_silent(new, {r.metadata.src_node_id for r in replies}, timeout, strict)
        for reply in replies:
            if reply.has_error():
                if strict:  # at start-up: a node that cannot even load its data is fatal
                    raise RuntimeError(f"node query failed: {error_message(reply.error.reason)}")
                log.warning("node query failed: %s", error_message(reply.error.reason))
                continue
            node = reply.metadata.src_node_id
            try:
                info, num = _node_info(reply)
            except ValueError as err:  # not this project's ClientApp answering
                if strict:
                    raise RuntimeError(f"node {node}: {err}") from err
                log.warning("node %s: %s; it is asked again at the next refresh", node, err)
                continue
            known = self.by_pid.get(info.pid)
            # a restarted SuperNode (without a key: a new node id) while its old id is still
            # listed (Flower drops it after ≈60 s), or a second SuperNode?
            served = (
                known is not None
                and known.node_id != node
                and known.node_id in listed
                and self._answers(grid, known.node_id, info.pid, timeout)
            )
            problem = self.identity_problem(info, num, served)
            if problem:
                if strict:
                    raise ValueError(f"node {node} {problem}")
                if self.refused.get(node) != problem:
                    log.warning("node %s %s: it is not used", node, problem)
                self.refused[node] = problem
                continue
            if info.pid in self.by_pid:
                log.info("partition %d now served by node %s", info.pid, node)
            self.add(info)
            self.refused.pop(node, None)
            self.asked.add(node)
            added += 1
        return added

    def _answers(self, grid: Grid, node: int, pid: int, timeout: float) -> bool:
        """Whether ``node`` answers an identity query (within ``min(timeout, 10)`` s) as the
        node of partition ``pid``."""
        for reply in send_and_receive(grid, [_identity_query(node)], min(timeout, PROBE_TIMEOUT_S)):
            if reply.has_error() or reply.metadata.src_node_id != node:
                continue
            try:
                return _node_info(reply)[0].pid == pid
            except ValueError:
                return False
        return False

    def _skip_silent(self, node: int) -> bool:
        """Whether a node that did not answer its last query sits this refresh out."""
        if node not in self.silent:
            return False
        skip, count = self.silent[node]
        self.silent[node] = (skip - 1, count)
        return skip > 0

    def _note_silent(
        self, asked: list[int], answered: set[int], timeout: float, strict: bool
    ) -> None:
        """Log the nodes that did not answer their query within ``timeout`` and back off
        from asking them (each such query holds a round up by ``timeout``)."""
        quiet = [n for n in asked if n not in answered]
        for n in answered:
            self.silent.pop(n, None)
        if not quiet or strict:  # at start-up discover_nodes waits and names the missing
            return
        for n in quiet:
            count = self.silent.get(n, (0, 0))[1] + 1
            self.silent[n] = (min(2 ** (count - 1), 32), count)
        log.warning(
            "node(s) %s did not answer the identity query within %.0fs; asked again after "
            "skipping %s refresh(es) (one a round) (a connected SuperNode whose ClientApp "
            "does not respond: check its log)",
            quiet,
            timeout,
            [self.silent[n][0] for n in quiet],
        )

    def identity_problem(
        self, info: NodeInfo, num_partitions: int, served: bool = False
    ) -> str | None:
        """Why a node that reports ``info`` and ``num-partitions=num_partitions`` cannot
        serve this federation of ``num_clients`` partitions (None: it can). Its label counts
        must be one per class and sum to its training samples. A partition already known
        must come back with the same data (a restarted node does: partitions are seeded);
        other label counts mean another dataset or partition config, whose node would
        corrupt the sample weights and the participation model. Nor may a node take over a
        partition that is ``served`` (its known node, another one, still answers for it): two
        SuperNodes started with the same ``partition-id``."""
        n, pid = self.num_clients, info.pid
        if num_partitions != n:
            return f"reports num-partitions={num_partitions}, but the run has {n} partitions"
        if not 0 <= pid < n:
            return f"reports partition-id={pid}, outside 0..{n - 1}"
        c = self.num_classes
        if c is not None and len(info.label_counts) != c:
            return f"reports {len(info.label_counts)} label counts, but the run has {c} classes"
        if info.label_counts and sum(info.label_counts) != info.num_examples:
            return (
                f"reports label counts summing to {sum(info.label_counts)}, not its "
                f"{info.num_examples} training samples"
            )
        known = self.by_pid.get(pid)
        if known is not None and (known.num_examples, known.label_counts) != (
            info.num_examples,
            info.label_counts,
        ):
            return (
                f"reports partition {pid} with {info.num_examples} training samples and label"
                f" counts {info.label_counts}, but it had {known.num_examples} and"
                f" {known.label_counts} (another dataset or partition config)"
            )
        if served and known is not None:
            return (
                f"reports partition-id={pid}, which node {known.node_id} serves and still "
                "answers for: two SuperNodes started with the same partition-id? Give each its "
                'own --node-config "partition-id=..."'
            )
        return None

    def label_matrix(self, num_classes: int) -> np.ndarray:
        out = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for pid, info in self.by_pid.items():
            if info.label_counts:
                out[pid] = info.label_counts
        return out


_T = TypeVar("_T")

# StrategyBase._collect_replies: log lines for an error reply and for a rejected reply
_REPLY_LOGS = {
    "training": ("client error (node %s): %s", "dropped result from node %s (partition %s): %s"),
    "evaluation": (
        "evaluation error (node %s): %s",
        "dropped evaluation from node %s (partition %s): %s",
    ),
}

# Flower's error codes for a ClientApp that raised (not for a node that went away)
_RAISED = {ErrorCode.LOAD_CLIENT_APP_EXCEPTION, ErrorCode.CLIENT_APP_RAISED_EXCEPTION}

_FLOWER_REASON = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>", re.DOTALL)
_REASON_LIMIT = 500


def error_message(reason: str | None) -> str:
    """The client's own error in the ``reason`` of a Flower error reply, on one line.

    A deployed SuperNode reports ``<class 'ValueError'>:<'bad data'>`` (→ ``ValueError: bad
    data``); in simulation the reason is Ray's whole traceback, whose client error follows its
    last ``Message: `` (→ the message alone). Anything else: its last non-empty line. White
    space collapsed to single spaces; at most 500 characters; ``None`` gives ``""``."""
    text = (reason or "").strip()
    if "Message: " in text:
        text = text.rsplit("Message: ", 1)[1].removesuffix("'>")
    elif m := _FLOWER_REASON.fullmatch(text):
        text = f"{m.group(1)}: {m.group(2)}"
    else:
        text = next((line for line in reversed(text.splitlines()) if line.strip()), "")
    text = " ".join(text.split())
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 1] + "…"


def _identity_query(node: int) -> Message:
    """The start-up query that asks ``node`` for its identity (the ClientApp's ``query``)."""
    return Message(
        RecordDict({"config": ConfigRecord({})}), dst_node_id=node, message_type=MessageType.QUERY
    )


def _node_info(reply: Message) -> tuple[NodeInfo, int]:
    """A node's answer to the start-up query (the ClientApp's ``query``): its
    :class:`NodeInfo` and the number of partitions it was told. ValueError names what is
    missing or malformed."""
    try:
        info: dict[str, Any] = dict(reply.content.config_records["info"])
        stats: dict[str, Any] = dict(reply.content.metric_records["stats"])
        counts = stats["label-counts"]
        if not isinstance(counts, list):
            raise TypeError(f"label-counts is {type(counts).__name__}, not a list")
        num_test = stats.get("num-test")
        return NodeInfo(
            _count(info["partition-id"], "partition-id", negative=True),  # range: see refresh
            reply.metadata.src_node_id,
            _count(stats["num-train"], "num-train"),
            [_count(c, "label-counts entry") for c in counts],
            None if num_test is None else _count(num_test, "num-test"),
        ), _count(info["num-partitions"], "num-partitions")
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"malformed query reply ({type(err).__name__}: {err})") from err


def _count(value: Any, name: str, negative: bool = False) -> int:
    """A whole number ≥ 0 (any sign with ``negative``) from a node's reply: an ``int``, or a
    float with an integral value (MetricRecord may carry either); ValueError otherwise
    (bool, inf, NaN, 1.5, −1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} = {value!r} is not a number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name} = {value!r} is not a whole number")
    if value < 0 and not negative:
        raise ValueError(f"{name} = {value!r} is negative")
    return int(value)


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


class NoNodesError(RuntimeError):
    """No node of the federation connected for ``server.wait_for_nodes`` seconds: the run
    stops at the last completed round instead of running the rest with no one."""

    def __init__(self, server_round: int, waited: float) -> None:
        super().__init__(
            f"round {server_round}: no node of the federation connected for {waited:.0f}s "
            "(server.wait_for_nodes); start the SuperNodes again, then resume=true "
            "(make: RESUME=1; deploy/run.sh --resume) continues from the last checkpoint"
        )


@dataclasses.dataclass(frozen=True)
class NoParams:
    """Plain averaging has no server hyperparameters."""


def _flat_norm_sq(arrays: Iterable[np.ndarray]) -> float:
    return float(sum(np.vdot(a, a).real for a in arrays))


def _delta_chunks(
    global_arrays: list[np.ndarray],
    results: list[ClientResult],
    new: list[np.ndarray] | None,
    chunk: int = 1 << 18,
) -> Iterable[tuple[np.ndarray, np.ndarray | None]]:
    """Column blocks of the float32 delta matrix ``D`` (K × chunk, row k = ``w_k − W``) and,
    with ``new``, the matching block of the global update ``W_new − W``. Bounded memory."""
    for i, g in enumerate(global_arrays):
        if not np.issubdtype(g.dtype, np.floating):
            continue
        flat_g = g.reshape(-1)
        flats = [r.arrays[i].reshape(-1) for r in results]
        for start in range(0, flat_g.size, chunk):
            sl = slice(start, start + chunk)
            d = np.stack([f[sl] for f in flats]).astype(np.float32)
            d -= flat_g[sl]
            u = None if new is None else new[i].reshape(-1)[sl].astype(np.float32) - flat_g[sl]
            yield d, u


def delta_gram(global_arrays: list[np.ndarray], results: list[ClientResult]) -> np.ndarray:
    """Gram matrix ``G_kl = Δ_kᵀΔ_l`` of the client deltas over the float arrays, from
    float32 column blocks (BLAS) accumulated in float64; no K×P matrix is ever held."""
    k = len(results)
    gram = np.zeros((k, k), dtype=np.float64)
    for d, _ in _delta_chunks(global_arrays, results, None):
        gram += d @ d.T
    return gram


def update_diagnostics(
    global_arrays: list[np.ndarray],
    new_arrays: list[np.ndarray],
    results: list[ClientResult],
    gram: np.ndarray,
) -> dict[str, Any]:
    """Dev^t = Σ_k (1 − cos(Δ_k, mean Δ)) (PMFL Def. 1) and cos(global update, Δ_k)
    (FedRANE Fig. 3), from the Gram matrix and one blocked pass over the arrays."""
    k = len(results)
    norms = np.sqrt(np.clip(np.diag(gram), 0, None))
    mean_dot = gram.sum(axis=1) / k  # Δ_k · mean Δ
    mean_norm = np.sqrt(max(gram.sum() / k**2, 0.0))
    denom = norms * mean_norm
    cos_mean = np.divide(mean_dot, denom, out=np.zeros(k), where=denom > 0)
    u_dot = np.zeros(k)
    u_sq = 0.0
    for d, u in _delta_chunks(global_arrays, results, new_arrays):
        assert u is not None
        u_sq += float(u.astype(np.float64) @ u)
        u_dot += d @ u
    denom_u = norms * np.sqrt(u_sq)
    cos_u = np.divide(u_dot, denom_u, out=np.zeros(k), where=denom_u > 0)
    return {
        "update_deviation": float(np.sum(1.0 - cos_mean)),
        "global_update_norm": float(np.sqrt(u_sq)),
        "cos_global_client": {str(r.pid): float(c) for r, c in zip(results, cos_u, strict=True)},
    }


def decode_array(name: str, arr: Array) -> np.ndarray:
    """One array of a client's reply, decoded. Only Flower's ``numpy.ndarray`` serialisation
    is read, by ``np.load(allow_pickle=False)``: an object (pickled) array, another ``stype``
    or truncated bytes raise RejectedResult naming the array (``name``); nothing is ever
    unpickled."""
    try:
        return arr.numpy()
    except Exception as err:  # ValueError (pickled or truncated data), TypeError (stype)
        raise RejectedResult(f"{name} cannot be decoded: {err}") from err


def decode_payload(payload: dict[str, Array]) -> dict[str, np.ndarray]:
    """A client's payload arrays, decoded by :func:`decode_array`."""
    return {key: decode_array(f"payload array {key!r}", arr) for key, arr in payload.items()}


def _as_float(v: Any) -> float:
    """``float(v)``, NaN for what has no float value (an int beyond float range)."""
    try:
        return float(v)
    except (OverflowError, TypeError, ValueError):
        return math.nan


def cast_like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``value`` (e.g. a float64 aggregate) in ``like``'s dtype, without a copy when it
    already has it; integer arrays are rounded, not truncated."""
    if np.issubdtype(like.dtype, np.integer):
        value = np.rint(value)
    return np.asarray(value).astype(like.dtype, copy=False)


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
            **type(self).flower_kwargs(cfg),
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
    @classmethod
    def flower_kwargs(cls, cfg: Config) -> dict[str, Any]:
        """Flower base-class keyword arguments derived from the config (FedAvgM/FedAdam add
        theirs)."""
        return {}

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
        """Config keys a resume may change in general (``fl_app.results.RESUME_MAY_CHANGE``)
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
        """The partitions whose nodes are connected now (new nodes asked for their identity
        first). With none, waits up to ``server.wait_for_nodes`` seconds for one to come
        back (SuperNodes restarting, a network outage) instead of running rounds with no
        one; then :class:`NoNodesError`."""
        s = self.cfg["server"]
        timeout, wait = float(s["round_timeout"]), float(s["wait_for_nodes"])
        deadline = None
        while True:
            left = timeout if deadline is None else max(deadline - time.monotonic(), 1.0)
            self.nodes.refresh(grid, timeout=min(timeout, left))
            connected = self.nodes.connected_pids(grid.get_node_ids())
            if connected:
                if deadline is not None:
                    log.info("round %d: %d node(s) connected again", server_round, len(connected))
                return connected
            if deadline is None:
                log.warning(
                    "round %d: no node of the federation is connected; waiting up to "
                    "server.wait_for_nodes=%.0fs for one",
                    server_round,
                    wait,
                )
                deadline = time.monotonic() + wait
            elif time.monotonic() >= deadline:
                raise NoNodesError(server_round, wait)
            time.sleep(min(1.0, wait))

    def _reply_pids(
        self, replies: list[Message], sent: list[tuple[Message, int]] | None = None
    ) -> list[int | None]:
        """The partition each reply answers (None: no message of the exchange): by the id of
        the message it replies to (error replies for dead nodes come from the SuperLink, not
        the node), else by sender. ``sent``: (message, partition) pairs of the exchange
        (default: this round's train messages)."""
        if sent is None:
            sent = getattr(self, "_sent", [])
        by_id = {m.metadata.message_id: p for m, p in sent if m.metadata.message_id}
        by_node = {self.nodes.node_of(p): p for _, p in sent}
        return [
            by_id.get(r.metadata.reply_to_message_id, by_node.get(r.metadata.src_node_id))
            for r in replies
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        expected = self._reply_pids(replies)
        results, failures = self.collect(replies, expected)
        missing = self._missing(
            self.record.get("participants", []),
            set(expected),
            "no reply before server.round_timeout",
        )
        for f in missing:
            log.warning("round %d: no reply from partition %d", server_round, f["pid"])
        failures += missing
        self.record["failures"] = failures
        self.record["num_results"] = len(results)
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
        gram = (
            self.gram_cache
            if self.gram_cache is not None and self.gram_round == server_round
            else delta_gram(self.current, results)
        )
        self.record.update(update_diagnostics(self.current, new, results, gram))
        metrics = self.train_metrics(results)
        self.record["train"] = metrics
        self.record["clients"] = {
            str(r.pid): {"num_examples": r.num_examples, **r.metrics} for r in results
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
        good, failures = self._collect_replies(
            replies, expected, self.validate_eval_reply, lambda g: g[0], "evaluation"
        )
        failures += self._missing(
            [pid for _, pid in sent],
            set(expected),
            "no evaluation reply before server.round_timeout",
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
        pid = self.check_identity(reply.content, expected)
        if type(m.get("num-examples")) is int and m.get("num-examples") == 0:
            return None  # an empty local test split: nothing was evaluated
        info = self.nodes.by_pid.get(pid)
        n = self.check_count(m.get("num-examples"), pid, info.num_test if info else None, "test")
        values = {}
        for key in ("accuracy", "loss"):
            v = m.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise RejectedResult(f"{key} must be a number, got {v!r}")
            values[key] = _as_float(v)
        acc, loss = values["accuracy"], values["loss"]
        if not 0.0 <= acc <= 1.0:
            raise RejectedResult(f"accuracy {m.get('accuracy')!r} outside [0, 1]")
        if not (np.isfinite(loss) and loss >= 0):
            raise RejectedResult(f"loss {m.get('loss')!r} must be finite and >= 0")
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
        results, failures = self._collect_replies(
            replies, expected, self.validate_reply, lambda r: r.pid, "training"
        )
        return sorted(results, key=lambda r: r.pid), failures

    def _collect_replies(
        self,
        replies: list[Message],
        expected_pids: list[int | None],
        validate: Callable[[Message, int | None], _T | None],
        pid_of: Callable[[_T], int],
        phase: str,
    ) -> tuple[list[_T], list[dict[str, Any]]]:
        """The per-reply loop shared by training (:meth:`collect`) and federated evaluation.

        ``validate(reply, expected)`` (``expected``: the partition the answered message was
        sent to, the reply's entry of ``expected_pids`` from :meth:`_reply_pids`) returns
        the validated result, ``None`` for a reply to leave out without a failure (an empty
        local test split), or raises RejectedResult. Returns the results in arrival order
        and a failure record for each error reply (``kind`` "error", with Flower's ``code``)
        and each rejected one (``kind`` "rejected"), a second result for a partition
        included; each failure is logged. ``phase`` ("training" or "evaluation") picks the
        log wording."""
        error_log, dropped_log = _REPLY_LOGS[phase]
        good: list[_T] = []
        failures: list[dict[str, Any]] = []
        seen: set[int] = set()
        for reply, expected in zip(replies, expected_pids, strict=True):
            node = reply.metadata.src_node_id
            if reply.has_error():
                err = reply.error
                failures.append(
                    {
                        "kind": "error",
                        "node_id": node,
                        "pid": expected,
                        "code": err.code,
                        "reason": f"code {err.code}: {error_message(err.reason)}",
                    }
                )
                log.warning(error_log, node, err.reason)
                continue
            try:
                got = validate(reply, expected)
                if got is None:
                    continue
                pid = pid_of(got)
                if pid in seen:
                    raise RejectedResult(f"duplicate result for partition {pid}")
                seen.add(pid)
                good.append(got)
            except RejectedResult as err:
                failures.append(
                    {"kind": "rejected", "node_id": node, "pid": expected, "reason": str(err)}
                )
                log.warning(dropped_log, node, expected, err)
        return good, failures

    def _missing(
        self, pids: Iterable[int], answered: set[int | None], reason: str
    ) -> list[dict[str, Any]]:
        """A ``kind`` "missing" failure record for each of ``pids`` not in ``answered`` (the
        :meth:`_reply_pids` of the replies; an error reply counts as an answer: it is
        recorded as the error)."""
        return [
            {"kind": "missing", "node_id": self.nodes.node_of(pid), "pid": pid, "reason": reason}
            for pid in pids
            if pid not in answered
        ]

    def check_identity(self, content: RecordDict, expected: int | None) -> int:
        """The reply's partition id: an integer (not 1.9, ``True`` or ``"1"``: int() would
        truncate or coerce them into another partition), in 0..num_clients−1, and the
        partition the message it answers was sent to (``expected``, from
        :meth:`_reply_pids`): a node answering as another partition would take that
        partition's place and report its own as missing."""
        try:
            pid = content["info"]["partition-id"]
        except (KeyError, TypeError) as err:
            raise RejectedResult(f"reply lacks info/partition-id ({err})") from err
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise RejectedResult(f"partition id must be an integer, got {pid!r}")
        if not 0 <= pid < self.nodes.num_clients:
            raise RejectedResult(f"partition id {pid} outside 0..{self.nodes.num_clients - 1}")
        if expected is None:
            raise RejectedResult(f"reply from partition {pid} answers no message of this round")
        if pid != expected:
            raise RejectedResult(
                f"partition id {pid} in a reply to the message sent to partition {expected}"
            )
        return pid

    @staticmethod
    def check_count(n: Any, pid: int, limit: int | None, split: str) -> int:
        """num-examples: a positive integer, at most ``limit`` (the size of the ``split``
        the node reported at its query; ``None``: not reported, no upper bound)."""
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise RejectedResult(f"num-examples must be a positive integer, got {n!r}")
        if limit is not None and n > limit:
            raise RejectedResult(
                f"num-examples {n} exceeds the {limit} {split} samples partition {pid} reported"
            )
        return n

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
        pid = self.check_identity(content, expected)
        if list(arrays_rec.keys()) != self.keys:
            raise RejectedResult(
                f"array names differ from the model's ({len(arrays_rec)} arrays, "
                f"expected {len(self.keys)})"
            )
        arrays = []
        for key, ref in zip(self.keys, self.template, strict=True):
            arr = decode_array(f"array {key!r}", arrays_rec[key])
            if arr.shape != ref.shape or arr.dtype != ref.dtype:
                raise RejectedResult(
                    f"array {key!r} has shape {arr.shape} dtype {arr.dtype}, "
                    f"expected {ref.shape} {ref.dtype}"
                )
            if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
                raise RejectedResult(f"array {key!r} holds NaN or Inf")
            arrays.append(arr)
        info = self.nodes.by_pid.get(pid)
        n = self.check_count(
            metrics_rec.get("num-examples"), pid, info.num_examples if info else None, "training"
        )
        metrics: dict[str, float] = {}
        for k, v in metrics_rec.items():
            if k == "num-examples":
                continue
            if isinstance(v, list):
                raise RejectedResult(
                    f"metric {k!r} is a list; metrics must be scalars (arrays go in the payload)"
                )
            value = _as_float(v)
            if not math.isfinite(value):
                raise RejectedResult(f"metric {k!r} = {v!r} is not a finite number")
            metrics[k] = value
        norm = np.sqrt(
            _flat_norm_sq(
                (a.astype(np.float64) - g)
                for a, g in zip(arrays, self.current, strict=True)
                if np.issubdtype(a.dtype, np.floating)
            )
        )
        if norm > self.cfg["server"]["max_update_norm"]:
            raise RejectedResult(
                f"update norm {norm:.3g} exceeds server.max_update_norm "
                f"{self.cfg['server']['max_update_norm']:.3g}"
            )
        records = content.array_records
        raw = dict(records["payload"].items()) if "payload" in records else {}
        payload = self.check_payload(pid, raw)
        # FedAvg.aggregate_train accepts exactly one ArrayRecord and one MetricRecord; its
        # "num-examples" is the weight Flower's mean gives the result (server.weighting)
        weight = MetricRecord({"num-examples": self.aggregation_weight(n)})
        reply.content = RecordDict({"arrays": arrays_rec, "metrics": weight})
        return ClientResult(pid, reply.metadata.src_node_id, arrays, n, metrics, payload, reply)

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


class FedAvgStrategy(StrategyBase, FedAvg):
    """FedAvg (McMahan et al., 2017): ``W ← Σ n_k w_k / Σ n_k`` over returned results
    (``server.weighting: uniform``: ``W ← Σ w_k / K``, FedRCL's server)."""


@dataclasses.dataclass(frozen=True)
class FedAvgMParams:
    server_lr: float = positive(1.0)
    server_momentum: float = below_one(0.9)


class FedAvgMStrategy(StrategyBase, FedAvgM):
    """FedAvgM (Hsu et al., 2019): server momentum on the averaged update (Flower built-in)."""

    Params = FedAvgMParams

    @classmethod
    def flower_kwargs(cls, cfg: Config) -> dict[str, Any]:
        s = cfg["server"]
        return {"server_learning_rate": s["server_lr"], "server_momentum": s["server_momentum"]}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # what FedAvgM.configure_train would record (its sampling is replaced by ours)
        if self.current_arrays is None:
            self.current_arrays = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def state_dict(self) -> dict[str, Any]:
        """The server momentum buffer (``None`` before the first aggregation)."""
        return {**super().state_dict(), "momentum_vector": self.momentum_vector}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        mv = state.get("momentum_vector")
        self.momentum_vector = None if mv is None else [np.asarray(v) for v in mv]


@dataclasses.dataclass(frozen=True)
class FedAdamParams:
    server_lr: float = positive(0.01)
    beta_1: float = below_one(0.9)
    beta_2: float = below_one(0.99)
    tau: float = positive(1e-3)  # τ of Reddi et al.: adaptivity (denominator offset)


class FedAdamStrategy(StrategyBase, FedAdam):
    """FedAdam as Flower implements it (after Reddi et al., 2021, Alg. 2): with the
    pseudo-gradient ``Δ_t = Σ n_k w_k / Σ n_k − x_t``, ``m_t = β1·m_{t−1} + (1−β1)·Δ_t``,
    ``v_t = β2·v_{t−1} + (1−β2)·Δ_t²`` and ``x_{t+1} = x_t + η_t·m_t / (√v_t + τ)``, where
    Flower's ``η_t = η·√(1−β2^(t+1)) / (1−β1^(t+1))`` (t the server round) is an Adam-style
    bias correction that the paper's Algorithm 2 lacks (it steps with η itself).
    Flower computes the new global arrays in float64; they are sent and saved in the model's
    dtype (:meth:`StrategyBase.to_record`), so ``x_t`` is what the clients receive."""

    Params = FedAdamParams

    @classmethod
    def flower_kwargs(cls, cfg: Config) -> dict[str, Any]:
        s = cfg["server"]
        return {"eta": s["server_lr"], **{k: s[k] for k in ("beta_1", "beta_2", "tau")}}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # what FedOpt.configure_train would record (its sampling is replaced by ours)
        self.current_arrays = {k: array.numpy() for k, array in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def state_dict(self) -> dict[str, Any]:
        """Adam's first and second moments (``None`` before the first aggregation)."""
        return {**super().state_dict(), "m_t": self.m_t, "v_t": self.v_t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for name in ("m_t", "v_t"):
            value = state.get(name)
            moments = None if value is None else {k: np.asarray(v) for k, v in value.items()}
            setattr(self, name, moments)
