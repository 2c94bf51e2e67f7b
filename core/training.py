"""Framework-level training utilities shared by every client and the server's evaluator."""

from __future__ import annotations

import os
from functools import lru_cache

import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits
from torch import nn

from core.data import TensorSplit

_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_limited_to: int | None = None  # the thread limit this process has set


def limit_threads(n: int) -> None:
    """Run this process's torch, BLAS and OpenMP work on ``n`` threads: the libraries
    loaded now (threadpoolctl) and those loaded later (their environment variables, read
    when a library loads; e.g. scipy's BLAS once FINCH or scikit-learn is imported).
    Threads beyond the free cores spin against busy ones: on the 2-core box with clients
    training, the server's Gram of 100 deltas took 9 s on 2 threads, 0.5 s on one."""
    global _limited_to
    torch.set_num_threads(n)
    if _limited_to == n:  # every client message calls this; threadpoolctl
        return  # takes ≈5 ms to find the libraries, which then keep the limit
    for var in _THREAD_ENV:
        os.environ[var] = str(n)
    threadpool_limits(limits=n)
    _limited_to = n


def pick_device(name: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; ``cuda:N`` fails clearly without a GPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"client.device={name!r} but CUDA is not available; use cpu or auto")
    return torch.device(name)


@lru_cache(maxsize=8)
def numerics(device: str) -> str:
    """What, besides the config (``client.num_threads`` among it), decides the last bits of
    a computation on ``device`` (``"cpu"``, ``"cuda:0"``, …), as one line: torch's version
    and the CPU instruction set its kernels dispatch to
    (``torch.backends.cpu.get_cpu_capability()``: e.g. AVX2 or AVX512), and on a CUDA device
    its name. Runs of one seed and config repeat bit for bit on CPU where this line is the
    same; where it differs, their floats differ from the first step, and training amplifies
    that (README, "Results files")."""
    line = f"torch {torch.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}"
    if device.startswith("cuda"):
        line += f", {torch.cuda.get_device_name(torch.device(device))}"
    return line


def batch_indices(
    n: int,
    batch_size: int,
    generator: torch.Generator,
    epochs: int = 1,
    steps: int | None = None,
    drop_last: bool = False,
) -> list[torch.Tensor]:
    """Mini-batch index tensors: ``epochs`` shuffled passes, or exactly ``steps`` batches
    (re-shuffling after each pass). A trailing batch of one sample is dropped (contrastive
    losses and normalisation need two), unless the whole split has one sample; with
    ``batch_size=1`` every batch has one sample and none is dropped. With ``drop_last`` every
    trailing batch smaller than ``batch_size`` is dropped (torch's ``DataLoader(drop_last=
    True)``), so a split smaller than one batch has no batches. An empty split has no
    batches."""
    out: list[torch.Tensor] = []
    if n == 0 or (drop_last and n < batch_size):
        return out
    passes = epochs if steps is None else None
    while True:
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            if drop_last and len(idx) < batch_size:
                continue
            if len(idx) == 1 and n > 1 and batch_size > 1:  # a trailing remainder of one
                continue
            out.append(idx)
            if steps is not None and len(out) == steps:
                return out
        if passes is not None:
            passes -= 1
            if passes == 0:
                return out


@torch.no_grad()
def evaluate_model(
    model: nn.Module, split: TensorSplit, batch_size: int, device: torch.device
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``split`` (eval mode)."""
    if len(split) == 0:
        return float("nan"), float("nan")
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(split), batch_size):
        x = split.x[start : start + batch_size].to(device, non_blocking=True)
        y = split.y[start : start + batch_size].to(device, non_blocking=True)
        logits = model(x).logits
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    return loss / len(split), correct / len(split)


@torch.no_grad()
def extract_features(
    model: nn.Module, split: TensorSplit, batch_size: int, device: torch.device, kind: str = "h"
) -> torch.Tensor:
    """Backbone features (``h``) or projections (``z``) of every sample, on the CPU."""
    model.eval()
    feats = []
    for start in range(0, len(split), batch_size):
        out = model(split.x[start : start + batch_size].to(device))
        feats.append(getattr(out, kind).float().cpu())
    return torch.cat(feats) if feats else torch.empty(0)
