import numpy as np
import torch

from clients.lra import LRA, adjacency, pearson_similarity, relational_weights


def test_pearson_identical_rows_is_one():
    z = torch.randn(1, 6).repeat(3, 1)
    torch.testing.assert_close(pearson_similarity(z), torch.ones(3, 3))


def test_relational_weights_match_direct_solve():
    torch.manual_seed(0)
    P = pearson_similarity(torch.randn(5, 8))
    B = relational_weights(P, lam_r=0.1)
    Pn = P.double().numpy()
    H = np.linalg.inv(Pn.T @ Pn + 0.2 * np.eye(5))
    ref = -H / np.diag(H)[None, :]
    np.fill_diagonal(ref, 0.0)
    np.testing.assert_allclose(B.numpy(), ref, rtol=1e-4, atol=1e-6)
    assert torch.all(B.diagonal() == 0)


def test_adjacency_symmetric_nonnegative_rows_normalised():
    B = relational_weights(pearson_similarity(torch.randn(6, 4)))
    A = adjacency(B)
    assert torch.all(A >= 0) and torch.all(A.diagonal() == 0)
    torch.testing.assert_close(A.sum(1), torch.ones(6))
    raw = 0.5 * (B.abs() + B.abs().T)
    torch.testing.assert_close(A * raw.sum(1, keepdim=True), raw - torch.diag(raw.diagonal()))


def test_lra_shapes_norms_and_edge_cases():
    lra = LRA(16)
    for b in (1, 2, 128):
        out = lra(torch.nn.functional.normalize(torch.randn(b, 16), dim=1))
        assert out.shape == (b, 16) and torch.isfinite(out).all()
        torch.testing.assert_close(out.norm(dim=1), torch.ones(b))
    dup = torch.nn.functional.normalize(torch.randn(1, 16), dim=1).repeat(4, 1)
    assert torch.isfinite(lra(dup)).all()
    assert torch.isfinite(LRA(16, nuclear_iters=2)(torch.randn(8, 16))).all()


def test_starts_as_identity_and_gradients_reach_parameters():
    lra = LRA(8)
    z = torch.nn.functional.normalize(torch.randn(6, 8), dim=1).requires_grad_(True)
    torch.testing.assert_close(lra(z), z)  # W = 0 at init
    with torch.no_grad():
        lra.W.weight.normal_()
    lra(z).pow(3).sum().backward()
    assert all(
        p.grad is not None and p.grad.abs().sum() > 0
        for p in (lra.W.weight, lra.W_m.weight, lra.W_n.weight)
    )
    assert z.grad is not None
