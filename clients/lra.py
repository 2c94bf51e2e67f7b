"""FedRANE's Local Relational Augmentation (LRA) as torch components (no Flower).

Per batch of L2-normalised backbone features ``Z`` (B, d):

1. ``P`` = sample-wise Pearson correlation (:func:`pearson_similarity`; FedRANE §3.3);
2. SLIM relational weights (Eqs. 2–4, :func:`relational_weights`):
   ``H = (PᵀP + λ_R(Φ+Φᵀ))⁻¹``, ``B_ij = −H_ij/H_jj``, ``B_ii = 0``. The first solve uses
   ``Φ = I``, i.e. the ridge ``2λ_R·I``: the EASE closed form (ridge regression under the
   zero-diagonal constraint) that the authors' code uses; optional nuclear-norm reweighting
   ``Φ = (BBᵀ + εI)^{-1/2}`` afterwards. Cholesky in float64, no gradient through the graph;
3. ``A = (|B| + |B|ᵀ)/2`` with zero diagonal, rows normalised to sum 1 (:func:`adjacency`);
   neighbours ``N_i = {j : A_ij > 0}``;
4. ``L`` steps of attentive message passing (Eqs. 5–6, :class:`LRA`) with the softmax the
   paper omits, ``α_ij = softmax_{j∈N_i}((W_m h_i)·(W_n h_j)/√d)``; ``Z̃ = normalize(h)``.

Two readings to know about:

- Data matrix of SLIM. The paper feeds the Pearson matrix ``P`` to SLIM as data, so the Gram
  matrix is ``PᵀP`` (this module). The authors' code instead uses ``P`` itself as the Gram
  matrix (EASE with the centred features as data) and a ridge of ``0.1·I``. Both are EASE
  solutions with the same zero-diagonal form of ``B``; with the dense ``B`` either gives, the
  attention only uses ``A`` as a mask (``A_ij > 0``), so the choice rarely changes ``Z̃``.
- Message passing. The literal Eq. 5 (``h_i ← Σ_{j∈N_i} α_ij W h_j``, ``self_loops=False,
  residual=False``) replaces every feature by a near-uniform average of the batch at
  initialisation; the project's default (see README, "Decisions") adds GAT's self-loop and a
  residual ``h_i ← h_i + Σ_{j∈N_i∪{i}} α_ij W h_j`` with ``W`` initialised to zero, so LRA
  starts as the identity. Measured on the tiny digits run: literal 0.08 (chance), default 0.87.

- Attention. ``attention="dot"`` (default) is the paper's Eq. 6 score
  ``(W_m h_i)·(W_n h_j)/√d``. ``attention="gat"`` is the authors' code instead (``GAT`` and
  ``GraphAttentionLayer``/``Attention``, system/flcore/trainmodel/graph_models.py:452-601 of
  XeniaLLL/HyperFed_and_FedRANE-master, commit 3fdab75): per head ``e_ij =
  LeakyReLU_0.1(aᵀ[W h_i ‖ W h_j])``, masked softmax over ``N_i`` (no self-loop: their ``A``
  has a zero diagonal), ``ELU(Σ_j α_ij W h_j)``, heads averaged, dropout after each hop, no
  residual, ``W`` and ``a`` Xavier-initialised, one layer per hop (:class:`GATHead`).

Everything runs in float32 (float64 for the graph) with autocast disabled.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from clients.losses import pearson_rows

_TINY = 1e-12  # floor for H_jj and row sums


# ------------------------------------------------------------------------ relational graph
def pearson_similarity(z: torch.Tensor) -> torch.Tensor:
    """(B, B) sample-wise Pearson correlation of the rows of ``z`` (B, d): centre each row
    over its features, L2-normalise, Gram (:func:`clients.losses.pearson_rows`). A constant
    row has correlation 0 with every row (itself included). Differentiable; the dtype of
    ``z`` is kept."""
    if z.ndim != 2:
        raise ValueError(f"expected a (B, d) matrix, got shape {tuple(z.shape)}")
    c = pearson_rows(z)
    return c @ c.T


def _slim_solve(M: torch.Tensor, capturable: bool = False) -> torch.Tensor:
    """EASE/SLIM closed form (FedRANE Eq. 4): ``H = M⁻¹`` by Cholesky (which reads the lower
    triangle only), ``B_ij = −H_ij/H_jj``, ``B_ii = 0``. ``M`` = Gram + ridge, SPD (float64).

    A numerically indefinite ``M`` is factored again with a relative jitter on its diagonal
    (an error if that fails too). ``capturable``: no host decision, so a CUDA graph can hold
    it: both factorisations run and the first that succeeded is used (if both fail, ``B`` is
    NaN off the diagonal instead of an error, so the neighbour mask is all pairs)."""
    eye = torch.eye(len(M), dtype=M.dtype, device=M.device)
    L, info = torch.linalg.cholesky_ex(M)
    jittered = M + (1e-10 * M.diagonal().abs().max() + _TINY) * eye  # for a retry
    failed = None
    if capturable:
        L_retry, info_retry = torch.linalg.cholesky_ex(jittered)
        L = torch.where(info == 0, L, L_retry)
        failed = (info != 0) & (info_retry != 0)
    elif int(info) != 0:  # numerically indefinite: retry with the jitter
        L = torch.linalg.cholesky(jittered)
    # H = L⁻ᵀL⁻¹ by a triangular solve (cholesky_inverse checks its result on the host)
    L_inv = torch.linalg.solve_triangular(L, eye, upper=False)
    H = L_inv.T @ L_inv
    B = -H / H.diagonal().clamp(min=_TINY)[None, :]  # column j divided by H_jj (> 0 for SPD)
    if failed is not None:  # cholesky_ex's factor of a failed matrix is partial, not NaN
        B = torch.where(failed, torch.nan, B)
    return B.fill_diagonal_(0.0)


def _inverse_sqrt_psd(S: torch.Tensor, eps: float) -> torch.Tensor:
    """``(S + εI)^{-1/2}`` for a symmetric PSD ``S`` via ``eigh`` (eigenvalues clamped ≥ 0)."""
    vals, vecs = torch.linalg.eigh(0.5 * (S + S.T))
    inv_sqrt = (vals.clamp(min=0.0) + eps).rsqrt()
    return (vecs * inv_sqrt[None, :]) @ vecs.T


@torch.no_grad()
def relational_weights(
    P: torch.Tensor,
    lam_r: float = 0.1,
    nuclear_iters: int = 0,
    eps: float = 1e-3,
    capturable: bool = False,
) -> torch.Tensor:
    """SLIM relational weights ``B`` (B×B, zero diagonal) of FedRANE Eqs. 2–4.

    ``H = (PᵀP + λ_R(Φ+Φᵀ))⁻¹`` and ``B_ij = −H_ij/H_jj``, ``B_ii = 0``, starting from
    ``Φ = I`` (ridge ``2λ_R·I``: the EASE closed form); then ``nuclear_iters`` (0–3)
    alternating updates ``Φ = (BBᵀ + εI)^{-1/2}`` (the reweighting of the nuclear norm in
    Eq. 3, by ``eigh``) and a new solve. Computed in float64 by Cholesky, without gradient
    (the graph is detached), and returned in ``P``'s dtype. ``lam_r > 0`` keeps the system
    SPD, also for duplicated samples (singular ``PᵀP``). ``capturable``: without host
    decisions (see :func:`_slim_solve`); only for ``nuclear_iters = 0`` (``eigh`` checks its
    result on the host)."""
    if P.ndim != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"P must be square, got shape {tuple(P.shape)}")
    if lam_r <= 0:
        raise ValueError("lam_r must be positive (it is the ridge that makes H exist)")
    if nuclear_iters < 0:
        raise ValueError("nuclear_iters must be >= 0")
    if capturable and nuclear_iters:
        raise ValueError("nuclear-norm reweighting (eigh) cannot run inside a CUDA graph")
    X = P.detach().to(torch.float64)
    gram = X.T @ X
    M = gram.clone()
    M.diagonal().add_(2.0 * lam_r)  # Φ = I
    B = _slim_solve(M, capturable)
    for _ in range(nuclear_iters):
        phi = _inverse_sqrt_psd(B @ B.T, eps)
        B = _slim_solve(gram + lam_r * (phi + phi.T))
    return B.to(P.dtype)


def adjacency(B: torch.Tensor) -> torch.Tensor:
    """Sample graph of FedRANE §3.3: ``A = (|B| + |B|ᵀ)/2`` with zero diagonal, each row
    divided by its sum (rows sum to 1; an empty row stays zero). The un-normalised matrix and
    the neighbour sets ``{j : A_ij > 0}`` are symmetric; the authors' code L2-normalises the
    rows instead, which gives the same neighbour sets."""
    A = 0.5 * (B.abs() + B.abs().T)
    A = A - torch.diag_embed(A.diagonal())
    return A / A.sum(dim=1, keepdim=True).clamp(min=_TINY)


# ------------------------------------------------------------------------ message passing
ATTENTIONS = ("dot", "gat")
GAT_SLOPE = 0.1  # LeakyReLU slope of the authors' GAT (graph_models.py:591, alpha=0.1)


def _attend(
    scores: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``Σ_j softmax_{j∈N_i}(scores_ij)·values_j`` for every row i (Eq. 5 with a masked
    softmax), and the (B, 1) "has a neighbour" column (``None`` for ``mask`` ``None``: every
    pair is a neighbour). A row without neighbours gets a dummy finite result, for the caller
    to replace."""
    if mask is None:
        return torch.softmax(scores, dim=1) @ values, None
    has = mask.any(dim=1, keepdim=True)
    # −inf outside N_i; rows without neighbours get a dummy finite row (result discarded)
    scores = scores.masked_fill(~mask, float("-inf")).masked_fill(~has, 0.0)
    return torch.softmax(scores, dim=1) @ values, has


class GATHead(nn.Module):
    """One head of the authors' graph attention (``Attention``, graph_models.py:452-488):
    ``e_ij = LeakyReLU_0.1(aᵀ[W h_i ‖ W h_j])`` = ``LeakyReLU(a₁·W h_i + a₂·W h_j)`` (the
    B×B×2d concatenation is never built), output ``ELU(Σ_{j∈N_i} α_ij W h_j)``. ``W`` (d→d)
    and ``a`` (2d→1), no bias, Xavier-uniform as theirs."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.W = nn.Linear(dim, dim, bias=False)
        self.a = nn.Linear(2 * dim, 1, bias=False)
        nn.init.xavier_uniform_(self.W.weight)
        nn.init.xavier_uniform_(self.a.weight)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        wh = self.W(h)
        a = self.a.weight[0]
        d = wh.shape[1]
        scores = F.leaky_relu((wh @ a[:d])[:, None] + (wh @ a[d:])[None, :], GAT_SLOPE)
        return F.elu(_attend(scores, wh, mask)[0])


class LRA(nn.Module):
    """Relational augmentation of a batch of features ``z`` (B, d) → ``Z̃`` (B, d), unit rows.

    ``attention="dot"`` (default): ``W``, ``W_m``, ``W_n`` (d→d, no bias) are model
    parameters, federated like the rest, and are shared by the ``steps`` message-passing steps
    (the paper's ``W^l`` are per step; the default is one step). Attention (Eq. 6 with a
    masked softmax): ``α_ij = softmax_{j∈N_i}((W_m h_i)·(W_n h_j)/√d)``; messages
    ``m_i = Σ_j α_ij W h_j`` (Eq. 5). Default (``self_loops=True, residual=True``):
    ``i ∈ N_i`` and ``h_i ← h_i + m_i`` with ``W`` initialised to zero (identity at start);
    literal (``False, False``): ``h_i ← m_i``, and a row with no neighbour keeps ``h_i``.

    ``attention="gat"``: the authors' GAT (module docstring), ``heads`` :class:`GATHead` per
    step, each step its own layer, ``m_i`` = the mean of the heads' outputs; its own form is
    ``self_loops=False, residual=False`` (the default for ``None``). ``dropout`` (either
    attention; the authors' 0.2, main.py:202-203) drops entries of each step's output in
    training mode. The graph is built without gradient; gradients reach ``z`` through the
    messages."""

    def __init__(
        self,
        dim: int,
        steps: int = 1,
        lam_r: float = 0.1,
        nuclear_iters: int = 0,
        *,
        self_loops: bool | None = None,
        residual: bool | None = None,
        attention: str = "dot",
        heads: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if dim < 1 or steps < 0:
            raise ValueError("dim must be >= 1 and steps >= 0")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention {attention!r}: choose {' or '.join(ATTENTIONS)}")
        if heads < 1 or (attention == "dot" and heads != 1):
            raise ValueError(
                f"{heads} attention heads: the dot attention has one head (leave heads at 1);"
                " several heads need attention='gat'"
            )
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout {dropout!r} must be in [0, 1)")
        own = attention == "dot"  # the dot attention's form has self-loops and a residual
        self.dim, self.steps, self.lam_r, self.nuclear_iters = dim, steps, lam_r, nuclear_iters
        self.self_loops = own if self_loops is None else self_loops
        self.residual = own if residual is None else residual
        self.attention, self.dropout = attention, dropout
        if attention == "gat":
            self.gat = nn.ModuleList(
                nn.ModuleList(GATHead(dim) for _ in range(heads)) for _ in range(steps)
            )
        else:
            self.W = nn.Linear(dim, dim, bias=False)
            self.W_m = nn.Linear(dim, dim, bias=False)
            self.W_n = nn.Linear(dim, dim, bias=False)
            if self.residual:
                nn.init.zeros_(self.W.weight)  # LRA starts as the identity; relations learned
        self.scale = 1.0 / math.sqrt(dim)
        #: In training mode, build the mask without host decisions (:meth:`_graph_neighbours`)
        #: on every step, not only inside a CUDA-graph capture: set for a client whose steps
        #: replay a graph, so its eager steps (the warm-up before the capture included) run
        #: exactly what the graph holds. The same mask either way; evaluation keeps the host
        #: path, which skips the solve for its large dense batches.
        self.graph_mask = False

    @torch.no_grad()
    def relations(self, z: torch.Tensor) -> torch.Tensor:
        """Detached SLIM weights ``B`` (B×B, float32) of the batch (steps 1–2 above)."""
        P = pearson_similarity(z.detach().float())
        return relational_weights(P, self.lam_r, self.nuclear_iters)

    @torch.no_grad()
    def graph(self, z: torch.Tensor) -> torch.Tensor:
        """Detached adjacency ``A`` (B×B, float32) of the batch (steps 1–3 above)."""
        return adjacency(self.relations(z))

    @torch.no_grad()
    def neighbours(self, z: torch.Tensor) -> torch.Tensor | None:
        """Boolean (B, B) neighbour mask ``A_ij > 0`` (plus the diagonal with self-loops), or
        ``None`` when every pair is a neighbour (the usual case: ``B`` is dense).
        ``A_ij > 0`` ⟺ ``B_ij ≠ 0 or B_ji ≠ 0`` (i ≠ j): the row normalisation of
        :func:`adjacency` does not change which entries are positive, so it is skipped.

        With self-loops the SLIM solve is skipped too when ``P`` has no zero entry (no
        constant feature row, no exactly uncorrelated pair): then ``PᵀP + λ_R(Φ+Φᵀ)`` and its
        inverse, hence ``B``, have no zero entry except by exact floating-point cancellation,
        so the mask is "all pairs" whatever ``B``'s values (which are used only through this
        mask). Saves the float64 Cholesky and inverse of every step (README, S2)."""
        P = pearson_similarity(z.detach().float())
        if (self.graph_mask and self.training) or (
            P.is_cuda and torch.cuda.is_current_stream_capturing()
        ):
            return self._graph_neighbours(P)
        if self.self_loops and bool((P != 0).all()):
            return None
        mask = self._solved_mask(P)
        if self.self_loops and bool(mask.all()):
            return None
        return mask

    def _solved_mask(self, P: torch.Tensor, capturable: bool = False) -> torch.Tensor:
        """Neighbour mask from the SLIM weights: ``B_ij ≠ 0 or B_ji ≠ 0``, diagonal =
        ``self_loops``."""
        nz = relational_weights(P, self.lam_r, self.nuclear_iters, capturable=capturable) != 0
        mask = nz | nz.T
        mask.fill_diagonal_(self.self_loops)
        return mask

    def _graph_neighbours(self, P: torch.Tensor) -> torch.Tensor:
        """:meth:`neighbours` without host decisions, for a step captured in a CUDA graph
        (``client.cuda_graph``): the SLIM solve always runs and "all pairs" is an all-true
        mask instead of ``None``, which gives the same messages bit for bit (masking nothing
        changes no score)."""
        mask = self._solved_mask(P, capturable=True)
        if self.self_loops:  # P without a zero entry: every pair (the host path's None)
            mask |= (P != 0).all()
        return mask

    def _step(self, h: torch.Tensor, mask: torch.Tensor | None, step: int = 0) -> torch.Tensor:
        """One attentive message-passing step (FedRANE Eqs. 5–6, masked softmax; or the
        authors' GAT layer number ``step``); ``mask`` ``None`` means all pairs (including i
        itself) are neighbours."""
        if self.attention == "gat":
            heads = cast(nn.ModuleList, self.gat[step])
            messages = torch.stack([head(h, mask) for head in heads]).mean(dim=0)
            has = None if mask is None else mask.any(dim=1, keepdim=True)
        else:
            scores = (self.W_m(h) @ self.W_n(h).T) * self.scale
            messages, has = _attend(scores, self.W(h), mask)
        if has is None:
            out = h + messages if self.residual else messages
        elif self.residual:
            out = h + torch.where(has, messages, torch.zeros_like(messages))
        else:
            out = torch.where(has, messages, h)
        if self.dropout:
            out = F.dropout(out, self.dropout, self.training)
        return out

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """``Z̃ = normalize(h^L)`` with ``h^0 = z``; B = 1 (empty graph) gives normalize(z).
        Float32 with autocast off; returned in ``z``'s dtype."""
        if z.ndim != 2 or z.shape[1] != self.dim:
            raise ValueError(f"expected (B, {self.dim}) features, got shape {tuple(z.shape)}")
        with torch.autocast(device_type=z.device.type, enabled=False):
            h = z.float()
            if len(h) > 1 and self.steps > 0:
                mask = self.neighbours(h)
                for step in range(self.steps):
                    h = self._step(h, mask, step)
            return F.normalize(h, dim=1).to(z.dtype)
