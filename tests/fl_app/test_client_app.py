"""fl_app.client_app: node identity from the node config, and a node's own data folder."""

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, RecordDict
from flwr.common import MessageType

from core.data import NORMALIZATION, load_client_data, local_split
from fl_app import client_app
from fl_app.config import config_from_run_config

RUN_CONFIG = {"experiment": "tiny", "method": "fedavg", "seed": 3, "set": "data.test_fraction=0.25"}


def _context(node_config, tmp_path):
    rc = {**RUN_CONFIG, "output-dir": str(tmp_path / "out")}
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config=rc)


def _write(path, n, seed):
    """``n`` digits-shaped samples (28×28 uint8, labels 0..9) in the node-data format."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    np.savez(path, x=x, y=y)
    return x, y


def _standardised(x):
    (mean,), (std,) = NORMALIZATION["digits"]
    return (torch.from_numpy(x).float() / 255.0 - mean) / std


# ---------------------------------------------------------------------------- partition_of
def test_partition_of_reads_the_node_config(tmp_path):
    ctx = _context({"partition-id": 2, "num-partitions": 5}, tmp_path)
    assert client_app.partition_of(ctx) == (2, 5)
    ctx = _context({"partition-id": "1", "num-partitions": "3"}, tmp_path)  # given as text
    assert client_app.partition_of(ctx) == (1, 3)


@pytest.mark.parametrize(
    ("node_config", "missing"),
    [({}, "partition-id"), ({"num-partitions": 3}, "partition-id"), ({"partition-id": 0}, "num-")],
)
def test_partition_of_without_the_ids_says_how_to_start_the_node(tmp_path, node_config, missing):
    with pytest.raises(KeyError) as err:
        client_app.partition_of(_context(node_config, tmp_path))
    msg = err.value.args[0]
    assert msg.startswith(f"node config lacks '{missing}")
    assert '--node-config "partition-id=<i> num-partitions=<n>"' in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__


# ------------------------------------------------------------------------- data-dir nodes
def test_node_data_reads_the_data_dir(tmp_path):
    """``train.npz`` and ``test.npz`` as given (standardised), not a partition: the node
    config needs no partition id."""
    x_tr, y_tr = _write(tmp_path / "train.npz", 12, seed=0)
    x_te, y_te = _write(tmp_path / "test.npz", 5, seed=1)
    data = client_app.node_data(_context({"data-dir": str(tmp_path)}, tmp_path))
    assert data.train.x.dtype == torch.float32 and data.train.y.dtype == torch.int64
    torch.testing.assert_close(data.train.x, _standardised(x_tr))
    torch.testing.assert_close(data.test.x, _standardised(x_te))
    assert data.train.y.tolist() == y_tr.tolist() and data.test.y.tolist() == y_te.tolist()


def test_node_data_without_test_npz_splits_train_npz(tmp_path):
    """data.test_fraction = 0.25 of 12 samples held out by core.data.local_split, seeded
    by the run's seed (3 here)."""
    x, y = _write(tmp_path / "train.npz", 12, seed=0)
    ctx = _context({"data-dir": str(tmp_path), "partition-id": 0}, tmp_path)
    data = client_app.node_data(ctx)
    assert len(data.train) == 9 and len(data.test) == 3
    merged = torch.cat([data.train.x, data.test.x])
    order = [int(np.flatnonzero((_standardised(x) == row).all((1, 2, 3)))[0]) for row in merged]
    assert sorted(order) == list(range(12))  # each sample exactly once
    assert torch.cat([data.train.y, data.test.y]).tolist() == y[order].tolist()
    tr, te = local_split(np.arange(12), 0.25, seed=3)  # the run's seed
    assert order == tr.tolist() + te.tolist()


def test_node_data_with_an_empty_data_dir_uses_the_partition(tmp_path):
    cfg = config_from_run_config({**RUN_CONFIG, "output-dir": str(tmp_path / "out")})
    ctx = _context({"data-dir": "", "partition-id": 1, "num-partitions": 3}, tmp_path)
    data, part = client_app.node_data(ctx), load_client_data(cfg, 1)
    torch.testing.assert_close(data.train.x, part.train.x)
    assert data.test.y.tolist() == part.test.y.tolist()


def test_query_reports_the_data_dir_statistics(tmp_path):
    _, y = _write(tmp_path / "train.npz", 12, seed=0)
    _write(tmp_path / "test.npz", 5, seed=1)
    node = {"data-dir": str(tmp_path), "partition-id": 2, "num-partitions": 3}
    msg = Message(RecordDict(), dst_node_id=7, message_type=MessageType.QUERY)
    reply = client_app.query(msg, _context(node, tmp_path))
    assert reply.content["info"]["partition-id"] == 2
    assert reply.content["info"]["num-partitions"] == 3
    assert reply.content["stats"]["num-train"] == 12
    assert reply.content["stats"]["num-test"] == 5  # bounds federated evaluation counts
    assert list(reply.content["stats"]["label-counts"]) == np.bincount(y, minlength=10).tolist()
