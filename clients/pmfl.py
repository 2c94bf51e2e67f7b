"""PMFL client (historical model contrast): contrast with the global model and the client's
N most recent local iterates.

Per step and sample: ``z`` (current model), ``Z_g`` (global model, frozen) and ``z_j`` for
every buffered iterate (frozen). Threshold ``μ_i = sim(z_i, Z_g,i)`` (detached; the paper's
``Sim(z^{tE}, Z^t)`` is identically 1 because ``w^{tE} = W^t``, so the current representation
is used); historical representations at least that similar are positives, the rest
negatives (see ``clients.losses.pmfl_loss``). Loss ``CE + λ·ℓ_con``. After each step the new
iterate is pushed into the buffer; the buffer is kept per node across rounds in the
disk-backed state store.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from clients.base import BaseClient
from clients.losses import pmfl_loss
from fl_app.models import ModelOutput

STATE_KEY = "pmfl_buffer"


@dataclasses.dataclass(frozen=True)
class PMFLParams:
    lam: float = 0.5  # weight λ of the contrastive term (0 = the w/o MCT ablation)
    tau: float = 0.5  # temperature
    buffer_size: int = 5  # N most recent local iterates


class PMFLClient(BaseClient):
    Params = PMFLParams

    def setup_round(self, config: dict[str, Any]) -> None:
        self.global_model = self.frozen_copy(self.state_dict_cpu())
        states: list[dict[str, torch.Tensor]] = []
        if self.store is not None and self.hp.lam > 0:
            states = self.store.load(self.pid, STATE_KEY) or []
        self.buffer: list[nn.Module] = [self.frozen_copy(s) for s in states]

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        ce = F.cross_entropy(out.logits, y)
        if self.hp.lam == 0:
            return ce
        with torch.no_grad():
            z_glob = self.global_model(x).z
            z_hist = [m(x).z for m in self.buffer]
        return ce + self.hp.lam * pmfl_loss(out.z, z_glob, z_hist, self.hp.tau)

    def after_step(self) -> None:
        """Push the new iterate: reuse the oldest frozen model's storage once the buffer is
        full (no allocation per step)."""
        if self.hp.lam == 0 or self.hp.buffer_size < 1:
            return
        if len(self.buffer) < self.hp.buffer_size:
            self.buffer.append(self.frozen_copy(self.state_dict_cpu()))
            return
        oldest = self.buffer.pop(0)
        with torch.no_grad():
            for dst, src in zip(
                oldest.state_dict().values(), self.model.state_dict().values(), strict=True
            ):
                dst.copy_(src)
        self.buffer.append(oldest)

    def finish_round(self) -> dict[str, Any]:
        if self.store is not None and self.hp.lam > 0:
            states = [
                {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}
                for m in self.buffer
            ]
            self.store.save(self.pid, STATE_KEY, states)
        return {"pmfl_buffer": float(len(self.buffer))}
