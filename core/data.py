"""Datasets, partitions and client splits.

Real datasets only, read from local files: Fashion-MNIST from Debian's
``dataset-fashion-mnist`` IDX files (or a torchvision-style root), MNIST/CIFAR-10/100/SVHN
through torchvision from a local root (downloaded only when ``data.download`` is true), and
scikit-learn's bundled ``digits`` for fast tests. Partitioning uses flwr-datasets'
partitioners over an in-memory label table; partitions are seeded and can be saved to and
loaded from an ``.npz`` index file so that every run and every machine gets identical splits;
the file records the settings that produced it, and a run with other settings is refused.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import logging
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.datafiles import (
    IDX_READ_ERRORS,
    NO_DOWNLOAD_ROOT,
    fmnist_files,
    fmnist_missing,
    idx_dims,
    idx_problem,
    located,
    marked_synthetic,
    pair_problem,
    unreadable,
)
from core.params import Config, ConfigError

log = logging.getLogger("fl_app").getChild(__name__)  # the project's logger (ServerApp handlers)

DATASETS = ("fmnist", "mnist", "cifar10", "cifar100", "svhn", "digits")
PARTITIONS = ("iid", "dirichlet", "shards", "pathological", "size_skew", "size_dirichlet")

# Per-channel mean/std used to standardise inputs.
NORMALIZATION = {
    "fmnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "digits": ((0.2,), (0.33,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
}


class DataError(ConfigError):
    """A dataset is missing, truncated or cannot be split as asked."""


@dataclass(frozen=True)
class ArrayDataset:
    """Images as uint8 ``(N, C, H, W)`` and int64 labels ``(N,)``."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, idx: np.ndarray) -> ArrayDataset:
        return ArrayDataset(self.x[idx], self.y[idx])


@dataclass(frozen=True)
class TensorSplit:
    """Standardised float32 images and int64 labels, ready for training."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class ClientData:
    """One client's local train and test splits."""

    train: TensorSplit
    test: TensorSplit


# --------------------------------------------------------------------------- loading
def _read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped); raise DataError if it is truncated or corrupt."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except IDX_READ_ERRORS as err:
        raise DataError(unreadable(path, err)) from err
    problem = idx_problem(path, raw, len(raw))
    if problem:
        raise DataError(problem)
    dims = idx_dims(raw)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def _load_fmnist(root: str | None) -> tuple[ArrayDataset, ArrayDataset]:
    files = fmnist_files(root)
    if files is None:
        raise DataError(fmnist_missing(root))
    out = []
    for split in ("train", "test"):
        img_path, lab_path = files[split]
        x, y = _read_idx(img_path), _read_idx(lab_path)
        problem = pair_problem(img_path, x.shape, lab_path, y.shape)
        if problem:
            raise DataError(problem)
        out.append(ArrayDataset(x[:, None, :, :], y.astype(np.int64)))
    return out[0], out[1]


def _load_digits() -> tuple[ArrayDataset, ArrayDataset]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    imgs = torch.from_numpy(bunch.images.astype(np.float32) / 16.0)[:, None]
    imgs = torch.nn.functional.interpolate(imgs, size=(28, 28), mode="bilinear")
    x = (imgs.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    y = bunch.target.astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(y))
    cut = int(0.75 * len(y))
    return ArrayDataset(x[perm[:cut]], y[perm[:cut]]), ArrayDataset(x[perm[cut:]], y[perm[cut:]])


@contextlib.contextmanager
def _integrity_is_presence() -> Iterator[None]:
    """Within it, torchvision's integrity check of the CIFAR and SVHN files (an MD5 sum of
    the real files) is "the file exists"; restored on exit. For :mod:`core.synthetic`'s
    stand-ins, which have the real files' names and format but not their bytes."""
    import torchvision.datasets.cifar as cifar
    import torchvision.datasets.svhn as svhn

    def present(fpath: str, md5: str | None = None) -> bool:
        return os.path.isfile(fpath)

    saved = cifar.check_integrity, svhn.check_integrity
    cifar.check_integrity = svhn.check_integrity = present
    try:
        yield
    finally:
        cifar.check_integrity, svhn.check_integrity = saved


def _load_torchvision(name: str, root: str | None, download: bool) -> tuple[ArrayDataset, ...]:
    """``name``'s (train, test) read through torchvision from ``root`` (downloaded there when
    ``download``); DataError when they are missing or a download fails. A ``root`` marked
    synthetic (:func:`core.datafiles.marked_synthetic`) is read without torchvision's MD5
    checks, with a warning."""
    import torchvision.datasets as tvd

    if root is None:
        raise DataError(f"data.root must point to the local {name} folder (torchvision layout)")
    checks: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
    if marked_synthetic(root):
        log.warning("%s under %s: synthetic stand-in files, read without MD5 checks", name, root)
        checks = _integrity_is_presence
    out = []
    for train in (True, False):
        try:
            with checks():
                if name == "svhn":
                    ds = tvd.SVHN(root, split="train" if train else "test", download=download)
                    x, y = np.asarray(ds.data), np.asarray(ds.labels)
                else:
                    kind = {"mnist": tvd.MNIST, "cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100}
                    ds = kind[name](root, train=train, download=download)
                    x, y = np.asarray(ds.data), np.asarray(ds.targets)
        except (RuntimeError, OSError, http.client.HTTPException) as err:  # missing, or download
            if download:  # torchvision's MNIST raises RuntimeError when every mirror fails
                raise DataError(
                    f"could not download {name} into {root}: {err}. Download it on a "
                    "machine with network access and copy it there (torchvision layout), or "
                    "fix the network, then run again"
                ) from err
            raise DataError(
                f"{name} not found under {root}: {err}. Put the files there or set "
                "data.download=true on a machine with network access."
            ) from err
        if x.ndim == 3:  # MNIST: (N, H, W)
            x = x[:, None]
        elif x.shape[-1] == 3:  # CIFAR: (N, H, W, C)
            x = x.transpose(0, 3, 1, 2)
        out.append(ArrayDataset(np.ascontiguousarray(x, dtype=np.uint8), y.astype(np.int64)))
    return out[0], out[1]


def fetch_dataset(name: str, root: Path | None) -> None:
    """Download a dataset of :data:`core.datafiles.DOWNLOADABLE` into ``root`` now
    (nothing if its files are there): the launcher does it once, before the simulation's
    clients, which would otherwise each download it at the same time into the same folder.
    DataError if that fails."""
    if name == "fmnist":
        _fetch_fmnist(None if root is None else str(root))
    else:
        _load_torchvision(name, None if root is None else str(root), download=True)


def _fetch_fmnist(root: str | None) -> None:
    """Fashion-MNIST's four IDX files into ``<root>/FashionMNIST/raw`` through torchvision;
    nothing when :func:`core.datafiles.fmnist_files` finds them (under ``root``, or in the
    default folders without one); without them and without ``root``, a DataError."""
    import torchvision.datasets as tvd

    if fmnist_files(root) is not None:
        return
    if root is None:
        raise DataError(NO_DOWNLOAD_ROOT)
    try:
        for train in (True, False):
            tvd.FashionMNIST(root, train=train, download=True)
    except (RuntimeError, OSError, http.client.HTTPException) as err:  # a mirror, the folder
        raise DataError(
            f"could not download fmnist into {root}: {str(err).strip()}. Copy the four IDX "
            f"files (train-images-idx3-ubyte.gz, ...) from a machine with network access into "
            f"{root}, install Debian's dataset-fashion-mnist, or fix the network, then run again"
        ) from err


@lru_cache(maxsize=4)
def _load_cached(name: str, root: str | None, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    if name == "fmnist":
        if download:
            _fetch_fmnist(root)
        return _load_fmnist(root)
    if name == "digits":
        return _load_digits()
    if name in DATASETS:
        return _load_torchvision(name, root, download)  # type: ignore[return-value]
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def _subset(ds: ArrayDataset, n: int | None, seed: int) -> ArrayDataset:
    if n is None or n >= len(ds):
        return ds
    idx = np.sort(np.random.default_rng(seed).permutation(len(ds))[:n])
    return ds.subset(idx)


def _check_labels(name: str, train: ArrayDataset, test: ArrayDataset, num_classes: int) -> None:
    """Raise DataError when a label falls outside ``0..num_classes-1`` (the model's outputs)."""
    ys = [y for y in (train.y, test.y) if len(y)]
    if not ys:
        return
    low, high = min(int(y.min()) for y in ys), max(int(y.max()) for y in ys)
    if low < 0 or high >= num_classes:
        raise DataError(
            f"{name} has labels {low}..{high}, but data.num_classes = {num_classes} gives the "
            f"model outputs for labels 0..{num_classes - 1} only; set data.num_classes = "
            f"{high + 1} (or use a dataset whose labels fit)"
        )
    if high + 1 < num_classes:
        log.warning(
            "%s has labels %d..%d, fewer than data.num_classes = %d: the model gets %d unused "
            "outputs",
            name,
            low,
            high,
            num_classes,
            num_classes - high - 1,
        )


def load_dataset(data_cfg: dict[str, Any], seed: int = 0) -> tuple[ArrayDataset, ArrayDataset]:
    """The (train, test) datasets named by ``data_cfg`` (cached per process)."""
    train, test = _load_cached(data_cfg["dataset"], data_cfg.get("root"), data_cfg["download"])
    expected = (data_cfg["channels"], data_cfg["image_size"], data_cfg["image_size"])
    if train.x.shape[1:] != expected:
        raise DataError(
            f"{data_cfg['dataset']} images have shape {train.x.shape[1:]}, but the config says "
            f"channels={expected[0]} image_size={expected[1]}"
        )
    _check_labels(data_cfg["dataset"], train, test, data_cfg["num_classes"])
    return _subset(train, data_cfg["train_subset"], seed), _subset(
        test, data_cfg["test_subset"], seed + 1
    )


def to_tensors(ds: ArrayDataset, dataset: str) -> TensorSplit:
    """Standardise uint8 images into float32 tensors."""
    mean, std = NORMALIZATION[dataset]
    x = torch.from_numpy(np.array(ds.x, copy=True)).float().div_(255.0)  # IDX buffers are read-only
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return TensorSplit((x - m) / s, torch.from_numpy(ds.y))


# ----------------------------------------------------------------------- partitioning
def dirichlet_sizes(n: int, k: int, alpha: float, min_size: int, seed: int) -> list[int]:
    """Client sizes of ``size_dirichlet``: each of the ``k`` clients gets ``min_size``
    samples plus a Dirichlet(α·1_k) share of the other ``n − k·min_size`` (largest-remainder
    rounding), so the sizes sum to ``n``. Small α gives a few large clients and many small
    ones, large α near-equal sizes (FedCCL's imbalanced inter-domain settings). Seeded.
    Raises DataError when ``k·min_size > n``."""
    spare = n - k * min_size
    if spare < 0:
        raise DataError(
            f"data.partition=size_dirichlet: num_clients * data.min_partition_size = "
            f"{k} * {min_size} exceeds the {n} training samples; "
            + PARTITION_ADVICE["size_dirichlet"]
        )
    share = np.random.default_rng(seed).dirichlet(np.full(k, alpha)) * spare
    if not np.isfinite(share).all():  # α so small that the draw underflows
        raise DataError(f"data.alpha = {alpha} is too small for size_dirichlet; raise it")
    sizes = np.floor(share).astype(np.int64)
    sizes[np.argsort(sizes - share)[: spare - int(sizes.sum())]] += 1  # largest remainders
    return [int(v) + min_size for v in sizes]


def _partitioner(cfg: dict[str, Any], num_partitions: int, seed: int, n: int) -> Any:
    import flwr_datasets.partitioner as fp

    scheme = cfg["partition"]
    if scheme == "iid":
        return fp.IidPartitioner(num_partitions)
    if scheme == "dirichlet":
        return fp.DirichletPartitioner(
            num_partitions,
            partition_by="label",
            alpha=cfg["alpha"],
            min_partition_size=cfg["min_partition_size"],
            self_balancing=False,
            seed=seed,
        )
    if scheme == "shards":
        return fp.ShardPartitioner(
            num_partitions,
            partition_by="label",
            num_shards_per_partition=cfg["shards_per_client"],
            seed=seed,
        )
    if scheme == "pathological":
        return fp.PathologicalPartitioner(
            num_partitions,
            partition_by="label",
            num_classes_per_partition=cfg["classes_per_client"],
            seed=seed,
        )
    if scheme == "size_skew":
        cls = {
            "linear": fp.LinearPartitioner,
            "square": fp.SquarePartitioner,
            "exponential": fp.ExponentialPartitioner,
        }[cfg["size_skew"]]
        return cls(num_partitions)
    if scheme == "size_dirichlet":  # consecutive runs of the shuffled table: IID labels
        sizes = dirichlet_sizes(n, num_partitions, cfg["alpha"], cfg["min_partition_size"], seed)
        return fp.SizePartitioner(sizes)
    raise DataError(f"unknown data.partition {scheme!r}; choose one of {', '.join(PARTITIONS)}")


# What to change when a partition scheme cannot split the data as asked (config key names).
PARTITION_ADVICE = {
    "iid": "lower num_clients or raise data.train_subset",
    "dirichlet": (
        "raise data.alpha (less label skew), lower num_clients, or set data.min_partition_size "
        "to a size every client can reach (>= 1 rules out empty clients)"
    ),
    "shards": (
        "lower num_clients or data.shards_per_client, or raise data.train_subset "
        "(num_clients * data.shards_per_client must not exceed the training samples)"
    ),
    "pathological": (
        "lower num_clients or data.classes_per_client, or raise data.train_subset "
        "(every class needs at least as many samples as clients it is dealt to)"
    ),
    "size_skew": (
        "lower num_clients, choose a milder data.size_skew (linear < square < exponential) "
        "or raise data.train_subset"
    ),
    "size_dirichlet": (
        "lower num_clients or data.min_partition_size (>= 1), or raise data.train_subset"
    ),
}


def _check_partition_request(
    labels: np.ndarray, num_partitions: int, data_cfg: dict[str, Any]
) -> None:
    """Refuse requests the partitioner would fail on obscurely (e.g. ZeroDivisionError)."""
    n, scheme = len(labels), data_cfg["partition"]
    if scheme == "size_dirichlet" and data_cfg["min_partition_size"] < 1:
        raise DataError(
            "data.partition=size_dirichlet needs data.min_partition_size >= 1 (the size every "
            f"client gets before its Dirichlet share), got {data_cfg['min_partition_size']}"
        )
    if scheme == "shards":
        shards = num_partitions * data_cfg["shards_per_client"]
        if shards > n:
            raise DataError(
                f"data.partition=shards needs num_clients * data.shards_per_client = "
                f"{num_partitions} * {data_cfg['shards_per_client']} = {shards} shards of at "
                f"least one sample, but there are only {n} training samples; "
                + PARTITION_ADVICE["shards"]
            )
    if scheme == "pathological":
        classes = len(np.unique(labels))
        if data_cfg["classes_per_client"] > classes:
            raise DataError(
                f"data.partition=pathological: data.classes_per_client = "
                f"{data_cfg['classes_per_client']} exceeds the {classes} classes present in the "
                f"{n} training samples; lower data.classes_per_client"
                + (" or raise data.train_subset" if data_cfg.get("train_subset") else "")
            )


def partition_indices(
    labels: np.ndarray, num_partitions: int, data_cfg: dict[str, Any], seed: int
) -> list[np.ndarray]:
    """Split sample indices ``0..len(labels)-1`` into ``num_partitions`` client partitions.

    Uses the flwr-datasets partitioner named by ``data_cfg['partition']``. The index table is
    shuffled with ``seed`` first, so order-based partitioners (IID, size skew) are seeded too.
    Raises DataError when there are fewer samples than partitions or a partition is empty.
    """
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    n = len(labels)
    if num_partitions > n:
        raise DataError(
            f"cannot split {n} training samples into {num_partitions} clients; "
            "lower num_clients or raise data.train_subset"
        )
    _check_partition_request(labels, num_partitions, data_cfg)
    order = np.random.default_rng(seed).permutation(n)
    table = Dataset.from_dict({"idx": order, "label": labels[order]})
    part = _partitioner(data_cfg, num_partitions, seed, n)
    part.dataset = table
    try:
        out = [
            np.sort(np.asarray(part.load_partition(i)["idx"], dtype=np.int64))
            for i in range(num_partitions)
        ]
    except (ValueError, ZeroDivisionError) as err:
        raise DataError(
            f"data.partition={data_cfg['partition']} cannot split {n} training samples into "
            f"num_clients = {num_partitions} clients; "
            f"{PARTITION_ADVICE.get(data_cfg['partition'], 'lower num_clients')} "
            f"(flwr-datasets: {err})"
        ) from err
    empty = [i for i, p in enumerate(out) if len(p) == 0]
    if empty:
        raise DataError(
            f"clients {empty} received no samples with data.partition={data_cfg['partition']}; "
            + PARTITION_ADVICE.get(data_cfg["partition"], "lower num_clients")
        )
    return out


# Settings that determine a partition file's contents besides the scheme's own parameters.
# Not among them: test_fraction, domain, test_subset (applied after the file is read) and
# root/download (where the same dataset is read from).
PARTITION_PARAMS = {
    "iid": (),
    "dirichlet": ("alpha", "min_partition_size"),
    "shards": ("shards_per_client",),
    "pathological": ("classes_per_client",),
    "size_skew": ("size_skew",),
    "size_dirichlet": ("alpha", "min_partition_size"),
}
_SETTINGS_KEY = "settings"


def partition_settings(
    data_cfg: dict[str, Any], num_partitions: int, seed: int, num_samples: int
) -> dict[str, Any]:
    """The settings that decide which sample goes to which client (keys as in the config)."""
    scheme = data_cfg["partition"]
    out: dict[str, Any] = {
        "data.dataset": data_cfg["dataset"],
        "data.train_subset": data_cfg.get("train_subset"),
        "training samples": int(num_samples),
        "num_clients": int(num_partitions),
        "seed": int(seed),
        "data.partition": scheme,
    }
    for key in PARTITION_PARAMS.get(scheme, ()):
        out[f"data.{key}"] = data_cfg[key]
    return out


def save_partitions(
    path: Path, parts: list[np.ndarray], settings: dict[str, Any] | None = None
) -> None:
    """Write client index arrays to an ``.npz`` file (``client_0``, ``client_1``, ...) and,
    when given, the settings that produced them (a JSON string in array ``settings``).

    The file is written under a temporary name and renamed into place, so a concurrent reader
    never sees half a file; the name is used exactly as given (no ``.npz`` is appended).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {f"client_{i}": np.asarray(p) for i, p in enumerate(parts)}
    if settings is not None:
        arrays[_SETTINGS_KEY] = np.array(json.dumps(settings, sort_keys=True))
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, allow_pickle=False, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_NPZ_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error)


def _open_npz(path: Path, what: str) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` archive, read without pickle; DataError naming ``path``."""
    try:
        z = np.load(path, allow_pickle=False)
    except _NPZ_ERRORS as err:
        raise DataError(f"{path}: cannot read it as a .npz archive ({err}); {what}") from err
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise DataError(f"{path} is a single .npy array, not a .npz archive; {what}")
    try:
        with z:
            return {k: np.asarray(z[k]) for k in z.files}
    except _NPZ_ERRORS as err:
        raise DataError(f"{path}: cannot read its arrays ({err}); {what}") from err


def _settings_diff(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    keys = list(current) + [k for k in stored if k not in current]
    return [
        f"{k}: file {stored.get(k, '(not used)')!r}, config {current.get(k, '(not used)')!r}"
        for k in keys
        if stored.get(k, "(not used)") != current.get(k, "(not used)")
    ]


def load_partitions(
    path: Path,
    num_partitions: int,
    num_samples: int,
    settings: dict[str, Any] | None = None,
) -> list[np.ndarray]:
    """Read an index file written by :func:`save_partitions`, checking it fits the data and,
    when ``settings`` is given, that it was written with those settings (DataError listing
    every difference otherwise). Files written without settings cannot be checked: they are
    used with a warning."""
    redo = "delete it to re-partition, or point data.partition_file at another file"
    arrays = _open_npz(path, redo)
    clients = {k for k in arrays if k.startswith("client_")}
    names = [f"client_{i}" for i in range(len(clients))]
    if set(names) != clients or set(arrays) - clients - {_SETTINGS_KEY}:
        raise DataError(
            f"{path} is not a partition file (arrays {sorted(arrays)}, expected client_0.."
            f"client_{{N-1}} and {_SETTINGS_KEY!r}); {redo}"
        )
    if settings is not None:
        if _SETTINGS_KEY not in arrays:
            log.warning(
                "%s records no partition settings (written by an older version), so it cannot "
                "be checked against this run's settings %s; using it as it is. Delete it to "
                "rewrite it with its settings recorded.",
                path,
                settings,
            )
        else:
            try:
                stored = json.loads(str(arrays[_SETTINGS_KEY]))
                if not isinstance(stored, dict):
                    raise ValueError("not a JSON object")
            except ValueError as err:
                raise DataError(f"{path}: unreadable {_SETTINGS_KEY!r} ({err}); {redo}") from err
            diff = _settings_diff(stored, settings)
            if diff:
                raise DataError(
                    f"data.partition_file {path} was written with other partition settings "
                    f"than this run's: {'; '.join(diff)}. Its partitions would silently replace "
                    "the configured ones: delete the file to re-partition with the current "
                    "settings (it is rewritten on the next run), point data.partition_file at "
                    "another file, or restore the settings the file was written with."
                )
    parts = []
    for name in names:
        p = arrays[name]
        if p.ndim != 1 or not np.issubdtype(p.dtype, np.integer):
            raise DataError(
                f"{path}: {name} must be a 1-D integer index array, got {p.dtype} {p.shape}; {redo}"
            )
        parts.append(p.astype(np.int64))
    if len(parts) != num_partitions:
        raise DataError(
            f"{path} holds {len(parts)} partitions, the run has {num_partitions}; {redo}"
        )
    if any(len(p) and (p.min() < 0 or p.max() >= num_samples) for p in parts):
        raise DataError(
            f"{path} indexes samples outside the dataset of {num_samples} samples; {redo}"
        )
    return parts


def partition_file_problem(cfg: Config, base: Path = Path()) -> str | None:
    """Why the run's existing ``data.partition_file`` (relative: under ``base``) cannot serve
    this config, found without loading the dataset (the launcher asks before Flower starts):
    not a partition file, written with other settings, another number of clients. The
    number of training samples is taken from the file; the clients check it against the
    data when they load it. None when there is no such file or it fits."""
    pfile = cfg["data"].get("partition_file")
    if not pfile:
        return None
    [path] = located(Path(str(pfile)), (base,))
    if not path.is_file():
        return None
    try:
        arrays = _open_npz(path, "delete it to re-partition")
        raw = arrays.get(_SETTINGS_KEY)
        stored = json.loads(str(raw)) if raw is not None else {}
        n = int(stored.get("training samples", 0)) if isinstance(stored, dict) else 0
        settings = partition_settings(cfg["data"], cfg["num_clients"], cfg["seed"], n)
        load_partitions(path, cfg["num_clients"], n or np.iinfo(np.int64).max, settings)
    except DataError as err:
        return str(err)
    except ValueError as err:  # the settings are checked properly by load_partitions
        return f"{path}: unreadable partition settings ({err})"
    return None


def local_split(idx: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of one client's indices into local train and test parts; the train
    part keeps at least one sample (a client with no training data could only fail)."""
    perm = np.random.default_rng(seed).permutation(idx)
    n_test = min(int(round(test_fraction * len(idx))), len(idx) - 1) if len(idx) > 1 else 0
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def partitions_of(
    data_cfg: dict[str, Any], num_partitions: int, seed: int, *, save: bool = True
) -> list[np.ndarray]:
    """What every client computes: the training set of ``data_cfg`` (shape and labels
    checked) split into ``num_partitions`` partitions, read from ``data.partition_file``
    when it exists (checked against this data and these settings), else partitioned and,
    with ``save``, written there. Raises DataError naming what to change."""
    train, _ = load_dataset(data_cfg, seed)
    pfile = data_cfg.get("partition_file")
    settings = partition_settings(data_cfg, num_partitions, seed, len(train))
    path = Path(pfile).expanduser() if pfile else None
    if path is not None and path.is_file():
        return load_partitions(path, num_partitions, len(train), settings)
    parts = partition_indices(train.y, num_partitions, data_cfg, seed)
    if path is not None and save:
        save_partitions(path, parts, settings)
    return parts


@lru_cache(maxsize=8)
def _partitions_cached(key: str, cfg_items: tuple, num_partitions: int, seed: int) -> tuple:
    return tuple(partitions_of(dict(cfg_items), num_partitions, seed))


def client_partitions(cfg: Config, num_partitions: int | None = None) -> list[np.ndarray]:
    """Indices (into the training set) of every client's partition, cached per process."""
    n = num_partitions or cfg["num_clients"]
    items = tuple(
        sorted((k, v if not isinstance(v, list) else tuple(v)) for k, v in cfg["data"].items())
    )
    return list(_partitions_cached("parts", items, n, cfg["seed"]))


def domain_noise_seed(seed: int, pid: int, split: int) -> int:
    """The noise domain's generator seed for client ``pid``'s ``split`` (0 train, 1 test) in
    a run seeded ``seed``: every split and run draws its own noise."""
    return int(np.random.SeedSequence([seed, pid, split, 1000]).generate_state(1)[0])


def _domain_transform(
    x: torch.Tensor,
    domain: str,
    pid: int,
    num_clients: int,
    *,
    dataset: str,
    noise_seed: int,
) -> torch.Tensor:
    """Client ``pid``'s domain shift (inter-domain heterogeneity) of standardised images
    ``x`` of ``dataset``; identity for 'none'.

    ``level = pid/(num_clients − 1)``: rotation by ``90°·level`` (the uncovered corners get
    the background, the standardised value of a black pixel), additive Gaussian noise of std
    ``0.8·level`` (drawn from ``noise_seed``), and contrast scaled by ``0.3 + 1.4·level``
    (low to high, the middle client unshifted). ``mixed`` cycles rotation, contrast, noise
    by ``pid mod 3`` at a strength growing with ``pid`` (client 0 unshifted); there
    contrast is scaled by ``1 − 0.7·level``, so that no contrast client lands on the
    identity (with 0.3 + 1.4·level, client (num_clients − 1)/2 would, sharing client 0's
    domain, e.g. client 1 of 3)."""
    if domain == "none":
        return x
    kind = ("rotation", "contrast", "noise")[pid % 3] if domain == "mixed" else domain
    level = pid / max(1, num_clients - 1)
    if kind == "rotation":
        import torchvision.transforms.functional as tvf

        black = [-m / s for m, s in zip(*NORMALIZATION[dataset], strict=True)]
        return tvf.rotate(x, angle=90.0 * level, fill=black)
    if kind == "contrast":
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        factor = 1.0 - 0.7 * level if domain == "mixed" else 0.3 + 1.4 * level
        return (x - mean) * factor + mean
    gen = torch.Generator().manual_seed(noise_seed)
    return x + 0.8 * level * torch.randn(x.shape, generator=gen)


@lru_cache(maxsize=64)
def _client_data_cached(cfg_key: str, pid: int, cfg_frozen: Any) -> ClientData:
    cfg = cfg_frozen.value
    train, _ = load_dataset(cfg["data"], cfg["seed"])
    parts = client_partitions(cfg)
    tr_idx, te_idx = local_split(parts[pid], cfg["data"]["test_fraction"], cfg["seed"] + pid)
    name = cfg["data"]["dataset"]
    splits = []
    for split, idx in enumerate((tr_idx, te_idx)):
        t = to_tensors(train.subset(idx), name)
        noise_seed = domain_noise_seed(cfg["seed"], pid, split)
        x = _domain_transform(
            t.x, cfg["data"]["domain"], pid, cfg["num_clients"], dataset=name, noise_seed=noise_seed
        )
        splits.append(TensorSplit(x.contiguous(), t.y))
    return ClientData(splits[0], splits[1])


class _Frozen:
    """Hashable-by-key wrapper so a config dict can pass through lru_cache."""

    def __init__(self, key: str, value: Config) -> None:
        self.key, self.value = key, value

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Frozen) and other.key == self.key


def _data_key(cfg: Config) -> str:
    return repr((sorted(cfg["data"].items()), cfg["seed"], cfg["num_clients"]))


def load_client_data(cfg: Config, pid: int) -> ClientData:
    """Client ``pid``'s local train/test tensors (cached per process: Ray actors serve many
    virtual clients)."""
    if not 0 <= pid < cfg["num_clients"]:
        raise DataError(f"partition id {pid} outside 0..{cfg['num_clients'] - 1}")
    key = _data_key(cfg)
    return _client_data_cached(key, pid, _Frozen(key, cfg))


def load_test_set(cfg: Config) -> TensorSplit:
    """The global (centralised) test set as tensors."""
    _, test = load_dataset(cfg["data"], cfg["seed"])
    return to_tensors(test, cfg["data"]["dataset"])


def label_counts(labels: np.ndarray | torch.Tensor, num_classes: int) -> np.ndarray:
    """Histogram of labels over ``num_classes`` classes."""
    arr = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    return np.bincount(arr, minlength=num_classes).astype(np.int64)


def _read_npz_split(path: Path, cfg: Config) -> ArrayDataset:
    """A node's ``train.npz``/``test.npz`` (untrusted): DataError naming the file and problem."""
    d = cfg["data"]
    expected = (d["channels"], d["image_size"], d["image_size"])
    layout = (
        f"expected arrays x (uint8 images, shape (N, {expected[0]}, {expected[1]}, "
        f"{expected[2]})) and y (integer labels 0..{d['num_classes'] - 1}, shape (N,))"
    )
    arrays = _open_npz(path, layout)
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise DataError(
            f"{path}: missing array(s) {', '.join(missing)} (it holds {sorted(arrays) or 'none'}); "
            + layout
        )
    x, y = arrays["x"], arrays["y"]
    if x.ndim == 3 and expected[0] == 1:
        x = x[:, None]
    if x.dtype != np.uint8 or x.shape[1:] != expected:
        raise DataError(f"{path}: x is {x.dtype} of shape {x.shape}; {layout}")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: y is {y.dtype} of shape {y.shape}; {layout}")
    if len(x) != len(y):
        raise DataError(f"{path}: x holds {len(x)} images but y {len(y)} labels; {layout}")
    if len(y) == 0:
        raise DataError(f"{path}: holds no samples; {layout}")
    y = y.astype(np.int64)
    if y.min() < 0 or y.max() >= d["num_classes"]:
        raise DataError(
            f"{path}: labels {int(y.min())}..{int(y.max())} lie outside 0..{d['num_classes'] - 1} "
            f"(data.num_classes = {d['num_classes']})"
        )
    return ArrayDataset(np.ascontiguousarray(x), y)


def load_node_data(cfg: Config, data_dir: str | Path, seed: int = 0) -> ClientData:
    """A node's own data (deployment): ``<data_dir>/train.npz`` with arrays ``x`` (uint8
    images) and ``y`` (labels), and optionally ``test.npz``; without it the local test split
    is taken from train.npz (``data.test_fraction``)."""
    root = Path(data_dir)
    if not (root / "train.npz").is_file():
        raise DataError(f"node data dir {root} has no train.npz (arrays x: uint8 images, y)")
    train = _read_npz_split(root / "train.npz", cfg)
    if (root / "test.npz").is_file():
        test = _read_npz_split(root / "test.npz", cfg)
    else:
        tr, te = local_split(np.arange(len(train)), cfg["data"]["test_fraction"], seed)
        train, test = train.subset(tr), train.subset(te)
    name = cfg["data"]["dataset"]
    return ClientData(to_tensors(train, name), to_tensors(test, name))
