from pathlib import Path

import pytest

from fl_app.datafiles import FMNIST_FILES, dataset_problem, fmnist_files


def _fake_fmnist(folder: Path, gz: bool = False) -> Path:
    """The four IDX file names (empty files: only their presence is checked here)."""
    folder.mkdir(parents=True)
    for stems in FMNIST_FILES.values():
        for stem in stems:
            (folder / (stem + (".gz" if gz else ""))).touch()
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
        ({"dataset": "mnist", "root": "/"}, None),
    ],
)
def test_torchvision_and_bundled_datasets(cfg, problem):
    found = dataset_problem(cfg)
    assert found is None if problem is None else problem in found
