"""Where a dataset's local files are, and whether they are whole, without loading them (and
without importing torch).

:mod:`core.data` reads the files these functions find; the launcher calls
:func:`dataset_problem` before Flower starts, so a missing dataset stops a simulation at once
with one line instead of after Flower's and Ray's start-up and tracebacks.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FMNIST_ROOTS = (
    Path("/usr/share/datasets/fashion-mnist"),
    Path("~/.cache/fashion-mnist").expanduser(),
    Path("data/FashionMNIST/raw"),
)
FMNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
TORCHVISION_DATASETS = ("mnist", "cifar10", "cifar100", "svhn")
# what ``data.download`` can fetch (through torchvision): Fashion-MNIST into
# ``<data.root>/FashionMNIST/raw``, which :func:`fmnist_files` searches
DOWNLOADABLE = ("fmnist", *TORCHVISION_DATASETS)
NO_DOWNLOAD_ROOT = "data.download=true needs data.root: the folder to download into"
# a file in ``data.root`` that says its files are :mod:`core.synthetic`'s stand-ins (random
# images in a real dataset's format): :mod:`core.data` reads them without torchvision's MD5
# checks, which only the real files pass
SYNTHETIC_MARKER = "SYNTHETIC"


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


#: What reading an IDX file raises when it cannot be read (zlib.error: a corrupt .gz stream).
IDX_READ_ERRORS = (OSError, EOFError, zlib.error)


def unreadable(path: Path, err: BaseException) -> str:
    """The error for an IDX file that raised one of :data:`IDX_READ_ERRORS`."""
    return f"cannot read {path}: {err}; reinstall the dataset"


def idx_problem(path: Path, head: bytes, size: int) -> str | None:
    """Why an IDX file ``path`` whose (uncompressed) bytes start with ``head`` and number
    ``size`` is not a whole unsigned-byte IDX file, or None. ``head`` must hold the header
    (4 bytes, then 4 per dimension) when the file has one."""
    if len(head) < 4 or head[:3] != b"\0\0\x08":
        return f"{path} is not an unsigned-byte IDX file; reinstall the dataset"
    if min(len(head), size) < 4 + 4 * head[3]:
        return f"{path} is truncated inside its header; reinstall the dataset"
    expected = 4 + 4 * head[3] + math.prod(idx_dims(head))
    if size != expected:
        return (
            f"{path} is truncated or corrupt ({size} bytes, expected {expected}); "
            "reinstall the dataset (apt-get install --reinstall dataset-fashion-mnist)"
        )
    return None


def idx_dims(head: bytes) -> tuple[int, ...]:
    """The dimensions in the header ``head`` of an IDX file (big-endian uint32 each)."""
    return tuple(int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(head[3]))


def _idx_head(path: Path) -> tuple[bytes, int]:
    """The first bytes (header included) and the uncompressed size of an IDX file. A plain
    file is sized by ``stat``; a gzipped one is decompressed (a second at most for
    Fashion-MNIST), as its trailer's size is only modulo 2**32 and of the last member."""
    if path.suffix != ".gz":
        with open(path, "rb") as fh:
            return fh.read(4 + 4 * 255), path.stat().st_size
    size, head = 0, b""
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            head, size = head or chunk[: 4 + 4 * 255], size + len(chunk)
    return head, size


def fmnist_problem(files: dict[str, tuple[Path, Path]]) -> str | None:
    """Why the IDX files :func:`fmnist_files` found are not a readable Fashion-MNIST (a file
    truncated, corrupt or not IDX, or a pair :func:`pair_problem` refuses), or None. Reads
    the headers and sizes, not the pixels of a plain file."""
    for images, labels in files.values():
        dims = []
        for path in (images, labels):
            try:
                head, size = _idx_head(path)
            except IDX_READ_ERRORS as err:
                return unreadable(path, err)
            problem = idx_problem(path, head, size)
            if problem:
                return problem
            dims.append(idx_dims(head))
        problem = pair_problem(images, dims[0], labels, dims[1])
        if problem:
            return problem
    return None


def pair_problem(
    images: Path, image_dims: Sequence[int], labels: Path, label_dims: Sequence[int]
) -> str | None:
    """Why IDX files of these dimensions are not images (N×H×W) with their N labels, or None."""
    if len(image_dims) != 3 or len(label_dims) != 1:
        return (
            f"{images} and {labels} are IDX files of {len(image_dims)} and {len(label_dims)} "
            "dimensions, not images (N×H×W) and labels (N); check data.root"
        )
    if image_dims[0] != label_dims[0]:
        return (
            f"{images} holds {image_dims[0]} images but {labels} {label_dims[0]} labels; "
            "reinstall the dataset"
        )
    return None


def fmnist_roots(root: str | None) -> list[Path]:
    """The folders searched for Fashion-MNIST: ``data.root`` if set, else :data:`FMNIST_ROOTS`."""
    return [Path(root).expanduser()] if root else list(FMNIST_ROOTS)


def located(path: Path, bases: Sequence[Path]) -> list[Path]:
    """``path`` if absolute (after ``~`` expansion), else ``path`` under each of ``bases``."""
    path = path.expanduser()
    return [path] if path.is_absolute() else [Path(b) / path for b in bases]


def fmnist_files(
    root: str | None, bases: Sequence[Path] = (Path(),)
) -> dict[str, tuple[Path, Path]] | None:
    """``{"train": (images, labels), "test": (images, labels)}`` of the first searched folder
    (each of :func:`fmnist_roots`, or its torchvision-style ``FashionMNIST/raw``) that holds
    all four IDX files, plain or gzipped; None when none does. A relative folder is looked up
    under each of ``bases`` (default: the working directory)."""
    for base in (f for r in fmnist_roots(root) for f in located(r, bases)):
        for folder in (base, base / "FashionMNIST" / "raw"):
            found = {s: tuple(_find_idx(folder, f) for f in FMNIST_FILES[s]) for s in FMNIST_FILES}
            if all(p is not None for pair in found.values() for p in pair):
                return found  # type: ignore[return-value]
    return None


def fmnist_missing(root: str | None, bases: Sequence[Path] = (Path(),)) -> str:
    """The error for a Fashion-MNIST that :func:`fmnist_files` did not find in ``bases``
    (the folders it searched, relative ones resolved as it did)."""
    searched = ", ".join(str(f.resolve()) for r in fmnist_roots(root) for f in located(r, bases))
    return (
        f"Fashion-MNIST not found (searched {searched}). Install it with "
        "`sudo apt-get install dataset-fashion-mnist` (IDX files in "
        "/usr/share/datasets/fashion-mnist), set data.root to a folder with the IDX files, or "
        "set data.root to a folder to download it into with data.download=true (on a machine "
        "with network access)"
    )


def marked_synthetic(root: str | Path | None) -> bool:
    """Whether the dataset folder ``root`` holds :data:`SYNTHETIC_MARKER` (written by
    :mod:`core.synthetic` beside its stand-in files); False for ``None``."""
    return root is not None and (Path(root) / SYNTHETIC_MARKER).is_file()


def dataset_problem(data_cfg: dict[str, Any], bases: Sequence[Path] = (Path(),)) -> str | None:
    """Why the dataset of a validated ``data`` config cannot be read from local files, or
    None. A relative ``data.root`` (and the relative default Fashion-MNIST folder) is looked
    up under each of ``bases`` (default: the working directory; the launcher passes the
    checkout, where the simulation's processes run whatever its own working directory).
    For Fashion-MNIST, also checks the IDX files' headers and sizes (:func:`fmnist_problem`);
    for the torchvision datasets, that the folder exists. ``digits`` ships with scikit-learn;
    a torchvision dataset with ``data.download`` true is downloaded by the launcher
    (``fl_app.launch.prefetch``) or, in deployment, by each node."""
    name, root = data_cfg["dataset"], data_cfg.get("root")
    if name == "fmnist":
        files = fmnist_files(root, bases)
        if files:
            return fmnist_problem(files)
        if data_cfg.get("download"):  # downloaded into data.root by the launcher / each node
            return None if root else NO_DOWNLOAD_ROOT
        return fmnist_missing(root, bases)
    if name in TORCHVISION_DATASETS:
        if root is None:
            return f"data.root must point to the local {name} folder (torchvision layout)"
        found = any(f.is_dir() for f in located(Path(root), bases))
        if not found and not data_cfg.get("download"):
            return (
                f"data.root {root!r} is not a folder: put the {name} files there (torchvision "
                "layout) or set data.download=true on a machine with network access"
            )
    return None
