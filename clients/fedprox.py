"""FedProx client: cross-entropy plus the proximal term μ/2·‖w − W‖² (Li et al., 2020)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from clients.base import BaseClient
from clients.losses import proximal_term
from core.models import ModelOutput
from core.params import nonnegative


@dataclasses.dataclass(frozen=True)
class FedProxParams:
    mu: float = nonnegative(0.001)  # proximal weight (0.001 in FedRCL's comparison)


class FedProxClient(BaseClient):
    Params = FedProxParams

    def setup_round(self, config: dict[str, Any]) -> None:
        self.global_params = [p.detach().clone() for p in self.model.parameters()]

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        ce = F.cross_entropy(out.logits, y)
        return ce + proximal_term(self.model.parameters(), self.global_params, self.hp.mu)
