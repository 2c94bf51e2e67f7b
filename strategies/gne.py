"""GNE — FedRANE's server: Nash-bargaining aggregation weights over the client deltas.

For client deltas ``Δ_k = w_k − W`` (rows of ``D``, K × P) with Gram matrix
``G_kl = Δ_kᵀΔ_l``, the Nash bargaining update ``Δθ = Σ_k p_k Δ_k`` (FedRANE Eq. 11–14)
solves ``Gp = 1/p``, ``p > 0`` (FedRANE §3.4). The project solves it on the scale-free
``M = G/‖G‖_F + εI``: ``Mp = 1/p`` is the stationarity condition of the strictly convex,
self-concordant potential ``φ(p) = ½pᵀMp − Σ_k log p_k``, so damped Newton (Hessian
``M + diag(1/p²)``, backtracking that keeps ``p > 0`` and decreases φ) reaches it in a handful
of steps; this replaces the paper's sequence of convex programmes (Eq. 16, cvxpy/ECOS in the
authors' code) with the same fixed point and no solver package. On the same client updates
the two give the same weights (to 10⁻⁴) wherever the authors' solver finds a solution; in the
rounds where its first programme fails it keeps the sample weights it started from
(docs/parity.md, "their server stepping with our GNE weights").
The raw solution always has ``pᵀMp = K`` whatever the scale of the deltas, so the weights are
normalised to a convex combination ``p/Σp`` (as the authors' code does) and the server applies
``W ← W + η_g·Σ p_k Δ_k``. Degenerate problems (all deltas zero, non-finite values, nearly
opposite deltas whose weights diverge) fall back to sample weights ``n_k/Σn`` with a warning.

The math section (up to :func:`nash_utilities`) needs only numpy and logging.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from flwr.serverapp.strategy import FedAvg

from core.diagnostics import delta_gram
from core.params import positive
from strategies.base import StrategyBase
from strategies.replies import ClientResult

log = logging.getLogger("fl_app")

_ARMIJO = 0.25  # sufficient-decrease fraction of the Newton decrement in the line search
_MIN_STEP = 1e-12  # smallest line-search step before giving up
_QUADRATIC = 0.1  # below this squared Newton decrement take full steps (quadratic phase)
#: A delta shorter than this fraction of the longest one counts as zero (see gram_weights)
NEGLIGIBLE_DELTA = 1e-3


class NashSolveError(ArithmeticError):
    """The bargaining problem is degenerate (zero, non-finite or unbounded) or the Newton
    iteration did not converge; the message says which."""


# ------------------------------------------------------------------------------ solver
def _normalised_gram(gram: np.ndarray, eps: float) -> np.ndarray:
    """``M = sym(G)/‖G‖_F + εI`` in float64; raises NashSolveError for a non-square,
    non-finite or all-zero Gram matrix."""
    G = np.asarray(gram, dtype=np.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1] or G.shape[0] == 0:
        raise NashSolveError(f"Gram matrix must be square and non-empty, got shape {G.shape}")
    if not np.isfinite(G).all():
        raise NashSolveError("Gram matrix has non-finite entries")
    norm = float(np.linalg.norm(G))
    if norm <= 0.0 or not np.isfinite(norm):
        raise NashSolveError("all deltas are zero")
    return 0.5 * (G + G.T) / norm + eps * np.eye(G.shape[0])


def _potential(M: np.ndarray, p: np.ndarray) -> float:
    """``φ(p) = ½pᵀMp − Σ log p``."""
    return float(0.5 * p @ M @ p - np.log(p).sum())


def _start(M: np.ndarray, init: np.ndarray | None) -> np.ndarray:
    """Starting point: the direction of ``init`` (default uniform), scaled to the minimiser
    of φ on its ray, ``c = √(K / uᵀMu)``, so the scale of ``init`` does not matter."""
    k = M.shape[0]
    u = np.full(k, 1.0 / k) if init is None else np.asarray(init, dtype=np.float64).reshape(-1)
    if u.shape != (k,) or not np.isfinite(u).all() or (u <= 0).any():
        raise NashSolveError(f"init must be {k} positive finite numbers")
    u = u / u.sum()
    curv = float(u @ M @ u)
    if curv <= 0.0 or not np.isfinite(curv):
        raise NashSolveError("φ is unbounded along the initial direction (opposite deltas)")
    return u * np.sqrt(k / curv)


def _newton_direction(M: np.ndarray, p: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """Solve ``(M + diag(1/p²)) s = ∇φ``; the Hessian is SPD for PSD ``M`` (one LAPACK call:
    at K ≤ 100 the cost is call overhead, not flops)."""
    hess = M + np.diag(1.0 / p**2)
    try:
        step = np.linalg.solve(hess, grad)
    except np.linalg.LinAlgError as err:
        raise NashSolveError(f"singular Newton system: {err}") from err
    if not np.isfinite(step).all():
        raise NashSolveError("non-finite Newton step")
    return step


def _line_search(
    M: np.ndarray, p: np.ndarray, step: np.ndarray, phi: float, decrement: float
) -> np.ndarray | None:
    """Backtracking from the largest step that keeps ``p − t·s > 0`` (capped at the full
    Newton step) until φ decreases by ``_ARMIJO·t·λ²``; ``None`` if no step decreases it."""
    t = 1.0
    pos = step > 0
    if pos.any():
        t = min(1.0, 0.99 * float(np.min(p[pos] / step[pos])))
    while t >= _MIN_STEP:
        cand = p - t * step
        if (cand > 0).all() and _potential(M, cand) <= phi - _ARMIJO * t * decrement:
            return cand
        t *= 0.5
    return None


def nash_weights(
    gram: np.ndarray,
    init: np.ndarray | None = None,
    *,
    eps: float = 1e-6,
    max_iter: int = 100,
    tol: float = 1e-10,
    p_max: float = 1e6,
) -> np.ndarray:
    """Raw (un-normalised) Nash bargaining weights ``p > 0`` with ``M p = 1/p``.

    ``M = gram/‖gram‖_F + eps·I`` for the K×K PSD Gram matrix ``gram_kl = Δ_kᵀΔ_l`` of the
    client deltas (FedRANE: ``GᵀGp = 1/p`` after Eq. 14; Navon et al. 2022, Nash-MTL). Damped
    Newton on ``φ(p) = ½pᵀMp − Σ log p`` (Hessian ``M + diag(1/p²)``) from the direction of
    ``init`` (default uniform; e.g. ``n_k/Σn`` as in the authors' code), rescaled to the
    best point on its ray: backtracking that keeps p > 0 and decreases φ while the Newton
    decrement λ is large, full steps once ``λ² < 0.1`` (quadratic phase; φ is
    self-concordant, so a full step then stays positive). Converged when every client's
    ``|p_k(Mp)_k − 1| ≤ tol`` or ``λ² ≤ tol²`` (float64 floor). At the solution
    ``pᵀMp = K`` and ``(Mp)_k = 1/p_k > 0``; the raw utilities ``(gram·p)_k =
    ‖gram‖_F(1/p_k − eps·p_k)`` are positive while ``p_k < 1/√eps``, i.e. unless the deltas are
    (nearly) linearly dependent or a client's ``‖Δ_k‖²`` is below ``eps·‖gram‖_F``.

    Raises NashSolveError for a zero or non-finite Gram matrix, a bad ``init``, weights
    above ``p_max`` (the bargaining set is unbounded: nearly opposite deltas with small
    ``eps``), a failed line search or no convergence within ``max_iter`` steps."""
    M = _normalised_gram(gram, eps)
    p = _start(M, init)
    for _ in range(max_iter):
        Mp = M @ p
        if float(np.max(np.abs(p * Mp - 1.0))) <= tol:
            return _checked(p, p_max)
        grad = Mp - 1.0 / p
        step = _newton_direction(M, p, grad)
        decrement = float(grad @ step)  # λ² ≥ 0; φ(p) − φ* ≈ λ²/2 near the optimum
        if decrement < 0:
            raise NashSolveError("Hessian is not positive definite (Gram matrix not PSD)")
        if decrement <= tol**2:
            return _checked(p, p_max)
        full = p - step
        if decrement < _QUADRATIC and (full > 0).all():
            p = full
        else:
            found = _line_search(M, p, step, _potential(M, p), decrement)
            if found is None:
                raise NashSolveError(f"line search failed (Newton decrement² {decrement:.3g})")
            p = found
        _checked(p, p_max)
    raise NashSolveError(f"no convergence in {max_iter} Newton steps")


def _checked(p: np.ndarray, p_max: float) -> np.ndarray:
    if not np.isfinite(p).all():
        raise NashSolveError("non-finite weights")
    if float(p.max()) > p_max:
        raise NashSolveError(
            f"weights exceed p_max={p_max:g} (unbounded bargaining set: nearly opposite deltas)"
        )
    return p


# ----------------------------------------------------------------- aggregation weights
def sample_weights(num_examples: np.ndarray) -> np.ndarray:
    """``n_k/Σn`` (FedAvg weights); uniform when the counts are not all positive and finite."""
    n = np.asarray(num_examples, dtype=np.float64).reshape(-1)
    if n.size == 0:
        raise ValueError("no clients")
    if not np.isfinite(n).all() or (n <= 0).any():
        return np.full(n.size, 1.0 / n.size)
    return n / n.sum()


def gram_weights(
    gram: np.ndarray,
    num_examples: np.ndarray,
    ids: Sequence[int] | None = None,
    **solver_kw: Any,
) -> tuple[np.ndarray, str]:
    """GNE aggregation weights (non-negative, summing to 1) from the K×K delta Gram matrix.

    Clients whose delta is all zeros (``G_kk = 0``) get weight 0 and are left out of the
    bargaining (the authors' code drops them); so are those whose delta is negligible,
    shorter than ``NEGLIGIBLE_DELTA`` (10⁻³) of the longest: a client that in effect did not
    train, or returned the global model plus noise. Nash weights grow as ``1/‖Δ_k‖`` (for
    orthogonal deltas ``p_k ∝ 1/‖Δ_k‖``), so such a client would take nearly all the weight
    and stall the global model (a 10⁻³ delta among four normal ones took 96 %). A partial
    mitigation: a short delta above the cut-off (10⁻² of the others) still takes most of the
    weight, as the bargaining has it.
    :func:`nash_weights` starts from the sample fractions ``n_k/Σn`` of the others (the
    authors' code); its raw ``p`` is normalised to
    ``p/Σp``, a Nash-weighted convex combination (``W ← W + η_g·Σ p_k Δ_k``, FedRANE Eq. 10–11).
    The solution must give every bargaining client a positive utility ``(G p)_k`` (FedRANE
    Eq. 12; METHODS.md's check), which fails when the deltas are nearly linearly dependent
    (some raw ``p_k ≥ 1/√eps``, see :func:`nash_weights`). On that or any other degenerate
    problem (NashSolveError) the sample weights are returned with status
    ``"fallback: <reason>"`` and a logged warning; otherwise the status is ``"nash"``.
    ``ids`` name the clients in the reason (e.g. partition ids; default: positions).
    ``solver_kw`` go to :func:`nash_weights`."""
    sample = sample_weights(num_examples)
    k = sample.size
    G = np.asarray(gram, dtype=np.float64)
    try:
        if G.shape != (k, k):
            raise NashSolveError(f"Gram matrix shape {G.shape} does not match {k} clients")
        if not np.isfinite(G).all():
            raise NashSolveError("Gram matrix has non-finite entries")
        norms_sq = np.diag(G)
        live = norms_sq > max(NEGLIGIBLE_DELTA**2 * norms_sq.max(), 0.0)
        if not live.any():
            raise NashSolveError("all deltas are zero")
        G_live = G[np.ix_(live, live)]
        p = nash_weights(G_live, init=sample[live], **solver_kw)
        utilities = G_live @ p
        if not (utilities > 0).all():
            worst = int(np.flatnonzero(live)[np.argmin(utilities)])
            raise NashSolveError(
                f"client {worst if ids is None else ids[worst]}'s utility "
                f"Δ_kᵀ(Σ p_l Δ_l) = {float(utilities.min()):.3g} is not positive at the "
                "solution (nearly linearly dependent deltas)"
            )
    except NashSolveError as err:
        log.warning("GNE: %s; falling back to sample weights", err)
        return sample, f"fallback: {err}"
    out = np.zeros(k)
    out[live] = p / p.sum()
    return out, "nash"


def aggregation_weights(
    deltas: np.ndarray, num_examples: np.ndarray, **solver_kw: Any
) -> tuple[np.ndarray, str]:
    """GNE weights from the K×P delta matrix (row k = ``Δ_k = w_k − W``): builds the Gram
    matrix in float64 and calls :func:`gram_weights` (same contract: weights summing to 1,
    zero deltas weight 0, status ``"nash"`` or ``"fallback: <reason>"``). K = 1 gives [1.0]."""
    return gram_weights(_gram_of(deltas), num_examples, **solver_kw)


def nash_utilities(deltas: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Each client's utility ``u_k = Δ_kᵀ(Σ_l p_l Δ_l) = Δ_kᵀ(Dᵀp)`` (FedRANE Eq. 12) for the
    K×P delta matrix ``D``; all positive at the Nash solution."""
    D = _as_deltas(deltas)
    return D @ (D.T @ np.asarray(p, dtype=np.float64))


def _as_deltas(deltas: np.ndarray) -> np.ndarray:
    D = np.asarray(deltas, dtype=np.float64)
    if D.ndim != 2:
        raise ValueError(f"deltas must be a (K, P) matrix, got shape {D.shape}")
    return D


def _gram_of(deltas: np.ndarray) -> np.ndarray:
    D = _as_deltas(deltas)
    with np.errstate(over="ignore", invalid="ignore"):  # non-finite → fallback downstream
        return D @ D.T


def apply_weighted_deltas(
    global_arrays: list[np.ndarray], results: list[ClientResult], p: np.ndarray, eta: float
) -> list[np.ndarray]:
    """``W + η·Σ_k p_k (w_k − W)`` per array (float64 accumulation, dtype kept); non-float
    arrays are taken from the highest-weight client."""
    best = int(np.argmax(p))
    out = []
    for i, g in enumerate(global_arrays):
        if not np.issubdtype(g.dtype, np.floating):
            out.append(results[best].arrays[i].copy())
            continue
        g64 = g.astype(np.float64)
        step = sum(
            float(pk) * (r.arrays[i].astype(np.float64) - g64)
            for pk, r in zip(p, results, strict=True)
        )
        out.append((g64 + eta * step).astype(g.dtype))
    return out


class GNEStep(NamedTuple):
    """What one GNE aggregation (:func:`gne_step`) produced."""

    arrays: list[np.ndarray]  # the new global model W + η_g·Σ p_k Δ_k
    weights: np.ndarray  # p, aligned with the results (summing to 1)
    status: str  # "nash" or "fallback: <reason>" (see gram_weights)
    gram: np.ndarray  # G_kl = Δ_kᵀΔ_l, K × K float64


def gne_step(
    global_arrays: list[np.ndarray],
    results: list[ClientResult],
    base_weights: np.ndarray,
    server_lr: float,
    ids: Sequence[int] | None = None,
    **solver_kw: Any,
) -> GNEStep:
    """One GNE round (FedRANE Eq. 10–14): ``W ← W + η_g·Σ_k p_k Δ_k`` with ``Δ_k = w_k − W``.

    ``global_arrays`` is ``W`` (a model = list of arrays), ``results`` the clients' models
    (only ``.arrays`` is read, in ``global_arrays``' order and shapes), ``base_weights`` the
    K non-negative weights the Nash solve starts from and falls back to (sample counts
    ``n_k``, or 1 each; normalised here), ``server_lr`` is ``η_g``; ``ids`` name the clients
    in a fallback reason and ``solver_kw`` go to :func:`nash_weights`. The Gram matrix comes
    from :func:`core.diagnostics.delta_gram` (float32 blocks accumulated in float64), the
    weights from :func:`gram_weights` (Nash weights ``p/Σp``, or sample weights on a
    degenerate problem) and the update from :func:`apply_weighted_deltas` (float64
    accumulation, each array's dtype kept). No input is modified."""
    gram = delta_gram(global_arrays, [r.arrays for r in results])
    p, status = gram_weights(gram, base_weights, ids=ids, **solver_kw)
    new = apply_weighted_deltas(global_arrays, results, p, server_lr)
    return GNEStep(new, p, status, gram)


# --------------------------------------------------------------------- Flower strategy
@dataclasses.dataclass(frozen=True)
class GNEParams:
    server_lr: float = positive(1.0)  # η_g in W ← W + η_g·Σ p_k Δ_k


class GNEStrategy(StrategyBase, FedAvg):
    """FedRANE's server: Nash-bargaining weights over the client deltas (GNE).

    ``W ← W + η_g·Σ_k p_k Δ_k`` with ``p`` the normalised solution of ``M p = 1/p`` for
    ``M = GᵀG/‖GᵀG‖_F + εI`` (see :func:`gram_weights`); falls back to sample weights with a
    logged warning when the bargaining problem is degenerate. Works with any client."""

    Params = GNEParams

    def aggregate(self, server_round: int, results: list[ClientResult]) -> list[np.ndarray]:
        # sample counts, or 1 each with server.weighting=uniform: the start and the fallback
        step = gne_step(
            self.current,
            results,
            self.client_weights(results),
            self.hp.server_lr,
            ids=[r.pid for r in results],
        )
        self.gram_cache, self.gram_round = step.gram, server_round
        self.record["aggregation_weights"] = {
            str(r.pid): float(w) for r, w in zip(results, step.weights, strict=True)
        }
        self.record["gne_status"] = step.status
        return step.arrays
