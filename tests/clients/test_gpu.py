"""The GPU path: every method's client trains on CUDA as it does on the CPU.

Skipped without CUDA (CI has none); run it on a GPU machine with
``pytest tests/clients/test_gpu.py``. Two rounds per method, so stateful methods (MOON's
previous models, PMFL's iterates, FedCCL's signals) load their CPU-saved state onto the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from clients.step_graph import WARMUP_STEPS
from core.data import load_client_data
from core.models import get_weights
from core.state import StateStore
from fl_app import registry
from fl_app.config import load_config
from strategies.fedccl import round_payload

from .updates import flat_update, update_cosine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

METHODS = ["fedavg", "fedprox", "moon", "fedrcl", "fedscl", "fedccl", "fedccl_plus", "fedrane"]
METHODS += ["pmfl", "pmfl_literal"]
#: Methods whose full-size steps replay a CUDA graph (``BaseClient.graph_safe()``): all but
#: FedCCL+ (PGD draws its start on the host). ``pmfl_literal``: PMFL with the constant
#: threshold μ = 1 (``client.threshold=literal``).
GRAPH_METHODS = ["fedavg", "fedprox", "moon", "fedrcl", "fedscl", "fedccl", "fedrane", "pmfl"]
GRAPH_METHODS += ["pmfl_literal"]


def _two_rounds(
    method: str, device: str, root, overrides: str = "client.steps=5"
) -> tuple[list[np.ndarray], list, dict, Any]:
    """Two rounds of client 0 (the second with the first's state); returns the start
    weights, the second round's weights and metrics, and its client."""
    extra = " client.adv_steps=1" if method == "fedccl_plus" else ""
    cfg = load_config("tiny", method, overrides + extra)
    cls = registry.resolve("client", cfg["client"]["name"])
    data, store = load_client_data(cfg, 0), StateStore(root / f"{device}-{overrides}")
    torch.manual_seed(0)
    w0 = get_weights(cls.build_model(cfg))
    w1, _, m1 = cls(cfg, data, 0, torch.device(device), store).fit(w0, {"server-round": 1})
    client = cls(cfg, data, 0, torch.device(device), store)
    signals = round_payload(m1["signals"], m1["signal_labels"], 10) if "signals" in m1 else {}
    w2, _, m2 = client.fit(w1, {"server-round": 2, **signals})
    assert all(p.device.type == device for p in client.model.parameters())
    return w0, w2, m2, client


@pytest.fixture(autouse=True)
def full_fp32():
    """GPU arithmetic in full fp32 for the comparison. cuDNN convolutions default to TF32 on
    Ampere and later; on an H100 (2026-11-25) the GPU/CPU update cosines were then 0.993
    (FedRCL) to 1.0, and FedCCL+'s PGD, whose sign() per input pixel amplifies rounding,
    0.990 and 0.998 in two runs (0.916 before its random start was drawn on the CPU for
    both devices). In full fp32 every method gave ≥ 0.999999, hence the strict bound."""
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("method", METHODS)
def test_method_trains_on_cuda_like_on_cpu(method, tmp_path):
    _cuda_like_cpu(method, tmp_path)


def _cuda_like_cpu(method: str, root, overrides: str = "client.steps=5") -> Any:
    """Asserts that :func:`_two_rounds` on CUDA updates the weights as on the CPU: the same
    direction, not the same bits (other kernels, other summation orders). Returns the CUDA
    round's client."""
    w0, cpu, m_cpu, _ = _two_rounds(method, "cpu", root, overrides)
    _, gpu, m_gpu, client = _two_rounds(method, "cuda", root, overrides)
    d_gpu = flat_update(gpu, w0)
    assert np.isfinite(d_gpu).all() and np.linalg.norm(d_gpu) > 0
    cosine = update_cosine(cpu, gpu, w0)
    assert cosine > 0.9999, f"{method}: GPU update differs from CPU (cosine {cosine:.6f})"
    assert m_gpu["train_loss"] == pytest.approx(m_cpu["train_loss"], rel=0.05)
    return client


def test_fedrane_with_nuclear_reweighting_trains_on_cuda_like_on_cpu(tmp_path):
    """FedRANE with ``nuclear_iters > 0`` (LRA's ``eigh``-based reweighting, which checks
    its result on the host) trains eagerly on CUDA, no graph, with the CPU's update."""
    client = _cuda_like_cpu("fedrane", tmp_path, "client.steps=5 client.nuclear_iters=2")
    assert not client.graph_safe() and client.step_graph is None


@pytest.fixture
def deterministic():
    """CUDA's deterministic algorithms for one test: an operator without a deterministic
    implementation raises (cuBLAS's deterministic workspace is set in tests/conftest.py)."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _graph_and_eager(method: str, extra: str, root) -> tuple[float, float, dict, dict]:
    """Two rounds of 2 epochs of batch 40 on 337 samples (8 full-size steps and one eager
    17-sample step per epoch, so eager steps run between replays on the same model and
    optimiser), eagerly and with the graph; returns the largest weight difference between
    the two, the eager update's largest entry, and both rounds' metrics."""
    run = "client.batch_size=40 client.lr=0.001" + extra + " client.cuda_graph="
    w0, eager, m_eager, _ = _two_rounds(method, "cuda", root, run + "false")
    _, graphed, m_graph, client = _two_rounds(method, "cuda", root, run + "true")
    graph = client.step_graph
    assert graph is not None and not graph.failed
    full = 2 * (len(client.data.train) // 40)
    assert graph.eager_steps == WARMUP_STEPS and graph.replays == full - WARMUP_STEPS
    assert m_graph["steps"] == m_eager["steps"] == full + 2
    update = max(float(np.abs(b - a).max()) for a, b in zip(w0, eager, strict=True))
    gap = max(float(np.abs(b - a).max()) for a, b in zip(eager, graphed, strict=True))
    print(f"{method}: graph-eager {gap:.2e}, update {update:.2e}")
    return gap, update, m_eager, m_graph


@pytest.mark.usefixtures("deterministic")
@pytest.mark.parametrize(
    ("method", "extra"),
    [(m, "") for m in GRAPH_METHODS]
    + [("fedavg", " client.grad_clip=1.0 client.weight_decay=0.0001")]  # both in the graph
    # bf16 autocast and the channels-last layout inside the graph (autocast's cache is off)
    + [(m, " client.precision=bf16 client.channels_last=true") for m in ("fedavg", "moon")],
)
def test_graph_round_trains_like_the_eager_round(method, extra, tmp_path):
    """Bit for bit, with deterministic algorithms: a replay launches the eager step's
    kernels, so a replay that read a wrong batch or a stale tensor changes the result.

    Without them the GPU itself is not reproducible: two eager runs differ by 0.5-2.5e-6 of
    the update at this lr 0.001 (H200, 2026-11-26), enough to flip a near-tie that decides
    a loss's terms: PMFL's positives (its iterates are all nearly the current model) made
    two eager runs' train losses differ by 3e-4 relative, and one graphed FedRCL run differed
    from eager by 1.3e-3 of the update. With deterministic algorithms graph and eager gave
    identical weights and losses for every graphed method, in three runs."""
    gap, update, m_eager, m_graph = _graph_and_eager(method, extra, tmp_path)
    assert update > 0 and gap == 0, f"{method}: graph {gap:.2e}, update {update:.2e}"
    assert m_graph["train_loss"] == m_eager["train_loss"]
    assert m_graph["train_accuracy"] == m_eager["train_accuracy"]


def test_graph_round_with_default_kernels_trains_like_the_eager_round(tmp_path):
    """The same comparison with PyTorch's default (nondeterministic) kernels, which users
    run, within rounding: FedAvg, whose loss has no near-ties that rounding could flip
    (H200, 2026-11-26: weights 7.5e-9 apart against an update of 1.1e-2)."""
    gap, update, m_eager, m_graph = _graph_and_eager("fedavg", "", tmp_path)
    assert update > 0 and gap <= 1e-4 * update, f"graph {gap:.2e}, update {update:.2e}"
    assert m_graph["train_loss"] == pytest.approx(m_eager["train_loss"], rel=1e-5)
    assert m_graph["train_accuracy"] == pytest.approx(m_eager["train_accuracy"], abs=5e-3)
