import gzip

import numpy as np
import pytest
import torch

from fl_app.config import load_config
from fl_app.data import (
    DataError,
    _read_idx,
    client_partitions,
    load_client_data,
    load_dataset,
    local_split,
    partition_indices,
)


def _labels(n=2000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, size=n)


def _cfg(**kw):
    base = {
        "partition": "dirichlet",
        "alpha": 0.5,
        "min_partition_size": 5,
        "classes_per_client": 2,
        "shards_per_client": 2,
        "size_skew": "exponential",
    }
    return {**base, **kw}


def _skew(parts, labels, classes=10):
    """Mean total-variation distance between client label distributions and the global one."""
    glob = np.bincount(labels, minlength=classes) / len(labels)
    return np.mean(
        [
            0.5 * np.abs(np.bincount(labels[p], minlength=classes) / len(p) - glob).sum()
            for p in parts
        ]
    )


def test_partitions_cover_disjoint_and_reproducible():
    y = _labels()
    a = partition_indices(y, 8, _cfg(), seed=1)
    b = partition_indices(y, 8, _cfg(), seed=1)
    c = partition_indices(y, 8, _cfg(), seed=2)
    assert all(np.array_equal(x, z) for x, z in zip(a, b, strict=True))
    assert not all(np.array_equal(x, z) for x, z in zip(a, c, strict=True))
    allidx = np.concatenate(a)
    assert len(allidx) == len(np.unique(allidx)) == len(y)


def test_label_skew_grows_as_alpha_shrinks():
    y = _labels(5000)
    skews = [_skew(partition_indices(y, 10, _cfg(alpha=a), seed=0), y) for a in (100.0, 1.0, 0.1)]
    assert skews[0] < skews[1] < skews[2]
    assert skews[0] < 0.1 and skews[2] > 0.4


def test_iid_sizes_equal_and_pathological_classes():
    y = _labels()
    iid = partition_indices(y, 4, _cfg(partition="iid"), seed=0)
    assert {len(p) for p in iid} == {500}
    path = partition_indices(y, 5, _cfg(partition="pathological", classes_per_client=2), seed=0)
    assert all(len(np.unique(y[p])) <= 2 for p in path)


def test_size_skew_gives_unequal_sizes():
    sizes = [len(p) for p in partition_indices(_labels(), 5, _cfg(partition="size_skew"), 0)]
    assert max(sizes) > 3 * min(sizes)


def test_more_partitions_than_samples_is_a_clear_error():
    with pytest.raises(DataError, match="cannot split 5 training samples into 10 clients"):
        partition_indices(_labels(5), 10, _cfg(), seed=0)


def test_local_split_75_25_and_seeded():
    tr, te = local_split(np.arange(100), 0.25, seed=3)
    assert len(tr) == 75 and len(te) == 25 and not set(tr) & set(te)
    assert np.array_equal(local_split(np.arange(100), 0.25, 3)[1], te)


def test_truncated_idx_file_is_reported(tmp_path):
    path = tmp_path / "x-idx3-ubyte.gz"
    header = bytes([0, 0, 8, 3]) + np.array([10, 28, 28], ">u4").tobytes()
    path.write_bytes(gzip.compress(header + b"\0" * 100))
    with pytest.raises(DataError, match="truncated or corrupt"):
        _read_idx(path)


def test_missing_fmnist_root_says_how_to_install(tmp_path):
    cfg = load_config("smoke", "fedavg", {"data": {"root": str(tmp_path)}})
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset(cfg["data"])


def test_fmnist_loads_from_debian_package():
    cfg = load_config("smoke", "fedavg")
    train, test = load_dataset(cfg["data"], seed=0)
    assert train.x.shape == (3000, 1, 28, 28) and test.x.shape == (1000, 1, 28, 28)
    assert train.x.dtype == np.uint8 and set(np.unique(train.y)) == set(range(10))


def test_client_data_and_partition_file(tmp_path):
    pfile = tmp_path / "parts.npz"
    cfg = load_config("tiny", "fedavg", {"data": {"partition_file": str(pfile)}})
    parts = client_partitions(cfg)
    assert pfile.is_file()
    cfg2 = load_config("tiny", "fedavg", {"data": {"partition_file": str(pfile), "alpha": 0.3}})
    assert all(np.array_equal(a, b) for a, b in zip(parts, client_partitions(cfg2), strict=True))
    d = load_client_data(cfg, 0)
    assert len(d.train) + len(d.test) == len(parts[0])
    assert d.train.x.dtype.is_floating_point and abs(float(d.train.x.mean())) < 1.0


@pytest.mark.parametrize("domain", ["rotation", "contrast", "noise", "mixed"])
def test_domain_skew_gives_each_client_its_own_transformation(domain):
    plain = load_config("tiny", "fedavg")
    shifted = load_config("tiny", "fedavg", {"data": {"domain": domain}})
    a0, b0 = load_client_data(plain, 0), load_client_data(shifted, 0)
    a2, b2 = load_client_data(plain, 2), load_client_data(shifted, 2)
    assert torch.equal(a0.train.y, b0.train.y)  # same samples and labels
    assert not torch.allclose(a2.train.x, b2.train.x, atol=1e-3)  # client 2 is shifted
