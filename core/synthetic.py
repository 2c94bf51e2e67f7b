"""Synthetic stand-ins for the real datasets: files in each dataset's own on-disk format
(CIFAR-10's and CIFAR-100's pickled batches, SVHN's ``.mat`` files, MNIST's and
Fashion-MNIST's IDX files) holding random images and labels, which :mod:`core.data` reads
as it reads the real files (``data.dataset=<name> data.root=<folder>``).

It lives in core, beside the loaders whose formats it follows, and not in a test module,
because two kinds of callers need it and both import core: the tests
(``tests/fl_app/test_paper_presets.py`` trains every paper preset on its dataset's format)
and the benchmarks (``bench/s1_overhead.py`` times ResNet-18 on CIFAR-shaped inputs on a
machine without CIFAR-10, through Flower's simulation, whose processes read the files
themselves). Every writer also leaves :data:`core.datafiles.SYNTHETIC_MARKER` in the folder:
torchvision checks the MD5 sums of the CIFAR and SVHN files it reads, which only the real
files pass, and the loader skips that check (with a warning) in a folder so marked.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from core.datafiles import SYNTHETIC_MARKER

N_TRAIN, N_TEST = 300, 100  # default sizes: a few hundred images of the real shape
# the real datasets' sizes (train, test): the most a stand-in needs to hold
FULL_SIZES = {
    "cifar10": (50_000, 10_000),
    "cifar100": (50_000, 10_000),
    "svhn": (73_257, 26_032),
    "mnist": (60_000, 10_000),
    "fmnist": (60_000, 10_000),
}


def _images(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """``n`` random uint8 images of ``shape``, seeded."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def _labels(n: int, classes: int, seed: int) -> np.ndarray:
    """``n`` labels in ``0..classes-1``, every class present (when ``n >= classes``), in a
    random order."""
    return np.random.default_rng(seed).permutation(np.arange(n) % classes)


def _pickle(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=2))


def mark_synthetic(root: Path) -> None:
    """Write :data:`core.datafiles.SYNTHETIC_MARKER` into ``root`` (created if missing)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / SYNTHETIC_MARKER).write_text(
        "The dataset files in this folder are random stand-ins written by core/synthetic.py; "
        "core/data.py reads them without torchvision's MD5 checks.\n"
    )


def write_cifar10(root: Path, n_train: int = N_TRAIN, n_test: int = N_TEST) -> None:
    """``<root>/cifar-10-batches-py``: five pickled training batches (``n_train`` images
    split as evenly as possible; at least 5), a test batch of ``n_test``, the meta file;
    each batch a dict of ``data`` (N×3072 uint8, channel-major rows) and ``labels``."""
    if n_train < 5:
        raise ValueError(f"CIFAR-10 has five training batches: n_train={n_train} is below 5")
    folder = root / "cifar-10-batches-py"
    for i, part in enumerate(np.array_split(np.arange(n_train), 5)):
        x, y = _images(len(part), (3 * 32 * 32,), i), _labels(len(part), 10, i)
        _pickle(folder / f"data_batch_{i + 1}", {"data": x, "labels": y.tolist()})
    x, y = _images(n_test, (3 * 32 * 32,), 9), _labels(n_test, 10, 9)
    _pickle(folder / "test_batch", {"data": x, "labels": y.tolist()})
    _pickle(folder / "batches.meta", {"label_names": [f"c{k}" for k in range(10)]})
    mark_synthetic(root)


def write_cifar100(root: Path, n_train: int = N_TRAIN, n_test: int = N_TEST) -> None:
    """``<root>/cifar-100-python``: pickled ``train`` and ``test`` (``data``, ``fine_labels``,
    ``coarse_labels``) and ``meta`` (``fine_label_names``)."""
    folder = root / "cifar-100-python"
    for name, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        y = _labels(n, 100, seed)
        entry = {"data": _images(n, (3 * 32 * 32,), seed), "fine_labels": y.tolist()}
        _pickle(folder / name, {**entry, "coarse_labels": (y // 5).tolist()})
    _pickle(folder / "meta", {"fine_label_names": [f"c{k}" for k in range(100)]})
    mark_synthetic(root)


def write_svhn(root: Path, n_train: int = N_TRAIN, n_test: int = N_TEST) -> None:
    """``<root>/train_32x32.mat`` and ``test_32x32.mat``: ``X`` (32×32×3×N uint8) and ``y``
    (N×1, digits 1..10, where 10 is the digit 0)."""
    from scipy.io import savemat

    root.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        x = _images(n, (32, 32, 3), seed).transpose(1, 2, 3, 0)
        y = (_labels(n, 10, seed) + 1).reshape(-1, 1).astype(np.uint8)
        savemat(root / f"{name}_32x32.mat", {"X": x, "y": y})
    mark_synthetic(root)


def _idx(path: Path, arr: np.ndarray, gz: bool) -> None:
    """An unsigned-byte IDX file (magic 0x08, then the dimensions, big-endian)."""
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    data = head + arr.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)


def _write_idx_set(folder: Path, gz: bool, n_train: int, n_test: int) -> None:
    for prefix, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        suffix = ".gz" if gz else ""
        _idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", _images(n, (28, 28), seed), gz)
        _idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", _labels(n, 10, seed), gz)


def write_mnist(root: Path, n_train: int = N_TRAIN, n_test: int = N_TEST) -> None:
    """torchvision's ``<root>/MNIST/raw`` layout: the four IDX files, uncompressed."""
    _write_idx_set(root / "MNIST" / "raw", False, n_train, n_test)
    mark_synthetic(root)


def write_fmnist(root: Path, n_train: int = N_TRAIN, n_test: int = N_TEST) -> None:
    """The four gzipped IDX files in ``root`` itself, as Debian's dataset-fashion-mnist
    installs them."""
    _write_idx_set(root, True, n_train, n_test)
    mark_synthetic(root)


WRITERS: dict[str, Callable[..., None]] = {
    "cifar10": write_cifar10,
    "cifar100": write_cifar100,
    "svhn": write_svhn,
    "mnist": write_mnist,
    "fmnist": write_fmnist,
}


def write_synthetic(dataset: str, root: Path, n_train: int, n_test: int) -> None:
    """Stand-in files of ``dataset`` (a key of :data:`WRITERS`) in ``root``: ``n_train``
    training and ``n_test`` test images. ValueError for a dataset without a writer."""
    if dataset not in WRITERS:
        raise ValueError(f"no synthetic writer for {dataset!r}; choose one of {sorted(WRITERS)}")
    WRITERS[dataset](root, n_train, n_test)
