"""The GPU path: every method's client trains on CUDA as it does on the CPU.

Skipped without CUDA (CI has none); run it on a GPU machine with
``pytest tests/clients/test_gpu.py``. Two rounds per method, so stateful methods (MOON's
previous models, PMFL's iterates, FedCCL's signals) load their CPU-saved state onto the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_app import registry
from fl_app.config import load_config
from fl_app.data import load_client_data
from fl_app.models import get_weights
from fl_app.prototypes import global_signals
from fl_app.state import StateStore

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

METHODS = ["fedavg", "fedprox", "moon", "fedrcl", "fedscl", "fedccl", "fedccl_plus", "fedrane"]
METHODS += ["pmfl"]


def _signals(metrics: dict) -> dict:
    """The next round's FedCCL config from this round's local signals (server-side mean)."""
    if "signals" not in metrics:
        return {}
    sig, lab = metrics["signals"], metrics["signal_labels"]
    u, mask = global_signals(sig, lab, 10, "mean")
    return {"local_signals": sig, "local_labels": lab, "global_signals": u, "global_mask": mask}


def _two_rounds(method: str, device: str, root) -> tuple[list[np.ndarray], list, dict]:
    extra = " client.adv_steps=1" if method == "fedccl_plus" else ""
    cfg = load_config("tiny", method, "client.steps=5" + extra)
    cls = registry.resolve("client", cfg["client"]["name"])
    data, store = load_client_data(cfg, 0), StateStore(root / device)
    torch.manual_seed(0)
    w0 = get_weights(cls.build_model(cfg))
    w1, _, m1 = cls(cfg, data, 0, torch.device(device), store).fit(w0, {"server-round": 1})
    client = cls(cfg, data, 0, torch.device(device), store)
    w2, _, m2 = client.fit(w1, {"server-round": 2, **_signals(m1)})
    assert all(p.device.type == device for p in client.model.parameters())
    return w0, w2, m2


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
    w0, cpu, m_cpu = _two_rounds(method, "cpu", tmp_path)
    _, gpu, m_gpu = _two_rounds(method, "cuda", tmp_path)
    d_cpu = np.concatenate([(a - b).ravel() for a, b in zip(cpu, w0, strict=True)])
    d_gpu = np.concatenate([(a - b).ravel() for a, b in zip(gpu, w0, strict=True)])
    assert np.isfinite(d_gpu).all() and np.linalg.norm(d_gpu) > 0
    # same update direction, not the same bits (other kernels, other summation orders)
    cosine = d_cpu @ d_gpu / (np.linalg.norm(d_cpu) * np.linalg.norm(d_gpu))
    assert cosine > 0.9999, f"{method}: GPU update differs from CPU (cosine {cosine:.6f})"
    assert m_gpu["train_loss"] == pytest.approx(m_cpu["train_loss"], rel=0.05)
