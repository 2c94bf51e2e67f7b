"""FedCCL's two loss terms alone, as the paper writes them (L_local, L_global): the client
computes both in one pass (:func:`clients.losses.signal_contrast`), and the tests check that
pass against these."""

from __future__ import annotations

import torch

from clients.losses import signal_bank, signal_contrast


def signal_contrast_local(
    xi: torch.Tensor,
    labels: torch.Tensor,
    signals: torch.Tensor,
    signal_labels: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """FedCCL ``L_local`` alone (:func:`signal_contrast` with λ_G = 0): ``signals`` (M, d) the
    local clustered signals of all clients (constants), ``signal_labels`` (M,) their classes.
    Mean over the samples whose class has a signal; none, or M = 0 → graph-connected 0."""
    top = max(int(t.max()) if t.numel() else 0 for t in (labels, signal_labels.long()))
    bank = signal_bank(signals, signal_labels, None, None, top + 1, tau)
    return signal_contrast(xi, labels, bank, lam_local=1.0, lam_global=0.0)


def signal_contrast_global(
    xi: torch.Tensor, labels: torch.Tensor, U: torch.Tensor, mask: torch.Tensor, tau: float
) -> torch.Tensor:
    """FedCCL ``L_global`` alone (:func:`signal_contrast` with λ_L = 0): ``U`` (C, d) global
    signals (constants), ``mask`` (C,) bool, True where class j has one (the softmax runs over
    those only). Mean over the samples whose class is unmasked; none → graph-connected 0."""
    bank = signal_bank(None, None, U, mask.bool(), U.shape[0], tau)
    return signal_contrast(xi, labels, bank, lam_local=0.0, lam_global=1.0)
