"""Comparing two clients' updates from the same global weights (lists of arrays)."""

from __future__ import annotations

import numpy as np


def flat_update(new: list, w0: list) -> np.ndarray:
    """The update ``new - w0`` of every array, flattened into one vector."""
    return np.concatenate([(a - b).ravel() for a, b in zip(new, w0, strict=True)])


def update_cosine(a: list, b: list, w0: list) -> float:
    """The cosine between the updates ``a - w0`` and ``b - w0`` (all arrays together)."""
    da, db = flat_update(a, w0), flat_update(b, w0)
    return float(da @ db / (np.linalg.norm(da) * np.linalg.norm(db)))


def update_relative_difference(a: list, b: list, w0: list) -> float:
    """``|(a - w0) - (b - w0)| / |b - w0|``: how far update ``a`` is from update ``b``,
    relative to ``b``'s size (0 for the same update; near 1 or above for an unrelated one)."""
    da, db = flat_update(a, w0), flat_update(b, w0)
    return float(np.linalg.norm(da - db) / np.linalg.norm(db))
