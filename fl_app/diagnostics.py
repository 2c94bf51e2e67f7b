"""Diagnostics of representations and updates (pure numpy)."""

from __future__ import annotations

import numpy as np


def effective_rank(features: np.ndarray) -> float:
    """Effective rank of a feature matrix (FedRCL Def. 2; Roy & Vetterli 2007):
    ``exp(H(σ/‖σ‖₁))`` with ``σ`` the singular values of the (N, d) feature matrix, not
    centred (as the definition reads). Identity-like features give d, rank-1 features 1;
    representation collapse shows as a falling value."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or f.size == 0:
        raise ValueError("features must be a non-empty (N, d) matrix")
    s = np.linalg.svd(f, compute_uv=False)
    total = s.sum()
    if total <= 0:
        return 0.0
    q = s[s > 0] / total
    return float(np.exp(-(q * np.log(q)).sum()))


def update_deviation(deltas: np.ndarray) -> float:
    """PMFL Def. 1: ``Dev = Σ_k (1 − cos(Δ_k, mean Δ))`` for deltas (K, P). A zero delta (or
    a zero mean) has cosine 0 and contributes 1."""
    d = np.asarray(deltas, dtype=np.float64)
    mean = d.mean(axis=0)
    return float(np.sum(1.0 - cosine_to_global(mean, d)))


def cosine_to_global(global_delta: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """Per-client ``cos(global update, Δ_k)`` (FedRANE Fig. 3); 0 where a norm is zero."""
    g = np.asarray(global_delta, dtype=np.float64).ravel()
    d = np.asarray(deltas, dtype=np.float64).reshape(len(deltas), -1)
    denom = np.linalg.norm(d, axis=1) * np.linalg.norm(g)
    return np.divide(d @ g, denom, out=np.zeros(len(d)), where=denom > 0)
