"""FedRANE client (local relational augmentation, LRA) — the client half of FedRANE.

The model wraps the backbone: ``Z = normalize(h)``; the LRA module builds a relational graph
over the batch (Pearson similarity → SLIM weights → symmetric adjacency) and runs attentive
message passing to get ``Z̃``; the classifier predicts from ``Z̃``. The LRA parameters (W,
W_m, W_n) are model parameters and are aggregated like the rest. Loss:
``CE(predictor(Z̃), y) + λ_CD·L_CD(Z, Z̃)`` (FedRANE Eq. 8-10). At evaluation LRA runs over
the evaluation batch (``evaluation.batch_size``), as documented in the README.
Unit-norm features give logits bounded by the classifier's weight norms, which makes CE slow
to train; the classifier therefore sees ``logit_scale·Z̃`` (a fixed scale, as in cosine
classifiers; ``logit_scale: 1`` is the paper's literal form).
The server half is GNE (``strategies/gne.py``); the methods ``fedrane_wo_lra`` and
``fedrane_wo_gne`` are the paper's ablations.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from clients.base import BaseClient
from clients.losses import lra_discrimination_loss
from clients.lra import LRA
from fl_app.config import Config, at_least, nonnegative, positive
from fl_app.models import Backbone, ModelOutput, build_model


@dataclasses.dataclass(frozen=True)
class FedRANEParams:
    lam_cd: float = nonnegative(0.2)  # λ_CD, weight of the contrastive discrimination loss
    tau_cd: float = positive(0.8)  # τ1
    lam_r: float = positive(0.1)  # λ_R, ridge of the SLIM relational weights
    lra_steps: int = at_least(0, default=1)  # L message-passing steps
    nuclear_iters: int = at_least(0, default=0)  # nuclear-norm reweighting iterations (0-3)
    logit_scale: float = positive(10.0)  # fixed scale of the classifier input (unit-norm features)


class FedRANENet(nn.Module):
    """Backbone + LRA + the backbone's classifier: ``ModelOutput.h`` is ``Z`` (normalised
    backbone feature), ``z`` is ``Z̃`` (augmented), ``logits`` come from ``Z̃``."""

    def __init__(self, base: Backbone, lra: LRA, logit_scale: float = 1.0) -> None:
        super().__init__()
        self.base, self.lra, self.logit_scale = base, lra, logit_scale
        self.feature_dim = base.feature_dim

    def forward(self, x: torch.Tensor) -> ModelOutput:
        out = self.base(x)
        z = F.normalize(out.h, dim=1)
        z_aug = self.lra(z)
        logits = self.base.head.classifier(self.logit_scale * z_aug)
        return ModelOutput(out.levels, z, z_aug, logits)


class FedRANEClient(BaseClient):
    Params = FedRANEParams

    @classmethod
    def build_model(cls, cfg: Config) -> nn.Module:
        if cfg["model"]["projection_dim"]:
            raise ValueError(
                "FedRANE puts LRA between h and the classifier: set model.projection_dim=0"
            )
        base = build_model(cfg)
        c = cfg["client"]
        lra = LRA(
            base.feature_dim,
            steps=c["lra_steps"],
            lam_r=c["lam_r"],
            nuclear_iters=c["nuclear_iters"],
        )
        return FedRANENet(base, lra, c["logit_scale"])

    def setup_round(self, config: dict[str, Any]) -> None:
        # With a CUDA graph, every step builds LRA's mask the graph's way, so the eager
        # warm-up steps before the capture make what the graph needs (cuSOLVER's handle,
        # whose creation a graph cannot hold, and its kernels); the host path would usually
        # skip the SLIM solve there
        lra = self.model.lra
        assert isinstance(lra, LRA)
        lra.graph_mask = self.graphed()

    def graph_safe(self) -> bool:
        """Under a CUDA graph LRA builds its mask without host decisions
        (``LRA._graph_neighbours``); the nuclear-norm reweighting's ``eigh`` checks its result
        on the host, so ``nuclear_iters > 0`` trains without the graph."""
        return self.hp.nuclear_iters == 0

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        ce = F.cross_entropy(out.logits, y)
        if self.hp.lam_cd == 0:  # no L_CD term: skip its 2B×2B similarity and its backward
            return ce
        return ce + self.hp.lam_cd * lra_discrimination_loss(out.h, out.z, self.hp.tau_cd)
