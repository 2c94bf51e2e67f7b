"""FedAU / PMFL server math: participation-aware weights and the historical-global update.

Pure numpy; the Flower strategies at the bottom of this module are thin glue over it.
Sign convention (METHODS.md): ``Δ_k = w_k − W`` (local minus global) and the update adds
``η_g·Σ x_k Δ_k`` — the paper's minus sign in Algorithm 2 line 17 is a slip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.serverapp.strategy import FedAvg

from strategies.base import ClientResult, StrategyBase


class ParticipationWeights:
    """PMFL Algorithm 2 (lines 2–14), FedAU's adaptive weights, keyed by partition id.

    Per node: ``Q`` rounds since its last participation (or cutoff), ``R`` number of
    recorded intervals, ``x`` the running mean of those intervals (an estimate of ``1/p_k``).
    Each round, for every known node: ``Q += 1``; if it participated or ``Q == C``:
    ``x = Q`` when ``R == 0`` else ``(R·x + Q)/(R+1)``; ``R += 1``; ``Q = 0``.
    As in the paper, the weight used in round t is ``x^t``, i.e. *after* this round's update
    (so a node's first participation gets ``x = Q*``, its first interval). Vectorised over
    nodes: one round costs O(#known nodes).
    """

    def __init__(self, cutoff: int = 50) -> None:
        if cutoff < 1:
            raise ValueError(f"cutoff C={cutoff}: must be >= 1")
        self.cutoff = cutoff
        self.ids = np.zeros(0, dtype=np.int64)
        self.Q = np.zeros(0, dtype=np.int64)
        self.R = np.zeros(0, dtype=np.int64)
        self.x = np.zeros(0, dtype=np.float64)

    def _ensure(self, known: np.ndarray) -> None:
        new = np.setdiff1d(known, self.ids)
        if len(new):
            ids = np.concatenate([self.ids, new])
            order = np.argsort(ids)
            pad = np.zeros(len(new), dtype=np.int64)
            self.ids = ids[order]
            self.Q = np.concatenate([self.Q, pad])[order]
            self.R = np.concatenate([self.R, pad])[order]
            self.x = np.concatenate([self.x, np.ones(len(new))])[order]

    def update(self, participants: Iterable[int], known: Iterable[int]) -> None:
        """Apply one round of Algorithm 2 to every known node."""
        known_arr = np.unique(np.fromiter(known, dtype=np.int64))
        part = np.fromiter(participants, dtype=np.int64)
        self._ensure(np.union1d(known_arr, part))
        idx = np.searchsorted(self.ids, known_arr)
        self.Q[idx] += 1
        took_part = np.isin(known_arr, part)
        hit = took_part | (self.Q[idx] == self.cutoff)
        h = idx[hit]
        q = self.Q[h].astype(np.float64)
        r = self.R[h].astype(np.float64)
        self.x[h] = np.where(r == 0, q, (r * self.x[h] + q) / (r + 1))
        self.R[h] += 1
        self.Q[h] = 0

    def weights(self, ids: Iterable[int]) -> np.ndarray:
        """``x_k`` of the given nodes (1 for a node never seen)."""
        ids_arr = np.fromiter(ids, dtype=np.int64)
        pos = np.searchsorted(self.ids, ids_arr)
        found = (pos < len(self.ids)) & (
            self.ids[np.minimum(pos, len(self.ids) - 1)] == ids_arr if len(self.ids) else False
        )
        out = np.ones(len(ids_arr))
        if len(self.ids):
            out[found] = self.x[pos[found]]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "cutoff": self.cutoff,
            "ids": self.ids.tolist(),
            "Q": self.Q.tolist(),
            "R": self.R.tolist(),
            "x": self.x.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cutoff = int(state["cutoff"])
        self.ids = np.asarray(state["ids"], dtype=np.int64)
        self.Q = np.asarray(state["Q"], dtype=np.int64)
        self.R = np.asarray(state["R"], dtype=np.int64)
        self.x = np.asarray(state["x"], dtype=np.float64)


def psi_schedule(t: int, T: int) -> float:
    """PMFL's historical-global weight ``ψ = 1/2 − t/(2(T−1))`` for 0-based round t of T,
    clipped to [0, 1/2] (``T = 1`` → 0)."""
    if T <= 1:
        return 0.0
    return float(np.clip(0.5 - t / (2.0 * (T - 1)), 0.0, 0.5))


def pmfl_update(
    global_params: list[np.ndarray],
    deltas: list[list[np.ndarray]],
    x: np.ndarray,
    num_known: int,
    history: list[list[np.ndarray]],
    psi: float,
    eta: float = 1.0,
) -> list[np.ndarray]:
    """PMFL Algorithm 2 line 17 (sign corrected):
    ``W ← (1−ψ)·(W + η·(1/K)·Σ_k x_k Δ_k) + ψ/(H−1)·Σ_h W^{t−h}``, with ``history`` the
    ``H−1`` previous global models that exist (empty → ψ treated as 0). Accumulates in
    float64 and casts back to each array's dtype. With ``x_k = K·n_k/Σn`` and no history
    this is exactly FedAvg's weighted mean."""
    if num_known < 1:
        raise ValueError("num_known must be >= 1")
    psi = psi if history else 0.0
    out = []
    for i, g in enumerate(global_params):
        step = sum(float(xk) * d[i].astype(np.float64) for xk, d in zip(x, deltas, strict=True))
        w = g.astype(np.float64) + eta * step / num_known
        if psi:
            hist = sum(h[i].astype(np.float64) for h in history) / len(history)
            w = (1.0 - psi) * w + psi * hist
        out.append(w.astype(g.dtype))
    return out


# --------------------------------------------------------------------- Flower strategies
@dataclasses.dataclass(frozen=True)
class PMFLServerParams:
    cutoff: int = 50  # C of Algorithm 2
    history: int = 3  # H: global models combined (H <= 1: no historical globals)
    server_lr: float = 1.0  # η_g
    adaptive_weights: bool = True  # False: x_k = K/|S_t| (the "w/o AWC" ablation)


class PMFLStrategy(StrategyBase, FedAvg):
    """PMFL's server: FedAU adaptive weights over all known nodes and historical globals.

    ``W ← (1−ψ)·(W + η_g·(1/K)·Σ_{k∈S_t} x_k Δ_k) + ψ/(H−1)·Σ_{h=1}^{H−1} W^{t−h}`` with
    ``ψ = 1/2 − t/(2(T−1))`` (t 0-based), K the number of nodes the server knows and ``x_k``
    from :class:`ParticipationWeights` (paper Algorithm 2). With ``history: 1`` this is
    FedAU. Works with any client."""

    Params = PMFLServerParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.weights = ParticipationWeights(cutoff=self.hp.cutoff)
        self.history: list[list[np.ndarray]] = []

    def aggregate(self, server_round: int, results: list[ClientResult]) -> list[np.ndarray]:
        pids = [r.pid for r in results]
        known = self.nodes.known_pids()
        self.weights.update(pids, known)  # Algorithm 2: x^t includes this round's interval
        if self.hp.adaptive_weights:
            x = self.weights.weights(pids)
        else:  # uniform weights normalised over the participants: their plain mean update
            x = np.full(len(pids), len(known) / len(pids))
        past = self.history[-(self.hp.history - 1) :] if self.hp.history > 1 else []
        psi = psi_schedule(server_round - 1, self.cfg["num_rounds"]) if past else 0.0
        deltas = [[a - g for a, g in zip(r.arrays, self.current, strict=True)] for r in results]
        new = pmfl_update(self.current, deltas, x, len(known), past, psi, self.hp.server_lr)
        if self.hp.history > 1:
            self.history = [*self.history, [a.copy() for a in self.current]][
                -(self.hp.history - 1) :
            ]
        weights = zip(pids, x, strict=True)
        self.record["aggregation_weights"] = {str(p): float(w) for p, w in weights}
        self.record["psi"] = psi
        return new

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights.state_dict(), "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights.load_state_dict(state["weights"])
        self.history = [[np.asarray(a) for a in model] for model in state.get("history", [])]


@dataclasses.dataclass(frozen=True)
class FedAUServerParams:
    cutoff: int = 50
    server_lr: float = 1.0
    history: int = 1
    adaptive_weights: bool = True


class FedAUStrategy(PMFLStrategy):
    """FedAU (Wang & Ji): PMFL's server with adaptive weights only (no historical globals)."""

    Params = FedAUServerParams
