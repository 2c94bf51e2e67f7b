"""FedCCL's clustered signals: FINCH per class on the clients and again on the server.

FINCH (Sarfraz et al., CVPR 2019) comes from the pinned PyPI ``finch-clust`` and is always
called with keyword arguments (its positional order differs from the original repository).
Exact path: O(n²) time and memory in the number of points clustered (a class's local
features on a client; the pooled signals of one class on the server, at most a few thousand
rows). Features are L2-normalised first; cluster means are re-normalised ("spherical").
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np


class PayloadError(ValueError):
    """A client's signals payload is malformed; the message names the problem."""


def _normalize(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def finch_partition(features: np.ndarray) -> np.ndarray:
    """Cluster labels (n,) of the coarsest partition FINCH returns (cosine distance).
    Up to 3 points form one cluster (FINCH's 1-NN graph on ≤ 3 points is connected)."""
    n = len(features)
    if n <= 3:
        return np.zeros(n, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from finch import FINCH

        with contextlib.redirect_stdout(io.StringIO()):
            c, _, _ = FINCH(
                data=np.ascontiguousarray(features, dtype=np.float32),
                distance="cosine",
                verbose=False,
            )
    return np.asarray(c)[:, -1].astype(np.int64)


def cluster_means(features: np.ndarray, method: str = "finch") -> np.ndarray:
    """Normalised cluster means (m, d) of ``features`` (n, d): FINCH clusters (``finch``) or
    one plain mean (``mean``, the paper's "averaged signals" ablation)."""
    f = _normalize(np.asarray(features, dtype=np.float64))
    if method == "mean":
        return _normalize(f.mean(axis=0, keepdims=True))
    if method != "finch":
        raise ValueError(f"signals method {method!r}; allowed: finch, mean")
    labels = finch_partition(f)
    means = np.stack([f[labels == c].mean(axis=0) for c in np.unique(labels)])
    return _normalize(means)


def local_signals(
    features: np.ndarray, labels: np.ndarray, num_classes: int, method: str = "finch"
) -> tuple[np.ndarray, np.ndarray]:
    """FedCCL local signals (paper Eq. 8–9): per class present in ``labels``, the normalised
    cluster means of that class's features. Returns (signals float32 (M, d), labels int64)."""
    sig, lab = [], []
    for c in range(num_classes):
        sel = labels == c
        if sel.any():
            means = cluster_means(features[sel], method)
            sig.append(means)
            lab.append(np.full(len(means), c, dtype=np.int64))
    d = features.shape[1]
    if not sig:
        return np.zeros((0, d), np.float32), np.zeros(0, np.int64)
    return np.concatenate(sig).astype(np.float32), np.concatenate(lab)


def global_signals(
    signals: np.ndarray, signal_labels: np.ndarray, num_classes: int, method: str = "finch"
) -> tuple[np.ndarray, np.ndarray]:
    """FedCCL global signals (paper Eq. 15): per class, cluster all clients' local signals
    (FINCH when more than one) and take the normalised mean of the cluster centres.
    Returns (U float32 (C, d), zero rows for missing classes; mask bool (C,))."""
    d = signals.shape[1]
    U = np.zeros((num_classes, d), np.float32)
    mask = np.zeros(num_classes, bool)
    for c in range(num_classes):
        sel = signal_labels == c
        if sel.any():
            centres = cluster_means(signals[sel], method)
            U[c] = _normalize(centres.mean(axis=0, keepdims=True))[0]
            mask[c] = True
    return U, mask


def validate_signals(
    signals: np.ndarray, labels: np.ndarray, *, dim: int, num_classes: int, max_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Check an untrusted client's signals payload; return float32/int64 normalised copies
    or raise PayloadError naming the problem."""
    s, lab = np.asarray(signals), np.asarray(labels)
    if s.dtype.kind != "f":
        raise PayloadError(f"signals must be a float array, got dtype {s.dtype}")
    if s.ndim != 2 or s.shape[1] != dim:
        raise PayloadError(f"signals has shape {s.shape}, expected (M, {dim})")
    if lab.dtype.kind not in "iu":
        raise PayloadError(f"signal_labels must be integers, got dtype {lab.dtype}")
    if lab.shape != (len(s),):
        raise PayloadError(f"signal_labels has shape {lab.shape}, expected ({len(s)},)")
    if len(s) > max_rows:
        raise PayloadError(f"{len(s)} signals exceed the limit of {max_rows} rows")
    if len(s) == 0:
        raise PayloadError("no signals")
    if not np.isfinite(s).all():
        raise PayloadError("signals hold NaN or Inf")
    if lab.min() < 0 or lab.max() >= num_classes:
        raise PayloadError(f"signal labels outside 0..{num_classes - 1}")
    norms = np.linalg.norm(s.astype(np.float64), axis=1)
    if (norms < 1e-8).any():
        raise PayloadError("signals contain a zero row")
    return (s / norms[:, None]).astype(np.float32), lab.astype(np.int64)
