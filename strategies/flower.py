"""Drop-in Flower strategies: GNE, FedAU and PMFL's server for any Flower app.

Each class here is a plain ``flwr.serverapp.strategy.FedAvg`` subclass (Flower's Message
API), built from Flower-style keyword arguments only, with no project config, node registry
or client protocol: the ClientApp replies to a ``train`` message with one ArrayRecord (the
local model, same keys and shapes as the global one) and one MetricRecord holding the
``weighted_by_key`` weight (``"num-examples"``), as for Flower's ``FedAvg``; every Flower
keyword (``fraction_train``, ``min_train_nodes``, ``min_available_nodes``,
``weighted_by_key``, ``train_metrics_aggr_fn``, ...) is passed through to ``FedAvg``::

    strategy = FedAU(fraction_train=0.1, min_available_nodes=10, cutoff=50)
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=100)

The math is the project's (one copy): :func:`strategies.gne.gne_step` for GNE,
:func:`strategies.fedau.participation_step` and :func:`strategies.fedau.pmfl_step` for
FedAU/PMFL. What differs from the project's own strategies (``strategies.gne.GNEStrategy``,
``strategies.fedau.FedAUStrategy``/``PMFLStrategy``): nodes are identified by Flower's node
id (``msg.metadata.src_node_id``), not by a client-reported partition id, so a SuperNode
that restarts without an authentication key comes back as a new node; sampling is
Flower's (``fraction_train``); and there is no checkpointing, reply bounds or
per-round records beyond each strategy's ``last_*`` attributes.

FedAvgM: the project's ``FedAvgMStrategy`` delegates its math to Flower's
``flwr.serverapp.strategy.FedAvgM`` and adds only the project's sampling, validation and
checkpointing, so the drop-in FedAvgM is Flower's own class, re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import AggregationError
from flwr.serverapp.strategy import FedAvg, FedAvgM, Result

from strategies.fedau import (
    ParticipationWeights,
    check_interval_timing,
    participation_step,
    pmfl_step,
)
from strategies.gne import gne_step
from strategies.replies import ClientResult, cast_like

__all__ = ["GNE", "PMFL", "FedAU", "FedAvgM"]


def reply_arrays(
    arrays: ArrayRecord, keys: list[str], shapes: list[tuple[int, ...]]
) -> list[np.ndarray]:
    """A reply's ArrayRecord decoded as the global model's arrays, in the order of ``keys``
    (the global model's array names; ``shapes`` their shapes). ValueError saying why it
    cannot be aggregated with the global model: other array names, another shape, an array
    that does not decode as a numeric numpy array (only Flower's ``numpy.ndarray``
    serialisation is read, without unpickling), or NaN/Inf in a float array (a diverged
    client would turn every weighted sum into NaN)."""
    if list(arrays.keys()) != keys:
        raise ValueError(f"array names {list(arrays.keys())} differ from the global model's {keys}")
    out = []
    for key, shape in zip(keys, shapes, strict=True):
        try:
            arr = arrays[key].numpy()
        except Exception as err:  # another serialisation, pickled or truncated data
            raise ValueError(f"array {key!r} cannot be decoded: {err}") from err
        if arr.shape != shape or not np.issubdtype(arr.dtype, np.number):
            raise ValueError(
                f"array {key!r} has shape {arr.shape} dtype {arr.dtype}, expected {shape}"
            )
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            raise ValueError(f"array {key!r} holds NaN or Inf")
        out.append(arr)
    return out


def _check_count(name: str, value: Any, optional: bool = False) -> None:
    """ValueError unless ``value`` is an integer >= 1 (or None when ``optional``); bools are
    refused."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name}={value!r}: must be an integer >= 1" + (" or None" if optional else "")
        )


class _DeltaStrategy(FedAvg):
    """What the drop-in strategies share: the global model of the round (recorded by
    ``configure_train``), the valid replies as client models in node-id order, and the
    new global model as an ArrayRecord in the global model's dtypes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: the round's global model ``W`` as ``configure_train`` sent it: its array names
        #: and the arrays, decoded once a round (None before the first round)
        self.current: tuple[list[str], list[np.ndarray]] | None = None
        #: node id → the weight its model had in the last aggregation
        self.last_weights: dict[int, float] = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's sampling and messages; records ``arrays`` as the round's global model
        ``W`` (the deltas are taken against it), decoded once for the round."""
        keys = list(arrays.keys())
        self.current = keys, [arrays[k].numpy() for k in keys]
        return super().configure_train(server_round, arrays, config, grid)

    def _current(self) -> tuple[list[str], list[np.ndarray]]:
        """The global model's array names and arrays (AggregationError before any
        ``configure_train``)."""
        if self.current is None:
            raise AggregationError(
                f"{type(self).__name__}: no global model recorded; configure_train must run "
                "before aggregate_train (Strategy.start does this)"
            )
        return self.current

    def _results(
        self, replies: Iterable[Message]
    ) -> tuple[list[ClientResult], np.ndarray, list[RecordDict]]:
        """The aggregable replies: ``ClientResult``s (``pid`` = ``node_id`` = the Flower node
        id; ``arrays`` in the global model's key order), sorted by node id so that the float
        sums do not depend on the order replies arrive in; their ``weighted_by_key`` values
        (float64); and their contents (for the metrics). Error replies are logged and left
        out as by FedAvg (whose consistency check raises ``InconsistentMessageReplies`` for
        replies without one ArrayRecord and one MetricRecord with the weight key); a reply
        that :func:`reply_arrays` refuses, or whose weight is not a finite number >= 0, is
        left out with a warning."""
        valid, _ = self._check_and_log_replies(list(replies), is_train=True)
        keys, current = self._current()
        shapes = [a.shape for a in current]
        results, weights, contents = [], [], []
        for msg in sorted(valid, key=lambda m: m.metadata.src_node_id):
            node = int(msg.metadata.src_node_id)
            record = next(iter(msg.content.array_records.values()))
            metrics = next(iter(msg.content.metric_records.values()))
            # FedAvg's consistency check has refused a missing or list-valued weight
            weight = float(cast(float, metrics[self.weighted_by_key]))
            try:
                arrays = reply_arrays(record, keys, shapes)
                if not (np.isfinite(weight) and weight >= 0):
                    raise ValueError(f"{self.weighted_by_key} = {weight} is not a number >= 0")
            except ValueError as err:
                log(WARNING, "%s: reply from node %d left out: %s", type(self).__name__, node, err)
                continue
            # ClientResult is the project's record of a result; num_examples is informative
            # here (the aggregation reads ``weights``)
            results.append(ClientResult(node, node, arrays, int(weight), {}, {}, msg))
            weights.append(weight)
            contents.append(msg.content)
        return results, np.asarray(weights, dtype=np.float64), contents

    def _record(self, arrays: list[np.ndarray]) -> ArrayRecord:
        """The new global arrays as an ArrayRecord under the global model's names, each in
        the global model's dtype (:func:`strategies.replies.cast_like`)."""
        keys, current = self._current()
        return ArrayRecord(
            {k: Array(cast_like(a, g)) for k, a, g in zip(keys, arrays, current, strict=True)}
        )

    def _metrics(self, contents: list[RecordDict]) -> MetricRecord | None:
        """``train_metrics_aggr_fn`` over the aggregated replies (None without any)."""
        return self.train_metrics_aggr_fn(contents, self.weighted_by_key) if contents else None


class GNE(_DeltaStrategy):
    """FedRANE's server (GNE): Nash-bargaining weights over the client deltas.

    ``W ← W + η_g·Σ_k p_k Δ_k`` with ``Δ_k = w_k − W`` and ``p`` the normalised solution of
    ``Mp = 1/p`` for ``M = G/‖G‖_F + εI``, ``G_kl = Δ_kᵀΔ_l`` (FedRANE Eq. 10–14; see
    :func:`strategies.gne.gram_weights`). The solve starts from the replies'
    ``weighted_by_key`` weights ``n_k/Σn`` and falls back to them (logged) when the
    bargaining problem is degenerate; clients with a zero or negligible delta get weight 0.

    Parameters: ``server_lr`` (η_g > 0, default 1), ``eps`` (ε > 0 of ``M``, default 10⁻⁶),
    and every ``FedAvg`` keyword. After each round ``last_weights`` maps node id → ``p_k``
    and ``last_status`` is ``"nash"`` or ``"fallback: <reason>"``."""

    def __init__(self, *, server_lr: float = 1.0, eps: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not server_lr > 0:
            raise ValueError(f"server_lr={server_lr}: must be > 0")
        if not eps > 0:
            raise ValueError(f"eps={eps}: must be > 0")
        self.server_lr, self.eps = float(server_lr), float(eps)
        self.last_status: str | None = None

    def summary(self) -> None:
        """Log GNE's settings, then FedAvg's."""
        log(INFO, "\t├──> GNE settings: server_lr %s, eps %s", self.server_lr, self.eps)
        super().summary()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The GNE update of this round's global model (:func:`strategies.gne.gne_step`)
        from the valid replies, and their aggregated metrics; ``(None, None)`` without any
        (the global model is kept)."""
        results, weights, contents = self._results(replies)
        if not results:
            return None, None
        _, current = self._current()
        nodes = [r.node_id for r in results]
        step = gne_step(current, results, weights, self.server_lr, ids=nodes, eps=self.eps)
        self.last_weights = dict(zip(nodes, step.weights.tolist(), strict=True))
        self.last_status = step.status
        log(INFO, "GNE round %d: %s, weights %s", server_round, step.status, self.last_weights)
        return self._record(step.arrays), self._metrics(contents)


class FedAU(_DeltaStrategy):
    """FedAU (Wang & Ji 2023; PMFL Algorithm 2 without historical globals): participation-
    aware weights.

    ``W ← W + η_g·(1/K)·Σ_{k∈S_t} x_k Δ_k`` over the nodes ``S_t`` whose valid reply
    arrived, with ``x_k`` the running mean of node k's participation intervals, capped at
    ``cutoff`` rounds (an estimate of ``1/p_k``; :class:`strategies.fedau.ParticipationWeights`),
    so that under Flower's random sampling (``fraction_train < 1``), or nodes that come and
    go, the expected update is the mean update of all K nodes rather than a mean biased
    towards the nodes that take part most often. Sample counts are not used (FedAU weighs
    nodes, not samples).

    **Nodes** are Flower node ids: every id the grid lists at ``configure_train`` (and every
    sender of a reply) is known from then on, and its interval counter advances every round
    (Algorithm 2 lines 2–14), whether or not it was sampled. Node ids are mapped to dense
    indices (Flower's are unsigned 64-bit). K is ``num_nodes`` when given, else the number
    of node ids known so far. A SuperNode that restarts without an authentication key comes
    back with a new node id: a new node to FedAU (give ``num_nodes`` to keep K fixed).

    Parameters: ``cutoff`` (C ≥ 1, default 50), ``server_lr`` (η_g > 0, default 1),
    ``num_nodes`` (K, default None: the known nodes), ``interval_timing`` (``"after"``,
    default: the paper's order, a participant's weight includes the interval that ends
    with this participation; ``"before"``: IBM/fedau's code, the mean of the earlier
    intervals, 1 at a first participation), ``adaptive_weights`` (default True; False:
    ``x_k = K/|S_t|``, the participants' plain mean update), and every ``FedAvg`` keyword.
    After each round ``last_weights`` maps node id → ``x_k``. A round without a valid reply
    still counts for every known node."""

    def __init__(
        self,
        *,
        cutoff: int = 50,
        server_lr: float = 1.0,
        num_nodes: int | None = None,
        interval_timing: str = "after",
        adaptive_weights: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not server_lr > 0:
            raise ValueError(f"server_lr={server_lr}: must be > 0")
        _check_count("num_nodes", num_nodes, optional=True)
        check_interval_timing(interval_timing)
        self.participation = ParticipationWeights(cutoff)  # validates the cutoff
        self.server_lr, self.num_nodes = float(server_lr), num_nodes
        self.interval_timing, self.adaptive_weights = interval_timing, bool(adaptive_weights)
        #: Flower node id → its index in ``participation`` (in the order first seen)
        self.node_index: dict[int, int] = {}
        # PMFL's historical globals: H = 1 (none) for FedAU
        self.history_len, self.psi_start, self.history_init = 1, 0.0, True
        self.num_rounds: int | None = None
        self.history: list[list[np.ndarray]] = []
        self.last_psi = 0.0
        self._start_rounds: int | None = None
        self._warned_k = False

    def summary(self) -> None:
        """Log FedAU's settings, then FedAvg's."""
        log(
            INFO,
            "\t├──> %s settings: cutoff %d, server_lr %s, num_nodes %s, interval_timing %s, "
            "adaptive_weights %s",
            type(self).__name__,
            self.participation.cutoff,
            self.server_lr,
            self.num_nodes if self.num_nodes is not None else "known nodes",
            self.interval_timing,
            self.adaptive_weights,
        )
        super().summary()

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """``Strategy.start``; ``num_rounds`` is also ψ's horizon T (PMFL eq. 11) unless the
        constructor was given one."""
        self._start_rounds = num_rounds
        return super().start(
            grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn
        )

    def know(self, node_ids: Iterable[int]) -> None:
        """Add node ids to the known nodes (each gets the next dense index)."""
        for node in node_ids:
            self.node_index.setdefault(int(node), len(self.node_index))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's sampling and messages; every node the grid lists now becomes known."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.know(grid.get_node_ids())
        return messages

    def num_known(self) -> int:
        """K: ``num_nodes``, or the number of known node ids (at least 1)."""
        known = max(len(self.node_index), 1)
        if self.num_nodes is None:
            return known
        if known > self.num_nodes and not self._warned_k:
            log(
                WARNING,
                "%s: %d nodes known but num_nodes=%d: updates are scaled by 1/%d",
                type(self).__name__,
                known,
                self.num_nodes,
                self.num_nodes,
            )
            self._warned_k = True
        return self.num_nodes

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Count the round for every known node (:func:`strategies.fedau.participation_step`),
        then apply :func:`strategies.fedau.pmfl_step` with the participants' weights; returns
        the new global model and the aggregated metrics (None without valid replies: the
        model then stays, or, for PMFL with history, moves towards the historical
        globals)."""
        results, _, contents = self._results(replies)
        _, current = self._current()
        nodes = [r.node_id for r in results]
        self.know(nodes)
        k = self.num_known()
        x = participation_step(
            self.participation,
            [self.node_index[n] for n in nodes],
            self.node_index.values(),
            interval_timing=self.interval_timing,
            adaptive=self.adaptive_weights,
            num_known=k,
        )
        step = pmfl_step(
            current,
            [r.arrays for r in results],
            x,
            k,
            self.history,
            history_len=self.history_len,
            t=server_round - 1,
            num_rounds=self.num_rounds if self.num_rounds is not None else self._start_rounds,
            psi_start=self.psi_start,
            history_init=self.history_init,
            server_lr=self.server_lr,
        )
        self.history, self.last_psi = step.history, step.psi
        self.last_weights = dict(zip(nodes, x.tolist(), strict=True))
        log(
            INFO,
            "%s round %d: K=%d, weights %s%s",
            type(self).__name__,
            server_round,
            k,
            self.last_weights,
            f", psi {step.psi:.4g}" if self.history_len > 1 else "",
        )
        return self._record(step.arrays), self._metrics(contents)


class PMFL(FedAU):
    """PMFL's server (Algorithm 2 line 17 / eq. 10–11): FedAU's weights plus historical
    global models.

    ``W^{t+1} = (1−ψ_t)·(W^t + η_g·(1/K)·Σ_{k∈S_t} x_k Δ_k) + ψ_t/(H−1)·Σ_{h=1}^{H−1} W^{t−h}``
    with ``ψ_t = psi_start·(1 − t/(T−1))`` (t = round − 1; the paper's ``psi_start`` is 1/2)
    and the mean over the earlier globals that exist (ψ = 0 while there are none).

    Parameters: ``history`` (H ≥ 1 global models combined, default 3; 1 is FedAU),
    ``psi_start`` (ψ at the first round, in [0, 1], default 0.5), ``history_init`` (default
    True: W⁰, the initial model, may be a historical global as eq. 10 has it; False: only
    aggregated models), ``num_rounds`` (T of ψ's schedule; default None: the ``num_rounds``
    given to :meth:`start`), and every FedAU and ``FedAvg`` keyword. ``last_psi`` is the ψ
    of the last round."""

    def __init__(
        self,
        *,
        history: int = 3,
        psi_start: float = 0.5,
        history_init: bool = True,
        num_rounds: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_count("history", history)
        if not 0.0 <= psi_start <= 1.0:
            raise ValueError(f"psi_start={psi_start}: must be in [0, 1]")
        _check_count("num_rounds", num_rounds, optional=True)
        self.history_len, self.psi_start = history, float(psi_start)
        self.history_init, self.num_rounds = bool(history_init), num_rounds

    def summary(self) -> None:
        """Log PMFL's history settings, then FedAU's and FedAvg's."""
        log(
            INFO,
            "\t├──> PMFL history: H %d, psi_start %s, history_init %s, num_rounds %s",
            self.history_len,
            self.psi_start,
            self.history_init,
            self.num_rounds if self.num_rounds is not None else "start()'s",
        )
        super().summary()
