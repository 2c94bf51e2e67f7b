"""Every local objective term as a pure tensor function (no Flower, no model code).

Common contract (METHODS.md):

* all arithmetic is fp32 with autocast disabled inside the function, and every softmax is a
  ``log_softmax`` / ``logsumexp`` (never ``log(exp(·)/·)``), so 1/τ = 20 (τ = 0.05) or more
  cannot overflow; the one exception are sums of ``e^{(s−1)/τ}`` over cosines s ∈ [−1, 1]
  (FedRCL, FedCCL hot paths), used only while 2/τ ≤ 80 (`_shift_is_exact`): every term lies in
  [e^{−80}, 1] and neither overflows nor underflows in fp32;
* every loss returns a 0-dim fp32 tensor, already reduced (the reduction is stated per
  function);
* a batch of one, a batch of a single class, an empty history/buffer and a batch in which no
  sample qualifies are all valid: the result is then a zero that is still connected to the
  autograd graph of the trainable input (``x.sum() * 0``), so ``backward`` always works;
* reference tensors that the papers treat as constants (the global / previous / historical
  representations, the clustered signals, the global parameters) are detached here.

``sim`` is cosine similarity and ``τ`` the temperature throughout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")
POS_INF = float("inf")
MINING = ("paper", "hard")
_SAFE_EXPONENT = 80.0  # e^{−80} ≈ 1.8e−35 is still a normal float32
_TINY = 1e-37  # below every e^{−x} with x ≤ 80: clamps only sums that are exactly 0
_NEG_BIG = -1e30  # finite stand-in for log 0 (a skipped row, multiplied by 0 afterwards)


# --------------------------------------------------------------------------- helpers
def _fp32(x: torch.Tensor) -> AbstractContextManager[None]:
    """Context that switches autocast off on ``x``'s device (the losses must stay fp32)."""
    return torch.autocast(device_type=x.device.type, enabled=False)


def _zero(x: torch.Tensor) -> torch.Tensor:
    """A graph-connected fp32 scalar zero (``x.sum() * 0``)."""
    return x.float().sum() * 0.0


def _unit(x: torch.Tensor) -> torch.Tensor:
    """Rows L2-normalised in fp32; a zero row stays zero (cosine 0 to everything)."""
    return F.normalize(x.float().flatten(1), dim=1)


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity of two (B, d) tensors, shape (B,)."""
    return (_unit(a) * _unit(b)).sum(dim=1)


def _cos_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """All-pairs cosine similarity, (N, d) × (M, d) → (N, M)."""
    return _unit(a) @ _unit(b).T


def _shift_is_exact(tau: float) -> bool:
    """Whether sums of ``e^{(s−1)/τ}`` over cosines s ∈ [−1, 1] are exact in fp32: every
    term lies in [e^{−2/τ}, 1], which neither overflows nor underflows while 2/τ ≤ 80. The
    FedRCL and FedCCL hot paths use such sums then, and ``logsumexp`` otherwise."""
    return 2.0 / tau <= _SAFE_EXPONENT


def _masked_logsumexp(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Row-wise (last dim) ``log Σ_{j : keep_ij} e^{logits_ij}`` (−inf for a row that keeps
    nothing); ``keep`` broadcasts against ``logits``."""
    return torch.logsumexp(logits.masked_fill(~keep, NEG_INF), dim=-1)


def _check_mining(mining: str) -> None:
    if mining not in MINING:
        raise ValueError(f"mining={mining!r}; allowed: {', '.join(MINING)}")


# --------------------------------------------------------------------------- FedProx
def proximal_term(
    params: Iterable[torch.Tensor], global_params: Iterable[torch.Tensor], mu: float
) -> torch.Tensor:
    """FedProx proximal term ``μ/2 · Σ_t ‖w_t − W_t‖²`` (Li et al., MLSys 2020, Eq. 2).

    ``params`` and ``global_params`` are matching sequences of tensors of equal shapes (the
    local model's parameters and the received global ones, treated as constants). Reduction:
    sum over every element of every tensor. Returns a 0-dim fp32 tensor; 0 for no tensors.
    Raises ``ValueError`` on a length or shape mismatch.

    The value and its gradient ``μ(w_t − W_t)`` are computed for all tensors at once
    (multi-tensor ``_foreach`` kernels), not tensor by tensor: on a GPU the per-tensor form
    launched ≈ 6 small kernels per tensor each step (ResNet-18's 62 tensors: +10 ms a step,
    FedProx at 1.8× FedAvg's step time on an H100)."""
    pairs = list(zip(params, global_params, strict=True))
    for w, g in pairs:
        if w.shape != g.shape:
            raise ValueError(f"parameter shape {tuple(w.shape)} != global {tuple(g.shape)}")
    if not pairs:
        return torch.zeros(())
    ws = [w for w, _ in pairs]
    gs = [g.detach().to(w.device) for w, g in pairs]
    with _fp32(ws[0]):
        return _Proximal.apply(mu, gs, *ws)


class _Proximal(torch.autograd.Function):
    """``μ/2 · Σ_t ‖w_t − W_t‖²`` as one autograd node; backward ``μ(w_t − W_t)`` (exact, also
    where ``w_t = W_t``, unlike differentiating the norms)."""

    @staticmethod
    def forward(
        ctx: Any,  # FunctionCtx, with this node's own attributes
        mu: float,
        global_params: list[torch.Tensor],
        *params: torch.Tensor,
    ) -> torch.Tensor:
        diffs = torch._foreach_sub([w.float() for w in params], [g.float() for g in global_params])
        ctx.save_for_backward(*diffs)
        ctx.mu, ctx.dtypes = mu, [w.dtype for w in params]
        return 0.5 * mu * torch.stack(torch._foreach_norm(diffs)).pow(2).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable  # a second derivative raises, never drops μ·I
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = torch._foreach_mul(list(ctx.saved_tensors), grad * ctx.mu)
        need = ctx.needs_input_grad[2:]  # frozen tensors get None
        return (
            None,
            None,
            *(g.to(dt) if n else None for g, dt, n in zip(grads, ctx.dtypes, need, strict=True)),
        )


# --------------------------------------------------------------------------- MOON
def moon_loss(
    z: torch.Tensor,
    z_glob: torch.Tensor,
    z_prev: torch.Tensor | Sequence[torch.Tensor],
    tau: float,
) -> torch.Tensor:
    """MOON model-contrastive loss ``ℓ_con`` (Li, He & Song, CVPR 2021, §3.2):

    ``ℓ_con = −log( e^{sim(z,z_glob)/τ} / (e^{sim(z,z_glob)/τ} + Σ_m e^{sim(z,z_prev_m)/τ}) )``,

    computed as cross-entropy over the logits ``[sim_pos, sim_neg_1..M] / τ`` with target 0.
    ``z`` (B, d) local projections; ``z_glob`` (B, d) from the global model; ``z_prev`` M
    tensors (B, d) from the previous local model(s) (a stacked (M, B, d) tensor also works).
    Reduction: mean over the batch. M = 0 (first participation) → graph-connected 0."""
    if len(z_prev) == 0 or z.shape[0] == 0:
        return _zero(z)
    with _fp32(z):
        pos = _cos(z, z_glob.detach())
        negs = [_cos(z, p.detach()) for p in z_prev]
        logits = torch.stack([pos, *negs], dim=1) / tau
        return (torch.logsumexp(logits, dim=1) - logits[:, 0]).mean()


# --------------------------------------------------------------------------- FedRCL
def supcon_loss(features: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """Supervised contrastive (SCL) term of FedRCL (Seo et al., CVPR 2024, Eq. 2–3),
    normalised per anchor as in METHODS.md:

    ``SCL_i = (1/|Pos_i|) Σ_{j∈Pos_i} −log( e^{s_ij/τ} / Σ_{k≠i} e^{s_ik/τ} )``,
    ``Pos_i = {j ≠ i : y_j = y_i}``, ``s`` the cosine similarities of ``features``.

    ``features`` (B, d) (normalised here; extra trailing dims are flattened), ``labels`` (B,).
    Reduction: mean over the anchors that have at least one positive; anchors without one
    contribute nothing. No such anchor (B = 1, all classes distinct) → graph-connected 0."""
    n = features.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=features.device)
    pos = (labels[:, None] == labels[None, :]) & ~eye
    has_pos = pos.any(dim=1)
    if not bool(has_pos.any()):
        return _zero(features)
    with _fp32(features):
        s = _cos_matrix(features, features)[has_pos] / tau
        pos, eye = pos[has_pos], eye[has_pos]
        log_den = _masked_logsumexp(s, ~eye)
        mean_pos = (s * pos).sum(dim=1) / pos.sum(dim=1)
        return (log_den - mean_pos).mean()


def divergence_penalty(
    features: torch.Tensor, labels: torch.Tensor, tau: float, lam: float
) -> torch.Tensor:
    """FedRCL divergence penalty (paper Eq. 5, β-term without β), per anchor

    ``log( Σ_{k∈P_i} e^{s_ik/τ} + e^{1/τ} ) − 1/τ = log( 1 + Σ_{k∈P_i} e^{(s_ik−1)/τ} )``,
    ``P_i = {k ≠ i : y_k = y_i, s_ik > λ}`` (membership decided on detached similarities).

    ``features`` (B, d) normalised here, ``labels`` (B,). Reduction: mean over all B anchors;
    anchors with empty ``P_i`` contribute exactly 0."""
    n = features.shape[0]
    if n == 0:
        return _zero(features)
    eye = torch.eye(n, dtype=torch.bool, device=features.device)
    with _fp32(features):
        s = _cos_matrix(features, features)
        in_p = (labels[:, None] == labels[None, :]) & ~eye & (s.detach() > lam)
        # the extra column 0 = (1 − 1)/τ is the e^{1/τ} term after dividing by e^{1/τ}
        logits = torch.cat([s.new_zeros(n, 1), (s - 1.0) / tau], dim=1)
        keep = torch.cat([in_p.new_ones(n, 1), in_p], dim=1)
        return _masked_logsumexp(logits, keep).mean()


def _hard_mined_level(
    features: torch.Tensor, labels: torch.Tensor, tau: float, beta: float, lam: float
) -> torch.Tensor:
    """The FedRCL authors' code (reference-implementations.md §2), per anchor i:

    * SCL: ``−log_softmax([s_pos, s_neg1, s_neg2] / τ)[0]`` with the hardest positive
      ``s_pos = min_{j: y_j = y_i} s_ij`` (self included, so 1 without a partner) and the two
      hardest negatives = the two largest ``s_ik`` with ``y_k ≠ y_i`` (missing ones dropped);
    * penalty: ``softplus((m_i − 1)/τ)`` with ``m_i = min_{k≠i, y_k=y_i} s_ik`` when such k
      exists and ``m_i ≥ λ``, else 0 (the code's ``≈ log(1 + e^{−2/τ})``, rounded to 0).

    Reduction: mean over all anchors of ``SCL + β·penalty``."""
    n = features.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=features.device)
    same = labels[:, None] == labels[None, :]
    others = same & ~eye
    s = _cos_matrix(features, features)
    s_pos = s.masked_fill(~same, POS_INF).amin(dim=1)
    s_neg = s.masked_fill(same, NEG_INF).topk(min(2, n), dim=1).values
    logits = torch.cat([s_pos[:, None], s_neg], dim=1) / tau
    scl = torch.logsumexp(logits, dim=1) - logits[:, 0]
    m = s.masked_fill(~others, POS_INF).amin(dim=1)
    active = others.any(dim=1) & (m.detach() >= lam)
    penalty = torch.where(active, F.softplus((m.masked_fill(~active, 1.0) - 1.0) / tau), 0.0)
    return (scl + beta * penalty).mean()


def rcl_level_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    tau: float,
    beta: float,
    lam: float,
    mining: str = "paper",
) -> torch.Tensor:
    """FedRCL relaxed contrastive loss on one feature level (paper Eq. 5).

    ``mining='paper'``: ``supcon_loss + β·divergence_penalty`` (each with its own reduction,
    see those functions; β = 0 is FedSCL). ``mining='hard'``: the authors' hard-mined code,
    see :func:`_hard_mined_level`. ``features`` (B, C) normalised here, ``labels`` (B,).
    Returns a 0-dim fp32 tensor. Raises ``ValueError`` for another ``mining``."""
    _check_mining(mining)
    if features.shape[0] == 0:
        return _zero(features)
    if mining == "hard":
        with _fp32(features):
            return _hard_mined_level(features, labels, tau, beta, lam)
    loss = supcon_loss(features, labels, tau)
    if beta != 0:
        loss = loss + beta * divergence_penalty(features, labels, tau, lam)
    return loss


def _rcl_paper_levels(
    levels: Sequence[torch.Tensor], labels: torch.Tensor, tau: float, beta: float, lam: float
) -> torch.Tensor:
    """``(1/L) Σ_l [supcon_loss + β·divergence_penalty](levels[l])`` computed on the stacked
    (L, B, B) similarity matrices: one similarity matrix per level instead of two, and every
    mask and reduction done once for all levels. Same value and gradient as the per-level
    functions (tested); this is the hot path of the FedRCL client (S2 step cost)."""
    n = labels.shape[0]
    with _fp32(levels[0]):
        units = [_unit(f) for f in levels]
        s = torch.stack([u @ u.T for u in units])  # (L, B, B), cosines in [−1, 1]
        eye = torch.eye(n, dtype=torch.bool, device=s.device)
        pos = (labels[:, None] == labels[None, :]) & ~eye
        has_pos = pos.any(dim=1)
        # e^{(s−1)/τ} ≤ 1 never overflows; when 2/τ ≤ 80 it cannot underflow either, so the
        # sums below may use it directly (≈ 3× fewer kernels than masked logsumexp)
        shifted = torch.exp((s - 1.0) / tau) if _shift_is_exact(tau) else None
        per_level = s.new_zeros(len(levels))
        # Only B ≥ 2 can have a positive pair. Then every log_den is finite, so an anchor
        # without a positive weighs exactly 0: no host-side test of has_pos (a GPU sync, and
        # no CUDA graph could hold the step)
        if n >= 2:
            if shifted is not None:  # log Σ_{k≠i} e^{s_ik/τ} = 1/τ + log Σ_{k≠i} e^{(s_ik−1)/τ}
                log_den = 1.0 / tau + torch.log((shifted * ~eye).sum(dim=-1))
            else:
                log_den = _masked_logsumexp(s / tau, ~eye)  # (L, B)
            mean_pos = (s * pos).sum(dim=-1) / (tau * pos.sum(dim=-1).clamp(min=1))
            # mean over the anchors with a positive (none: all weights 0)
            anchor_w = has_pos / has_pos.sum().clamp(min=1)
            per_level = per_level + ((log_den - mean_pos) * anchor_w).sum(dim=-1)
        if beta != 0:
            in_p = pos & (s.detach() > lam)  # (L, B, B)
            # log(1 + Σ_{P_i} e^{(s−1)/τ}); the sum is ≥ 1, underflowing terms are ≈ 0 anyway
            terms = (shifted if shifted is not None else torch.exp((s - 1.0) / tau)) * in_p
            per_level = per_level + beta * torch.log1p(terms.sum(dim=-1)).mean(dim=-1)
        if n < 2 and beta == 0:  # no term applies: keep the graph connected
            return per_level.mean() + sum(_zero(u) for u in units)
        return per_level.mean()


def rcl_loss(
    levels: Sequence[torch.Tensor],
    labels: torch.Tensor,
    tau: float = 0.05,
    beta: float = 1.0,
    lam: float = 0.7,
    mining: str = "paper",
) -> torch.Tensor:
    """FedRCL ``L_RCL`` (Algorithm 1, line 8): ``(1/L) Σ_l rcl_level_loss(levels[l])``.

    ``levels``: L ≥ 1 tensors (B, C_l), each normalised inside; ``labels`` (B,). Reduction:
    unweighted mean over levels. Raises ``ValueError`` for no level or an unknown ``mining``.
    The paper form runs all levels at once (:func:`_rcl_paper_levels`)."""
    _check_mining(mining)
    if len(levels) == 0:
        raise ValueError("rcl_loss needs at least one feature level")
    if mining == "paper" and labels.shape[0] > 0:
        return _rcl_paper_levels(levels, labels, tau, beta, lam)
    per_level = [rcl_level_loss(f, labels, tau, beta, lam, mining) for f in levels]
    return torch.stack(per_level).mean()


# --------------------------------------------------------------------------- FedCCL
class SignalBank(NamedTuple):
    """One round's FedCCL signals, prepared once for every step of the round
    (:func:`signal_bank`); C classes, M local signals."""

    scaled: torch.Tensor  # (M + C, d): unit local signals, then unit global signals, times 1/τ
    local_onehot: torch.Tensor  # (M, C) float: signal m belongs to class c
    has_local: torch.Tensor  # (C,) float: class c has at least one local signal
    global_mask: torch.Tensor  # (C,) float: class c has a global signal
    inv_tau: float
    shifted: bool  # _shift_is_exact(τ): sums of e^{s/τ − 1/τ} are exact in fp32

    @property
    def num_local(self) -> int:
        """M, the number of local signals."""
        return self.local_onehot.shape[0]


def signal_bank(
    local_signals: torch.Tensor | None,
    local_labels: torch.Tensor | None,
    global_signals: torch.Tensor | None,
    global_mask: torch.Tensor | None,
    num_classes: int,
    tau: float,
) -> SignalBank:
    """Prepare a round's signals for :func:`signal_contrast`: normalise and scale them once,
    and turn labels and masks into (M, C) / (C,) float indicators, so that a step costs one
    similarity product and a few reductions. ``None`` (or M = 0) for a missing part: its
    term is then a graph-connected zero. Local labels must be < ``num_classes``."""
    ref = global_signals if global_signals is not None else local_signals
    if ref is None or ref.dim() != 2:
        raise ValueError("signal_bank needs local signals (M, d) or global signals (C, d)")
    dev, d = ref.device, ref.shape[1]
    if local_signals is None or local_labels is None or local_signals.numel() == 0:
        local_signals, local_labels = torch.zeros(0, d, device=dev), torch.zeros(0, device=dev)
    if global_signals is None or global_mask is None:
        global_signals = torch.zeros(num_classes, d, device=dev)
        global_mask = torch.zeros(num_classes, dtype=torch.bool, device=dev)
    onehot = F.one_hot(local_labels.long().to(dev), num_classes).float()
    units = torch.cat([_unit(local_signals.detach()), _unit(global_signals.detach().to(dev))])
    return SignalBank(
        scaled=units / tau,
        local_onehot=onehot,
        has_local=(onehot.sum(dim=0) > 0).float(),
        global_mask=global_mask.to(dev).float(),
        inv_tau=1.0 / tau,
        shifted=_shift_is_exact(tau),
    )


def signal_contrast(
    h: torch.Tensor,
    labels: torch.Tensor,
    bank: SignalBank,
    lam_local: float = 1.0,
    lam_global: float = 1.0,
) -> torch.Tensor:
    """FedCCL's two contrast terms (Qiao et al., 2024, Eqs. 16-17) on ``ξ = normalize(h)``,
    ``λ_L·L_local + λ_G·L_global`` with

    ``L_local(i) = −log( Σ_{Z: label(Z)=y_i} e^{sim(ξ_i,Z)/τ} / Σ_{all Z} e^{sim(ξ_i,Z)/τ} )``
    over the local clustered signals of all clients, and
    ``L_global(i) = −log( e^{sim(ξ_i,U_{y_i})/τ} / Σ_{j: mask_j} e^{sim(ξ_i,U_j)/τ} )``
    over the classes that have a global signal.

    ``h`` (B, d) features (normalised here); ``labels`` (B,) < C. Reduction: each term is the
    mean over the samples whose class has a signal for it (others are skipped and get no
    gradient); no such sample → graph-connected 0. One similarity product serves both terms;
    the sums use e^{s/τ − 1/τ} ≤ 1 when 2/τ ≤ 80 (no overflow, no underflow: ≈2× faster than
    masked ``logsumexp``, README S2) and ``logsumexp`` otherwise."""
    if h.shape[0] == 0:
        return _zero(h)
    m = bank.num_local
    with _fp32(h):
        s = _unit(h) @ bank.scaled.T  # (B, M + C): sim/τ
        s_loc, s_glob = s[:, :m], s[:, m:]
        rows = torch.arange(h.shape[0], device=h.device)
        # log Σ_{local Z} e^{s}, log Σ_{local Z of class y_i} e^{s}, log Σ_{masked U} e^{s},
        # each minus the same constant c, which cancels in the differences below
        if bank.shifted:
            c = bank.inv_tau
            e_loc, e_glob = torch.exp(s_loc - c), torch.exp(s_glob - c) * bank.global_mask
            log_all = torch.log(e_loc.sum(dim=1).clamp_min(_TINY))
            log_pos = torch.log((e_loc @ bank.local_onehot)[rows, labels].clamp_min(_TINY))
            log_glob = torch.log(e_glob.sum(dim=1).clamp_min(_TINY))
        else:
            c = 0.0
            pos = bank.local_onehot.T[labels] > 0  # (B, M)
            log_all = torch.logsumexp(s_loc, dim=1) if m else s.new_zeros(h.shape[0])
            log_pos = _masked_logsumexp(s_loc, pos).clamp_min(_NEG_BIG) if m else log_all
            log_glob = _masked_logsumexp(s_glob, bank.global_mask > 0).clamp_min(_NEG_BIG)
        use_loc, use_glob = bank.has_local[labels], bank.global_mask[labels]
        local = ((log_all - log_pos) * use_loc).sum() / use_loc.sum().clamp_min(1.0)
        target = s_glob[rows, labels] - c
        glob = ((log_glob - target) * use_glob).sum() / use_glob.sum().clamp_min(1.0)
        return lam_local * local + lam_global * glob


# --------------------------------------------------------------------------- PMFL
def pmfl_loss(
    z: torch.Tensor,
    z_glob: torch.Tensor,
    z_hist: torch.Tensor | Sequence[torch.Tensor],
    tau: float,
    present: torch.Tensor | None = None,
    mu: float | None = None,
) -> torch.Tensor:
    """PMFL historical model-contrastive loss ``ℓ_con`` (PMFL Eq. 4, METHODS.md reading):

    threshold ``μ_i = sim(z_i, Z_g,i)`` (detached; the current representation replaces the
    paper's ``z^{tE}``), ``Z⁺_i = {z_j : sim(z_i, z_j,i) ≥ μ_i}``, ``Z⁻_i`` the rest,
    ``pos = e^{sim(z,Z_g)/τ} + Σ_{Z⁺} e^{sim/τ}``, ``neg = Σ_{Z⁻} e^{sim/τ}``,
    ``ℓ_con = −log(pos / (pos + neg)) = LSE(all) − LSE(positives)``.

    ``mu``: a fixed threshold for every sample instead of ``sim(z_i, Z_g,i)``. The paper's
    literal ``μ = Sim(z^{tE}, Z^t)`` is ``mu=1.0`` (``w^{tE} = W^t``, so that similarity is
    1): a historical representation is then a positive only if its cosine to ``z`` is at
    least 1 (the same direction), so in practice every buffered model is a negative.

    ``z`` (B, d) current projections; ``z_glob`` (B, d) from the global model; ``z_hist`` N
    tensors (B, d), or one stacked (N, B, d) tensor, from the buffered historical local models
    (constants). Reduction: mean over
    the batch. N = 0 → only the global positive, loss 0 (graph-connected). So is a buffer
    whose models are all positives (``Z⁻`` empty), as in a node's first round with short
    local training, where the buffer holds only that round's iterates (README, "PMFL's
    buffer").

    ``present`` (N,) bool, optional: which of the N historical models exist; the others are
    in neither sum, so the value and gradient are those of the present models alone. A
    fixed-size buffer that is still filling uses it (the CUDA-graph step of
    ``clients.pmfl``), with no host decision."""
    if len(z_hist) == 0 or z.shape[0] == 0:
        return _zero(z)
    with _fp32(z):
        s_g = _cos(z, z_glob.detach())
        s_h = torch.stack([_cos(z, h.detach()) for h in z_hist], dim=1)
        # threshold μ_i (or the fixed μ), ties are positive
        in_z_plus = s_h.detach() >= (s_g.detach()[:, None] if mu is None else mu)
        logits = torch.cat([s_g[:, None], s_h], dim=1) / tau
        if present is not None:
            in_z_plus = in_z_plus & present
            logits = logits.masked_fill(~torch.cat([present.new_ones(1), present]), NEG_INF)
        positive = torch.cat([torch.ones_like(in_z_plus[:, :1]), in_z_plus], dim=1)
        return (torch.logsumexp(logits, dim=1) - _masked_logsumexp(logits, positive)).mean()


# --------------------------------------------------------------------------- FedRANE / LRA
def pearson_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (B, ...) flattened, centred over their features and L2-normalised, so
    that the dot product of two rows is their Pearson correlation; a constant row becomes 0.

    A constant row centres to rounding noise (the mean is inexact), not to 0, and
    normalising would blow that noise up to a unit row; a centred row within the mean's
    rounding error (≈ eps·√d·max|x_j|) counts as constant. Other rows get exactly
    ``F.normalize``'s values. Differentiable; the dtype of ``x`` is kept."""
    x = x.flatten(1)
    c = x - x.mean(dim=1, keepdim=True)
    norm = c.norm(dim=1, keepdim=True)
    tol = 4.0 * torch.finfo(x.dtype).eps * math.sqrt(x.shape[1])
    flat = norm <= tol * x.detach().abs().amax(dim=1, keepdim=True)
    return torch.where(flat, 0.0, c / norm.clamp_min(1e-12))


CD_SIMILARITIES = ("pearson", "cosine")


def lra_discrimination_loss(
    z: torch.Tensor, z_aug: torch.Tensor, tau: float = 0.8, similarity: str = "pearson"
) -> torch.Tensor:
    """FedRANE contrastive discrimination ``L_CD`` (FedRANE Eq. 7), NT-Xent over the 2B views
    ``v = [Z; Z̃]``:

    ``L_CD(i) = −log( e^{ρ(v_i, v_{p(i)})/τ} / Σ_{j≠i} e^{ρ(v_i, v_j)/τ} )``, ``p(i) = i ± B``,

    ``ρ`` the Pearson correlation (rows centred over features, L2-normalised, dot product;
    the paper, §3.3 "We also take Pearson coefficient as similarity"), or with
    ``similarity="cosine"`` the cosine of the rows (the authors' ``info_nce_loss``,
    clientFedRANE.py:80-110 of XeniaLLL/HyperFed_and_FedRANE-master: ``F.normalize``, Gram,
    SimCLR logits over the 2B views). ``z``, ``z_aug`` (B, d), both in the graph. Reduction:
    mean over the 2B anchors (as the authors' cross-entropy over 2B rows). B = 1 leaves each
    anchor only its partner, so the loss is exactly 0 (finite)."""
    if similarity not in CD_SIMILARITIES:
        raise ValueError(f"similarity {similarity!r}: choose {' or '.join(CD_SIMILARITIES)}")
    if z.shape != z_aug.shape:
        raise ValueError(f"z {tuple(z.shape)} and z_aug {tuple(z_aug.shape)} differ")
    b = z.shape[0]
    if b == 0:
        return _zero(z) + _zero(z_aug)
    with _fp32(z):
        views = torch.cat([z, z_aug], dim=0).float()
        v = pearson_rows(views) if similarity == "pearson" else _unit(views)
        sim = (v @ v.T / tau).fill_diagonal_(NEG_INF)  # j ≠ i
        partner = (torch.arange(2 * b, device=v.device) + b) % (2 * b)
        return F.cross_entropy(sim, partner)


# --------------------------------------------------------------------------- mixup
def mixup_draw(batch: int, alpha: float) -> tuple[float, torch.Tensor]:
    """One mixup draw for a batch (``mixup_data``, btLoss.py:80-90 of
    XeniaLLL/HyperFed_and_FedRANE-master, after Zhang et al. 2018): ``λ ~ Beta(α, α)`` (one
    per batch) and a random permutation of the batch, from torch's global CPU generator (the
    client seeds it per round). ``alpha`` must be > 0 (their ``alpha <= 0`` means λ = 1, no
    mixing: use a mixup weight of 0 instead)."""
    if alpha <= 0:
        raise ValueError(
            f"mixup alpha {alpha!r} must be > 0 (to switch mixup off set its weight to 0)"
        )
    a = torch.tensor(float(alpha), dtype=torch.float64)
    lam = float(torch.distributions.Beta(a, a).sample())
    return lam, torch.randperm(batch)


def mixup_batch(x: torch.Tensor, lam: float, perm: torch.Tensor) -> torch.Tensor:
    """``λ·x + (1 − λ)·x[perm]`` (btLoss.py:88): each input mixed with the permuted one."""
    return lam * x + (1.0 - lam) * x[perm.to(x.device)]


def mixup_cross_entropy(
    logits: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float
) -> torch.Tensor:
    """``λ·CE(logits, y_a) + (1 − λ)·CE(logits, y_b)`` (``MixupLoss``, btLoss.py:99-101;
    clientFedRANE.py:154), each CE the batch mean. ``logits`` (B, C) with ``y_a``, ``y_b``
    class indices < C: the classifier's output, or (as clientFedRANE.py:154 does) the mixed
    batch's unit features themselves, whose first coordinates then act as class scores."""
    with _fp32(logits):
        lg = logits.float()
        return lam * F.cross_entropy(lg, y_a) + (1.0 - lam) * F.cross_entropy(lg, y_b)
