"""Build strategies and client replies by hand for strategy unit tests."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from core.participation import AllParticipation
from fl_app import registry
from fl_app.config import load_config
from strategies.nodes import NodeInfo, NodeRegistry

TEMPLATE = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
NUM_TRAIN, NUM_TEST = 100, 40  # each partition's split sizes as its node reported them


class FakeGrid:
    def __init__(self, node_ids: list[int]) -> None:
        self.node_ids = node_ids

    def get_node_ids(self) -> list[int]:
        return self.node_ids

    def send_and_receive(self, messages: Any, timeout: float | None = None) -> list[Message]:
        return []


def make_strategy(
    cls: type,
    method: str = "fedavg",
    num_clients: int = 3,
    template: dict[str, np.ndarray] | None = None,
    overrides: str = "",
    num_train: int = NUM_TRAIN,
    num_test: int | None = NUM_TEST,
) -> Any:
    """The aggregator ``cls`` over ``num_clients`` nodes (node id 100 + partition id), each
    known with ``num_train`` training samples (10 classes, balanced) and ``num_test`` test
    samples (``None``: a node that did not report it), holding the payload exchange that the
    config's client brings (as the ServerApp builds it; none for most clients)."""
    cfg = load_config("tiny", method, f"num_clients={num_clients} {overrides}")
    nodes = NodeRegistry(num_clients)
    for pid in range(num_clients):
        counts = [num_train // 10 + (c < num_train % 10) for c in range(10)]
        nodes.add(NodeInfo(pid, 100 + pid, num_train, counts, num_test))
        nodes.asked.add(100 + pid)
    tmpl = ArrayRecord({k: Array(v) for k, v in (template or TEMPLATE).items()})
    exchange_cls = registry.exchange_for(cfg)
    exchange = exchange_cls(cfg, nodes) if exchange_cls is not None else None
    return cls(cfg, nodes, AllParticipation(), tmpl, exchange=exchange)


def train_messages(
    strategy: Any, server_round: int = 1, arrays: dict[str, np.ndarray] | None = None
) -> list[Message]:
    rec = ArrayRecord({k: Array(v) for k, v in (arrays or TEMPLATE).items()})
    grid = FakeGrid([100 + p for p in strategy.nodes.known_pids()])
    return list(strategy.configure_train(server_round, rec, ConfigRecord({}), grid))


def eval_messages(strategy: Any, server_round: int = 1) -> list[Message]:
    """The federated-evaluation messages (the strategy needs ``evaluation.federated=true``)."""
    rec = ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()})
    grid = FakeGrid([100 + p for p in strategy.nodes.known_pids()])
    return list(strategy.configure_evaluate(server_round, rec, ConfigRecord({}), grid))


def eval_reply(
    msg: Message, pid: Any, accuracy: Any = 0.5, loss: Any = 1.0, n: Any = NUM_TEST
) -> Message:
    """A federated-evaluation reply as the ClientApp sends it."""
    content = RecordDict(
        {
            "metrics": MetricRecord({"accuracy": accuracy, "loss": loss, "num-examples": n}),
            "info": ConfigRecord({"partition-id": pid}),
        }
    )
    return Message(content, reply_to=msg)


def reply(
    msg: Message,
    pid: Any,
    arrays: dict[str, np.ndarray],
    n: int = 10,
    payload: dict[str, np.ndarray] | None = None,
    **metrics: Any,
) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": n, **metrics}),
            "info": ConfigRecord({"partition-id": pid}),
        }
    )
    if payload:
        content["payload"] = ArrayRecord({k: Array(v) for k, v in payload.items()})
    return Message(content, reply_to=msg)


def arrays_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: record[k].numpy() for k in record}


def filled(v: float) -> dict[str, np.ndarray]:
    """Arrays of :data:`TEMPLATE`'s names and shapes, every entry ``v``."""
    return {"w": np.full((2, 2), v, np.float32), "b": np.full(3, v, np.float32)}


RAY_REASON = (  # the shape of Flower's reason for a ClientApp that raised in a Ray actor
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()\n"
    '  File "/work/main/clients/base.py", line 285, in train_local\n'
    "FloatingPointError: client 0: non-finite loss in round 1; lower client.lr\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "flwr.clientapp.client_app.ClientAppException:\n"
    "Exception ClientAppException occurred. Message: client 0: non-finite loss in round 1; "
    "lower client.lr'>"
)


def random_round(
    rng: np.random.Generator,
    global_arrays: dict[str, np.ndarray],
    ns: list[int],
    scale: float = 1.0,
) -> list[dict[str, np.ndarray]]:
    """Client arrays ``W + Δ_k`` (float32) for one round, one per weight in ``ns``."""
    return [
        {
            k: (g + scale * rng.normal(size=g.shape) + 0.3 * (i + 1)).astype(np.float32)
            for k, g in global_arrays.items()
        }
        for i in range(len(ns))
    ]
