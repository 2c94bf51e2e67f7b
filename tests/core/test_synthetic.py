"""core/synthetic.py's stand-in files are what the project's loader reads as the real
datasets (shapes, sizes, labels), and only the folder it marks skips torchvision's MD5
checks."""

import numpy as np
import pytest
import torchvision.datasets.cifar as tv_cifar

from core.data import DataError, load_dataset
from core.datafiles import SYNTHETIC_MARKER, marked_synthetic
from core.synthetic import WRITERS, write_cifar10, write_synthetic
from fl_app.config import load_config

SHAPES = {  # (channels, height, width) the loader gives each dataset's images
    "cifar10": (3, 32, 32),
    "cifar100": (3, 32, 32),
    "svhn": (3, 32, 32),
    "mnist": (1, 28, 28),
    "fmnist": (1, 28, 28),
}


def _data_cfg(dataset, root):
    return load_config("smoke", "fedavg", f"data.dataset={dataset} data.root={root}")["data"]


@pytest.mark.parametrize("dataset", sorted(WRITERS))
def test_the_loader_reads_each_stand_in_as_its_dataset(dataset, tmp_path):
    """Every image of the files, in the dataset's shape, uint8; labels within its classes
    (all of CIFAR-10's ten in 53 images)."""
    write_synthetic(dataset, tmp_path, 53, 21)
    assert marked_synthetic(tmp_path)
    cfg = {**_data_cfg(dataset, tmp_path), "train_subset": None, "test_subset": None}
    train, test = load_dataset(cfg)
    assert train.x.shape == (53, *SHAPES[dataset]) and test.x.shape == (21, *SHAPES[dataset])
    assert train.x.dtype == np.uint8 and len(train.y) == 53 and len(test.y) == 21
    classes = cfg["num_classes"]
    assert min(train.y.min(), test.y.min()) >= 0
    assert train.y.max() < classes and test.y.max() < classes
    if classes == 10:
        assert sorted(set(train.y.tolist())) == list(range(10))


def test_cifar10_spreads_its_images_over_five_batches_and_needs_five(tmp_path):
    write_cifar10(tmp_path, 12, 3)
    folder = tmp_path / "cifar-10-batches-py"
    assert sorted(p.name for p in folder.iterdir()) == [
        "batches.meta",
        *(f"data_batch_{i}" for i in range(1, 6)),
        "test_batch",
    ]
    with pytest.raises(ValueError, match="five training batches"):
        write_cifar10(tmp_path / "small", 4, 3)
    with pytest.raises(ValueError, match="no synthetic writer"):
        write_synthetic("digits", tmp_path / "digits", 10, 10)


def test_without_the_marker_torchvision_checks_the_md5_and_refuses_them(tmp_path):
    """The marker is what lets the stand-ins through: removed, torchvision's MD5 check
    stands (the loader's data error); after a marked folder is read, the check is
    torchvision's own again."""
    original = tv_cifar.check_integrity
    marked, unmarked = tmp_path / "marked", tmp_path / "unmarked"
    write_cifar10(marked, 10, 5)
    write_cifar10(unmarked, 10, 5)
    (unmarked / SYNTHETIC_MARKER).unlink()
    assert len(load_dataset(_data_cfg("cifar10", marked))[0]) == 10
    assert tv_cifar.check_integrity is original
    with pytest.raises(DataError, match="cifar10 not found under"):
        load_dataset(_data_cfg("cifar10", unmarked))
