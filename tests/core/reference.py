"""Plain reference implementations of the update diagnostics (PMFL Def. 1, FedRANE Fig. 3),
straight from their definitions on a stacked (K, P) matrix of deltas: the blocked,
Gram-matrix path of :func:`core.diagnostics.update_diagnostics` is tested against them.

Sign convention as everywhere in the project: ``Δ_k = w_k − W`` and the global update is
``W_new − W``. A cosine that involves a zero vector is defined as 0 here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _as_float64(x: Any) -> np.ndarray:
    """A numpy float64 copy of an array or a torch tensor."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def cosine_to_global(global_delta: Any, deltas: Any) -> np.ndarray:
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


def update_deviation(deltas: Any) -> float:
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
