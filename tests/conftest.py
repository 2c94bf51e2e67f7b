"""Shared fixtures: a Flower task identity for building Messages outside a runtime, and an
in-process Grid that delivers messages straight to the ClientApp functions (no Ray), so the
whole ServerApp → ClientApp round trip runs in a unit test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.common import MessageType
from flwr.supercore.task_identity import TaskIdentity

torch.set_num_threads(1)
#: cuBLAS's deterministic workspace, for the GPU tests that compare CUDA-graph and eager rounds
#: bit for bit under deterministic algorithms (tests/clients/test_gpu.py). cuBLAS reads it when
#: it starts, so it is set for the whole session, whichever tests run first; no effect on a CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


COMPOSE_TEST = "tests/deploy/test_compose.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the docker-compose demo's test last (the others keep their order).

    `.ci/run` builds the demo's image in the background while the suite runs; run last, the
    test's own build (which waits for that one: docker/demo.sh takes a lock) finds it done.
    """
    items.sort(key=lambda item: item.nodeid.startswith(COMPOSE_TEST))


@pytest.fixture(autouse=True)
def task_identity() -> None:
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 1
    TaskIdentity.task_id = 1


class InProcessGrid:
    """A Grid whose nodes are ClientApp functions called in this process."""

    def __init__(
        self,
        run_config: dict[str, Any],
        num_nodes: int,
        num_partitions: int | None = None,
        node_config: dict[str, Any] | None = None,
        intercept: Callable[[Message, Message], Message] | None = None,
    ) -> None:
        from fl_app import client_app

        self.handlers = {
            MessageType.TRAIN: client_app.train,
            MessageType.EVALUATE: client_app.evaluate,
            MessageType.QUERY: client_app.query,
        }
        n = num_partitions or num_nodes
        self.contexts = {
            1000 + i: Context(
                run_id=1,
                node_id=1000 + i,
                node_config={"partition-id": i, "num-partitions": n, **(node_config or {})},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i in range(num_nodes)
        }
        self.intercept = intercept
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None):
        replies = []
        for msg in messages:
            self.sent.append(msg)
            ctx = self.contexts[msg.metadata.dst_node_id]
            try:
                reply = self.handlers[msg.metadata.message_type](msg, ctx)
            except Exception as err:  # what Flower does with a ClientApp exception
                reply = Message(Error(code=1, reason=f"{type(err).__name__}: {err}"), reply_to=msg)
            if self.intercept is not None:
                reply = self.intercept(msg, reply)
            replies.append(reply)
        return replies


def run_config(
    method: str = "fedavg",
    experiment: str = "tiny",
    set_: str = "",
    output_dir: str = "results",
    seed: int = 0,
    resume: bool = False,
    fresh: bool = False,
) -> dict[str, Any]:
    return {
        "experiment": experiment,
        "method": method,
        "seed": seed,
        "output-dir": output_dir,
        "set": set_,
        "resume": resume,
        "fresh": fresh,
    }


@pytest.fixture
def run_in_process(tmp_path) -> Callable[..., dict[str, Any]]:
    """Run the real ServerApp main over an InProcessGrid; return summary and records."""
    import json

    from fl_app import server_app

    def _run(
        method: str = "fedavg",
        set_: str = "",
        num_nodes: int = 3,
        intercept: Callable[[Message, Message], Message] | None = None,
        experiment: str = "tiny",
        seed: int = 0,
        resume: bool = False,
        grid: InProcessGrid | None = None,
        failures_ok: bool = False,
        fresh: bool = False,
    ) -> dict[str, Any]:
        """Unless ``failures_ok``, every round must have a result from every node: the
        grid turns a client's exception into an error reply, which a run survives, so a
        test that only checked accuracy would pass over a client that always fails."""
        rc = run_config(method, experiment, set_, str(tmp_path / "out"), seed, resume, fresh)
        grid = grid or InProcessGrid(rc, num_nodes, intercept=intercept)
        ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
        server_app.main(grid, ctx)  # type: ignore[arg-type]  # a Grid in all it is asked
        out = tmp_path / "out" / experiment / method / f"seed{seed}"
        summary = json.loads((out / "summary.json").read_text())
        records = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
        if not failures_ok:
            for r in records[1:]:  # records[0] is round 0, the initial evaluation
                assert r["failures"] == [], f"round {r['round']}: {r['failures']}"
        return {"summary": summary, "records": records, "dir": out, "grid": grid}

    return _run
