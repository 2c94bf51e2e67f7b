"""FedAU / PMFL server math: participation-aware weights and the historical-global update.

The functions and :class:`ParticipationWeights` above the "Flower strategies" line are pure
numpy (no Flower, no torch); the strategies below it are thin glue over them.
Sign convention (METHODS.md, reference-implementations §5): ``Δ_k = w_k − W`` (local minus
global) and the update *adds* ``η_g·(1/K)·Σ x_k Δ_k`` — the minus sign of PMFL Algorithm 2
line 17 / eq. (9) is a slip (taken literally it steps away from the client models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from flwr.serverapp.strategy import FedAvg

from core.params import Config, at_least, hyper, one_of, positive
from strategies.base import StrategyBase
from strategies.replies import ClientResult, cast_like


class ParticipationWeights:
    """Adaptive aggregation weights, PMFL Algorithm 2 lines 2–14 (FedAU's ω), keyed by
    partition id.

    Per node: ``Q`` rounds since its last participation or cutoff (the current interval),
    ``R`` number of recorded intervals (participations + cutoffs), ``x`` the running mean of
    the recorded intervals, an estimate of ``1/p_k``. One round (:meth:`update`), for every
    known node (lines 2–14)::

        Q += 1                                              # line 3
        if participated or Q == C:                          # line 4
            x = Q if R == 0 else (R·x + Q)/(R + 1)          # lines 5–9 (Q* = Q)
            R += 1; Q = 0                                   # line 11
        (else x unchanged)                                  # line 14

    **Weight timing (the paper's order).** Algorithm 2 computes ``x_k^t`` in lines 2–14 and
    uses that same ``x_k^t`` in line 17's aggregation, so the weight of a participant in
    round t already includes the interval that ends with this participation. Hence a node's
    first participation is weighted by its first interval ``Q*`` (rounds since the server
    first knew it, at most C), not 1. FedAU's code (reference-implementations §5) uses the
    weight *before* appending the new interval (ω = 1 at first participation); the project
    follows the paper, as METHODS.md's PMFL section specifies. Use :meth:`step` (update, then
    read the participants' weights) to get exactly the paper's order.

    ``x = 1`` for a node with no recorded interval yet (never participated nor hit the
    cutoff) and for an id never seen: FedAU's "unscaled" default; with the paper's order it
    is never the weight of a participant. The state is a pure deterministic function of the
    sequence of (participants, known) rounds. Nodes enter the table the first round they
    are in ``known`` (or among the participants, which are always treated as known) with
    ``Q = R = 0``; a node missing from ``known`` in a round is left untouched that round.

    Storage is numpy arrays aligned with a sorted id index, so a round costs
    O(#known · log #known) vectorised work (about a millisecond for 10,000 nodes).
    """

    def __init__(self, cutoff: int = 50) -> None:
        self.cutoff = self._check_cutoff(cutoff)
        self.ids = np.zeros(0, dtype=np.int64)  # sorted partition ids
        self.Q = np.zeros(0, dtype=np.int64)
        self.R = np.zeros(0, dtype=np.int64)
        self.x = np.zeros(0, dtype=np.float64)

    @staticmethod
    def _check_cutoff(cutoff: int) -> int:
        if isinstance(cutoff, bool) or not isinstance(cutoff, int | np.integer) or cutoff < 1:
            raise ValueError(f"cutoff C={cutoff!r}: must be an integer >= 1")
        return int(cutoff)

    @staticmethod
    def _as_ids(ids: Iterable[int]) -> np.ndarray:
        return np.asarray(list(ids), dtype=np.int64).reshape(-1)

    def _insert(self, ids: np.ndarray) -> None:
        """Add the ids not in the table yet (``Q = R = 0``, ``x = 1``), keeping it sorted."""
        new = np.setdiff1d(ids, self.ids, assume_unique=True)
        if len(new) == 0:
            return
        order = np.argsort(np.concatenate([self.ids, new]), kind="stable")
        zeros = np.zeros(len(new), dtype=np.int64)
        self.ids = np.concatenate([self.ids, new])[order]
        self.Q = np.concatenate([self.Q, zeros])[order]
        self.R = np.concatenate([self.R, zeros])[order]
        self.x = np.concatenate([self.x, np.ones(len(new))])[order]

    def _positions(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Table positions of ``ids`` and a mask of which ids are in the table."""
        if len(self.ids) == 0:
            return np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=bool)
        pos = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return pos, self.ids[pos] == ids

    def update(self, participants: Iterable[int], known: Iterable[int]) -> None:
        """Apply one round of Algorithm 2 (lines 2–14) to every node in
        ``known ∪ participants``; ``participants`` are the nodes with ``A_k^t = 1``."""
        part = np.unique(self._as_ids(participants))
        nodes = np.union1d(np.unique(self._as_ids(known)), part)
        self._insert(nodes)
        idx = np.searchsorted(self.ids, nodes)
        took_part = np.zeros(len(self.ids), dtype=bool)
        took_part[np.searchsorted(self.ids, part)] = True
        self.Q[idx] += 1  # line 3
        hit = idx[took_part[idx] | (self.Q[idx] == self.cutoff)]  # line 4
        q, r = self.Q[hit].astype(np.float64), self.R[hit].astype(np.float64)
        self.x[hit] = np.where(r == 0, q, (r * self.x[hit] + q) / (r + 1.0))  # lines 5–9
        self.R[hit] += 1  # line 11
        self.Q[hit] = 0

    def weights(self, ids: Iterable[int]) -> np.ndarray:
        """``x_k`` of ``ids`` in the given order (float64; 1 for an id not in the table)."""
        arr = self._as_ids(ids)
        pos, found = self._positions(arr)
        out = np.ones(len(arr))
        out[found] = self.x[pos[found]]
        return out

    def step(self, participants: Sequence[int], known: Iterable[int]) -> np.ndarray:
        """One round in the paper's order: :meth:`update`, then the participants' ``x_k^t``
        (aligned with ``participants``) for Algorithm 2 line 17."""
        self.update(participants, known)
        return self.weights(participants)

    def counters(self, ids: Iterable[int]) -> dict[str, np.ndarray]:
        """``Q``, ``R`` and ``x`` of ``ids`` (0, 0, 1 for an id not in the table)."""
        arr = self._as_ids(ids)
        pos, found = self._positions(arr)
        q, r = np.zeros(len(arr), dtype=np.int64), np.zeros(len(arr), dtype=np.int64)
        q[found], r[found] = self.Q[pos[found]], self.R[pos[found]]
        return {"Q": q, "R": r, "x": self.weights(arr)}

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable state (floats survive a JSON round trip exactly)."""
        return {
            "cutoff": self.cutoff,
            "ids": self.ids.tolist(),
            "Q": self.Q.tolist(),
            "R": self.R.tolist(),
            "x": self.x.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ids = np.asarray(state["ids"], dtype=np.int64).reshape(-1)
        cols = [np.asarray(state[k]).reshape(-1) for k in ("Q", "R", "x")]
        if any(len(c) != len(ids) for c in cols) or (np.diff(ids) <= 0).any():
            raise ValueError(
                "ParticipationWeights state: ids must be sorted, unique and as long as Q, R and x"
            )
        self.cutoff = self._check_cutoff(int(state["cutoff"]))
        self.ids = ids
        self.Q, self.R = cols[0].astype(np.int64), cols[1].astype(np.int64)
        self.x = cols[2].astype(np.float64)


def psi_schedule(t: int, T: int, start: float = 0.5) -> float:
    """PMFL's historical-global coefficient (eq. 11): ``ψ = 1/2 − t/(2(T−1))`` for the
    0-based round ``t`` of ``T``, clipped to [0, 1/2]; ``T = 1`` gives 0. So ψ falls linearly
    from 1/2 at t = 0 to 0 at t = T−1. ``start`` generalises the paper's 1/2 (``ψ =
    start·(1 − t/(T−1))``, clipped to [0, start]): 0.5 is the paper, 0 disables the mix."""
    if T < 1:
        raise ValueError(f"T={T}: the number of rounds must be >= 1")
    if not 0.0 <= start <= 1.0:
        raise ValueError(f"start={start}: ψ at the first round must be in [0, 1]")
    if T == 1:
        return 0.0
    return float(np.clip(start * (1.0 - t / (T - 1)), 0.0, start))


def _check_update_args(
    global_params: list[np.ndarray],
    deltas: list[list[np.ndarray]],
    x: np.ndarray,
    num_known: int,
    history: list[list[np.ndarray]],
    psi: float,
) -> np.ndarray:
    weights = np.asarray(x, dtype=np.float64).reshape(-1)
    if len(weights) != len(deltas):
        raise ValueError(f"x has {len(weights)} weights for {len(deltas)} deltas")
    if num_known < 1:
        raise ValueError(f"num_known={num_known}: K must be >= 1")
    if not 0.0 <= psi <= 1.0:
        raise ValueError(f"psi={psi}: must be in [0, 1]")
    shapes = [np.shape(g) for g in global_params]
    for name, models in (("delta", deltas), ("history model", history)):
        for j, model in enumerate(models):
            if [np.shape(a) for a in model] != shapes:
                raise ValueError(f"{name} {j} does not match the global model's array shapes")
    return weights


def pmfl_update(
    global_params: list[np.ndarray],
    deltas: list[list[np.ndarray]],
    x: np.ndarray,
    num_known: int,
    history: list[list[np.ndarray]],
    psi: float,
    eta: float = 1.0,
) -> list[np.ndarray]:
    """PMFL Algorithm 2 line 17 / eq. (10), sign corrected (METHODS.md):

    ``W^{t+1} = (1−ψ)·(W^t + η·(1/K)·Σ_k x_k Δ_k) + ψ/(H−1)·Σ_{h=1}^{H−1} W^{t−h}``

    ``global_params`` is ``W^t`` (a model = list of arrays), ``deltas[k] = w_k − W^t`` of the
    participants (non-participants add 0), ``x`` their weights, ``num_known`` = K, the
    number of nodes the server knows (FedAU's divisor N), and ``history`` the previous
    global models ``W^{t−1}, …`` that exist (at most H−1; the divisor is their count, so the
    mix is a convex combination). Empty ``history`` → ψ is treated as 0 (plain FedAU step).
    Works per array, accumulates in float64, and casts back to each array's dtype. With
    ``x_k = K·n_k/Σn``, ``η = 1`` and no history it is exactly FedAvg's weighted mean
    ``Σ n_k w_k / Σn``. No input is modified."""
    weights = _check_update_args(global_params, deltas, x, num_known, history, psi)
    coef = float(eta) * weights / float(num_known)
    mix = float(psi) if history else 0.0
    out = []
    for i, g in enumerate(global_params):
        w = np.array(g, dtype=np.float64)
        for c, delta in zip(coef, deltas, strict=True):
            w += c * np.asarray(delta[i], dtype=np.float64)
        if mix:
            past = sum(np.asarray(h[i], dtype=np.float64) for h in history) / len(history)
            w = (1.0 - mix) * w + mix * past
        out.append(cast_like(w, np.asarray(g)))
    return out


INTERVAL_TIMINGS = ("after", "before")


def check_interval_timing(value: str) -> str:
    """``value`` if it is one of :data:`INTERVAL_TIMINGS`, else ValueError naming them."""
    if value not in INTERVAL_TIMINGS:
        raise ValueError(f"interval_timing={value!r}: must be one of {INTERVAL_TIMINGS}")
    return value


def participation_step(
    table: ParticipationWeights,
    participants: Sequence[int],
    known: Iterable[int],
    *,
    interval_timing: str = "after",
    adaptive: bool = True,
    num_known: int | None = None,
) -> np.ndarray:
    """One round of PMFL Algorithm 2 lines 2–14 on ``table`` and the participants' weights
    ``x_k`` for line 17 (FedAU's ω_k), aligned with ``participants``.

    ``table`` is updated in place for every node of ``known ∪ participants``
    (:meth:`ParticipationWeights.update`); ``participants`` are the nodes whose update the
    server received this round (``A_k^t = 1``). The weight read depends on
    ``interval_timing``: ``"after"`` (the paper's order: ``x^t``, which includes the
    interval that ends now, so a first participation weighs its first interval) or
    ``"before"`` (IBM/fedau main.py:156-171: ``x^{t−1}``, the mean of the earlier intervals,
    1 at a first participation). With ``adaptive=False`` (the "w/o AWC" ablation) the table
    is still updated but every participant gets ``K/|S_t|`` (K = ``num_known``, default the
    number of ``known`` ids), so that PMFL's ``(1/K)·Σ x_k Δ_k`` is the participants' plain
    mean update. ValueError for an unknown ``interval_timing``."""
    check_interval_timing(interval_timing)
    ids, known = list(participants), list(known)
    # x^{t-1}, the intervals recorded so far, is read before this round's are recorded
    before = table.weights(ids) if adaptive and interval_timing == "before" else None
    table.update(ids, known)  # Algorithm 2: x^t includes this round's interval
    if adaptive:
        return before if before is not None else table.weights(ids)
    k = len(known) if num_known is None else num_known
    return np.full(len(ids), k / max(len(ids), 1))


class PMFLStep(NamedTuple):
    """What one PMFL/FedAU aggregation (:func:`pmfl_step`) produced."""

    arrays: list[np.ndarray]  # W^{t+1}
    psi: float  # the ψ that was applied (0 without historical globals)
    history: list[list[np.ndarray]]  # the historical globals for the next round


def pmfl_step(
    current: list[np.ndarray],
    client_arrays: Sequence[list[np.ndarray]],
    x: np.ndarray,
    num_known: int,
    history: list[list[np.ndarray]],
    *,
    history_len: int,
    t: int,
    num_rounds: int | None,
    psi_start: float = 0.5,
    history_init: bool = True,
    server_lr: float = 1.0,
) -> PMFLStep:
    """One server round of PMFL (Algorithm 2 line 17 / eq. 10–11); FedAU with
    ``history_len = 1``.

    ``current`` is ``W^t`` of the 0-based round ``t`` of ``num_rounds`` (T), ``client_arrays``
    the participants' models ``w_k`` (``Δ_k = w_k − W^t`` in the arrays' dtype), ``x``
    their weights (:func:`participation_step`), ``num_known`` K, ``history`` the earlier
    globals oldest first (as this function returned them last round; ``[]`` at the start)
    and ``history_len`` H. The update is :func:`pmfl_update` with the last ``H − 1`` entries
    of ``history`` and ``ψ = psi_schedule(t, T, psi_start)`` (eq. 11), ψ = 0 when there are
    none. The returned history has ``W^t`` appended (at most H−1 kept) when ``H > 1``,
    unless ``t = 0`` and ``history_init`` is false (W⁰, the initialisation, is then never
    mixed in). ``num_rounds`` may be None only while no history is mixed (FedAU).
    No input is modified."""
    past = history[-(history_len - 1) :] if history_len > 1 else []
    if past and num_rounds is None:
        raise ValueError("num_rounds is needed for ψ's schedule (eq. 11)")
    psi = psi_schedule(t, num_rounds, psi_start) if past and num_rounds is not None else 0.0
    deltas = [[a - g for a, g in zip(arrays, current, strict=True)] for arrays in client_arrays]
    new = pmfl_update(current, deltas, x, num_known, past, psi, server_lr)
    # W^t joins the history for the next rounds, unless it is W⁰ (t = 0) and the
    # history holds aggregated models only
    if history_len > 1 and (history_init or t > 0):
        history = [*history, [a.copy() for a in current]][-(history_len - 1) :]
    return PMFLStep(new, psi, history)


# --------------------------------------------------------------------- Flower strategies
@dataclasses.dataclass(frozen=True)
class PMFLServerParams:
    cutoff: int = at_least(1, default=50)  # C of Algorithm 2
    # H: global models combined (1: no historical globals)
    history: int = at_least(1, default=3)
    server_lr: float = positive(1.0)  # η_g
    adaptive_weights: bool = True  # False: x_k = K/|S_t| (the "w/o AWC" ablation)
    # ψ at the first round, falling linearly to 0 (paper: 1/2; 0: no historical globals)
    psi_start: float = hyper(0.5, "0 <= x <= 1", lambda v: 0 <= v <= 1)
    # whether the historical globals may include W⁰, the initial model: true is eq. (10) as
    # written (at t = 1 the one earlier global is W⁰); false keeps only models produced by
    # aggregation (W¹, W², …), so ψ = 0 at t = 0 and t = 1 (W¹ is then the current model)
    history_init: bool = True
    # when a participant's x_k is read: "after" this round's interval is recorded (PMFL
    # Algorithm 2: x^t includes the interval that ends now, so a first participation weighs
    # its first interval) or "before" it (IBM/fedau main.py:156-171: the mean of the earlier
    # intervals, 1 at a node's first participation; used by the parity run)
    interval_timing: str = one_of(*INTERVAL_TIMINGS)


class PMFLStrategy(StrategyBase, FedAvg):
    """PMFL's server: FedAU adaptive weights over all known nodes and historical globals.

    ``W ← (1−ψ)·(W + η_g·(1/K)·Σ_{k∈S_t} x_k Δ_k) + ψ/(H−1)·Σ_{h=1}^{H−1} W^{t−h}`` with
    ``ψ = 1/2 − t/(2(T−1))`` (t 0-based; ``psi_start`` replaces the 1/2), K the number of
    nodes the server knows and ``x_k`` from :class:`ParticipationWeights` (paper Algorithm
    2). With ``history: 1`` this is FedAU. Works with any client.

    **The history.** Round ``server_round`` is the paper's ``t = server_round − 1``: it
    starts from ``W^t`` (``self.current``; ``W⁰`` is the initial model) and returns
    ``W^{t+1}``. ``self.history`` then holds the globals before ``W^t``, oldest first, at
    most H−1 of them: ``W^{t−H+1}, …, W^{t−1}`` (eq. 10's ``W^{t−h}``, h = 1..H−1, never
    ``W^t`` itself), the ones with ``t − h ≥ 0``; the mix divides by how many there are, so it
    stays a convex combination, and with none ψ is 0. With H = 3: t = 0 mixes nothing, t = 1
    mixes ``W⁰``, t = 2 ``W⁰, W¹``, t = 3 ``W¹, W²``. ``history_init: false`` leaves
    ``W⁰`` out (it was never aggregated: the random initialisation), so t = 1 mixes
    nothing, t = 2 ``W¹``, and from t = 3 on both mix the same rounds ``W^{t−2}, W^{t−1}``
    (of different values: the trajectories part at t = 1). The history entries are the
    globals as sent to the clients (after their own mix), as eq. (10) uses them."""

    Params = PMFLServerParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.weights = ParticipationWeights(cutoff=self.hp.cutoff)
        self.history: list[list[np.ndarray]] = []

    @classmethod
    def fixed_on_resume(cls, cfg: Config) -> frozenset[str]:
        """ψ runs from ``psi_start`` to 0 over ``num_rounds``: resuming with another
        ``num_rounds`` would give the remaining rounds another schedule."""
        return frozenset({"num_rounds"}) if cfg["server"]["history"] > 1 else frozenset()

    def aggregate(self, server_round: int, results: list[ClientResult]) -> list[np.ndarray]:
        pids = [r.pid for r in results]
        known = self.nodes.known_pids()
        x = participation_step(
            self.weights,
            pids,
            known,
            interval_timing=self.hp.interval_timing,
            adaptive=self.hp.adaptive_weights,
        )
        step = pmfl_step(
            self.current,
            [r.arrays for r in results],
            x,
            len(known),
            self.history,
            history_len=self.hp.history,
            t=server_round - 1,
            num_rounds=self.cfg["num_rounds"],
            psi_start=self.hp.psi_start,
            history_init=self.hp.history_init,
            server_lr=self.hp.server_lr,
        )
        new, psi, self.history = step
        weights = zip(pids, x, strict=True)
        self.record["aggregation_weights"] = {str(p): float(w) for p, w in weights}
        self.record["psi"] = psi
        return new

    def aggregate_empty(self, server_round: int) -> list[np.ndarray]:
        """A round without participants still counts for every known node (Algorithm 2:
        ``Q_k += 1``, the cutoff may fire) and, with history, moves the model towards the
        historical globals (eq. 10 with no updates)."""
        return self.aggregate(server_round, [])

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "weights": self.weights.state_dict(),
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.weights.load_state_dict(state["weights"])
        self.history = [[np.asarray(a) for a in model] for model in state.get("history", [])]


@dataclasses.dataclass(frozen=True)
class FedAUServerParams(PMFLServerParams):
    # FedAU is PMFL's server without historical globals (ψ unused)
    history: int = at_least(1, default=1)


class FedAUStrategy(PMFLStrategy):
    """FedAU (Wang & Ji): PMFL's server with adaptive weights only (no historical globals)."""

    Params = FedAUServerParams
