"""ClientApp: thin adapters between Flower Messages and the method's NumPyClient.

Message → (NDArrays, config) → ``client.fit`` / ``client.evaluate`` → (NDArrays,
num_examples, metrics) → Message. Method payloads travel at the NumPyClient level inside
``config`` (server → client) and ``metrics`` (client → server) as numpy arrays; on the wire
they are a named ArrayRecord ``payload`` (typed arrays, never pickle).

Node identity comes from ``context.node_config``: ``partition-id`` and ``num-partitions``
(injected by the simulation, or given with ``flower-supernode --node-config``), plus optional
``device`` (cpu, cuda, cuda:N), ``state-dir`` (where this node keeps model-sized state) and
``data-dir`` (the node's own ``train.npz``/``test.npz`` instead of a partition).
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from core.data import ClientData, label_counts, load_client_data, load_node_data
from core.params import Config
from core.state import Lineage, RoundState, client_state_dir, get_store
from core.training import limit_threads, numerics, pick_device
from fl_app import registry
from fl_app.config import config_from_run_config, run_dir

log = logging.getLogger("fl_app")
app = ClientApp()


@lru_cache(maxsize=4)
def _config(run_config_key: str, run_config: Any) -> Config:
    return config_from_run_config(run_config.value)


class _Key:
    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash(repr(sorted(self.value.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.value == self.value


def config_of(context: Context) -> Config:
    """The merged config of this run (parsed once per process)."""
    rc = dict(context.run_config)
    return _config(repr(sorted(rc.items())), _Key(rc))


def partition_of(context: Context) -> tuple[int, int]:
    """(partition id, number of partitions) from the node config, with a clear error."""
    nc = context.node_config
    try:
        return int(nc["partition-id"]), int(nc["num-partitions"])
    except KeyError as err:
        raise KeyError(
            f"node config lacks {err}; start the SuperNode with "
            '--node-config "partition-id=<i> num-partitions=<n>"'
        ) from None


def make_client(context: Context, config: dict[str, Any]) -> Any:
    """Build this node's NumPyClient for the configured method."""
    cfg = config_of(context)
    limit_threads(cfg["client"]["num_threads"])
    pid, _ = partition_of(context)
    cls = registry.resolve("client", cfg["client"]["name"])
    device = pick_device(str(context.node_config.get("device", cfg["client"]["device"])))
    state_root = context.node_config.get("state-dir") or config.get("state-dir")
    if not state_root:
        state_root = str(client_state_dir(run_dir(cfg)))
    store = RoundState(
        get_store(Path(str(state_root)) / str(config.get("state-token", "run"))),
        int(config.get("server-round", 0)),
        Lineage.from_config(config),
    )
    return cls(cfg, node_data(context), pid, device, store)


def node_data(context: Context) -> ClientData:
    """This node's data: its own folder (node config ``data-dir``) or its partition."""
    cfg = config_of(context)
    data_dir = context.node_config.get("data-dir")
    if data_dir:
        return load_node_data(cfg, str(data_dir), seed=cfg["seed"])
    return load_client_data(cfg, partition_of(context)[0])


@lru_cache(maxsize=1)
def where() -> dict[str, str]:
    """Where this process runs, as a training reply reports it (the round log's ``host``,
    ``ray_node``, ``ray_node_ip``): the host name and, in a Ray actor (the simulation), its
    Ray node's id and IP address."""
    place = {"host": socket.gethostname()}
    ray = sys.modules.get("ray")  # imported by Flower's Ray backend; never imported here
    if ray is not None and ray.is_initialized():
        place["ray-node"] = ray.get_runtime_context().get_node_id()
        place["ray-node-ip"] = ray.util.get_node_ip_address()
    return place


def _info(context: Context, **extra: str) -> ConfigRecord:
    return ConfigRecord({"partition-id": partition_of(context)[0], **extra})


def _incoming(msg: Message) -> tuple[list[np.ndarray], dict[str, Any], list[str]]:
    records = msg.content.array_records
    arrays = records["arrays"]
    keys = list(arrays.keys())
    config: dict[str, Any] = dict(msg.content["config"]) if "config" in msg.content else {}
    if "payload" in records:
        config.update({k: v.numpy() for k, v in records["payload"].items()})
    return [arrays[k].numpy() for k in keys], config, keys


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Report identity and data statistics (the server learns partition ids only here)."""
    cfg = config_of(context)
    pid, num = partition_of(context)
    reply = ConfigRecord({"partition-id": pid, "num-partitions": num})
    stats = MetricRecord(
        {"num-train": 0, "num-test": 0, "label-counts": [0] * cfg["data"]["num_classes"]}
    )
    if num == cfg["num_clients"] and 0 <= pid < num:
        data = node_data(context)
        counts = label_counts(data.train.y, cfg["data"]["num_classes"])
        stats = MetricRecord(
            {
                "num-train": len(data.train),
                "num-test": len(data.test),  # bounds federated evaluation's num-examples
                "label-counts": counts.tolist(),
            }
        )
    return Message(RecordDict({"info": reply, "stats": stats}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training of the method's NumPyClient on this node's partition.

    Metrics carry ``app_seconds``: decoding, building the client and ``fit`` (of which
    ``fit_seconds`` is the local optimisation), so the framework's own cost can be told apart."""
    t0 = time.perf_counter()
    params, config, keys = _incoming(msg)
    client = make_client(context, config)
    new, num_examples, metrics = client.fit(params, config)
    metrics["app_seconds"] = time.perf_counter() - t0
    scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    arrays = {k: v for k, v in metrics.items() if isinstance(v, np.ndarray)}
    content = RecordDict(
        {
            "arrays": ArrayRecord(
                {k: Array(np.ascontiguousarray(a)) for k, a in zip(keys, new, strict=True)}
            ),
            "metrics": MetricRecord({**scalars, "num-examples": int(num_examples)}),
            "info": _info(context, **where(), numerics=numerics(str(client.device))),
        }
    )
    if arrays:
        content["payload"] = ArrayRecord(
            {k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}
        )
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the global model on this node's local test split."""
    params, config, _ = _incoming(msg)
    client = make_client(context, config)
    loss, num_examples, metrics = client.evaluate(params, config)
    scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    content = RecordDict(
        {
            "metrics": MetricRecord({**scalars, "loss": float(loss), "num-examples": num_examples}),
            "info": _info(context),
        }
    )
    return Message(content, reply_to=msg)
