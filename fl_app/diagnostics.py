"""Diagnostics of representations and model updates (pure numpy; tensors are accepted).

* :func:`effective_rank` — FedRCL Def. 2 (Roy & Vetterli, 2007) of the feature covariance;
* :func:`update_deviation` — PMFL Def. 1, ``Dev = Σ_k (1 − sim(Δ_k, mean Δ))``;
* :func:`cosine_to_global` — per-client ``sim(global update, Δ_k)`` (FedRANE Fig. 3).

Sign convention as everywhere in the project: ``Δ_k = w_k − W`` and the global update is
``W_new − W``. A cosine that involves a zero vector is defined as 0 here.
"""

from __future__ import annotations

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


def cosine_to_global(global_delta: ArrayLike, deltas: ArrayLike) -> np.ndarray:
    """Per-client cosine similarity between the global update and each client's update
    (FedRANE Fig. 3): ``c_k = ⟨g, Δ_k⟩ / (‖g‖ ‖Δ_k‖)``.

    ``global_delta``: (P,) (any shape, flattened); ``deltas``: (K, P) (rows flattened).
    Returns (K,) float64; ``c_k = 0`` where ``g`` or ``Δ_k`` has zero norm."""
    g = _as_float64(global_delta).ravel()
    d = _as_float64(deltas)
    d = d.reshape(d.shape[0], -1)
    if d.shape[1] != g.size:
        raise ValueError(f"deltas have {d.shape[1]} entries per client, global update {g.size}")
    denom = np.linalg.norm(d, axis=1) * np.linalg.norm(g)
    return np.divide(d @ g, denom, out=np.zeros(d.shape[0]), where=denom > 0.0)


def update_deviation(deltas: ArrayLike) -> float:
    """Deviation among model updates (PMFL Def. 1):
    ``Dev = Σ_k (1 − sim(Δ_k, Δ̄))`` with ``Δ̄ = (1/K) Σ_k Δ_k`` (plain mean).

    ``deltas``: (K, P), one flattened update per participating client. Lies in [0, 2K]; 0 iff
    all non-zero updates point the same way. A zero row (or a zero mean, e.g. two opposite
    updates) has cosine 0 by convention and so contributes 1. K = 0 gives 0.0."""
    d = _as_float64(deltas)
    if d.ndim == 0 or d.shape[0] == 0:
        return 0.0
    d = d.reshape(d.shape[0], -1)
    return float(np.sum(1.0 - cosine_to_global(d.mean(axis=0), d)))
