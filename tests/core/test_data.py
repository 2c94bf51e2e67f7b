import gzip
import itertools
import json
import logging

import numpy as np
import pytest
import torch

from core.data import (
    NORMALIZATION,
    DataError,
    _domain_transform,
    _read_idx,
    client_partitions,
    dirichlet_sizes,
    domain_noise_seed,
    fetch_dataset,
    load_client_data,
    load_dataset,
    load_node_data,
    load_partitions,
    local_split,
    partition_file_problem,
    partition_indices,
)
from fl_app.config import load_config

FMNIST_NOISE0 = {"dataset": "fmnist", "noise_seed": 0}


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


def test_dirichlet_sizes_sum_to_n_keep_the_floor_and_follow_alpha():
    for alpha in (0.05, 1.0, 1000.0):
        for seed in range(3):
            sizes = dirichlet_sizes(1000, 7, alpha, 20, seed)
            assert sum(sizes) == 1000 and min(sizes) >= 20 and len(sizes) == 7
    assert dirichlet_sizes(1000, 7, 0.5, 20, 1) == dirichlet_sizes(1000, 7, 0.5, 20, 1)
    # 0.05: most of the spare samples go to one or two clients; 1000: near-equal sizes
    spread = {a: np.std(dirichlet_sizes(10_000, 10, a, 10, 0)) for a in (0.05, 1.0, 1000.0)}
    assert spread[0.05] > spread[1.0] > spread[1000.0] and spread[1000.0] < 50
    assert dirichlet_sizes(10, 5, 0.1, 2, 0) == [2] * 5  # nothing spare: every client at the floor
    with pytest.raises(DataError, match="5 \\* 3 exceeds the 10 training samples"):
        dirichlet_sizes(10, 5, 0.1, 3, 0)


def test_size_dirichlet_partition_has_unequal_sizes_and_iid_labels():
    """FedCCL's imbalanced inter-domain setting: sizes from Dirichlet(α), labels as in the
    whole set (unlike ``dirichlet``, which skews labels)."""
    y = _labels(20_000)
    cfg = _cfg(partition="size_dirichlet", alpha=0.5, min_partition_size=500)
    parts = partition_indices(y, 8, cfg, seed=0)
    sizes = [len(p) for p in parts]
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx)) == len(y)
    assert min(sizes) >= 500 and max(sizes) > 3 * min(sizes)
    assert sizes == dirichlet_sizes(len(y), 8, 0.5, 500, 0)
    assert _skew(parts, y) < 0.06  # IID labels: only sampling noise on the ≥ 500-sample clients
    assert _skew(partition_indices(y, 8, _cfg(alpha=0.5), seed=0), y) > 0.3  # vs label skew
    again = partition_indices(y, 8, cfg, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    with pytest.raises(DataError, match="min_partition_size >= 1"):
        partition_indices(y, 8, {**cfg, "min_partition_size": 0}, seed=0)


def test_more_partitions_than_samples_is_a_clear_error():
    with pytest.raises(DataError, match="cannot split 5 training samples into 10 clients"):
        partition_indices(_labels(5), 10, _cfg(), seed=0)


def test_local_split_75_25_and_seeded():
    tr, te = local_split(np.arange(100), 0.25, seed=3)
    assert len(tr) == 75 and len(te) == 25 and not set(tr) & set(te)
    assert np.array_equal(local_split(np.arange(100), 0.25, 3)[1], te)


@pytest.mark.parametrize(("n", "fraction"), [(2, 0.75), (4, 0.9), (3, 0.99), (1, 0.5)])
def test_local_split_keeps_a_training_sample(n, fraction):
    """round(0.75 * 2) = 2 used to leave the client no training data (FedCCL then failed
    on its empty feature matrix)."""
    tr, te = local_split(np.arange(n), fraction, seed=0)
    assert len(tr) >= 1 and len(tr) + len(te) == n


def test_truncated_idx_file_is_reported(tmp_path):
    path = tmp_path / "x-idx3-ubyte.gz"
    header = bytes([0, 0, 8, 3]) + np.array([10, 28, 28], ">u4").tobytes()
    path.write_bytes(gzip.compress(header + b"\0" * 100))
    with pytest.raises(DataError, match="truncated or corrupt"):
        _read_idx(path)


def test_idx_file_cut_inside_its_header_or_with_a_corrupt_gzip_stream_is_reported(tmp_path):
    short = tmp_path / "short-idx3-ubyte"
    short.write_bytes(bytes([0, 0, 8, 3]) + b"\0\0\0\x0a")  # 3 dimensions, one given
    with pytest.raises(DataError, match="truncated inside its header"):
        _read_idx(short)
    corrupt = tmp_path / "corrupt-idx1-ubyte.gz"
    packed = bytearray(gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 200]) + bytes(range(200))))
    packed[12] ^= 0xFF  # inside the deflate stream
    corrupt.write_bytes(bytes(packed))
    with pytest.raises(DataError, match="cannot read .*reinstall the dataset"):
        _read_idx(corrupt)


def test_missing_fmnist_root_says_how_to_install(tmp_path):
    cfg = load_config("smoke", "fedavg", {"data": {"root": str(tmp_path)}})
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset(cfg["data"])


def _write_idx(path, array):
    dims = np.array(array.shape, ">u4").tobytes()
    path.write_bytes(gzip.compress(bytes([0, 0, 8, array.ndim]) + dims + array.tobytes()))


def test_fmnist_downloads_into_data_root_once_with_data_download(tmp_path, monkeypatch):
    """Without root (no Debian package), ``data.download=true`` fetches Fashion-MNIST
    through torchvision into ``<data.root>/FashionMNIST/raw``, which the loader reads; the
    files found there are not fetched again, and a failed download is a DataError naming the
    folder and what to do."""
    import torchvision.datasets as tvd

    calls = []

    class FakeFashionMNIST:  # writes what torchvision's download leaves: gzipped IDX files
        def __init__(self, root, train, download):
            calls.append((root, train, download))
            raw = tmp_path / "fm" / "FashionMNIST" / "raw"
            raw.mkdir(parents=True, exist_ok=True)
            prefix, n = ("train", 60) if train else ("t10k", 20)
            images = np.random.default_rng(n).integers(0, 256, (n, 28, 28), dtype=np.uint8)
            _write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", images)
            _write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n, dtype=np.uint8) % 10)

    monkeypatch.setattr(tvd, "FashionMNIST", FakeFashionMNIST)
    root = str(tmp_path / "fm")
    cfg = load_config("smoke", "fedavg", f"data.root={root} data.download=true")
    train, test = load_dataset(cfg["data"])
    assert calls == [(root, True, True), (root, False, True)]
    assert train.x.shape == (60, 1, 28, 28) and test.x.shape == (20, 1, 28, 28)
    assert list(train.y[:12]) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    fetch_dataset("fmnist", tmp_path / "fm")  # the launcher's fetch: the files are there
    assert len(calls) == 2

    def offline(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(tvd, "FashionMNIST", offline)
    with pytest.raises(DataError, match=r"could not download fmnist into .*elsewhere.*network"):
        fetch_dataset("fmnist", tmp_path / "elsewhere")


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
    # Settings that do not decide the partition (alpha under iid, test_fraction) may change.
    cfg2 = load_config(
        "tiny",
        "fedavg",
        {"data": {"partition_file": str(pfile), "alpha": 0.3, "test_fraction": 0.5}},
    )
    assert all(np.array_equal(a, b) for a, b in zip(parts, client_partitions(cfg2), strict=True))
    d = load_client_data(cfg, 0)
    assert len(d.train) + len(d.test) == len(parts[0])
    assert d.train.x.dtype.is_floating_point and abs(float(d.train.x.mean())) < 1.0


def _pcfg(pfile, **data):
    over = {k: data.pop(k) for k in ("seed", "num_clients") if k in data}
    data = {"partition_file": str(pfile), "partition": "dirichlet", "alpha": 0.1, **data}
    return load_config("tiny", "fedavg", {"data": data, **over})


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"alpha": 100.0}, "data.alpha: file 0.1, config 100.0"),
        ({"min_partition_size": 7}, "data.min_partition_size: file 5, config 7"),
        ({"seed": 1}, "seed: file 0, config 1"),
        ({"num_clients": 4}, "num_clients: file 3, config 4"),
        ({"train_subset": 1000}, "data.train_subset: file None, config 1000"),
        ({"partition": "iid"}, "data.partition: file 'dirichlet', config 'iid'"),
        ({"partition": "shards"}, "data.shards_per_client: file '(not used)', config 2"),
    ],
)
def test_partition_file_refuses_changed_partition_settings(tmp_path, change, shown):
    pfile = tmp_path / "parts.npz"
    client_partitions(_pcfg(pfile))
    with pytest.raises(DataError, match="written with other partition settings") as err:
        client_partitions(_pcfg(pfile, **change))
    msg = str(err.value)
    assert shown in msg and str(pfile) in msg
    assert "delete the file" in msg and "point data.partition_file" in msg and "restore" in msg
    # the launcher finds the same before Flower starts, without loading the dataset (so
    # without the number of training samples, which the clients compare)
    early = partition_file_problem(_pcfg(pfile, **change))
    assert early is not None and shown in early and "written with other partition" in early
    assert partition_file_problem(_pcfg(pfile)) is None


def test_the_partition_file_check_reads_relative_paths_under_the_base(tmp_path):
    client_partitions(_pcfg(tmp_path / "parts.npz"))
    relative = _pcfg("parts.npz", alpha=100.0)
    assert "written with other partition settings" in partition_file_problem(relative, tmp_path)
    assert partition_file_problem(relative, tmp_path / "elsewhere") is None  # no file there
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert "cannot read it as a .npz" in partition_file_problem(_pcfg("bad.npz"), tmp_path)


def test_partition_file_round_trip_records_settings(tmp_path):
    pfile = tmp_path / "parts"  # no .npz suffix: written and read under exactly this name
    parts = client_partitions(_pcfg(pfile))
    assert pfile.is_file() and not (tmp_path / "parts.npz").exists()
    with np.load(pfile, allow_pickle=False) as z:
        stored = json.loads(str(z["settings"]))
    assert stored["data.alpha"] == 0.1 and stored["num_clients"] == 3 and stored["seed"] == 0
    again = client_partitions(_pcfg(pfile, test_fraction=0.5))  # another cache entry: reads
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_partition_file_without_settings_is_used_with_a_warning(tmp_path, caplog):
    pfile = tmp_path / "old.npz"
    mine = [np.arange(0, 5), np.arange(5, 10), np.arange(10, 20)]
    np.savez(pfile, **{f"client_{i}": p for i, p in enumerate(mine)})  # pre-settings layout
    with caplog.at_level(logging.WARNING, logger="fl_app"):
        got = client_partitions(_pcfg(pfile))
    assert all(np.array_equal(a, b) for a, b in zip(mine, got, strict=True))
    assert "records no partition settings" in caplog.text and str(pfile) in caplog.text


def test_partition_file_malformed_is_a_clear_error(tmp_path):
    pfile = tmp_path / "bad.npz"
    pfile.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match="cannot read it as a .npz archive.*delete it"):
        load_partitions(pfile, 3, 100)
    np.savez(pfile, client_0=np.arange(3), x=np.zeros(2))
    with pytest.raises(DataError, match="is not a partition file"):
        load_partitions(pfile, 1, 100)


def _shard_assignment(y, parts, shards_per_client):
    """Shards as the partitioner documents them: the labels sorted, cut into blocks of
    ``n // (num_clients·shards_per_client)`` consecutive samples (the rest dropped). Returns
    one disjoint set of ``shards_per_client`` shard ids per client whose label counts add up
    to the client's, or None when no such assignment exists (depth-first search)."""
    size = len(y) // (len(parts) * shards_per_client)
    ordered = np.sort(y)
    shard = [
        np.bincount(ordered[j * size : (j + 1) * size], minlength=10) for j in range(len(y) // size)
    ]
    wanted = [np.bincount(y[p], minlength=10) for p in parts]

    def search(k, used):
        if k == len(parts):
            return []
        free = [j for j in range(len(shard)) if j not in used]
        for combo in itertools.combinations(free, shards_per_client):
            if np.array_equal(sum(shard[j] for j in combo), wanted[k]):
                rest = search(k + 1, used | set(combo))
                if rest is not None:
                    return [set(combo), *rest]
        return None

    return search(0, set())


def test_shards_give_each_client_its_sorted_label_shards_deterministically():
    # 10 classes of 20, 5 clients × 2 shards of 20: every shard is one class, every client
    # holds two whole classes and the clients share none
    y = np.repeat(np.arange(10), 20)
    parts = partition_indices(y, 5, _cfg(partition="shards", shards_per_client=2), seed=0)
    counts = np.array([np.bincount(y[p], minlength=10) for p in parts])
    assert sorted(counts.ravel().tolist()) == [0] * 40 + [20] * 10
    assert (counts.sum(axis=1) == 40).all() and (counts.sum(axis=0) == 20).all()
    # uneven classes: 6 clients × 3 shards of 317 // 18 = 17 sorted-label samples (straddling
    # class boundaries), the 11 left over dropped
    y = _labels(317)
    cfg = _cfg(partition="shards", shards_per_client=3)
    parts = partition_indices(y, 6, cfg, seed=0)
    assert [len(p) for p in parts] == [3 * 17] * 6
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx) == 306
    assigned = _shard_assignment(y, parts, 3)
    assert assigned is not None and len(set().union(*assigned)) == 18
    assert np.bincount(y).min() >= 17  # so a shard spans at most two classes
    assert max(len(np.unique(y[p])) for p in parts) <= 3 * 2
    assert np.mean([len(np.unique(y[p])) for p in parts]) < 6  # label skew (IID: all 10)
    again = partition_indices(y, 6, cfg, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition_indices(y, 6, cfg, seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))
    assert _shard_assignment(y, other, 3) is not None


def test_shards_beyond_the_samples_is_a_clear_error():
    with pytest.raises(DataError, match=r"num_clients \* data.shards_per_client = 60 \* 2") as e:
        partition_indices(_labels(100), 60, _cfg(partition="shards"), seed=0)
    assert "only 100 training samples" in str(e.value)
    with pytest.raises(DataError, match=r"34 \* 3 = 102 shards"):
        partition_indices(_labels(100), 34, _cfg(partition="shards", shards_per_client=3), 0)


@pytest.mark.parametrize(
    ("n", "classes_per_client", "keys"),
    [
        (30, 3, ("num_clients", "data.classes_per_client", "data.train_subset")),
        (5, 11, ("data.classes_per_client = 11", "10 classes")),
    ],
)
def test_pathological_errors_name_its_own_keys(n, classes_per_client, keys):
    cfg = _cfg(partition="pathological", classes_per_client=classes_per_client)
    with pytest.raises(DataError) as err:
        partition_indices(_labels(100), n, cfg, seed=0)
    msg = str(err.value)
    assert all(k in msg for k in keys), msg
    assert "alpha" not in msg and "min_partition_size" not in msg


def test_partition_errors_advise_the_schemes_keys():
    with pytest.raises(DataError, match="data.size_skew") as err:
        partition_indices(_labels(2000), 20, _cfg(partition="size_skew"), seed=0)
    assert "alpha" not in str(err.value)
    with pytest.raises(DataError, match="received no samples.*data.alpha"):
        partition_indices(_labels(2000), 30, _cfg(alpha=0.01, min_partition_size=0), seed=0)


def test_labels_beyond_num_classes_are_refused_when_loading():
    cfg = load_config("tiny", "fedavg", {"data": {"num_classes": 5}})
    with pytest.raises(DataError, match=r"labels 0\.\.9, but data.num_classes = 5"):
        load_dataset(cfg["data"])


def _node_file(path, **arrays):
    base = {"x": np.zeros((8, 1, 28, 28), np.uint8), "y": np.arange(8) % 10}
    np.savez(path, **{k: v for k, v in {**base, **arrays}.items() if v is not None})
    return path


def test_node_data_reads_a_valid_folder(tmp_path):
    cfg = load_config("tiny", "fedavg")
    _node_file(tmp_path / "train.npz", x=np.zeros((8, 28, 28), np.uint8))  # (N, H, W) accepted
    d = load_node_data(cfg, tmp_path)
    assert len(d.train) + len(d.test) == 8 and d.train.y.dtype == torch.int64


@pytest.mark.parametrize(
    ("arrays", "problem"),
    [
        ({"x": np.zeros((8, 1, 28, 28), np.float32)}, r"x is float32 of shape \(8, 1, 28, 28\)"),
        ({"x": np.zeros((8, 3, 28, 28), np.uint8)}, r"x is uint8 of shape \(8, 3, 28, 28\)"),
        ({"y": np.arange(7)}, "x holds 8 images but y 7 labels"),
        ({"y": np.arange(8) + 5}, r"labels 5\.\.12 lie outside 0\.\.9 \(data.num_classes = 10\)"),
        ({"y": np.full(8, -1)}, r"labels -1\.\.-1 lie outside"),
        ({"y": np.linspace(0, 9, 8)}, "y is float64"),
        ({"y": np.zeros((8, 1), np.int64)}, r"y is int64 of shape \(8, 1\)"),
        ({"y": None}, r"missing array\(s\) y \(it holds \['x'\]\)"),
        ({"x": np.zeros((0, 1, 28, 28), np.uint8), "y": np.zeros(0, np.int64)}, "no samples"),
    ],
)
def test_node_data_malformed_file_names_file_and_problem(tmp_path, arrays, problem):
    cfg = load_config("tiny", "fedavg")
    path = _node_file(tmp_path / "train.npz", **arrays)
    with pytest.raises(DataError, match=problem) as err:
        load_node_data(cfg, tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("kind", ["truncated", "npy", "empty", "pickled", "test"])
def test_node_data_unreadable_file_names_file(tmp_path, kind):
    cfg = load_config("tiny", "fedavg")
    path = _node_file(tmp_path / "train.npz")
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif kind == "npy":
        np.save(tmp_path / "a.npy", np.zeros(3))
        path.write_bytes((tmp_path / "a.npy").read_bytes())
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "pickled":
        np.savez(path, x=np.array([object()], dtype=object), y=np.arange(1))
    else:  # a broken test.npz next to a good train.npz
        path = tmp_path / "test.npz"
        path.write_bytes(b"not an archive")
    with pytest.raises(DataError) as err:
        load_node_data(cfg, tmp_path)
    assert str(path) in str(err.value)


def test_rotation_fills_the_corners_with_the_background():
    """Rotating a black (standardised) image leaves it black: the corners the rotation
    uncovers are background, not 0 = the dataset's mean grey."""
    mean, std = NORMALIZATION["fmnist"]
    black = torch.full((2, 1, 28, 28), -mean[0] / std[0])
    out = _domain_transform(black, "rotation", 1, 3, **FMNIST_NOISE0)  # 45°
    torch.testing.assert_close(out, black)


def test_noise_domain_draws_its_own_noise_per_split_and_seed():
    """The local test split's noise is not the training split's, and runs with other seeds
    draw other noise."""
    x = torch.zeros(4, 1, 28, 28)
    seeds = {domain_noise_seed(s, 2, split) for s in (0, 1) for split in (0, 1)}
    assert len(seeds) == 4
    a, b = (
        _domain_transform(x, "noise", 2, 3, dataset="fmnist", noise_seed=domain_noise_seed(0, 2, i))
        for i in (0, 1)
    )
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("partition", ["iid", "size_dirichlet"])  # balanced, imbalanced sizes
@pytest.mark.parametrize("domain", ["rotation", "contrast", "noise", "mixed"])
def test_domain_skew_gives_each_client_its_own_transformation(domain, partition):
    plain = load_config("tiny", "fedavg", {"data": {"partition": partition}})
    shifted = load_config("tiny", "fedavg", {"data": {"domain": domain, "partition": partition}})
    k, name = plain["num_clients"], plain["data"]["dataset"]
    sizes = {len(p) for p in client_partitions(plain)}
    assert (len(sizes) == 1) == (partition == "iid")
    a0, b0 = load_client_data(plain, 0), load_client_data(shifted, 0)
    assert torch.equal(a0.train.y, b0.train.y)  # same samples and labels
    for pid in range(k):  # each client's data is its own transformation of its samples
        a, b = load_client_data(plain, pid), load_client_data(shifted, pid)
        for split, (split_a, split_b) in enumerate(((a.train, b.train), (a.test, b.test))):
            seed = domain_noise_seed(shifted["seed"], pid, split)
            want = _domain_transform(split_a.x, domain, pid, k, dataset=name, noise_seed=seed)
            torch.testing.assert_close(split_b.x, want, rtol=0, atol=0)
    assert not torch.allclose(
        load_client_data(plain, 2).train.x, load_client_data(shifted, 2).train.x, atol=1e-3
    )
    # the domains differ from each other: the same images come out differently for every
    # pair of clients (3 clients as in tiny, and 9 and 10)
    x = a0.train.x[:16]
    for n in (k, 9, 10):
        out = [_domain_transform(x, domain, pid, n, **FMNIST_NOISE0) for pid in range(n)]
        same = [
            (i, j)
            for i in range(n)
            for j in range(i + 1, n)
            if torch.allclose(out[i], out[j], atol=1e-3)
        ]
        assert same == [], f"{n} clients: clients {same} share a domain"
    if domain == "mixed":  # the kinds cycle rotation, contrast, noise (client 0 unshifted)
        torch.testing.assert_close(_domain_transform(x, "mixed", 0, k, **FMNIST_NOISE0), x)
        noise = _domain_transform(x, "noise", 2, k, **FMNIST_NOISE0)
        torch.testing.assert_close(_domain_transform(x, "mixed", 2, k, **FMNIST_NOISE0), noise)
