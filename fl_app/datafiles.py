"""Where a dataset's local files are, without loading them (and without importing torch).

:mod:`fl_app.data` reads the files these functions find; the launcher calls
:func:`dataset_problem` before Flower starts, so a missing dataset stops a simulation at once
with one line instead of after Flower's and Ray's start-up and tracebacks.
"""

from __future__ import annotations

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


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
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
        "/usr/share/datasets/fashion-mnist) or set data.root to a folder with the IDX files."
    )


def dataset_problem(data_cfg: dict[str, Any], bases: Sequence[Path] = (Path(),)) -> str | None:
    """Why the dataset of a validated ``data`` config cannot be read from local files, or
    None. A relative ``data.root`` (and the relative default Fashion-MNIST folder) is looked
    up under each of ``bases`` (default: the working directory; the launcher passes the
    checkout, where the simulation's processes run whatever its own working directory).
    Checks that the files exist, not their contents (:mod:`fl_app.data` checks those when it
    reads them). ``digits`` ships with scikit-learn; a torchvision dataset with
    ``data.download`` true is downloaded by the launcher (``fl_app.launch.prefetch``) or, in
    deployment, by each node."""
    name, root = data_cfg["dataset"], data_cfg.get("root")
    if name == "fmnist":
        return None if fmnist_files(root, bases) else fmnist_missing(root, bases)
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
