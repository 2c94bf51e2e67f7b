"""MOON client (Li, He & Song, CVPR 2021): model-contrastive local objective.

Loss per batch: ``CE(logits, y) + μ·ℓ_con(z, z_glob, z_prev_1..M)`` (MOON Eq. 3), with
``z_glob`` from the received global model and ``z_prev_m`` from this client's own previous
local models (FIFO buffer of size M, from the last rounds it took part in); both frozen.
A client with no previous model yet trains with CE only. The buffer lives in the state store
(on disk, keyed by partition id), so it survives the rounds the client skips, the per-round
rebuild of client objects in simulation and process restarts in deployment.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from clients.base import BaseClient, FrozenStack
from clients.losses import moon_loss
from core.models import ModelOutput
from core.params import at_least, nonnegative, positive

STATE_KEY = "moon_prev"


@dataclasses.dataclass(frozen=True)
class MoonParams:
    mu: float = nonnegative(5.0)  # contrastive weight (5 for 10 classes, 1 for CIFAR-100)
    tau: float = positive(0.5)  # temperature
    buffer_size: int = at_least(1, default=1)  # M previous local models used as negatives


class MoonClient(BaseClient):
    Params = MoonParams
    KEEPS_STATE = True  # the previous local models

    def setup_round(self, config: dict[str, Any]) -> None:
        self.prev_states = self.load_states(STATE_KEY)
        # slot 0: the received global model; slots 1..M: previous local models
        self.frozen = FrozenStack(
            self.model, [self.state_dict_cpu(), *self.prev_states], self.device
        )

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        ce = F.cross_entropy(out.logits, y)
        if not self.prev_states:
            return ce
        z_all = self.frozen.z(x)
        return ce + self.hp.mu * moon_loss(out.z, z_all[0], z_all[1:], self.hp.tau)

    def finish_round(self) -> dict[str, Any]:
        if self.store is not None:
            buffer = [*self.prev_states, self.state_dict_cpu()][-self.hp.buffer_size :]
            self.store.save(self.pid, STATE_KEY, buffer)
        return {"moon_negatives": float(len(self.prev_states))}
