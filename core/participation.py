"""Who takes part in each round of a simulation (clients are partition ids 0..K−1).

``uniform`` (Flower-style fraction sampling) and ``all`` are the usual FL sampling;
``bernoulli``, ``markov`` and ``cyclic`` are PMFL §V-B's heterogeneous participation patterns
with per-node probabilities ``p_k = max(⟨Z, D_k⟩/r, floor)``
(see :func:`participation_probabilities`). In deployment the real connected nodes are the
candidates: ``select`` only ever returns a subset of ``available``.

Contract shared by every model (:class:`ParticipationModel`):

- ``select(server_round, available)`` takes the 1-based round and the candidate partition ids
  and returns the participants as a sorted list of ``int``, a subset of ``available``.
- **Nobody selected.** A pattern may select nobody in a round (all nodes off). ``select``
  then returns ``[]`` and the caller skips training for that round (no aggregation, the
  global model is unchanged); the round still counts for the pattern's clock.
- **Reproducibility.** The random draws of round t come from a generator seeded by
  ``(seed, pattern tag, t)`` (:func:`_round_rng`: independent of the data partition's
  ``default_rng(seed)``), so the selection of round t is a pure function of the seed,
  the model's parameters, t and ``available``: the same seed gives the same sequence, asking
  for the same round twice gives the same answer, and a node's draw does not depend on which
  other nodes are available. The Markov chain is advanced round by round from round 1
  (cached, so sequential calls cost one step each).
- ``state_dict``/``load_state_dict`` are plain JSON-serialisable dicts holding everything
  needed to continue the identical sequence: the seed (which, with the round number, *is*
  the RNG state of the counter-based scheme above), the per-node probabilities (they depend
  on the label counts of the nodes connected at start, which may differ on resume), the
  cyclic offsets and the Markov chain's current round and states.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

PATTERNS = ("uniform", "all", "bernoulli", "markov", "cyclic")

# Stream tags: each use of the seed draws from its own independent stream.
_TAG_PROBABILITIES, _TAG_UNIFORM, _TAG_BERNOULLI, _TAG_MARKOV, _TAG_CYCLIC = range(5)


# ------------------------------------------------------------------ PMFL §V-B probabilities
def _label_distributions(label_counts: np.ndarray) -> np.ndarray:
    """Rows of ``label_counts`` normalised to sum 1 (``D_k``); ValueError on bad input."""
    counts = np.asarray(label_counts, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[0] < 1 or counts.shape[1] < 1:
        raise ValueError(
            f"label_counts has shape {counts.shape}: must be (nodes >= 1, classes >= 1)"
        )
    if not np.isfinite(counts).all() or (counts < 0).any():
        raise ValueError("label_counts: every count must be finite and >= 0")
    totals = counts.sum(axis=1)
    empty = np.flatnonzero(totals <= 0)
    if len(empty):
        raise ValueError(
            f"label_counts: rows {empty[:10].tolist()} are all zero; every node needs at "
            "least one labelled sample to have a label distribution"
        )
    return counts / totals[:, None]


def _check_probability_args(beta: float, mean: float, floor: float) -> None:
    if not beta > 0:
        raise ValueError(f"beta={beta}: the Dirichlet concentration must be > 0")
    if not 0 < mean <= 1:
        raise ValueError(f"mean={mean}: the target mean probability must be in (0, 1]")
    if not 0 <= floor <= mean:
        raise ValueError(f"floor={floor}: the minimum probability must be in [0, mean={mean}]")


def _solve_scale(score: np.ndarray, mean: float, floor: float) -> np.ndarray:
    """``p(r) = min(1, max(score/r, floor))`` with ``mean(p(r)) = mean``, by bisection on
    ``log r`` (``mean(p(r))`` is continuous and non-increasing in r)."""

    def probs(r: float) -> np.ndarray:
        return np.minimum(np.maximum(score / r, floor), 1.0)

    positive = score[score > 0]
    if len(positive) == 0:  # ⟨Z, D_k⟩ = 0 for every node: nothing to scale
        best = np.full(len(score), float(floor))
    else:
        lo = float(positive.min()) / 2.0  # every positive score gives p = 1
        hi = 2.0 * float(score.max()) / (floor if floor > 0 else mean)  # p(hi) mean <= mean
        for _ in range(200):
            mid = float(np.sqrt(lo * hi))
            if probs(mid).mean() > mean:
                lo = mid
            else:
                hi = mid
        best = probs(hi)
    if abs(best.mean() - mean) > 1e-9:
        raise ValueError(
            f"mean={mean} is unattainable: {int((score <= 0).sum())} of {len(score)} nodes "
            f"have ⟨Z, D_k⟩ = 0 and stay at floor={floor}; the largest reachable mean is "
            f"{probs(float(positive.min()) / 2.0).mean() if len(positive) else floor:.6g}"
        )
    return best


def participation_probabilities(
    label_counts: np.ndarray, beta: float, mean: float, floor: float, rng: np.random.Generator
) -> np.ndarray:
    """Per-node participation probabilities, PMFL §V-B eq. (12).

    ``Z ~ Dir(β·1)`` over the classes (one draw from ``rng``), ``D_k`` = row k of
    ``label_counts`` normalised, and ``p_k = min(1, max(⟨Z, D_k⟩/r, floor))`` with the
    normaliser ``r`` found by bisection so that ``mean(p) = mean`` (to 1e-9). The paper's
    values are β = 0.1, mean = 0.1, floor = 0.02; the cap at 1 is the project's (a
    probability). ``mean = 1`` gives every node ``p = 1``.

    Raises ValueError naming the argument for ``beta <= 0``, ``mean`` outside (0, 1],
    ``floor`` outside [0, mean], a ``label_counts`` that is not a 2-D array of finite
    non-negative counts with a positive row per node, or a ``mean`` that cannot be reached
    (too many nodes with ``⟨Z, D_k⟩ = 0``).
    """
    _check_probability_args(beta, mean, floor)
    dist = _label_distributions(label_counts)
    z = np.asarray(rng.dirichlet(np.full(dist.shape[1], float(beta))), dtype=np.float64)
    if mean >= 1:
        return np.ones(dist.shape[0])
    return _solve_scale(dist @ z, float(mean), float(floor))


# ----------------------------------------------------------------------------- helpers
def _round_rng(seed: int, tag: int, server_round: int) -> np.random.Generator:
    """The generator of one (seed, stream, round): the counter-based RNG of this module.

    The stream and round go into the seed sequence's ``spawn_key``, not its entropy: numpy
    pads entropy with zeros, so ``default_rng([seed, 0, 0])`` would be ``default_rng(seed)``,
    the generator of the data partition, and the PMFL vector ``Z`` would repeat the first
    class's Dirichlet split over the nodes. Spawned, every stream differs from
    ``default_rng(seed)``: ``Z`` is independent of the ``D_k`` it weighs, as PMFL's model
    assumes."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(tag, server_round)))


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be an integer >= 0")
    return int(seed)


def _check_round(server_round: int) -> int:
    if isinstance(server_round, bool) or not isinstance(server_round, int | np.integer):
        raise ValueError(f"server_round={server_round!r}: must be an integer >= 1")
    if server_round < 1:
        raise ValueError(f"server_round={server_round}: rounds are 1-based (>= 1)")
    return int(server_round)


def _candidates(available: Sequence[int], num_clients: int | None) -> np.ndarray:
    """``available`` as a sorted unique int64 array, checked against ``[0, num_clients)``."""
    ids = np.unique(np.asarray(list(available), dtype=np.int64))
    if len(ids) and (ids[0] < 0 or (num_clients is not None and ids[-1] >= num_clients)):
        raise ValueError(
            f"available partition ids must lie in [0, {num_clients}); got "
            f"{ids[0] if ids[0] < 0 else ids[-1]}"
        )
    return ids


def _check_probabilities(p: np.ndarray | Sequence[float]) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or len(arr) < 1:
        raise ValueError(f"p has shape {arr.shape}: must be one probability per node (1-D)")
    if not np.isfinite(arr).all() or (arr < 0).any() or (arr > 1).any():
        raise ValueError("p: every per-node probability must be in [0, 1]")
    return arr


# ------------------------------------------------------------------------------ models
class ParticipationModel(abc.ABC):
    """Chooses the participating partition ids of each round (see the module docstring)."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        """Sorted partition ids taking part in 1-based ``server_round``, a subset of
        ``available``; ``[]`` when nobody does (the caller then skips the round)."""

    def description(self) -> dict[str, Any]:
        """What a run's ``participation.json`` records: the pattern (``kind``) and, for the
        PMFL §V-B patterns, each node's participation probability ``p`` (index = partition
        id), the truth that FedAU's and PMFL's interval estimates approach."""
        return {"kind": self.kind}

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state that lets :meth:`load_state_dict` continue the sequence."""
        return {"kind": self.kind, **self._state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (ValueError for another model's state)."""
        if state.get("kind") != self.kind:
            raise ValueError(
                f"participation state of kind {state.get('kind')!r} cannot be loaded into "
                f"{self.kind!r}"
            )
        self._load(state)

    def _state(self) -> dict[str, Any]:
        return {}

    def _load(self, state: dict[str, Any]) -> None:
        return None


class AllParticipation(ParticipationModel):
    """Every available client, every round (stateless)."""

    kind = "all"

    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        _check_round(server_round)
        return _candidates(available, None).tolist()


class UniformParticipation(ParticipationModel):
    """``n = min(|available|, max(min_clients, round(fraction·|available|)))`` clients drawn
    uniformly without replacement from ``available`` (Python's ``round``, half to even)."""

    kind = "uniform"

    def __init__(self, num_clients: int, fraction: float, min_clients: int, seed: int) -> None:
        if num_clients < 1:
            raise ValueError(f"num_clients={num_clients}: must be >= 1")
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction={fraction}: must be in (0, 1]")
        if min_clients < 0:
            raise ValueError(f"min_clients={min_clients}: must be >= 0")
        self.num_clients, self.fraction, self.min_clients = num_clients, fraction, min_clients
        self.seed = _check_seed(seed)

    def sample_size(self, num_available: int) -> int:
        """How many of ``num_available`` candidates take part."""
        return min(num_available, max(self.min_clients, round(self.fraction * num_available)))

    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        t = _check_round(server_round)
        pool = _candidates(available, self.num_clients)
        n = self.sample_size(len(pool))
        if n == 0:
            return []
        chosen = _round_rng(self.seed, _TAG_UNIFORM, t).choice(pool, size=n, replace=False)
        return sorted(int(k) for k in chosen)

    def _state(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def _load(self, state: dict[str, Any]) -> None:
        self.seed = _check_seed(int(state["seed"]))


class _PatternParticipation(ParticipationModel):
    """A PMFL §V-B pattern over K nodes with per-node probabilities ``p`` (length K)."""

    def __init__(self, p: np.ndarray | Sequence[float], seed: int) -> None:
        self.p = _check_probabilities(p)
        self.seed = _check_seed(seed)

    @property
    def num_clients(self) -> int:
        return len(self.p)

    @abc.abstractmethod
    def active(self, server_round: int) -> np.ndarray:
        """Boolean on/off state of every node (length K) in ``server_round``."""

    def select(self, server_round: int, available: Sequence[int]) -> list[int]:
        on = self.active(_check_round(server_round))
        ids = _candidates(available, self.num_clients)
        return ids[on[ids]].tolist()

    def description(self) -> dict[str, Any]:
        return {**super().description(), "p": self.p.tolist()}

    def _state(self) -> dict[str, Any]:
        return {"seed": self.seed, "p": self.p.tolist()}

    def _load(self, state: dict[str, Any]) -> None:
        self.seed = _check_seed(int(state["seed"]))
        self.p = _check_probabilities(state["p"])


class BernoulliParticipation(_PatternParticipation):
    """PMFL §V-B bernoulli: node k is on independently with probability ``p_k`` each round,
    ``P(A_k^t = 1) = p_k``."""

    kind = "bernoulli"

    def active(self, server_round: int) -> np.ndarray:
        u = _round_rng(self.seed, _TAG_BERNOULLI, server_round).random(self.num_clients)
        return u < self.p


class MarkovParticipation(_PatternParticipation):
    """PMFL §V-B markovian: a two-state (off/on) Markov chain per node.

    ``P(off→on) = p01`` and ``P(on→off) = p10_k = p01·(1−p_k)/p_k``, so the stationary on-rate
    ``p01/(p01 + p10_k)`` is ``p_k``. (The paper's ``p10_k = (1−p_k)·p01`` gives the rate
    ``1/(2−p_k) ≥ 1/2`` whatever ``p_k`` is, so the project does not use it — METHODS.md.)

    Validity: ``p10_k ≤ 1`` ⇔ ``p_k ≥ p01/(1+p01)`` (0.0476 for p01 = 0.05, i.e. above the
    default floor 0.02). **Clipping:** for a node below that bound ``p10_k`` is clipped to 1
    and that node's ``p01`` is lowered to ``p_k/(1−p_k)`` (≤ p01), which keeps its stationary
    rate exactly ``p_k`` (its on-spells then last one round). ``p_k = 1`` → always on,
    ``p_k = 0`` → never on. Round 1's states are drawn from the stationary distribution
    (on with probability ``p_k``), so the rate is ``p_k`` in every round, not only in the limit.
    """

    kind = "markov"

    def __init__(self, p: np.ndarray | Sequence[float], p01: float = 0.05, seed: int = 0) -> None:
        super().__init__(p, seed)
        self.p01 = self._check_p01(p01)
        self._reset_chain()

    @staticmethod
    def _check_p01(p01: float) -> float:
        if not 0 < p01 <= 1:
            raise ValueError(f"p01={p01}: the off→on probability must be in (0, 1]")
        return float(p01)

    def _reset_chain(self) -> None:
        self.p01_k, self.p10_k = self.transition_probabilities(self.p, self.p01)
        self._round = 0  # last round whose states are in self._on (0: none yet)
        self._on = np.zeros(self.num_clients, dtype=bool)

    @staticmethod
    def transition_probabilities(p: np.ndarray, p01: float) -> tuple[np.ndarray, np.ndarray]:
        """Per-node ``(p01_k, p10_k)`` with stationary rate ``p_k`` (clipped as documented)."""
        p10 = np.full(len(p), np.inf)
        np.divide(p01 * (1.0 - p), p, out=p10, where=p > 0)
        clipped = p10 > 1.0
        p01_k = np.full(len(p), p01)
        p01_k[clipped] = p[clipped] / (1.0 - p[clipped])  # p < p01/(1+p01) < 1 here
        return p01_k, np.minimum(p10, 1.0)

    def _step(self, server_round: int) -> None:
        u = _round_rng(self.seed, _TAG_MARKOV, server_round).random(self.num_clients)
        if server_round == 1:  # stationary start
            self._on = u < self.p
        else:
            self._on = np.where(self._on, u >= self.p10_k, u < self.p01_k)
        self._round = server_round

    def active(self, server_round: int) -> np.ndarray:
        if server_round < self._round:  # an earlier round: replay the chain from round 1
            self._round = 0
        while self._round < server_round:
            self._step(self._round + 1)
        return self._on.copy()

    def _state(self) -> dict[str, Any]:
        return {
            **super()._state(),
            "p01": self.p01,
            "round": self._round,
            "on": self._on.astype(int).tolist(),
        }

    def _load(self, state: dict[str, Any]) -> None:
        super()._load(state)
        self.p01 = self._check_p01(float(state["p01"]))
        self._reset_chain()
        on = np.asarray(state["on"], dtype=bool)
        if len(on) != self.num_clients:
            raise ValueError(f"markov state has {len(on)} node states for {self.num_clients}")
        self._round, self._on = int(state["round"]), on


class CyclicParticipation(_PatternParticipation):
    """PMFL §V-B cyclic: node k is on in round t iff ``(t − o_k) mod period < p_k·period``,
    with a random offset ``o_k ∈ [0, period)`` drawn once from the seed.

    The phase is an integer, so node k is on for ``ceil(p_k·period)`` consecutive rounds
    per cycle (``p_k·period`` is rounded up after removing float noise of 1e-9, so 0.07·100
    gives 7 rounds, not 8): its rate is ``p_k`` exactly when ``p_k·period`` is an integer and
    otherwise exceeds ``p_k`` by less than ``1/period``. ``p_k = 1`` → always on.
    """

    kind = "cyclic"

    def __init__(self, p: np.ndarray | Sequence[float], period: int = 100, seed: int = 0) -> None:
        super().__init__(p, seed)
        self.period = self._check_period(period)
        self.offsets = _round_rng(self.seed, _TAG_CYCLIC, 0).integers(
            0, self.period, size=self.num_clients
        )

    @staticmethod
    def _check_period(period: int) -> int:
        if isinstance(period, bool) or not isinstance(period, int | np.integer) or period < 1:
            raise ValueError(f"period={period!r}: the cycle length must be an integer >= 1")
        return int(period)

    def on_rounds_per_cycle(self) -> np.ndarray:
        """``ceil(p_k·period)`` per node (float noise below 1e-9 ignored)."""
        return np.ceil(self.p * self.period - 1e-9).astype(np.int64)

    def active(self, server_round: int) -> np.ndarray:
        return (server_round - self.offsets) % self.period < self.on_rounds_per_cycle()

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "period": self.period, "offsets": self.offsets.tolist()}

    def _load(self, state: dict[str, Any]) -> None:
        super()._load(state)
        self.period = self._check_period(int(state["period"]))
        offsets = np.asarray(state["offsets"], dtype=np.int64)
        if len(offsets) != self.num_clients:
            raise ValueError(f"cyclic state has {len(offsets)} offsets for {self.num_clients}")
        self.offsets = offsets


# ----------------------------------------------------------------------------- factory
def build_participation(
    name: str,
    *,
    num_clients: int,
    label_counts: np.ndarray | None,
    seed: int,
    fraction: float,
    min_clients: int,
    beta: float,
    mean: float,
    floor: float,
    p01: float,
    period: int,
) -> ParticipationModel:
    """The participation model ``name`` (one of :data:`PATTERNS`) for ``num_clients``
    partitions. ``uniform`` uses ``fraction``/``min_clients``; ``bernoulli``/``markov``/
    ``cyclic`` draw ``p = participation_probabilities(label_counts, beta, mean, floor, ·)``
    (``label_counts``: one row per partition, shape ``(num_clients, classes)``) from their
    own stream of ``seed`` and use ``p01`` (markov) or ``period`` (cyclic). ValueError for an
    unknown name (listing the allowed ones) or a bad argument."""
    if name not in PATTERNS:
        raise ValueError(f"unknown participation {name!r}; allowed: {', '.join(PATTERNS)}")
    if name == "all":
        return AllParticipation()
    if name == "uniform":
        return UniformParticipation(num_clients, fraction, min_clients, seed)
    if label_counts is None or np.shape(label_counts)[0] != num_clients:
        rows = None if label_counts is None else np.shape(label_counts)[0]
        raise ValueError(
            f"participation {name!r} needs label_counts with one row per client: "
            f"got {rows} rows for num_clients={num_clients}"
        )
    prob_rng = _round_rng(_check_seed(seed), _TAG_PROBABILITIES, 0)
    p = participation_probabilities(label_counts, beta, mean, floor, prob_rng)
    if name == "bernoulli":
        return BernoulliParticipation(p, seed)
    if name == "markov":
        return MarkovParticipation(p, p01, seed)
    return CyclicParticipation(p, period, seed)


def participation_of(cfg: Mapping[str, Any], label_counts: np.ndarray | None) -> ParticipationModel:
    """The participation model a run's config asks for (``server.participation`` and its
    settings, ``num_clients``, ``seed``): :func:`build_participation` as the ServerApp builds
    it, for anything that must draw the same participants (the parity harness)."""
    s = cfg["server"]
    return build_participation(
        s["participation"],
        num_clients=cfg["num_clients"],
        label_counts=label_counts,
        seed=cfg["seed"],
        fraction=s["fraction"],
        min_clients=s["min_clients"],
        beta=s["participation_beta"],
        mean=s["participation_mean"],
        floor=s["participation_floor"],
        p01=s["markov_p01"],
        period=s["cyclic_period"],
    )
