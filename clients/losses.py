"""Every local objective term as a pure tensor function (no Flower, no model code).

All functions compute in fp32 with log-softmax / logsumexp (never ``log(exp(·)/·)``), accept a
batch of one and batches of a single class, and return a scalar that stays connected to the
autograd graph of their inputs even when it is zero (so ``backward`` always works).
Notation as in METHODS.md: ``sim`` cosine similarity, ``τ`` temperature.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


def _zero(*tensors: torch.Tensor) -> torch.Tensor:
    """A graph-connected fp32 zero."""
    return sum((t.float().sum() * 0.0 for t in tensors), torch.zeros(()))  # type: ignore[return-value]


def _masked_logsumexp(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row-wise ``log Σ_{j: mask_ij} e^{logits_ij}`` (−inf for an empty row)."""
    return torch.logsumexp(logits.masked_fill(~mask, NEG_INF), dim=1)


def proximal_term(
    params: Iterable[torch.Tensor], global_params: Iterable[torch.Tensor], mu: float
) -> torch.Tensor:
    """FedProx proximal term ``μ/2 · Σ ‖w − W‖²`` over matching parameter tensors
    (Li et al., 2020, Eq. 2). ``global_params`` are treated as constants."""
    total = None
    for w, g in zip(params, global_params, strict=True):
        term = (w.float() - g.detach().float()).pow(2).sum()
        total = term if total is None else total + term
    if total is None:
        return torch.zeros(())
    return 0.5 * mu * total


def moon_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: Sequence[torch.Tensor], tau: float
) -> torch.Tensor:
    """MOON model-contrastive loss (Li et al., CVPR 2021, Eq. 2), mean over the batch.

    ``ℓ_con = −log( e^{sim(z,z_glob)/τ} / (e^{sim(z,z_glob)/τ} + Σ_m e^{sim(z,z_prev_m)/τ}) )``
    computed as cross-entropy over ``[sim_pos, sim_neg_1..M]/τ`` with target 0.
    ``z``, ``z_glob``, each ``z_prev[m]``: (B, d). With no previous model the loss is 0."""
    if len(z_prev) == 0:
        return _zero(z)
    z = z.float()
    pos = F.cosine_similarity(z, z_glob.float().detach(), dim=1)
    negs = [F.cosine_similarity(z, p.float().detach(), dim=1) for p in z_prev]
    logits = torch.stack([pos, *negs], dim=1) / tau
    target = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits, target)


def _similarities(features: torch.Tensor) -> torch.Tensor:
    f = F.normalize(features.float(), dim=1)
    return f @ f.T


def supcon_loss(features: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """Supervised contrastive term of FedRCL (Seo et al., CVPR 2024, Eq. 3).

    For anchor i with positives ``Pos_i = {j ≠ i : y_j = y_i}``:
    ``(1/|Pos_i|) Σ_{j∈Pos_i} −log( e^{s_ij/τ} / Σ_{k≠i} e^{s_ik/τ} )``, ``s`` cosine
    similarities of ``features`` (B, d). Mean over anchors that have a positive; 0 if none."""
    s = _similarities(features) / tau
    n = len(labels)
    eye = torch.eye(n, dtype=torch.bool, device=s.device)
    same = (labels[:, None] == labels[None, :]) & ~eye
    has_pos = same.any(dim=1)
    if not bool(has_pos.any()):
        return _zero(features)
    log_den = _masked_logsumexp(s, ~eye)  # Σ_{k≠i}
    log_prob = s - log_den[:, None]
    per_anchor = -(log_prob * same).sum(dim=1) / same.sum(dim=1).clamp(min=1)
    return per_anchor[has_pos].mean()


def divergence_penalty(
    features: torch.Tensor, labels: torch.Tensor, tau: float, lam: float
) -> torch.Tensor:
    """FedRCL divergence penalty, paper Eq. 5, per anchor
    ``log(1 + Σ_{k∈P_i} e^{(s_ik − 1)/τ})`` with ``P_i = {k ≠ i : y_k = y_i, s_ik > λ}``
    (equal to ``log(Σ_{P_i} e^{s_ik/τ} + e^{1/τ}) − 1/τ``). Mean over all anchors; anchors
    with empty ``P_i`` contribute 0."""
    s = _similarities(features)
    n = len(labels)
    eye = torch.eye(n, dtype=torch.bool, device=s.device)
    mask = (labels[:, None] == labels[None, :]) & ~eye & (s.detach() > lam)
    logits = torch.cat([torch.zeros(n, 1, device=s.device), (s - 1.0) / tau], dim=1)
    full = torch.cat([torch.ones(n, 1, dtype=torch.bool, device=s.device), mask], dim=1)
    return _masked_logsumexp(logits, full).mean()


def _hard_mined(
    features: torch.Tensor, labels: torch.Tensor, tau: float, lam: float, beta: float
) -> torch.Tensor:
    """The FedRCL authors' code: per anchor, SCL over [hardest positive (least similar
    same-class sample, self included), two hardest negatives (most similar other-class
    samples, missing ones ignored)] and a penalty ``softplus((s_min − 1)/τ)`` applied only
    when even the least similar other same-class sample is above λ."""
    s = _similarities(features)
    n = len(labels)
    eye = torch.eye(n, dtype=torch.bool, device=s.device)
    same = labels[:, None] == labels[None, :]
    pos = s.masked_fill(~same, float("inf")).min(dim=1).values  # self included
    neg_sims = s.masked_fill(same, NEG_INF)
    k = min(2, n)
    top_neg = neg_sims.topk(k, dim=1).values
    logits = torch.cat([pos[:, None], top_neg], dim=1) / tau
    scl = -(logits[:, 0] - torch.logsumexp(logits, dim=1))
    others = same & ~eye
    s_min = s.masked_fill(~others, float("inf")).min(dim=1).values
    active = others.any(dim=1) & (s_min.detach() >= lam)
    pen = torch.where(
        active, F.softplus((s_min.masked_fill(~active, 0.0) - 1.0) / tau), torch.zeros_like(s_min)
    )
    return scl.mean() + beta * pen.mean()


def rcl_level_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    tau: float,
    beta: float,
    lam: float,
    mining: str = "paper",
) -> torch.Tensor:
    """FedRCL loss on one feature level: ``supcon + β·penalty`` (paper form, Eqs. 3 and 5)
    or the authors' hard-mined variant (``mining='hard'``)."""
    if mining == "paper":
        loss = supcon_loss(features, labels, tau)
        if beta:
            loss = loss + beta * divergence_penalty(features, labels, tau, lam)
        return loss
    if mining == "hard":
        return _hard_mined(features, labels, tau, lam, beta)
    raise ValueError(f"mining={mining!r}; allowed: paper, hard")


def rcl_loss(
    levels: Sequence[torch.Tensor],
    labels: torch.Tensor,
    tau: float = 0.05,
    beta: float = 1.0,
    lam: float = 0.7,
    mining: str = "paper",
) -> torch.Tensor:
    """FedRCL ``L_RCL``: mean over feature levels (each (B, C_l), normalised inside) of
    :func:`rcl_level_loss` (paper Eq. 6, multi-level)."""
    if not levels:
        raise ValueError("rcl_loss needs at least one feature level")
    return torch.stack([rcl_level_loss(f, labels, tau, beta, lam, mining) for f in levels]).mean()


def signal_contrast_local(
    xi: torch.Tensor,
    labels: torch.Tensor,
    signals: torch.Tensor,
    signal_labels: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """FedCCL local clustered contrast (Qiao et al., 2024, Eq. 11), mean over used samples:
    ``−log( Σ_{Z: label y_i} e^{sim(ξ_i,Z)/τ} / Σ_{all Z} e^{sim(ξ_i,Z)/τ} )``.
    ``xi`` (B, d), ``signals`` (M, d), ``signal_labels`` (M,). Samples whose class has no
    signal are skipped; 0 when none is used."""
    if signals.numel() == 0:
        return _zero(xi)
    sim = F.normalize(xi.float(), dim=1) @ F.normalize(signals.float(), dim=1).T / tau
    pos = labels[:, None] == signal_labels[None, :]
    used = pos.any(dim=1)
    if not bool(used.any()):
        return _zero(xi)
    per = torch.logsumexp(sim, dim=1) - _masked_logsumexp(sim, pos)
    return per[used].mean()


def signal_contrast_global(
    xi: torch.Tensor, labels: torch.Tensor, U: torch.Tensor, mask: torch.Tensor, tau: float
) -> torch.Tensor:
    """FedCCL global clustered contrast (Eq. 13), mean over used samples:
    ``−log( e^{sim(ξ_i,U_{y_i})/τ} / Σ_{j: mask_j} e^{sim(ξ_i,U_j)/τ} )``. ``U`` (C, d),
    ``mask`` (C,) classes with a global signal; samples of masked-out classes are skipped."""
    mask = mask.bool()
    if not bool(mask.any()):
        return _zero(xi)
    used = mask[labels]
    if not bool(used.any()):
        return _zero(xi)
    sim = F.normalize(xi.float(), dim=1) @ F.normalize(U.float(), dim=1).T / tau
    sim = sim.masked_fill(~mask[None, :], NEG_INF)
    log_p = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    picked = log_p.gather(1, labels[:, None]).squeeze(1)
    return -picked[used].mean()


def pmfl_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_hist: Sequence[torch.Tensor], tau: float
) -> torch.Tensor:
    """PMFL historical-model contrast (METHODS.md), mean over the batch.

    Threshold ``μ_i = sim(z_i, Z_g,i)`` (detached); historical ``z_j`` with
    ``sim(z_i, z_j) ≥ μ_i`` join the global positive, the rest are negatives:
    ``pos = e^{sim(z,Z_g)/τ} + Σ_{Z⁺} e^{sim/τ}``, ``neg = Σ_{Z⁻} e^{sim/τ}``,
    ``ℓ = −log(pos / (pos + neg))``. Empty history → 0."""
    if len(z_hist) == 0:
        return _zero(z)
    z = z.float()
    s_g = F.cosine_similarity(z, z_glob.float().detach(), dim=1)
    s_h = torch.stack([F.cosine_similarity(z, h.float().detach(), dim=1) for h in z_hist], 1)
    positive = torch.cat(
        [torch.ones_like(s_g, dtype=torch.bool)[:, None], s_h.detach() >= s_g.detach()[:, None]],
        dim=1,
    )
    logits = torch.cat([s_g[:, None], s_h], dim=1) / tau
    return (torch.logsumexp(logits, dim=1) - _masked_logsumexp(logits, positive)).mean()


def _pearson(x: torch.Tensor) -> torch.Tensor:
    c = x.float() - x.float().mean(dim=1, keepdim=True)
    return F.normalize(c, dim=1)


def lra_discrimination_loss(z: torch.Tensor, z_aug: torch.Tensor, tau: float = 0.8) -> torch.Tensor:
    """FedRANE contrastive discrimination ``L_CD`` (Eq. 10): NT-Xent over the 2B views
    ``[Z; Z̃]`` with positive pairs ``(i, B+i)``, similarity = Pearson correlation, self
    excluded from the denominator, mean over the 2B anchors. B = 1 is finite (one negative-
    free pair gives loss 0)."""
    v = _pearson(torch.cat([z, z_aug], dim=0))
    n2 = len(v)
    b = n2 // 2
    sim = v @ v.T / tau
    eye = torch.eye(n2, dtype=torch.bool, device=v.device)
    idx = torch.arange(n2, device=v.device)
    partner = torch.where(idx < b, idx + b, idx - b)
    log_den = _masked_logsumexp(sim, ~eye)
    pos = sim[idx, partner]
    return (log_den - pos).mean()
