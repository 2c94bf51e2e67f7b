"""GNE — FedRANE's server: Nash-bargaining aggregation weights over the client deltas.

For client deltas ``Δ_k = w_k − W`` with Gram matrix ``G_kl = Δ_kᵀΔ_l``, the Nash bargaining
solution solves ``M p = 1/p``, ``p > 0``, with ``M = G/‖G‖_F + εI``. This is the stationary
point of the strictly convex potential ``φ(p) = ½pᵀMp − Σ_k log p_k``, so damped Newton
(Hessian ``M + diag(1/p²)``, backtracking that keeps ``p > 0`` and decreases φ) converges in a
handful of steps; no convex-optimisation package is needed. The raw solution always has
``pᵀMp = K``, so the weights are normalised to a convex combination (as the authors' code
does) and the server applies ``W ← W + η_g·Σ p_k Δ_k``.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
from flwr.serverapp.strategy import FedAvg

from strategies.base import ClientResult, StrategyBase, delta_gram

log = logging.getLogger("fl_app")


class NashSolveError(ArithmeticError):
    """The bargaining problem is degenerate (zero, non-finite or unbounded)."""


def _potential(M: np.ndarray, p: np.ndarray) -> float:
    return float(0.5 * p @ M @ p - np.log(p).sum())


def nash_weights(
    gram: np.ndarray,
    init: np.ndarray | None = None,
    *,
    eps: float = 1e-6,
    max_iter: int = 100,
    tol: float = 1e-10,
    p_max: float = 1e6,
) -> np.ndarray:
    """Raw Nash bargaining weights ``p > 0`` with ``M p = 1/p``, ``M = gram/‖gram‖_F + εI``
    (FedRANE Eq. 12–13; Navon et al. 2022, Nash-MTL). Damped Newton on
    ``φ(p) = ½pᵀMp − Σ log p`` from ``init`` (default uniform). Raises NashSolveError for a
    zero or non-finite Gram matrix, a diverging solution or no convergence."""
    G = np.asarray(gram, dtype=np.float64)
    k = G.shape[0]
    if G.shape != (k, k) or not np.isfinite(G).all():
        raise NashSolveError("Gram matrix is not a finite square matrix")
    norm = np.linalg.norm(G)
    if norm <= 0:
        raise NashSolveError("all deltas are zero")
    M = 0.5 * (G + G.T) / norm + eps * np.eye(k)
    p = np.full(k, 1.0 / k) if init is None else np.asarray(init, dtype=np.float64).copy()
    if (p <= 0).any() or not np.isfinite(p).all():
        raise NashSolveError("init must be positive and finite")
    phi = _potential(M, p)
    for _ in range(max_iter):
        grad = M @ p - 1.0 / p
        if np.linalg.norm(grad) < tol:
            break
        H = M + np.diag(1.0 / p**2)
        try:
            step = np.linalg.solve(H, grad)
        except np.linalg.LinAlgError as err:
            raise NashSolveError(f"singular Newton system: {err}") from err
        t = 1.0
        neg = step > 0
        if neg.any():  # stay strictly positive
            t = min(1.0, 0.99 * float(np.min(p[neg] / step[neg])))
        while True:
            cand = p - t * step
            new_phi = _potential(M, cand)
            if new_phi <= phi - 1e-4 * t * float(grad @ step) or t < 1e-12:
                break
            t *= 0.5
        p, phi = cand, new_phi
        if p.max() > p_max:
            raise NashSolveError("weights diverge (nearly opposite deltas)")
    else:
        raise NashSolveError(f"no convergence in {max_iter} Newton steps")
    if not np.isfinite(p).all():
        raise NashSolveError("non-finite solution")
    return p


def gram_weights(gram: np.ndarray, num_examples: np.ndarray, **kw: float) -> tuple[np.ndarray, str]:
    """Normalised GNE aggregation weights (summing to 1) from the delta Gram matrix.

    All-zero deltas get weight 0 and are left out of the bargaining; the solve starts from
    the sample fractions ``n_k/Σn`` (the authors' code). On a degenerate problem the sample
    fractions are returned with status ``"fallback: <reason>"`` and a logged warning."""
    n = np.asarray(num_examples, dtype=np.float64)
    k = len(n)
    sample = n / n.sum()
    if k == 1:
        return np.ones(1), "nash"
    live = np.diag(gram) > 0
    try:
        if live.sum() == 0:
            raise NashSolveError("all deltas are zero")
        sub = gram[np.ix_(live, live)]
        p = nash_weights(sub, init=sample[live] / sample[live].sum(), **kw)
    except NashSolveError as err:
        log.warning("GNE: %s; falling back to sample weights", err)
        return sample, f"fallback: {err}"
    out = np.zeros(k)
    out[live] = p / p.sum()
    return out, "nash"


def nash_utilities(gram: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Each client's utility ``Δ_kᵀ(Σ_l p_l Δ_l) = (G p)_k``."""
    return np.asarray(gram, dtype=np.float64) @ np.asarray(p, dtype=np.float64)


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


# --------------------------------------------------------------------- Flower strategy
@dataclasses.dataclass(frozen=True)
class GNEParams:
    server_lr: float = 1.0  # η_g in W ← W + η_g·Σ p_k Δ_k


class GNEStrategy(StrategyBase, FedAvg):
    """FedRANE's server: Nash-bargaining weights over the client deltas (GNE).

    ``W ← W + η_g·Σ_k p_k Δ_k`` with ``p`` the normalised solution of ``M p = 1/p`` for
    ``M = GᵀG/‖GᵀG‖_F + εI`` (see :func:`gram_weights`); falls back to sample weights with a
    logged warning when the bargaining problem is degenerate. Works with any client."""

    Params = GNEParams

    def aggregate(self, server_round: int, results: list[ClientResult]) -> list[np.ndarray]:
        gram = delta_gram(self.current, results)
        self.gram_cache, self.gram_round = gram, server_round
        n = np.array([r.num_examples for r in results], dtype=np.float64)
        p, status = gram_weights(gram, n)
        self.record["aggregation_weights"] = {
            str(r.pid): float(w) for r, w in zip(results, p, strict=True)
        }
        self.record["gne_status"] = status
        return apply_weighted_deltas(self.current, results, p, self.hp.server_lr)
