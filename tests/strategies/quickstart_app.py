"""A foreign Flower app, written as Flower's quickstart examples write one (``task.py``,
``client_app.py`` and ``server_app.py`` in one file): a linear model trained by gradient
descent on tiny synthetic regression data, numpy only. It knows nothing of this project:
the ClientApp replies with ``arrays`` and a ``num-examples`` metric, as Flower's FedAvg
expects, and the ServerApp takes any Flower strategy (tests/strategies/test_flower.py runs
the drop-in GNE, FedAU, PMFL and FedAvgM through it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

# ---------------------------------------------------------------------------- task.py
TRUE_W = np.array([1.0, -2.0, 0.5], dtype=np.float32)


def load_data(partition_id: int, num_partitions: int, n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Partition ``partition_id``'s inputs and targets: ``y = X·w* + noise``, each
    partition's inputs shifted differently (feature skew)."""
    rng = np.random.default_rng(1000 + partition_id)
    x = rng.normal(loc=partition_id / max(num_partitions, 1), size=(n, 3)).astype(np.float32)
    y = x @ TRUE_W + 0.05 * rng.normal(size=n).astype(np.float32)
    return x, y.astype(np.float32)


def train(w: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float, steps: int) -> float:
    """``steps`` full-batch gradient steps on the mean squared error, in place; returns the
    final training loss."""
    for _ in range(steps):
        w -= lr * 2.0 * x.T @ (x @ w - y) / len(y)
    return evaluate_loss(w, x, y)


def evaluate_loss(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error of the linear model ``w`` on ``(x, y)``."""
    return float(np.mean((x @ w - y) ** 2))


# ---------------------------------------------------------------------- client_app.py
app = ClientApp()


@app.train()
def client_train(msg: Message, context: Context) -> Message:
    """Train the received model on the local data; reply with it and ``num-examples``."""
    w = msg.content.array_records["arrays"].to_numpy_ndarrays()[0].copy()
    pid = int(context.node_config["partition-id"])
    x, y = load_data(pid, int(context.node_config["num-partitions"]))
    lr = float(msg.content.config_records["config"]["lr"])  # type: ignore[arg-type]
    loss = train(w, x, y, lr, steps=5)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    content = RecordDict({"arrays": ArrayRecord([w]), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def client_evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local data."""
    w = msg.content.array_records["arrays"].to_numpy_ndarrays()[0]
    pid = int(context.node_config["partition-id"])
    x, y = load_data(pid, int(context.node_config["num-partitions"]))
    metrics = MetricRecord({"eval_loss": evaluate_loss(w, x, y), "num-examples": len(y)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


# ---------------------------------------------------------------------- server_app.py
def central_evaluate(num_partitions: int) -> Callable[[int, ArrayRecord], MetricRecord]:
    """Server-side evaluation on every partition's data (the union)."""
    parts = [load_data(p, num_partitions) for p in range(num_partitions)]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"loss": evaluate_loss(arrays.to_numpy_ndarrays()[0], x, y)})

    return evaluate


def server_app(
    strategies: Mapping[str, Callable[[], Strategy]],
    results: dict[str, Any],
    num_partitions: int,
    num_rounds: int = 3,
) -> ServerApp:
    """A ServerApp whose ``main`` is the quickstart's, once per strategy (one simulation for
    all: starting Ray takes most of a run's time); ``results[name]`` gets
    ``(strategy, Result)``."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        for name, make_strategy in strategies.items():
            strategy = make_strategy()
            result = strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord([np.zeros(3, dtype=np.float32)]),
                train_config=ConfigRecord({"lr": 0.05}),
                num_rounds=num_rounds,
                evaluate_fn=central_evaluate(num_partitions),
                timeout=600,  # round 1 waits for Ray to start the ClientApp actors
            )
            results[name] = (strategy, result)

    return server
