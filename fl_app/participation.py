"""Who takes part in each round of a simulation (clients are partition ids 0..K−1).

``uniform`` and ``all`` are the usual FL sampling; ``bernoulli``, ``markov`` and ``cyclic``
are PMFL §V-B's heterogeneous participation patterns with per-node probabilities
``p_k = max(⟨Z, D_k⟩/r, floor)`` (see :func:`participation_probabilities`).
Every model is seeded, and ``state_dict``/``load_state_dict`` (plain JSON-friendly dicts with
the RNG state) let a resumed run continue the identical sequence. In deployment the real
connected nodes are the candidates (``available``). A pattern may select nobody in a round:
``select`` then returns an empty list and the server skips training for that round.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np


def participation_probabilities(
    label_counts: np.ndarray, beta: float, mean: float, floor: float, rng: np.random.Generator
) -> np.ndarray:
    """PMFL §V-B: ``Z ~ Dir(β)`` over classes, ``D_k`` node k's label distribution,
    ``p_k = min(1, max(⟨Z, D_k⟩/r, floor))`` with ``r`` found by bisection so that
    ``mean(p) = mean``. Raises ValueError naming a bad argument."""
    counts = np.asarray(label_counts, dtype=np.float64)
    if beta <= 0:
        raise ValueError(f"participation beta={beta}: must be > 0")
    if not 0 < mean <= 1:
        raise ValueError(f"participation mean={mean}: must be in (0, 1]")
    if not 0 <= floor <= mean:
        raise ValueError(f"participation floor={floor}: must be in [0, mean={mean}]")
    if counts.ndim != 2 or (counts.sum(axis=1) <= 0).any():
        raise ValueError("label_counts must be (nodes, classes) with a positive row per node")
    dist = counts / counts.sum(axis=1, keepdims=True)
    z = rng.dirichlet(np.full(counts.shape[1], beta))
    score = dist @ z
    if mean >= 1:
        return np.ones(len(score))

    def probs(r: float) -> np.ndarray:
        return np.clip(np.maximum(score / r, floor), 0.0, 1.0)

    lo, hi = 1e-12, max(float(score.max()), 1e-12) / max(floor, 1e-12) * 10 + 1.0
    for _ in range(200):  # mean(probs(r)) decreases in r
        mid = 0.5 * (lo + hi)
        if probs(mid).mean() > mean:
            lo = mid
        else:
            hi = mid
    return probs(0.5 * (lo + hi))


class ParticipationModel(abc.ABC):
    """Chooses the participating partition ids of each round (1-based rounds)."""

    @abc.abstractmethod
    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        """Sorted partition ids taking part in ``server_round``, a subset of ``available``."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (stateless default)
        """Restore what :meth:`state_dict` returned."""


class _Seeded(ParticipationModel):
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


class AllParticipation(ParticipationModel):
    """Every available client, every round."""

    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        return sorted(available)


class UniformParticipation(_Seeded):
    """``max(min_clients, round(fraction·|available|))`` clients drawn without replacement."""

    def __init__(self, fraction: float, min_clients: int, seed: int) -> None:
        super().__init__(seed)
        self.fraction, self.min_clients = fraction, min_clients

    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        pool = sorted(available)
        n = min(len(pool), max(self.min_clients, round(self.fraction * len(pool))))
        return sorted(int(i) for i in self.rng.choice(pool, size=n, replace=False)) if n else []


class BernoulliParticipation(_Seeded):
    """Node k takes part independently with probability ``p_k`` each round."""

    def __init__(self, p: np.ndarray, seed: int) -> None:
        super().__init__(seed)
        self.p = np.asarray(p, dtype=np.float64)

    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        active = self.rng.random(len(self.p)) < self.p
        return sorted(int(k) for k in available if active[k])


class MarkovParticipation(_Seeded):
    """Two-state Markov chain per node with ``P(off→on) = p01`` and
    ``P(on→off) = p10 = p01·(1−p_k)/p_k``, whose stationary rate is ``p_k`` (the paper's
    ``(1−p_k)·p01`` does not keep ``p_k``). Valid while ``p10 ≤ 1``, i.e.
    ``p_k ≥ p01/(1+p01)``; below that ``p10`` is clipped to 1 and the rate becomes
    ``p01/(1+p01)`` (a documented limit). States start from the stationary distribution."""

    def __init__(self, p: np.ndarray, p01: float, seed: int) -> None:
        super().__init__(seed)
        self.p = np.asarray(p, dtype=np.float64)
        self.p01 = p01
        with np.errstate(divide="ignore"):
            self.p10 = np.clip(p01 * (1 - self.p) / self.p, 0.0, 1.0)
        self.on = self.rng.random(len(self.p)) < self.p
        self.started = False

    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        if self.started:
            u = self.rng.random(len(self.p))
            self.on = np.where(self.on, u >= self.p10, u < self.p01)
        self.started = True
        return sorted(int(k) for k in available if self.on[k])

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "on": self.on.tolist(), "started": self.started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.on = np.asarray(state["on"], dtype=bool)
        self.started = bool(state["started"])


class CyclicParticipation(_Seeded):
    """Node k is active while ``(t − o_k) mod period < p_k·period`` (random offset ``o_k``)."""

    def __init__(self, p: np.ndarray, period: int, seed: int) -> None:
        super().__init__(seed)
        self.p = np.asarray(p, dtype=np.float64)
        self.period = period
        self.offset = self.rng.integers(0, period, size=len(self.p))

    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        phase = (server_round - self.offset) % self.period
        active = phase < self.p * self.period
        return sorted(int(k) for k in available if active[k])


PATTERNS = ("all", "uniform", "bernoulli", "markov", "cyclic")


def build_participation(
    name: str,
    *,
    num_clients: int,
    label_counts: np.ndarray,
    seed: int,
    fraction: float,
    min_clients: int,
    beta: float,
    mean: float,
    floor: float,
    p01: float,
    period: int,
) -> ParticipationModel:
    """The participation model named ``name`` (one of :data:`PATTERNS`)."""
    if name == "all":
        return AllParticipation()
    if name == "uniform":
        return UniformParticipation(fraction, min_clients, seed)
    if name not in PATTERNS:
        raise ValueError(f"unknown participation {name!r}; choose one of {', '.join(PATTERNS)}")
    rng = np.random.default_rng(seed + 7_777)
    p = participation_probabilities(label_counts, beta, mean, floor, rng)
    if len(p) != num_clients:
        raise ValueError(f"label_counts has {len(p)} rows for {num_clients} clients")
    if name == "bernoulli":
        return BernoulliParticipation(p, seed)
    if name == "markov":
        return MarkovParticipation(p, p01, seed)
    return CyclicParticipation(p, period, seed)
