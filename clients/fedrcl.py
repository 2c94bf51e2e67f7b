"""FedRCL client (Seo et al., CVPR 2024): relaxed supervised contrastive learning.

Loss per batch: ``CE + L_RCL`` with ``L_RCL`` the mean over feature levels (every conv stage,
pooled and normalised) of the supervised contrastive term plus the divergence penalty
``β·log(1 + Σ_{k∈P_i} e^{(s_ik−1)/τ})`` on same-class pairs more similar than λ (paper
Eq. 5). ``beta: 0`` gives FedSCL (the paper's ablation); ``levels: last`` uses the last level
only; ``mining: hard`` is the authors' code (hardest positive, two hardest negatives).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from clients.base import BaseClient
from clients.losses import rcl_loss
from fl_app.config import hyper, nonnegative, one_of, positive
from fl_app.models import ModelOutput


@dataclasses.dataclass(frozen=True)
class FedRCLParams:
    tau: float = positive(0.05)  # temperature
    beta: float = nonnegative(1.0)  # divergence-penalty weight (0 = FedSCL)
    # similarity threshold λ of the penalty (a cosine)
    lam: float = hyper(0.7, "-1 <= x <= 1", lambda v: -1 <= v <= 1)
    mining: str = one_of("paper", "hard")  # hard: the authors' code
    levels: str = one_of("all", "last")
    rcl_weight: float = nonnegative(1.0)  # weight of L_RCL next to CE


class FedRCLClient(BaseClient):
    Params = FedRCLParams

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        levels = out.levels if self.hp.levels == "all" else out.levels[-1:]
        rcl = rcl_loss(
            levels, y, tau=self.hp.tau, beta=self.hp.beta, lam=self.hp.lam, mining=self.hp.mining
        )
        return F.cross_entropy(out.logits, y) + self.hp.rcl_weight * rcl
