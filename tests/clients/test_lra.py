import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.lra import LRA, adjacency, pearson_similarity, relational_weights


def _unit(b, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(b, d, generator=g), dim=1)


def _slim_numpy(P, ridge):
    H = np.linalg.inv(P.T @ P + ridge)
    B = -H / np.diag(H)[None, :]
    np.fill_diagonal(B, 0.0)
    return B


# ------------------------------------------------------------------------ graph
def test_pearson_identical_rows_is_one_and_matches_numpy():
    z = torch.randn(1, 6).repeat(3, 1)
    torch.testing.assert_close(pearson_similarity(z), torch.ones(3, 3))
    x = torch.randn(5, 7, dtype=torch.float64)
    torch.testing.assert_close(pearson_similarity(x), torch.from_numpy(np.corrcoef(x.numpy())))
    shifted = pearson_similarity(3.0 * x + 2.0)  # invariant to per-sample affine maps
    torch.testing.assert_close(shifted, pearson_similarity(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("d", [5, 8, 10, 128])
def test_constant_row_has_zero_correlation_despite_rounding(d, dtype):
    """A constant row has Pearson 0 with every row, itself included, also when its mean is
    inexact in floating point (d = 8, 10, 128 in float32 centred it to ~1e-8 noise, which
    normalising blew up to a unit row: P_ii = 1 and tiny non-zero P_ij), so in LRA its only
    neighbour is its self-loop."""
    g = torch.Generator().manual_seed(d)
    z = F.normalize(torch.randn(6, d, generator=g, dtype=dtype), dim=1)
    z[2] = F.normalize(torch.ones(d, dtype=dtype), dim=0)
    P = pearson_similarity(z)
    assert torch.all(P[2] == 0) and torch.all(P[:, 2] == 0)
    others = [0, 1, 3, 4, 5]
    ref = torch.from_numpy(np.corrcoef(z[others].double().numpy()))
    torch.testing.assert_close(P[others][:, others].double(), ref, rtol=1e-5, atol=1e-5)
    mask = LRA(d).neighbours(z.float())
    assert mask is not None and mask[2].tolist() == [False, False, True, False, False, False]


def test_relational_weights_match_direct_float64_solve():
    P = pearson_similarity(_unit(5, 8))
    B = relational_weights(P, lam_r=0.1)
    ref = _slim_numpy(P.double().numpy(), 0.2 * np.eye(5))  # λ_R(Φ+Φᵀ) with Φ = I
    assert B.dtype == P.dtype and torch.all(B.diagonal() == 0)
    np.testing.assert_allclose(B.numpy(), ref, rtol=1e-4, atol=1e-6)


def test_relational_weights_solve_the_constrained_ridge_problem():
    # B minimises ½‖P − PB‖² + λ_R‖B‖² subject to diag(B) = 0 (Eq. 3 with Φ = I): the KKT
    # condition is (PᵀP + 2λ_R I)B − PᵀP = diagonal matrix (the multipliers).
    P = pearson_similarity(_unit(7, 5, seed=1)).double()
    B = relational_weights(P, lam_r=0.3)
    G = P.T @ P
    R = (G + 0.6 * torch.eye(7, dtype=torch.float64)) @ B - G
    off = R - torch.diag(R.diagonal())
    assert off.abs().max() < 1e-10


def test_nuclear_reweighting_matches_numpy_alternation():
    P = pearson_similarity(_unit(6, 9, seed=2)).double()
    eps = 1e-3
    Pn = P.numpy()
    B = _slim_numpy(Pn, 0.2 * np.eye(6))
    for _ in range(2):
        vals, vecs = np.linalg.eigh(B @ B.T)
        phi = vecs @ np.diag(1 / np.sqrt(np.clip(vals, 0, None) + eps)) @ vecs.T
        B = _slim_numpy(Pn, 0.1 * (phi + phi.T))
    out = relational_weights(P, lam_r=0.1, nuclear_iters=2, eps=eps)
    np.testing.assert_allclose(out.numpy(), B, rtol=1e-7, atol=1e-9)
    assert not np.allclose(B, _slim_numpy(Pn, 0.2 * np.eye(6)))  # reweighting does something


def test_relational_weights_are_detached_and_finite_on_duplicates():
    z = _unit(1, 8).repeat(6, 1).requires_grad_(True)
    B = relational_weights(pearson_similarity(z))  # singular PᵀP: the ridge handles it
    assert not B.requires_grad and torch.isfinite(B).all()
    with pytest.raises(ValueError):
        relational_weights(torch.eye(3), lam_r=0.0)


def test_adjacency_symmetric_nonnegative_zero_diagonal_rows_sum_to_one():
    B = relational_weights(pearson_similarity(_unit(6, 4, seed=3)))
    A = adjacency(B)
    assert torch.all(A >= 0) and torch.all(A.diagonal() == 0)
    torch.testing.assert_close(A.sum(1), torch.ones(6))
    raw = 0.5 * (B.abs() + B.abs().T)
    raw = raw - torch.diag(raw.diagonal())
    torch.testing.assert_close(raw, raw.T)
    torch.testing.assert_close(A * raw.sum(1, keepdim=True), raw)  # rows of the symmetric A
    assert torch.equal(A > 0, (A > 0).T)  # symmetric neighbour sets
    assert torch.equal(adjacency(torch.zeros(3, 3)), torch.zeros(3, 3))  # empty rows stay 0


# ------------------------------------------------------------------------ LRA module
@pytest.mark.parametrize("kw", [{}, {"self_loops": False, "residual": False}])
@pytest.mark.parametrize(("b", "d"), [(1, 16), (2, 16), (128, 128)])
def test_lra_shape_unit_norm_finite(kw, b, d):
    torch.manual_seed(0)
    lra = LRA(d, **kw)
    with torch.no_grad():
        lra.W.weight.normal_(0, d**-0.5)
    out = lra(_unit(b, d))
    assert out.shape == (b, d) and torch.isfinite(out).all()
    torch.testing.assert_close(out.norm(dim=1), torch.ones(b))


def test_single_sample_and_duplicates():
    z = _unit(1, 8)
    torch.testing.assert_close(LRA(8, residual=False, self_loops=False)(z), z)
    dup = _unit(1, 16).repeat(5, 1).requires_grad_(True)
    for kw in ({}, {"self_loops": False, "residual": False}, {"nuclear_iters": 2}):
        out = LRA(16, **kw)(dup)
        assert torch.isfinite(out).all()
        out.sum().backward()
        assert torch.isfinite(dup.grad).all()


def test_nuclear_iterations_finite():
    out = LRA(32, nuclear_iters=2, residual=False)(_unit(24, 32))
    assert torch.isfinite(out).all() and out.shape == (24, 32)


def test_default_starts_as_identity():
    z = _unit(6, 8)
    torch.testing.assert_close(LRA(8)(z), z)  # W = 0 and the residual


def test_literal_message_passing_matches_manual_attention():
    torch.manual_seed(1)
    lra = LRA(8, self_loops=False, residual=False)
    z = _unit(6, 8, seed=4)
    mask = lra.graph(z) > 0
    assert not mask.diagonal().any()
    s = (lra.W_m(z) @ lra.W_n(z).T) / np.sqrt(8)
    alpha = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=1)
    expected = F.normalize(alpha @ lra.W(z), dim=1)
    torch.testing.assert_close(lra(z), expected)


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("constant_row", [False, True])
def test_default_message_passing_matches_manual_residual_attention(steps, constant_row):
    """The default step (self-loops + residual) with W ≠ 0, written out from METHODS.md
    (FedRANE/LRA steps 1-4) in plain ops: Pearson P, B = SLIM(PᵀP + 2λ_R·I) by a float64
    inverse, A = (|B|+|B|ᵀ)/2 with zero diagonal, N_i = {j : A_ij > 0} ∪ {i},
    α = softmax over N_i of (W_m h_i)·(W_n h_j)/√d, h ← h + α W h (graph from Z, reused for
    every step), Z̃ = normalize(h). A dense batch runs the all-pairs branch; a constant
    feature row (Pearson 0 with every row, so only its self-loop) runs the masked branch."""
    torch.manual_seed(7)
    d, b = 16, 6
    lra = LRA(d, steps=steps, lam_r=0.1)
    with torch.no_grad():
        lra.W.weight.normal_(0, 0.3)
    z = _unit(b, d, seed=9)
    if constant_row:
        z[2] = 0.25  # unit norm, and its mean is exact: the centred row is exactly 0
    # graph, by hand in float64
    zc = z.double() - z.double().mean(dim=1, keepdim=True)
    zc = zc / zc.norm(dim=1, keepdim=True).clamp(min=1e-12)
    P = (zc @ zc.T).numpy()
    B = _slim_numpy(P, 0.2 * np.eye(b))
    A = 0.5 * (np.abs(B) + np.abs(B).T)
    np.fill_diagonal(A, 0.0)
    nbr = torch.from_numpy(A > 1e-9) | torch.eye(b, dtype=torch.bool)
    assert nbr.all() != constant_row  # the constant row has only its self-loop
    assert (lra.neighbours(z) is None) != constant_row  # which branch of _step runs
    # message passing
    h = z.clone()
    with torch.no_grad():
        for _ in range(steps):
            s = (h @ lra.W_m.weight.T) @ (h @ lra.W_n.weight.T).T / np.sqrt(d)
            alpha = torch.softmax(s.masked_fill(~nbr, float("-inf")), dim=1)
            h = h + alpha @ (h @ lra.W.weight.T)
        expected = F.normalize(h, dim=1)
        out = lra(z)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert (out - z).abs().max() > 1e-2  # W ≠ 0: the step is not the identity


def test_neighbours_are_the_positive_entries_of_the_adjacency():
    z = _unit(7, 5, seed=6)
    z[3] = z[2]  # duplicates and a zero-correlation pair still give a well-defined mask
    for kw in ({}, {"self_loops": False, "residual": False}, {"nuclear_iters": 1}):
        lra = LRA(5, **kw)
        expected = lra.graph(z) > 0
        expected.fill_diagonal_(lra.self_loops)
        mask = lra.neighbours(z)
        if mask is None:  # "all pairs" shortcut: only with self-loops and a dense graph
            assert lra.self_loops and expected.all()
        else:
            assert torch.equal(mask, expected)


def test_all_pairs_shortcut_equals_the_masked_step():
    torch.manual_seed(3)
    lra = LRA(8)
    with torch.no_grad():
        lra.W.weight.normal_(0, 0.3)
    h = _unit(6, 8, seed=5)
    assert lra.neighbours(h) is None
    full = torch.ones(6, 6, dtype=torch.bool)
    assert torch.equal(lra._step(h, None), lra._step(h, full))  # bit for bit (CUDA graphs)


def _graph_mask_or_all(lra: LRA, z: torch.Tensor) -> torch.Tensor:
    """The host path's mask, ``None`` written out as all pairs."""
    mask = lra.neighbours(z)
    return torch.ones(len(z), len(z), dtype=torch.bool) if mask is None else mask


@pytest.mark.parametrize("kw", [{}, {"self_loops": False, "residual": False}])
@pytest.mark.parametrize("case", ["dense", "constant-row", "duplicates", "uncorrelated"])
def test_graph_mask_equals_the_host_mask(kw, case):
    """The mask built without host decisions (inside a CUDA graph) is the host path's."""
    z = _unit(7, 5, seed=9)
    if case == "constant-row":
        z[4] = F.normalize(torch.ones(5), dim=0)
    elif case == "duplicates":
        z[3] = z[2]
    elif case == "uncorrelated":
        z = F.normalize(torch.tensor([[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]]), dim=1)
    lra = LRA(z.shape[1], **kw)
    graph = lra._graph_neighbours(pearson_similarity(z))
    assert torch.equal(graph, _graph_mask_or_all(lra, z))
    with torch.no_grad():
        lra.W.weight.normal_(0, 0.3)  # messages that depend on the mask
    host = lra(z)
    lra.graph_mask = True  # a client whose steps replay a CUDA graph: every step this way
    assert torch.equal(lra.neighbours(z), graph)
    assert torch.equal(lra(z), host)
    if case == "dense" and lra.self_loops:  # evaluation keeps the host path (its shortcut)
        assert lra.eval().neighbours(z) is None


def test_capturable_solve_equals_the_host_solve_also_when_it_retries():
    from clients.lra import _slim_solve

    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 6, generator=g, dtype=torch.float64)
    spd = x.T @ x + 0.2 * torch.eye(6, dtype=torch.float64)
    a = torch.randn(6, 1, generator=g, dtype=torch.float64)
    rank_one = a @ a.T  # PSD, singular: the first factorisation fails, the jittered one not
    assert torch.linalg.cholesky_ex(rank_one)[1] != 0
    for M in (spd, rank_one):
        assert torch.equal(_slim_solve(M, capturable=True), _slim_solve(M))
    with pytest.raises(ValueError, match="CUDA graph"):
        relational_weights(pearson_similarity(_unit(4, 3)), nuclear_iters=1, capturable=True)
    # both factorisations failing (not SPD even with the jitter): an error on the host path,
    # a non-finite B in a graph (cholesky_ex's partial factor would give a finite, wrong one)
    minus = -torch.eye(3, dtype=torch.float64)
    with pytest.raises(torch.linalg.LinAlgError):
        _slim_solve(minus)
    B = _slim_solve(minus, capturable=True)
    assert torch.isnan(B[~torch.eye(3, dtype=torch.bool)]).all()


def test_dense_correlations_skip_the_solve_and_constant_rows_do_not(monkeypatch):
    import clients.lra as lra_module

    calls = []
    solve = lra_module.relational_weights
    monkeypatch.setattr(
        lra_module, "relational_weights", lambda *a, **k: calls.append(1) or solve(*a, **k)
    )
    lra = LRA(5)
    z = _unit(7, 5, seed=8)
    assert lra.neighbours(z) is None and not calls  # dense P: no Cholesky
    z[4] = F.normalize(torch.ones(5), dim=0)  # constant row: Pearson 0 with every row
    mask = lra.neighbours(z)
    assert calls and mask is not None
    expected = lra.graph(z) > 0
    expected.fill_diagonal_(True)
    assert torch.equal(mask, expected) and not mask[4, :4].any()


def test_row_without_neighbours_keeps_its_feature():
    # two samples with zero Pearson correlation: B = 0, so the graph has no edge
    z = F.normalize(torch.tensor([[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]]), dim=1)
    lra = LRA(4, self_loops=False, residual=False)
    assert not (lra.graph(z) > 0).any()
    torch.testing.assert_close(lra(z), z)


def test_gradients_reach_parameters_and_features_not_the_graph():
    torch.manual_seed(2)
    for kw in ({"self_loops": False, "residual": False}, {}):
        lra = LRA(8, steps=2, **kw)
        if kw == {}:
            with torch.no_grad():
                lra.W.weight.normal_()
        z = _unit(6, 8).requires_grad_(True)
        assert not lra.graph(z).requires_grad
        lra(z).pow(3).sum().backward()
        for p in (lra.W.weight, lra.W_m.weight, lra.W_n.weight):
            assert p.grad is not None and p.grad.abs().sum() > 0
        assert z.grad is not None and z.grad.abs().sum() > 0


def test_fp32_under_autocast_and_dtype_kept():
    lra = LRA(16, residual=False)
    z = _unit(10, 16)
    ref = lra(z)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = lra(z)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref)  # the graph and attention ran in fp32
    assert lra(z.double()).dtype == torch.float64


# ------------------------------------------------------------------------ the authors' GAT
def _gat_reference(head, h, mask):
    """One GAT head written as the original GAT: e_ij = LeakyReLU_0.1(aᵀ[W h_i ‖ W h_j]) from
    the explicit B×B×2d concatenation, softmax over the neighbours, ELU of the weighted sum."""
    wh = head.W(h)
    b = len(h)
    pairs = torch.cat([wh[:, None, :].expand(b, b, -1), wh[None, :, :].expand(b, b, -1)], -1)
    e = F.leaky_relu(head.a(pairs).squeeze(-1), negative_slope=0.1)
    alpha = torch.softmax(e.masked_fill(~mask, float("-inf")), dim=1)
    return F.elu(alpha @ wh)


@pytest.mark.parametrize("steps", [1, 2])
def test_gat_matches_the_original_gat_with_averaged_heads(steps):
    """``attention="gat"``: per step its own layer of 2 heads, each the original GAT over
    the neighbours without self-loops, averaged, no residual; Z̃ the normalised result."""
    torch.manual_seed(2)
    lra = LRA(8, steps=steps, attention="gat", heads=2)
    assert (lra.self_loops, lra.residual) == (False, False)
    assert not hasattr(lra, "W_m") and len(lra.gat) == steps and len(lra.gat[0]) == 2
    z = _unit(7, 8, seed=5)
    mask = lra.graph(z) > 0
    assert not mask.diagonal().any() and mask.sum() == 7 * 6  # dense B: all other samples
    h = z
    for layer in lra.gat:
        h = sum(_gat_reference(head, h, mask) for head in layer) / 2
    torch.testing.assert_close(lra(z), F.normalize(h, dim=1))


def test_gat_dropout_only_in_training_and_parameters_get_gradients():
    torch.manual_seed(3)
    lra = LRA(8, attention="gat", heads=2, dropout=0.2)
    z = _unit(6, 8, seed=6).requires_grad_(True)
    lra.eval()
    first = lra(z)
    torch.testing.assert_close(lra(z), first)  # eval: deterministic, no dropout
    lra.train()
    out = lra(z)
    assert not torch.allclose(out, first)  # dropout zeroed entries before the normalisation
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lra.parameters())
    assert z.grad is not None


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"attention": "sum"}, "choose dot or gat"),
        ({"heads": 2}, "dot attention has one head"),
        ({"attention": "gat", "heads": 0}, "dot attention has one head"),
        ({"dropout": 1.0}, r"dropout 1.0 must be in \[0, 1\)"),
    ],
)
def test_attention_options_are_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        LRA(8, **kw)
