import gzip
import re
from pathlib import Path

import numpy as np
import pytest

from core.data import DataError, _load_fmnist
from core.datafiles import FMNIST_FILES, dataset_problem, fmnist_files, fmnist_problem


def _idx(dims: tuple[int, ...], cut: int = 0) -> bytes:
    """An unsigned-byte IDX file of these dimensions, less its last ``cut`` bytes."""
    header = bytes([0, 0, 8, len(dims)]) + np.array(dims, ">u4").tobytes()
    raw = header + bytes(int(np.prod(dims)))
    return raw[: len(raw) - cut]


def _fake_fmnist(folder: Path, gz: bool = False, n: int = 3) -> Path:
    """The four IDX files, ``n`` blank 28×28 images and labels each (gzipped or not)."""
    folder.mkdir(parents=True)
    for images, labels in FMNIST_FILES.values():
        for stem, dims in ((images, (n, 28, 28)), (labels, (n,))):
            raw = _idx(dims)
            (folder / (stem + (".gz" if gz else ""))).write_bytes(gzip.compress(raw) if gz else raw)
    return folder


def test_fmnist_files_in_the_root_or_its_torchvision_folder(tmp_path):
    _fake_fmnist(tmp_path / "flat", gz=True)
    _fake_fmnist(tmp_path / "tv" / "FashionMNIST" / "raw")
    flat = fmnist_files(str(tmp_path / "flat"))
    assert flat is not None and flat["test"][1].name == "t10k-labels-idx1-ubyte.gz"
    tv = fmnist_files(str(tmp_path / "tv"))
    assert tv is not None and tv["train"][0].parent.name == "raw"
    (tmp_path / "flat" / "train-labels-idx1-ubyte.gz").unlink()  # one file short: not found
    assert fmnist_files(str(tmp_path / "flat")) is None


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(
    ("file", "content", "problem"),
    [
        (None, None, None),
        (
            "t10k-images-idx3-ubyte",
            _idx((3, 28, 28), cut=5),
            r"truncated or corrupt \(2363 bytes, expected 2368\)",
        ),
        ("train-labels-idx1-ubyte", _idx((3,), cut=6), "truncated inside its header"),
        ("train-labels-idx1-ubyte", b"PK\x03\x04 not IDX", "is not an unsigned-byte IDX file"),
        ("t10k-labels-idx1-ubyte", _idx((4,)), "holds 3 images but .* 4 labels"),
        ("train-images-idx3-ubyte", _idx((3, 784)), "of 2 and 1 dimensions, not images"),
    ],
)
def test_fmnist_files_are_checked_before_a_run_as_the_loader_checks_them(
    tmp_path, gz, file, content, problem
):
    """The launcher's check (headers and sizes) and the loader refuse the same files, with
    the same message; a whole dataset passes both."""
    folder = _fake_fmnist(tmp_path / "fm", gz=gz)
    if file:
        path = folder / (file + (".gz" if gz else ""))
        path.write_bytes(gzip.compress(content) if gz else content)
    found = dataset_problem({"dataset": "fmnist", "root": str(folder)})
    if problem is None:
        assert found is None
        train, test = _load_fmnist(str(folder))
        assert train.x.shape == (3, 1, 28, 28) and test.y.dtype == np.int64
        return
    assert found is not None
    assert found.startswith(f"{folder}/") and re.search(problem, found), found
    with pytest.raises(DataError) as err:
        _load_fmnist(str(folder))
    assert str(err.value) == found


def test_a_gzip_stream_cut_short_is_reported_before_the_run(tmp_path):
    folder = _fake_fmnist(tmp_path / "fm", gz=True, n=200)
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-20])  # the end of the deflate stream and the trailer
    files = fmnist_files(str(folder))
    assert files is not None
    problem = fmnist_problem(files)
    assert problem is not None and problem.startswith(f"cannot read {path}: Compressed file ended")


def test_a_relative_root_is_looked_up_under_every_base(tmp_path, monkeypatch):
    _fake_fmnist(tmp_path / "b" / "fm")
    cfg = {"dataset": "fmnist", "root": "fm"}
    assert dataset_problem(cfg, bases=(tmp_path / "a", tmp_path / "b")) is None
    problem = dataset_problem(cfg, bases=(tmp_path / "a",))
    searched = f"Fashion-MNIST not found (searched {(tmp_path / 'a' / 'fm').resolve()})"
    assert problem is not None and searched in problem  # where it looked, resolved
    assert "apt-get install dataset-fashion-mnist" in problem
    monkeypatch.chdir(tmp_path / "b")  # no bases: the working directory
    assert dataset_problem(cfg) is None


@pytest.mark.parametrize(
    ("cfg", "problem"),
    [
        ({"dataset": "digits", "root": None}, None),
        ({"dataset": "cifar10", "root": None}, "data.root must point to the local cifar10"),
        ({"dataset": "svhn", "root": "/nonexistent"}, "'/nonexistent' is not a folder"),
        ({"dataset": "svhn", "root": "/nonexistent", "download": True}, None),
        ({"dataset": "fmnist", "root": "/nonexistent", "download": True}, None),
        ({"dataset": "mnist", "root": "/"}, None),
    ],
)
def test_torchvision_and_bundled_datasets(cfg, problem):
    found = dataset_problem(cfg)
    assert found is None if problem is None else problem in found


def test_fmnist_download_needs_a_folder_to_download_into(monkeypatch, tmp_path):
    """Where no default folder holds Fashion-MNIST, ``data.download=true`` without
    ``data.root`` is refused before anything starts; the missing-data message offers the
    download."""
    import core.datafiles as datafiles

    monkeypatch.setattr(datafiles, "FMNIST_ROOTS", (tmp_path / "none",))
    cfg = {"dataset": "fmnist", "root": None, "download": True}
    assert dataset_problem(cfg) == "data.download=true needs data.root: the folder to download into"
    problem = dataset_problem({**cfg, "download": False})
    assert problem is not None and "data.download=true" in problem
