"""The CUDA-graph step (clients/step_graph.py): when it applies, and, on a GPU, that replays
read their indices and a capture that fails loses no step. The GPU cases are skipped
without CUDA (CI has none); run them on a GPU machine with
``pytest tests/clients/test_step_graph.py`` (each method's graphed round against its eager
round is in ``test_gpu.py``)."""

from __future__ import annotations

import logging

import pytest
import torch

from clients import step_graph
from clients.step_graph import WARMUP_STEPS, StepGraph, graph_applies
from fl_app import registry
from strategies.fedccl import round_payload

from .graph_contract import TracedStepGraph

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(
    ("asked", "safe", "adversarial", "device", "expected"),
    [
        (True, True, False, CUDA, True),
        (False, True, False, CUDA, False),  # client.cuda_graph=false
        (True, False, False, CUDA, False),  # the method's step does not allow it
        (True, True, True, CUDA, False),  # PGD draws its random start on the host
        (True, True, False, CPU, False),  # no graph on the CPU
    ],
)
def test_graph_applies_only_when_asked_safe_clean_and_on_cuda(
    asked, safe, adversarial, device, expected
):
    assert graph_applies(asked, safe, adversarial, device) is expected


def test_only_reweighted_fedrane_decides_on_the_host_per_step(make_client):
    methods = ["fedavg", "fedprox", "moon", "fedrcl", "fedccl", "fedrane", "pmfl"]
    assert all(make_client(m).graph_safe() for m in methods)
    # FedRANE's nuclear-norm reweighting (eigh) checks its result on the host
    assert not make_client("fedrane", overrides="client.nuclear_iters=1").graph_safe()


def test_no_graph_after_a_failed_capture_in_the_process(monkeypatch):
    monkeypatch.setitem(step_graph.PROCESS, "capture_failed", True)
    assert not graph_applies(True, True, False, CUDA)


def test_cpu_rounds_never_build_a_graph(make_client, global_weights):
    client = make_client("fedavg")
    client.fit(global_weights(client), {"server-round": 1})
    assert client.step_graph is None


def test_full_size_batches_go_to_the_graph_and_the_rest_run_eagerly(
    make_client, global_weights, monkeypatch
):
    """The loop's dispatch, on the CPU with a recording stand-in for the graph: batch 40 on
    337 samples, 2 epochs: 8 full batches and one of 17 per epoch, in order."""
    calls: list[tuple[str, int]] = []

    class Recording:
        def __init__(self, step, size, device):
            self.step, self.size = step, size

        def __call__(self, idx):
            calls.append(("graph", len(idx)))
            self.step(idx)

        def close(self):
            calls.append(("close", 0))

    monkeypatch.setattr("clients.base.graph_applies", lambda *args: True)
    monkeypatch.setattr("clients.base.StepGraph", Recording)
    client = make_client("fedavg", overrides="client.batch_size=40")
    real_step = client.train_step
    monkeypatch.setattr(
        client, "train_step", lambda x, *a: (calls.append(("step", len(x))), real_step(x, *a))
    )
    _, _, metrics = client.fit(global_weights(client), {"server-round": 1})
    assert len(client.data.train) == 337 and metrics["steps"] == 18
    epoch = [("graph", 40), ("step", 40)] * 8 + [("step", 17)]
    assert calls == [*epoch, *epoch, ("close", 0)]  # the round's graph is freed at its end


# ------------------------------------------- the graph contract, checked on the CPU
def _traced(step, calls: int = WARMUP_STEPS + 3) -> TracedStepGraph:
    graph = TracedStepGraph(step, 4, CPU)
    for k in range(calls):
        graph(torch.arange(k, k + 4))
    return graph


def test_the_contract_check_passes_a_step_a_graph_can_replay():
    src, out = torch.arange(20.0), torch.zeros(())
    graph = _traced(lambda idx: out.add_(src[idx].sum() * 0.5))
    assert graph.errors == [] and graph.replays == 2
    assert float(out) == sum(float(src[k : k + 4].sum()) * 0.5 for k in range(WARMUP_STEPS + 3))


def test_the_contract_check_catches_host_syncs_and_per_step_python_values():
    src, out = torch.arange(20.0), torch.zeros(())
    synced = _traced(lambda idx: out.add_(float(src[idx].sum())))  # .item()
    assert synced.errors and "_local_scalar_dense" in synced.errors[0]
    masked = _traced(lambda idx: out.add_(src[idx][src[idx] > 3].sum()))  # boolean mask
    assert masked.errors and "aten.index.Tensor" in masked.errors[0]
    slot = iter(range(100))  # a Python int that moves every step, as PMFL's slot once did
    moving = _traced(lambda idx: out.add_(src[next(slot)]))
    assert moving.errors and "differs from the capture" in moving.errors[0]
    fresh = _traced(lambda idx: out.add_(torch.tensor([1.0, 2.0]).sum()))  # a new host tensor
    assert fresh.errors and "a tensor made on the host" in fresh.errors[0]
    eigh = _traced(lambda idx: out.add_(torch.linalg.eigh(torch.eye(2, device=src.device))[0][0]))
    assert eigh.errors and "aten._linalg_eigh" in eigh.errors[0]  # checks on the host
    listed = _traced(lambda idx: out.add_(sum(src[idx].tolist())))  # no aten op: patched
    assert listed.errors and "Tensor.tolist" in listed.errors[0]
    noise = _traced(lambda idx: out.add_(torch.empty(4).uniform_().to(src.device).sum()))
    assert noise.errors and "a tensor made on the host" in noise.errors[0]  # as PGD's start


@pytest.mark.parametrize(
    ("method", "overrides", "found"),
    [("fedavg_plus", "client.adv_steps=1", "a tensor made on the host")],  # PGD's start
)
def test_the_contract_check_fails_the_methods_that_are_not_graphed(
    method, overrides, found, make_client, global_weights, monkeypatch
):
    """PGD (FedAvg+/FedCCL+), which ``graph_safe()`` keeps off the graph, fails the check
    (FedRANE's ``nuclear_iters > 0`` cannot even build its graph mask; its ``eigh`` is
    flagged in the test above)."""
    monkeypatch.setattr("clients.base.graph_applies", lambda *args: True)
    monkeypatch.setattr("clients.base.StepGraph", TracedStepGraph)
    monkeypatch.setattr(TracedStepGraph, "instances", [])
    client = make_client(method, overrides=f"client.epochs=1 {overrides}")
    monkeypatch.setattr(client, "graph_safe", lambda: True)  # as if it claimed to be
    client.fit(global_weights(client), {"server-round": 1})
    [graph] = TracedStepGraph.instances
    assert graph.errors and found in graph.errors[0]


@pytest.mark.parametrize("method", [*sorted(registry.CLIENTS), "fedscl", "pmfl_literal"])
def test_every_graphed_method_keeps_the_graph_contract(
    method, make_client, global_weights, monkeypatch
):
    """Each graph-safe method, as the loop runs it with a graph (``graphed()`` true: FedRANE
    builds its mask the graph's way, PMFL uses its fixed-size buffer, with either threshold
    reading: ``pmfl_literal`` compares with the constant μ = 1), with clipping, weight
    decay and momentum, over two rounds (the second with the first's state: MOON's previous
    model, FedCCL's signals, PMFL's buffer, which fills and wraps within a round): no full-size
    step syncs with the host, and every step after the capture repeats its trace
    (``graph_contract.TracedStepGraph``)."""
    monkeypatch.setattr("clients.base.graph_applies", lambda *args: True)
    monkeypatch.setattr("clients.base.StepGraph", TracedStepGraph)
    monkeypatch.setattr(TracedStepGraph, "instances", [])
    overrides = "client.epochs=1 client.grad_clip=1.0 client.weight_decay=0.001"
    client = make_client(method, overrides=overrides)
    weights, config = global_weights(client), {}
    for rnd in (1, 2):
        client = make_client(method, overrides=overrides, store=client.store)
        weights, _, metrics = client.fit(weights, {**config, "server-round": rnd})
        sig = metrics.get("signals")
        config = {} if sig is None else round_payload(sig, metrics["signal_labels"], 10)
    graphs = TracedStepGraph.instances
    assert len(graphs) == 2 and [g.errors for g in graphs] == [[], []]
    assert all(g.replays == len(client.data.train) // 32 - WARMUP_STEPS - 1 for g in graphs)


# ------------------------------------------------------------------------ on a GPU
@needs_cuda
def test_graph_replays_read_the_indices_they_are_given():
    src = torch.arange(10.0, device=CUDA)
    out = torch.zeros((), device=CUDA)

    def step(idx: torch.Tensor) -> None:
        out.add_(src[idx].sum())

    graph = StepGraph(step, 2, CUDA)
    pairs = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (0, 9)]
    for pair in pairs:
        graph(torch.tensor(pair, device=CUDA))
    torch.cuda.synchronize()
    assert graph.replays == len(pairs) - WARMUP_STEPS
    assert float(out) == sum(a + b for a, b in pairs)
    with pytest.raises(ValueError, match="batches of 2"):
        graph(torch.arange(3, device=CUDA))
    graph.close()
    assert graph.graph is None and graph.replays == len(pairs) - WARMUP_STEPS
    with pytest.raises(RuntimeError, match="closed"):
        graph(torch.tensor((0, 1), device=CUDA))


@needs_cuda
def test_a_step_that_syncs_falls_back_to_eager_and_loses_no_step(caplog, monkeypatch):
    """Last in this file: a failed capture may leave PyTorch's allocator in states it does
    not clean up (why ``PROCESS`` stops captures), so no capture runs after it. The RNG it
    leaves in capture mode is mended: random draws on the GPU go on, in their sequence (on
    an H200 the next test file's ``randn_like`` on CUDA raised before that)."""
    monkeypatch.setitem(step_graph.PROCESS, "capture_failed", False)  # restored afterwards
    rng = torch.cuda.get_rng_state(CUDA)
    count = torch.zeros((), device=CUDA)
    seen: list[float] = []

    def step(idx: torch.Tensor) -> None:
        count.add_(1)
        seen.append(float(count))  # a host sync: not allowed while capturing

    graph = StepGraph(step, 4, CUDA)
    with caplog.at_level(logging.WARNING, logger="clients.step_graph"):
        for _ in range(WARMUP_STEPS + 3):
            graph(torch.arange(4, device=CUDA))
    torch.cuda.synchronize()
    assert graph.failed and graph.graph is None and graph.replays == 0
    assert float(count) == WARMUP_STEPS + 3  # every call ran once (the capture ran nothing)
    assert "client.cuda_graph=false" in caplog.text
    # the stream torch.cuda.graph leaves current when its capture_end fails is undone
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert not graph_applies(True, True, False, CUDA)  # no more captures in this process
    after = torch.randn(8, device=CUDA)  # raised in the generator's capture mode
    torch.cuda.set_rng_state(rng, CUDA)
    assert torch.equal(after, torch.randn(8, device=CUDA))  # the same draw as before it
