"""FedCCL client (Qiao et al., 2024): dual-clustered feature contrast.

Local objective ``CE + λ_L·L_local + λ_G·L_global`` on ``ξ = normalize(h)`` (paper Eqs. 9-13):
``L_local`` contrasts each sample with the clustered local signals of all clients (positives:
its class), ``L_global`` with the global signal ``U_j`` of every class. Round 1 is CE only
(no signals yet); samples whose class has no signal are skipped.

After local training the client extracts ``ξ`` of all its training samples (eval mode),
clusters each class with FINCH (cosine) and returns the normalised cluster means as its local
signals, through the fit metrics as arrays (``signals`` float32 M×d, ``signal_labels`` int64).
The server sends back every client's signals (``local_signals``, ``local_labels``) and the
global signals (``global_signals`` C×d, ``global_mask``) in the next round's config.

FedCCL+ (method ``fedccl_plus``) is this client with ``client.adversarial: true``: the base
loop replaces each batch by its PGD examples, so the CE and both contrast terms see the
adversarial features (paper Eqs. 21–23; ``clients/adversarial.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from clients.base import BaseClient
from clients.losses import signal_bank, signal_contrast
from core.models import Backbone, ModelOutput
from core.params import nonnegative, one_of, positive
from core.training import extract_features
from strategies.fedccl import check_round_payload, local_signals


@dataclasses.dataclass(frozen=True)
class FedCCLParams:
    lam_local: float = nonnegative(1.0)  # λ_L (0 = the "global only" ablation)
    lam_global: float = nonnegative(1.0)  # λ_G (0 = the "local only" ablation)
    tau: float = positive(0.07)
    signals: str = one_of("finch", "mean")  # mean: the "averaged signals" ablation


class FedCCLClient(BaseClient):
    Params = FedCCLParams
    exchange = "signals"  # strategies.fedccl.SignalExchange, with any aggregator
    model: Backbone  # the base build_model's: ``h`` of ``feature_dim`` features

    def setup_round(self, config: dict[str, Any]) -> None:
        """Read the server's signals (none in round 1: CE only) into one ``SignalBank``,
        after checking their shapes and values (:func:`check_round_payload`)."""
        dev = self.device
        num_classes = self.cfg["data"]["num_classes"]
        check_round_payload(config, dim=self.model.feature_dim, num_classes=num_classes)
        local_sig = local_lab = global_sig = global_mask = None
        if "local_signals" in config and len(config["local_signals"]):
            local_sig = torch.as_tensor(config["local_signals"], device=dev).float()
            local_lab = torch.as_tensor(config["local_labels"], device=dev).long()
        if "global_signals" in config:
            global_sig = torch.as_tensor(config["global_signals"], device=dev).float()
            global_mask = torch.as_tensor(config["global_mask"], device=dev).bool()
        self.bank = None
        if local_sig is not None or global_sig is not None:
            self.bank = signal_bank(
                local_sig,
                local_lab,
                global_sig,
                global_mask,
                self.cfg["data"]["num_classes"],
                self.hp.tau,
            )

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        loss = F.cross_entropy(out.logits, y)
        if self.bank is not None and (self.hp.lam_local > 0 or self.hp.lam_global > 0):
            loss = loss + signal_contrast(
                out.h, y, self.bank, self.hp.lam_local, self.hp.lam_global
            )
        return loss

    def finish_round(self) -> dict[str, Any]:
        feats = extract_features(self.model, self.data.train, 512, self.device, kind="h")
        signals, labels = local_signals(
            F.normalize(feats, dim=1).numpy(),
            self.data.train.y.numpy(),
            self.cfg["data"]["num_classes"],
            method=self.hp.signals,
        )
        return {
            "signals": signals.astype(np.float32),
            "signal_labels": labels.astype(np.int64),
            "num_signals": float(len(labels)),
            "received_signals": float(0 if self.bank is None else self.bank.num_local),
        }
