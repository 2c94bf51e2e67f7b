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

The authors' client (``system/flcore/clients/clientFedRANE.py``, ``train_raw``, of
XeniaLLL/HyperFed_and_FedRANE-master, commit 3fdab75; it builds on SphereFed) differs from
the paper; each difference is an option here, off by default (the preset
``fedrane_authors`` switches them on, the mixup on the logits: its comment says why):

- ``classifier: fixed_orthogonal``: a fixed classifier, the first C rows of a random
  orthogonal matrix, no bias, never trained (serverFedRANE.py:25-30, clientFedRANE.py:40-42);
  their logits are not scaled (``logit_scale: 1``);
- ``alpha_z``: the classifier sees ``α·Z + (1−α)·Z̃`` (``reg_graph_aug``, default 0,
  clientFedRANE.py:142); ``alpha_z: 1`` drops LRA and ``L_CD`` altogether
  (clientFedRANE.py:136: "1 for not use graph"), which is SphereFed's client;
- ``cd_similarity: cosine``: their InfoNCE compares cosines, not Pearson coefficients
  (clientFedRANE.py:87-89), weight ``nce_reg`` 0.1 and temperature 0.8 (main.py:345-349),
  i.e. ``lam_cd: 0.1, tau_cd: 0.8``;
- ``mixup_weight``/``mixup_alpha``/``mixup_on``: a second forward pass on the mixup batch
  ``λx + (1−λ)x[perm]``, ``λ ~ Beta(0.5, 0.5)`` (clientFedRANE.py:29, 65), through LRA with
  its own graph and its own ``λ_CD·L_CD`` (clientFedRANE.py:145-150), and the loss
  ``10·(λ·CE(·, y) + (1−λ)·CE(·, y[perm]))`` (clientFedRANE.py:154) applied to the mixed
  batch's features themselves (``mixup_on: features``, what line 154 does) or to its logits
  (``mixup_on: classifier``, their ``MixupLoss``/``train_mixup``, lines 112-115);
- ``lra_attention: gat`` (with ``lra_heads: 2, lra_dropout: 0.2``): their GAT instead of the
  paper's dot-product attention (``clients/lra.py``);
- ``eval_lra: false``: evaluation (global model on the server, clients' local test splits)
  without LRA, ``classifier(logit_scale·Z)``, as their ``test_metrics`` and the server's
  global test (clientFedRANE.py:336-337, serverFedRANE.py:138-139).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from clients.base import BaseClient
from clients.losses import (
    lra_discrimination_loss,
    mixup_batch,
    mixup_cross_entropy,
    mixup_draw,
)
from clients.lra import LRA
from core.models import Backbone, FixedClassifier, ModelOutput, build_model, orthogonal_rows
from core.params import Config, at_least, below_one, nonnegative, one_of, positive, unit_interval


@dataclasses.dataclass(frozen=True)
class FedRANEParams:
    lam_cd: float = nonnegative(0.2)  # λ_CD, weight of the contrastive discrimination loss
    tau_cd: float = positive(0.8)  # τ1
    lam_r: float = positive(0.1)  # λ_R, ridge of the SLIM relational weights
    lra_steps: int = at_least(0, default=1)  # L message-passing steps
    nuclear_iters: int = at_least(0, default=0)  # nuclear-norm reweighting iterations (0-3)
    logit_scale: float = positive(10.0)  # fixed scale of the classifier input (unit-norm features)
    # --- the authors' code (module docstring); the defaults are the paper's form
    cd_similarity: str = one_of("pearson", "cosine")  # similarity inside L_CD
    lra_attention: str = one_of("dot", "gat")  # Eq. 6 dot product | the authors' GAT
    lra_heads: int = at_least(1, default=1)  # attention heads (gat; dot has one)
    lra_dropout: float = below_one(0.0)  # dropout on each message-passing step's output
    alpha_z: float = unit_interval(0.0)  # classifier input α·Z + (1−α)·Z̃; 1 = no LRA at all
    classifier: str = one_of("linear", "fixed_orthogonal")  # trained | fixed, seeded, no bias
    mixup_weight: float = nonnegative(0.0)  # weight of the mixup cross-entropy (0 = off)
    mixup_alpha: float = positive(0.5)  # λ ~ Beta(α, α)
    mixup_on: str = one_of("classifier", "features")  # what the mixup CE scores
    eval_lra: bool = True  # evaluate with LRA over the evaluation batch (False: Z only)


def mix_features(z: torch.Tensor, z_aug: torch.Tensor, alpha: float) -> torch.Tensor:
    """The classifier's input ``α·Z + (1−α)·Z̃`` (clientFedRANE.py:142, not re-normalised);
    ``Z̃`` itself for α = 0 and ``Z`` for α = 1 (no arithmetic on those ends)."""
    if alpha == 0:
        return z_aug
    if alpha == 1:
        return z
    return alpha * z + (1.0 - alpha) * z_aug


class FedRANENet(nn.Module):
    """Backbone + LRA + the backbone's classifier: ``ModelOutput.h`` is ``Z`` (normalised
    backbone feature), ``z`` is ``Z̃`` (augmented; ``Z`` itself without LRA), ``logits`` come
    from ``logit_scale·mix_features(Z, Z̃, alpha_z)``.

    ``lra`` None (``alpha_z = 1``): no augmentation. ``eval_lra`` False: in eval mode the
    model skips LRA (``Z̃ = Z``, logits from ``Z``), so every evaluation of this model (the
    server's global test set, clients' local test splits) is the backbone + classifier path."""

    def __init__(
        self,
        base: Backbone,
        lra: LRA | None,
        logit_scale: float = 1.0,
        *,
        alpha_z: float = 0.0,
        eval_lra: bool = True,
    ) -> None:
        super().__init__()
        self.base, self.lra, self.logit_scale = base, lra, logit_scale
        self.alpha_z, self.eval_lra = alpha_z, eval_lra
        self.feature_dim = base.feature_dim

    def augments(self) -> bool:
        """Whether this forward pass runs LRA (a module, and training or ``eval_lra``)."""
        return self.lra is not None and (self.training or self.eval_lra)

    def forward(self, x: torch.Tensor) -> ModelOutput:
        out = self.base(x)
        z = F.normalize(out.h, dim=1)
        if self.augments():
            assert self.lra is not None
            z_aug = self.lra(z)
            feats = mix_features(z, z_aug, self.alpha_z)
        else:
            z_aug = feats = z
        logits = self.base.head.classifier(self.logit_scale * feats)
        return ModelOutput(out.levels, z, z_aug, logits)


def check_options(cfg: Config) -> None:
    """Combinations of the client options that cannot work, as errors that say what to
    change (raised at config load, through ``build_model``)."""
    c, d, m = cfg["client"], cfg["data"], cfg["model"]
    if m["projection_dim"]:
        raise ValueError(
            "FedRANE puts LRA between h and the classifier: set model.projection_dim=0"
        )
    needs_dim = c["mixup_weight"] > 0 and c["mixup_on"] == "features"
    if needs_dim and m["feature_dim"] < d["num_classes"]:
        raise ValueError(
            f"client.mixup_on=features scores the {m['feature_dim']} feature coordinates as"
            f" {d['num_classes']} classes: raise model.feature_dim to at least"
            f" {d['num_classes']} or set client.mixup_on=classifier"
        )
    if c["lra_attention"] == "dot" and c["lra_heads"] != 1:
        raise ValueError(
            f"client.lra_heads={c['lra_heads']} needs client.lra_attention=gat (the dot"
            " attention has one head): set lra_attention=gat or lra_heads=1"
        )


class FedRANEClient(BaseClient):
    Params = FedRANEParams

    @classmethod
    def build_model(cls, cfg: Config) -> nn.Module:
        check_options(cfg)
        base = build_model(cfg)
        c = cfg["client"]
        if c["classifier"] == "fixed_orthogonal":
            rows = orthogonal_rows(cfg["data"]["num_classes"], base.feature_dim, cfg["seed"])
            base.head.classifier = FixedClassifier(rows)
        lra = None
        if c["alpha_z"] < 1:
            lra = LRA(
                base.feature_dim,
                steps=c["lra_steps"],
                lam_r=c["lam_r"],
                nuclear_iters=c["nuclear_iters"],
                attention=c["lra_attention"],
                heads=c["lra_heads"],
                dropout=c["lra_dropout"],
            )
        return FedRANENet(base, lra, c["logit_scale"], alpha_z=c["alpha_z"], eval_lra=c["eval_lra"])

    @property
    def net(self) -> FedRANENet:
        assert isinstance(self.model, FedRANENet)
        return self.model

    def setup_round(self, config: dict[str, Any]) -> None:
        # With a CUDA graph, every step builds LRA's mask the graph's way, so the eager
        # warm-up steps before the capture make what the graph needs (cuSOLVER's handle,
        # whose creation a graph cannot hold, and its kernels); the host path would usually
        # skip the SLIM solve there
        if self.net.lra is not None:
            self.net.lra.graph_mask = self.graphed()

    def graph_safe(self) -> bool:
        """Under a CUDA graph LRA builds its mask without host decisions
        (``LRA._graph_neighbours``); the nuclear-norm reweighting's ``eigh`` checks its result
        on the host, so ``nuclear_iters > 0`` trains without the graph. Mixup draws λ and
        its permutation on the host every step, and the GAT attention and LRA dropout have
        not been checked against the graph contract on a GPU: those train without it too."""
        hp = self.hp
        return (
            hp.nuclear_iters == 0
            and hp.mixup_weight == 0
            and hp.lra_attention == "dot"
            and hp.lra_dropout == 0
        )

    def discrimination(self, out: ModelOutput) -> torch.Tensor | None:
        """``L_CD(Z, Z̃)`` of a forward pass, or None when it is off (λ_CD = 0, or no LRA)."""
        if self.hp.lam_cd == 0 or self.net.lra is None:
            return None
        return lra_discrimination_loss(out.h, out.z, self.hp.tau_cd, self.hp.cd_similarity)

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        """``CE + λ_CD·L_CD`` (Eq. 9), plus with ``mixup_weight`` > 0 the authors' mixup
        branch: ``w·mixup-CE + λ_CD·L_CD`` of a second forward pass on the mixed batch
        (clientFedRANE.py:143-154)."""
        loss = F.cross_entropy(out.logits, y)
        cd = self.discrimination(out)  # None: no L_CD term, its 2B×2B similarity is skipped
        if cd is not None:
            loss = loss + self.hp.lam_cd * cd
        if self.hp.mixup_weight == 0:
            return loss
        lam, perm = mixup_draw(len(x), self.hp.mixup_alpha)
        mixed = self.model(mixup_batch(x, lam, perm))
        scored = (
            mixed.logits
            if self.hp.mixup_on == "classifier"
            else mix_features(mixed.h, mixed.z, self.hp.alpha_z)
        )
        y_b = y[perm.to(y.device)]
        loss = loss + self.hp.mixup_weight * mixup_cross_entropy(scored, y, y_b, lam)
        cd_mixed = self.discrimination(mixed)
        if cd_mixed is not None:
            loss = loss + self.hp.lam_cd * cd_mixed
        return loss
