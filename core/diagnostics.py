"""Diagnostics of representations and model updates (pure numpy; tensors are accepted).

* :func:`effective_rank` — FedRCL Def. 2 (Roy & Vetterli, 2007) of the feature covariance;
* :func:`update_diagnostics` — for a server round, the update deviation of PMFL Def. 1,
  ``Dev = Σ_k (1 − sim(Δ_k, mean Δ))``, and the per-client ``sim(global update, Δ_k)`` of
  FedRANE Fig. 3, from the Gram matrix of the client deltas (:func:`delta_gram`, shared
  with GNE) and blocked passes over the model's arrays, so that no K × P matrix of deltas is
  ever held (tests/core/reference.py has the plain definitions they are tested against).

Sign convention as everywhere in the project: ``Δ_k = w_k − W`` and the global update is
``W_new − W``. A cosine that involves a zero vector is defined as 0 here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import torch

ArrayLike: TypeAlias = "np.ndarray | torch.Tensor"


def _as_float64(x: ArrayLike | Any) -> np.ndarray:
    """A numpy float64 copy of an array or a (possibly CUDA, grad-tracking) torch tensor."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _entropy_rank(weights: np.ndarray) -> float:
    """``exp(H(p))`` with ``p = weights / Σ weights`` (weights ≥ 0); 0.0 when all are 0."""
    total = weights.sum()
    if not np.isfinite(total) or total <= 0.0:
        return 0.0
    p = weights[weights > 0.0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def effective_rank(features: ArrayLike, covariance: bool = True) -> float:
    """Effective rank (FedRCL Def. 2, after Roy & Vetterli, EUSIPCO 2007):
    ``erank(A) = exp(−Σ_k p_k log p_k)`` with ``p_k = σ_k(A) / Σ_i σ_i(A)``.

    FedRCL §4.2 applies it to "the covariance matrix of all feature embeddings", so by default
    ``A = Cov(features)``: the features (N, d) are **centred** over the samples, and the
    singular values of the (symmetric PSD) covariance are the squared singular values of the
    centred feature matrix (the ``1/(N−1)`` scale cancels in ``p``). ``covariance=False``
    applies the definition to the raw, uncentred (N, d) feature matrix instead.

    Values lie in [1, min(N, d)]: isotropic features give d, features on one line give 1.
    Note that centring removes one direction, so e.g. ``np.eye(d)`` has covariance rank d − 1.
    Returns 0.0 when A is all zero (e.g. N = 1 with ``covariance=True``).
    ``features``: numpy array or torch tensor of shape (N, d)."""
    f = _as_float64(features)
    if f.ndim != 2 or f.size == 0:
        raise ValueError(f"features must be a non-empty (N, d) matrix, got shape {f.shape}")
    if covariance:
        f = f - f.mean(axis=0, keepdims=True)
    sigma = np.linalg.svd(f, compute_uv=False)
    return _entropy_rank(sigma**2 if covariance else sigma)


def _delta_chunks(
    global_arrays: Sequence[np.ndarray],
    client_arrays: Sequence[Sequence[np.ndarray]],
    new: Sequence[np.ndarray] | None,
    chunk: int = 1 << 18,
) -> Iterable[tuple[np.ndarray, np.ndarray | None]]:
    """Column blocks of the float32 delta matrix ``D`` (K × chunk, row k = ``w_k − W``) and,
    with ``new``, the matching block of the global update ``W_new − W``, over the float
    arrays. Bounded memory."""
    for i, g in enumerate(global_arrays):
        if not np.issubdtype(g.dtype, np.floating):
            continue
        flat_g = g.reshape(-1)
        flats = [arrays[i].reshape(-1) for arrays in client_arrays]
        for start in range(0, flat_g.size, chunk):
            sl = slice(start, start + chunk)
            d = np.stack([f[sl] for f in flats]).astype(np.float32)
            d -= flat_g[sl]
            u = None if new is None else new[i].reshape(-1)[sl].astype(np.float32) - flat_g[sl]
            yield d, u


def delta_gram(
    global_arrays: Sequence[np.ndarray], client_arrays: Sequence[Sequence[np.ndarray]]
) -> np.ndarray:
    """Gram matrix ``G_kl = Δ_kᵀΔ_l`` of the client deltas ``Δ_k = w_k − W`` over the float
    arrays (``client_arrays[k]``: client k's arrays, in the global model's order), from
    float32 column blocks (BLAS) accumulated in float64; no K×P matrix is ever held."""
    k = len(client_arrays)
    gram = np.zeros((k, k), dtype=np.float64)
    for d, _ in _delta_chunks(global_arrays, client_arrays, None):
        gram += d @ d.T
    return gram


def update_diagnostics(
    global_arrays: Sequence[np.ndarray],
    new_arrays: Sequence[np.ndarray],
    client_arrays: Sequence[Sequence[np.ndarray]],
    gram: np.ndarray,
) -> dict[str, Any]:
    """A server round's ``update_deviation`` Dev^t = Σ_k (1 − cos(Δ_k, mean Δ)) (PMFL
    Def. 1), ``global_update_norm`` ‖W_new − W‖ and
    ``cos_global_client``, the list of cos(global update, Δ_k) in client order (FedRANE
    Fig. 3), from the Gram matrix :func:`delta_gram` and one
    blocked pass over the arrays."""
    k = len(client_arrays)
    norms = np.sqrt(np.clip(np.diag(gram), 0, None))
    mean_dot = gram.sum(axis=1) / k  # Δ_k · mean Δ
    mean_norm = np.sqrt(max(gram.sum() / k**2, 0.0))
    denom = norms * mean_norm
    cos_mean = np.divide(mean_dot, denom, out=np.zeros(k), where=denom > 0)
    u_dot = np.zeros(k)
    u_sq = 0.0
    for d, u in _delta_chunks(global_arrays, client_arrays, new_arrays):
        assert u is not None
        u_sq += float(u.astype(np.float64) @ u)
        u_dot += d @ u
    denom_u = norms * np.sqrt(u_sq)
    cos_u = np.divide(u_dot, denom_u, out=np.zeros(k), where=denom_u > 0)
    return {
        "update_deviation": float(np.sum(1.0 - cos_mean)),
        "global_update_norm": float(np.sqrt(u_sq)),
        "cos_global_client": [float(c) for c in cos_u],
    }
