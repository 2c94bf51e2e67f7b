"""Every loss against values computed by hand on tiny inputs, plus the edge cases of the
shared contract (batch of one, one class, empty buffers, masked classes, large 1/τ, fp32)."""

import math

import pytest
import torch
import torch.nn.functional as F

from clients.losses import (
    divergence_penalty,
    lra_discrimination_loss,
    mixup_batch,
    mixup_cross_entropy,
    mixup_draw,
    moon_loss,
    pearson_rows,
    pmfl_loss,
    proximal_term,
    rcl_level_loss,
    rcl_loss,
    signal_bank,
    signal_contrast,
    supcon_loss,
)
from tests.clients.signal_terms import signal_contrast_global, signal_contrast_local

E1, E2, E3 = torch.eye(3)
R = 1 / math.sqrt(2)
DIAG = torch.tensor([1.0, 1.0, 0.0]) * R  # cosine R to E1 and E2, 0 to E3


def lse(*xs: float) -> float:
    """log Σ e^x in double precision (the hand-computed reference)."""
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def rows(*vs: torch.Tensor) -> torch.Tensor:
    return torch.stack(list(vs))


def approx(x: float, rel: float = 1e-5, abs_: float = 1e-6):
    return pytest.approx(x, rel=rel, abs=abs_)


# --------------------------------------------------------------------------- FedProx
def test_proximal_term_value_and_gradient():
    w = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([[3.0]], requires_grad=True)]
    g = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    loss = proximal_term(w, g, mu=0.5)
    assert loss.item() == approx(0.25 * (1 + 4 + 4))
    loss.backward()
    # d/dw μ/2‖w−W‖² = μ(w − W)
    assert w[0].grad.tolist() == approx([0.5, 1.0])
    assert w[1].grad.tolist() == [[1.0]]


def test_proximal_term_equals_the_per_tensor_sum_and_its_autograd_gradient():
    """The multi-tensor form against the plain definition, at w ≠ W and at w = W (the first
    local step: gradient exactly zero, not the NaN of a differentiated zero norm)."""
    torch.manual_seed(0)
    shapes = [(6, 1, 5, 5), (6,), (10, 16), (10,)]
    g = [torch.randn(s) for s in shapes]
    for w0 in ([torch.randn(s) for s in shapes], [t.clone() for t in g]):
        w = [t.clone().requires_grad_(True) for t in w0]
        ref_w = [t.clone().requires_grad_(True) for t in w0]
        loss = proximal_term(w, g, mu=0.3)
        ref = 0.15 * sum(((a - b) ** 2).sum() for a, b in zip(ref_w, g, strict=True))
        (2 * loss).backward()
        (2 * ref).backward()
        assert loss.dtype == torch.float32 and loss.dim() == 0
        assert loss.item() == approx(float(ref))
        for a, b in zip(w, ref_w, strict=True):
            torch.testing.assert_close(a.grad, b.grad)
            assert torch.isfinite(a.grad).all()


def test_proximal_term_frozen_tensors_and_second_derivative():
    """A tensor that does not require grad gets none; a second derivative through the term
    raises instead of silently leaving out its μ·I (the term is once-differentiable)."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    frozen = torch.tensor([3.0])
    proximal_term([w, frozen], [torch.zeros(2), torch.zeros(1)], mu=1.0).backward()
    assert w.grad.tolist() == [1.0, 2.0] and frozen.grad is None
    w2 = torch.tensor([1.0, 2.0], requires_grad=True)
    # the squared term's upstream gradient depends on w, so its second derivative would need
    # the term's own μ·I: once_differentiable refuses it
    (g,) = torch.autograd.grad(
        proximal_term([w2], [torch.zeros(2)], mu=1.0) ** 2, w2, create_graph=True
    )
    with pytest.raises(RuntimeError, match="once_differentiable|not have been used in the graph"):
        torch.autograd.grad(g.sum(), w2)


def test_proximal_term_empty_and_mismatch():
    assert proximal_term([], [], mu=1.0).item() == 0.0
    with pytest.raises(ValueError):
        proximal_term([torch.zeros(2)], [torch.zeros(2), torch.zeros(1)], mu=1.0)
    with pytest.raises(ValueError):
        proximal_term([torch.zeros(2)], [torch.zeros(1)], mu=1.0)  # would broadcast


# --------------------------------------------------------------------------- MOON
def test_moon_loss_hand_values():
    z = rows(E1, E2)
    z_glob = rows(E1, DIAG)  # positives: 1, R
    z_prev = [rows(E2, E2)]  # negatives: 0, 1
    tau = 0.5
    expect = ((lse(2, 0) - 2) + (lse(2 * R, 2) - 2 * R)) / 2
    assert moon_loss(z, z_glob, z_prev, tau).item() == approx(expect)


def test_moon_loss_two_previous_models_and_stacked_buffer():
    z, z_glob = rows(E1), rows(DIAG)
    prev = [rows(E1), rows(E3)]  # negatives: 1, 0
    tau = 0.5
    expect = lse(2 * R, 2, 0) - 2 * R
    assert moon_loss(z, z_glob, prev, tau).item() == approx(expect)
    assert moon_loss(z, z_glob, torch.stack(prev), tau).item() == approx(expect)


def test_moon_loss_equal_global_and_previous_is_log2():
    z = torch.randn(5, 4)
    other = torch.randn(5, 4)
    assert moon_loss(z, other, [other], 0.5).item() == approx(math.log(2))


def test_moon_loss_empty_buffer_is_connected_zero():
    z = torch.randn(4, 3, requires_grad=True)
    loss = moon_loss(z, torch.randn(4, 3), [], 0.5)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(z.grad, torch.zeros(4, 3))


@pytest.mark.parametrize("tau", [0.05, 0.01])
def test_moon_loss_large_inverse_temperature(tau):
    # positive sim 0, negative sim 1: loss = log(1 + e^{1/τ}) ≈ 1/τ (e^{100} overflows fp32)
    loss = moon_loss(rows(E1), rows(E2), [rows(E1)], tau)
    assert loss.item() == approx(lse(0, 1 / tau))


# --------------------------------------------------------------------------- FedRCL
def test_supcon_hand_values_one_positive():
    f = rows(E1, E1, E2)
    y = torch.tensor([0, 0, 1])
    # anchors 0, 1: positive sim 1, denominator e^1 + e^0; anchor 2 has none (excluded)
    assert supcon_loss(f, y, 1.0).item() == approx(lse(1, 0) - 1)


def test_supcon_hand_values_mean_over_anchors_with_positives():
    f = rows(E1, DIAG, E2, E3)
    y = torch.tensor([0, 0, 0, 1])
    tau = 0.5
    a0 = lse(2 * R, 0, 0) - (2 * R + 0) / 2  # positives DIAG (R), E2 (0); E3 negative
    a1 = lse(2 * R, 2 * R, 0) - 2 * R
    a2 = lse(0, 2 * R, 0) - (0 + 2 * R) / 2
    # anchor 3 (class 1, alone) adds nothing and is not counted in the mean
    assert supcon_loss(f, y, tau).item() == approx((a0 + a1 + a2) / 3)


def test_supcon_all_one_class_hand_value():
    f = rows(E1, DIAG, E2)
    y = torch.zeros(3, dtype=torch.long)
    tau = 0.05
    a0 = lse(R / tau, 0) - (R / tau) / 2
    a1 = math.log(2)
    assert supcon_loss(f, y, tau).item() == approx((a0 + a1 + a0) / 3)


def test_supcon_no_positive_and_batch_of_one_are_connected_zeros():
    f = torch.randn(3, 4, requires_grad=True)
    loss = supcon_loss(f, torch.tensor([0, 1, 2]), 0.1)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(f.grad, torch.zeros(3, 4))
    assert supcon_loss(f[:1], torch.tensor([0]), 0.1).item() == 0.0


def test_divergence_penalty_hand_values():
    f = rows(E1, DIAG, E2)
    y = torch.tensor([0, 0, 0])
    tau, lam = 0.5, 0.7
    # R ≈ 0.707 > λ: pairs (0,1) and (1,2) are in P_i; (0,2) with sim 0 is not
    a0 = math.log(1 + math.exp((R - 1) / tau))
    a1 = math.log(1 + 2 * math.exp((R - 1) / tau))
    assert divergence_penalty(f, y, tau, lam).item() == approx((a0 + a1 + a0) / 3)
    assert divergence_penalty(f, y, tau, 0.9).item() == approx(0.0, abs_=1e-7)


def test_divergence_penalty_ignores_other_classes_and_means_over_all_anchors():
    f = rows(E1, E1, E1)
    y = torch.tensor([0, 0, 1])
    # anchors 0, 1: one same-class partner at sim 1 → log 2; anchor 2: empty P → 0
    assert divergence_penalty(f, y, 0.5, 0.7).item() == approx(2 * math.log(2) / 3)


def test_rcl_level_is_supcon_plus_beta_penalty_and_fedscl():
    torch.manual_seed(0)
    f = torch.randn(8, 5)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1])
    full = rcl_level_loss(f, y, tau=0.05, beta=2.0, lam=0.3)
    parts = supcon_loss(f, y, 0.05) + 2.0 * divergence_penalty(f, y, 0.05, 0.3)
    assert full.item() == approx(parts.item())
    assert rcl_level_loss(f, y, 0.05, 0.0, 0.3).item() == approx(supcon_loss(f, y, 0.05).item())


def test_rcl_hard_mining_hand_values():
    f = rows(E1, DIAG, E2)
    y = torch.tensor([0, 0, 1])
    tau, lam, beta = 1.0, 0.7, 1.0
    # anchor 0: hardest positive = least similar same class incl. self = R; negatives: E2 (0)
    # anchor 1: positive R; negative E2 (R); anchor 2: positive self (1); negatives 0 and R
    scl = ((lse(R, 0) - R) + (lse(R, R) - R) + (lse(1, 0, R) - 1)) / 3
    # penalty: anchors 0 and 1 have their only other same-class sample at R ≥ λ
    pen = 2 * softplus((R - 1) / tau) / 3
    got = rcl_level_loss(f, y, tau, beta, lam, mining="hard").item()
    assert got == approx(scl + beta * pen)


def test_rcl_hard_mining_one_class_penalises_only_if_least_similar_is_above_lambda():
    f = rows(E1, DIAG, E2)
    y = torch.zeros(3, dtype=torch.long)
    # no negatives → SCL 0 for every anchor; least similar other sample: 0, R, 0
    got = rcl_level_loss(f, y, tau=1.0, beta=1.0, lam=0.7, mining="hard").item()
    assert got == approx(softplus(R - 1) / 3)
    # the paper form penalises anchor 0 as well (P_0 = {DIAG})
    paper = divergence_penalty(f, y, 1.0, 0.7).item()
    assert paper > got


def test_rcl_hard_mining_batch_of_one_and_no_partner():
    f = torch.randn(1, 4, requires_grad=True)
    assert rcl_level_loss(f, torch.tensor([3]), 0.05, 1.0, 0.7, mining="hard").item() == 0.0
    g = rows(E1, E2)  # two classes, no partner: positive = self (1/τ), negative 0
    got = rcl_level_loss(g, torch.tensor([0, 1]), 0.5, 1.0, 0.7, mining="hard").item()
    assert got == approx(lse(2, 0) - 2)


def test_rcl_loss_hand_value_mean_over_levels():
    y = torch.tensor([0, 0, 1])
    a = rows(E1, E1, E2)  # SCL lse(1,0)−1, penalty 2·log2/3
    e1, e2 = torch.eye(2)
    b = rows(e1, e2, e2)  # SCL (log 2 + lse(0,1))/2, penalty 0 (sim 0 < λ)
    level_a = (lse(1, 0) - 1) + 2 * math.log(2) / 3
    level_b = (math.log(2) + lse(0, 1)) / 2
    got = rcl_loss([a, b], y, tau=1.0, beta=1.0, lam=0.7).item()
    assert got == approx((level_a + level_b) / 2)
    # pooled (B, C, 1, 1) features are flattened
    assert rcl_loss([a[:, :, None, None]], y, tau=1.0).item() == approx(level_a)


@pytest.mark.parametrize("tau", [0.5, 0.05, 0.01])  # 0.01: the logsumexp fallback
@pytest.mark.parametrize("beta", [0.0, 2.5])
@pytest.mark.parametrize("lam", [0.0, 0.3, 0.7])
@pytest.mark.parametrize(
    "labels",
    [[0, 0, 1, 1, 2, 2], [0, 1, 2, 3, 4, 5], [3] * 6, [0, 0, 1, 2, 3, 3], [7]],
    ids=["pairs", "all-distinct", "one-class", "some-singletons", "batch-of-1"],
)
def test_rcl_loss_all_levels_at_once_equals_per_level_mean(labels, lam, beta, tau):
    """The stacked fast path gives the per-level functions' value and gradients (those are
    checked by hand above), for penalty thresholds that split the same-class pairs."""
    torch.manual_seed(0)
    y = torch.tensor(labels)
    dims = (3, 5, 8)
    fast = [torch.randn(len(labels), d, requires_grad=True) for d in dims]
    slow = [f.detach().clone().requires_grad_(True) for f in fast]
    got = rcl_loss(fast, y, tau=tau, beta=beta, lam=lam)
    want = torch.stack([rcl_level_loss(f, y, tau, beta, lam) for f in slow]).mean()
    assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    got.backward()
    want.backward()
    for a, b in zip(fast, slow, strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.allclose(a.grad, b.grad, atol=1e-5)


def test_rcl_loss_rejects_bad_mining_and_no_levels():
    y = torch.tensor([0, 0, 1, 1])
    a = torch.randn(4, 3)
    with pytest.raises(ValueError, match="allowed: paper, hard"):
        rcl_loss([a], y, mining="soft")
    with pytest.raises(ValueError, match="allowed: paper, hard"):
        rcl_level_loss(a, y, 0.05, 1.0, 0.7, mining="topk")
    with pytest.raises(ValueError):
        rcl_loss([], y)


@pytest.mark.parametrize("mining", ["paper", "hard"])
def test_rcl_small_tau_single_class_finite_gradients(mining):
    torch.manual_seed(0)
    f = torch.randn(16, 8, requires_grad=True)
    loss = rcl_loss([f, f * 2], torch.zeros(16, dtype=torch.long), tau=0.05, mining=mining)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(f.grad).all()


# --------------------------------------------------------------------------- FedCCL
def test_signal_contrast_local_hand_values():
    xi = rows(E1, E2)
    signals = rows(E1, DIAG, E2)
    sig_lab = torch.tensor([0, 0, 1])
    y = torch.tensor([0, 2])  # sample 1's class has no signal: skipped
    tau = 0.5
    expect = lse(2, 2 * R, 0) - lse(2, 2 * R)
    assert signal_contrast_local(xi, y, signals, sig_lab, tau).item() == approx(expect)


def test_signal_contrast_local_mean_over_used_samples():
    xi = rows(E1, E2, E3)
    signals = rows(E1, DIAG, E2)
    sig_lab = torch.tensor([0, 0, 1])
    y = torch.tensor([0, 1, 2])
    tau = 0.5
    s0 = lse(2, 2 * R, 0) - lse(2, 2 * R)
    s1 = lse(0, 2 * R, 2) - 2  # positive: E2 (class 1)
    assert signal_contrast_local(xi, y, signals, sig_lab, tau).item() == approx((s0 + s1) / 2)


def test_signal_contrast_local_skips_and_empty_signals_are_connected_zeros():
    xi = torch.randn(2, 3, requires_grad=True)
    sig, lab = rows(E1, E2), torch.tensor([0, 1])
    assert signal_contrast_local(xi, torch.tensor([2, 2]), sig, lab, 0.07).item() == 0
    empty = signal_contrast_local(xi, torch.tensor([0, 1]), torch.empty(0, 3), torch.empty(0), 0.07)
    assert empty.item() == 0.0
    empty.backward()
    assert torch.equal(xi.grad, torch.zeros(2, 3))


def test_signal_contrast_local_skipped_sample_gets_no_gradient():
    xi = torch.randn(3, 3, requires_grad=True)
    loss = signal_contrast_local(
        xi, torch.tensor([0, 5, 1]), rows(E1, E2), torch.tensor([0, 1]), 0.07
    )
    loss.backward()
    assert torch.isfinite(xi.grad).all() and torch.equal(xi.grad[1], torch.zeros(3))


def test_signal_contrast_global_masks_classes():
    xi = rows(E1, E3)
    U = rows(E1, E2, E3)
    mask = torch.tensor([True, True, False])
    y = torch.tensor([0, 2])  # class 2 is masked: sample skipped and not in the softmax
    tau = 0.5
    expect = lse(2, 0) - 2
    assert signal_contrast_global(xi, y, U, mask, tau).item() == approx(expect)
    none = torch.zeros(3, dtype=torch.bool)
    assert signal_contrast_global(xi, y, U, none, tau).item() == 0


def test_signal_contrast_global_masked_signal_is_not_a_negative():
    xi, y = rows(E1), torch.tensor([0])
    U = rows(E1, E2, E1)  # class 2's (stale) signal equals E1 but is masked
    tau = 0.07
    masked = signal_contrast_global(xi, y, U, torch.tensor([True, True, False]), tau)
    unmasked = signal_contrast_global(xi, y, U, torch.tensor([True, True, True]), tau)
    assert masked.item() == approx(lse(1 / tau, 0) - 1 / tau)
    assert unmasked.item() == approx(lse(1 / tau, 0, 1 / tau) - 1 / tau)


def test_signal_contrast_both_terms_hand_values():
    xi, y, tau = rows(E1, E3), torch.tensor([0, 2]), 0.5
    bank = signal_bank(
        rows(E1, DIAG, E2),
        torch.tensor([0, 0, 1]),  # class 2 has no local signal
        rows(E1, E2, E3),
        torch.tensor([True, True, False]),  # nor a global one
        3,
        tau,
    )
    local = lse(2, 2 * R, 0) - lse(2, 2 * R)  # sample 0 only
    glob = lse(2, 0) - 2  # sample 0 only; class 2 is not in the softmax
    got = signal_contrast(xi, y, bank, lam_local=0.5, lam_global=2.0)
    assert got.item() == approx(0.5 * local + 2.0 * glob)


def _naive_signal_contrast(h, y, sig, lab, U, mask, tau, lam_l, lam_g):
    """Eqs. 16-17 sample by sample in float64: the reference for the batched version."""
    xi, S, G = (torch.nn.functional.normalize(t.double(), dim=1) for t in (h, sig, U))
    loc, n_loc, glo, n_glo = 0.0, 0, 0.0, 0
    for i in range(len(y)):
        s = xi[i] @ S.T / tau
        if (lab == y[i]).any():
            loc = loc + torch.logsumexp(s, 0) - torch.logsumexp(s[lab == y[i]], 0)
            n_loc += 1
        if mask[y[i]]:
            g = xi[i] @ G.T / tau
            glo = glo + torch.logsumexp(g[mask], 0) - g[y[i]]
            n_glo += 1
    return lam_l * loc / max(n_loc, 1) + lam_g * glo / max(n_glo, 1)


@pytest.mark.parametrize("tau", [0.07, 0.01])  # e^{(s−1)/τ} sums, and the logsumexp path
def test_signal_contrast_matches_per_sample_reference(tau):
    g = torch.Generator().manual_seed(3)
    h = torch.randn(24, 8, generator=g, requires_grad=True)
    y = torch.randint(0, 5, (24,), generator=g)
    sig, lab = torch.randn(9, 8, generator=g), torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 0])
    U, mask = torch.randn(5, 8, generator=g), torch.tensor([True, True, False, True, True])
    bank = signal_bank(sig, lab, U, mask, 5, tau)
    assert bank.shifted == (tau == 0.07)
    want = _naive_signal_contrast(h, y, sig, lab, U, mask, tau, 0.7, 1.3)
    (g_want,) = torch.autograd.grad(want, h)
    # at τ 0.07 the logsumexp path (valid at any τ) must agree with the shifted one
    for b in (bank, bank._replace(shifted=False)):
        got = signal_contrast(h, y, b, 0.7, 1.3)
        (g_got,) = torch.autograd.grad(got, h)
        assert got.item() == approx(want.item(), rel=1e-5)
        assert torch.allclose(g_got, g_want, rtol=1e-4, atol=1e-6)


def test_signal_bank_needs_some_signals():
    with pytest.raises(ValueError, match="local signals"):
        signal_bank(None, None, None, None, 3, 0.07)


# --------------------------------------------------------------------------- PMFL
def test_pmfl_loss_hand_values():
    z, z_glob = rows(E1), rows(DIAG)  # μ = R
    hist = [rows(E1), rows(E2)]  # sims 1 (≥ μ: positive), 0 (negative)
    tau = 0.5
    expect = lse(2 * R, 2, 0) - lse(2 * R, 2)
    assert pmfl_loss(z, z_glob, hist, tau).item() == approx(expect)


def test_pmfl_loss_per_sample_threshold_and_tie_is_positive():
    z = rows(E1, E2)
    z_glob = rows(DIAG, E2)  # μ = R for sample 0, 1 for sample 1
    hist = [rows(DIAG, DIAG)]  # sims R (= μ_0: positive), R (< μ_1: negative)
    tau = 0.5
    s0 = 0.0  # pos = e^{2R} + e^{2R}, no negative
    s1 = lse(2, 2 * R) - 2
    assert pmfl_loss(z, z_glob, hist, tau).item() == approx((s0 + s1) / 2)


def test_pmfl_loss_literal_threshold_makes_every_historical_model_a_negative():
    """The paper's literal μ = Sim(z^{tE}, Z^t) = 1 (``mu=1.0``): by hand, on one sample.
    z = E1, Z_g = DIAG (cosine R), history DIAG (R) and E2 (0). With the current reading
    μ = R, DIAG ties and is a positive; with μ = 1 both are negatives:
    ``ℓ = log(e^{2R} + e^{2R} + e^0) − log e^{2R}`` (τ = 0.5)."""
    z, z_glob = rows(E1), rows(DIAG)
    hist = [rows(DIAG), rows(E2)]
    tau = 0.5
    current = lse(2 * R, 2 * R, 0) - lse(2 * R, 2 * R)
    literal = lse(2 * R, 2 * R, 0) - 2 * R
    assert pmfl_loss(z, z_glob, hist, tau).item() == approx(current)
    assert pmfl_loss(z, z_glob, hist, tau, mu=1.0).item() == approx(literal)
    assert literal > current > 0


def test_pmfl_loss_literal_threshold_per_sample_and_a_tie_at_one_is_positive():
    """μ = 1 for every sample whatever its Z_g: sample 0 (Z_g = DIAG) has the history E1 = z
    (cosine exactly 1: a positive, the only way to be one) and E2 (0: a negative); sample 1
    (z = E2, Z_g = E2, so the current μ would be 1 as well) has DIAG (R) and E3 (0), both
    negatives. The loss is the mean of the two, with the gradient of the by-hand value."""
    z = rows(E1, E2).requires_grad_(True)
    z_glob = rows(DIAG, E2)
    hist = torch.stack([rows(E1, DIAG), rows(E2, E3)])  # (N = 2, B = 2, d)
    tau = 0.5
    s0 = lse(2 * R, 2, 0) - lse(2 * R, 2)  # pos {Z_g, E1}, neg {E2}
    s1 = lse(2, 2 * R, 0) - 2  # pos {Z_g}, neg {DIAG, E3}
    loss = pmfl_loss(z, z_glob, hist, tau, mu=1.0)
    assert loss.item() == approx((s0 + s1) / 2)
    loss.backward()
    assert z.grad is not None and torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


def test_pmfl_loss_literal_threshold_with_absent_models():
    """The fixed-size buffer's mask (CUDA-graph step) with μ = 1: the value and gradient of
    the present models alone."""
    torch.manual_seed(1)
    z = torch.randn(5, 4, requires_grad=True)
    z_glob, hist = torch.randn(5, 4), torch.randn(3, 5, 4)
    mask = torch.tensor([False, True, True])
    masked = pmfl_loss(z, z_glob, hist, 0.5, present=mask, mu=1.0)
    (g_masked,) = torch.autograd.grad(masked, z)
    alone = pmfl_loss(z, z_glob, hist[mask], 0.5, mu=1.0)
    (g_alone,) = torch.autograd.grad(alone, z)
    assert masked.item() == pytest.approx(alone.item(), abs=1e-7)
    assert torch.allclose(g_masked, g_alone, atol=1e-7)
    # random directions: no history reaches cosine 1, so all are negatives
    s_g = F.cosine_similarity(z, z_glob, dim=1)
    s_h = F.cosine_similarity(z[None], hist[mask], dim=2).T  # (B, 2)
    logits = torch.cat([s_g[:, None], s_h], dim=1) / 0.5
    expect = (torch.logsumexp(logits, dim=1) - logits[:, 0]).mean()
    assert alone.item() == pytest.approx(expect.item(), rel=1e-5)


@pytest.mark.parametrize("present", [[True, False, True], [False, False, False]])
def test_pmfl_loss_leaves_absent_models_out(present):
    """A fixed-size buffer that is still filling (the CUDA-graph step) masks its empty slots:
    the same value and gradient as the present models alone (0 for none)."""
    torch.manual_seed(0)
    z = torch.randn(5, 4, requires_grad=True)
    z_glob, hist = torch.randn(5, 4), torch.randn(3, 5, 4)
    mask = torch.tensor(present)
    masked = pmfl_loss(z, z_glob, hist, 0.5, present=mask)
    (g_masked,) = torch.autograd.grad(masked, z)
    alone = pmfl_loss(z, z_glob, hist[mask], 0.5)
    (g_alone,) = torch.autograd.grad(alone, z)
    assert masked.item() == pytest.approx(alone.item(), abs=1e-7)
    assert torch.allclose(g_masked, g_alone, atol=1e-7)


def test_pmfl_empty_history_is_connected_zero():
    z = torch.randn(3, 4, requires_grad=True)
    loss = pmfl_loss(z, torch.randn(3, 4), [], 0.5)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(z.grad, torch.zeros(3, 4))


# --------------------------------------------------------------------------- FedRANE
def test_lra_discrimination_hand_values_identical_views():
    z = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]])
    tau = 0.8
    # identical views: positive Pearson 1; between the two samples Pearson 0.5
    expect = lse(1 / tau, 0.5 / tau, 0.5 / tau) - 1 / tau
    assert lra_discrimination_loss(z, z.clone(), tau).item() == approx(expect)


def test_lra_discrimination_hand_values_pearson_not_cosine():
    # rows centre to a = [1,0,−1], b ∝ [0,1,−1]; the augmented second view is −a
    z = torch.tensor([[3.0, 2.0, 1.0], [5.0, 7.0, 3.0]])
    z_aug = torch.tensor([[1.0, 0.0, -1.0], [-1.0, 0.0, 1.0]])
    tau = 0.8
    # views [a, b, a, −a]; ρ(a,b) = 0.5, ρ(a,a) = 1, ρ(a,−a) = −1, ρ(b,−a) = −0.5
    l0 = lse(0.5 / tau, 1 / tau, -1 / tau) - 1 / tau
    l1 = lse(0.5 / tau, 0.5 / tau, -0.5 / tau) + 0.5 / tau
    l2 = l0
    l3 = lse(-1 / tau, -0.5 / tau, -1 / tau) + 0.5 / tau
    got = lra_discrimination_loss(z, z_aug, tau).item()
    assert got == approx((l0 + l1 + l2 + l3) / 4)


@pytest.mark.parametrize("tau", [0.8, 0.05, 0.01])
def test_lra_discrimination_matches_nt_xent_reference(tau):
    torch.manual_seed(1)
    z, z_aug = torch.randn(6, 5), torch.randn(6, 5)
    v = torch.cat([z, z_aug]).double()
    v = torch.nn.functional.normalize(v - v.mean(dim=1, keepdim=True), dim=1)
    sim = (v @ v.T / tau).fill_diagonal_(float("-inf"))
    want = (torch.logsumexp(sim, 1) - sim[torch.arange(12), (torch.arange(12) + 6) % 12]).mean()
    got = lra_discrimination_loss(z, z_aug, tau).item()
    assert got == pytest.approx(want.item(), rel=1e-5)


def test_lra_discrimination_batch_of_one_and_shape_check():
    z = torch.randn(1, 5, requires_grad=True)
    loss = lra_discrimination_loss(z, torch.randn(1, 5))
    assert torch.isfinite(loss) and loss.item() == approx(0.0)
    loss.backward()
    assert torch.isfinite(z.grad).all()
    with pytest.raises(ValueError):
        lra_discrimination_loss(torch.randn(2, 5), torch.randn(3, 5))


# --------------------------------------------------------------------------- shared contract
def _all_losses(z: torch.Tensor, y: torch.Tensor, tau: float) -> dict[str, torch.Tensor]:
    """Every loss on batch z (B, 4) with labels y, with constant references of matching size."""
    g = torch.Generator().manual_seed(1)
    b = z.shape[0]

    def ref() -> torch.Tensor:
        return torch.randn(b, 4, generator=g).to(z.dtype)

    signals = torch.randn(4, 4, generator=g).to(z.dtype)
    return {
        "moon": moon_loss(z, ref(), [ref(), ref()], tau),
        "supcon": supcon_loss(z, y, tau),
        "penalty": divergence_penalty(z, y, tau, 0.0),
        "rcl_paper": rcl_loss([z, z[:, :2]], y, tau=tau, lam=0.0),
        "rcl_hard": rcl_loss([z, z[:, :2]], y, tau=tau, lam=0.0, mining="hard"),
        "local": signal_contrast_local(z, y, signals, torch.tensor([0, 0, 1, 2]), tau),
        "global": signal_contrast_global(z, y, signals, torch.tensor([1, 1, 0, 1]).bool(), tau),
        "pmfl": pmfl_loss(z, ref(), [ref() for _ in range(3)], tau),
        "lra": lra_discrimination_loss(z, ref(), tau),
    }


BATCHES = {
    "mixed": torch.tensor([0, 0, 1, 1, 2, 3]),
    "one_class": torch.zeros(6, dtype=torch.long),
    "single": torch.tensor([1]),
}


@pytest.mark.parametrize("tau", [0.05, 0.07, 0.01])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_every_loss_fp32_finite_with_finite_gradients(batch, tau):
    y = BATCHES[batch]
    z = torch.randn(len(y), 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    for name, loss in _all_losses(z, y, tau).items():
        assert loss.dim() == 0 and loss.dtype == torch.float32, name
        assert torch.isfinite(loss), name
        (grad,) = torch.autograd.grad(loss, z, allow_unused=True)
        assert grad is None or torch.isfinite(grad).all(), name


def test_every_loss_is_fp32_for_double_inputs_and_under_autocast():
    y = BATCHES["mixed"]
    z = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    reference = _all_losses(z, y, 0.07)
    for name, loss in _all_losses(z.double(), y, 0.07).items():
        assert loss.dtype == torch.float32, name
        assert loss.item() == approx(reference[name].item(), rel=1e-4), name
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = _all_losses(z, y, 0.07)
    for name, loss in amp.items():
        assert loss.dtype == torch.float32, name
        assert loss.item() == approx(reference[name].item(), rel=1e-5), name


def test_losses_reach_the_trainable_input_only():
    z = torch.randn(4, 3, requires_grad=True)
    z_glob = torch.randn(4, 3, requires_grad=True)
    prev = torch.randn(4, 3, requires_grad=True)
    (moon_loss(z, z_glob, [prev], 0.5) + pmfl_loss(z, z_glob, [prev], 0.5)).backward()
    assert z.grad is not None and z_glob.grad is None and prev.grad is None


def test_pearson_rows_zero_a_constant_row_and_match_normalize_elsewhere():
    """A constant row centres to rounding noise that normalising would turn into a unit
    row (correlated with itself and, by accident, with others); it must be 0. Other rows
    equal F.normalize of the centred row bit for bit (FedRANE's results are unchanged)."""
    torch.manual_seed(0)
    for d in (8, 10, 128):
        x = torch.randn(5, d)
        x[2] = F.normalize(torch.ones(d), dim=0) * 3.7
        u = pearson_rows(x)
        assert torch.equal(u[2], torch.zeros(d))
        keep = [0, 1, 3, 4]
        ref = F.normalize(x[keep] - x[keep].mean(dim=1, keepdim=True), dim=1)
        assert torch.equal(u[keep], ref)
    z = torch.randn(4, 16, requires_grad=True)
    loss = lra_discrimination_loss(z, torch.full((4, 16), 0.25))  # constant augmented views
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()


def test_lra_discrimination_cosine_hand_values():
    """``similarity="cosine"`` (the authors' info_nce_loss) on the rows of the Pearson test:
    a = [3,2,1] and b = [5,7,3] are not centred, so their cosine is not their Pearson."""
    z = torch.tensor([[3.0, 2.0, 1.0], [5.0, 7.0, 3.0]])
    z_aug = torch.tensor([[1.0, 0.0, -1.0], [-1.0, 0.0, 1.0]])
    tau = 0.8
    rows = [[3.0, 2.0, 1.0], [5.0, 7.0, 3.0], [1.0, 0.0, -1.0], [-1.0, 0.0, 1.0]]

    def cos(u, v):
        dot = sum(a * b for a, b in zip(u, v, strict=True))
        return dot / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))

    total = 0.0
    for i in range(4):
        others = [cos(rows[i], rows[j]) / tau for j in range(4) if j != i]
        total += lse(*others) - cos(rows[i], rows[(i + 2) % 4]) / tau
    got = lra_discrimination_loss(z, z_aug, tau, similarity="cosine").item()
    assert got == approx(total / 4)
    assert abs(got - lra_discrimination_loss(z, z_aug, tau).item()) > 0.1  # not Pearson's
    with pytest.raises(ValueError, match="pearson or cosine"):
        lra_discrimination_loss(z, z_aug, tau, similarity="dot")


def test_mixup_cross_entropy_hand_values():
    """λ·CE(·, y_a) + (1−λ)·CE(·, y_b), each CE the batch mean, by hand on 2 samples."""
    logits = torch.tensor([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]])
    y_a, y_b, lam = torch.tensor([0, 1]), torch.tensor([2, 0]), 0.3
    ce_a = ((lse(1.0, 0.0, -1.0) - 1.0) + (lse(0.5, 2.0, 0.0) - 2.0)) / 2
    ce_b = ((lse(1.0, 0.0, -1.0) + 1.0) + (lse(0.5, 2.0, 0.0) - 0.5)) / 2
    got = mixup_cross_entropy(logits, y_a, y_b, lam)
    assert got.dtype == torch.float32 and got.item() == approx(lam * ce_a + (1 - lam) * ce_b)
    assert mixup_cross_entropy(logits, y_a, y_a, lam).item() == approx(ce_a)  # same labels: CE


def test_mixup_batch_and_draw():
    """The mixed batch is λx + (1−λ)x[perm]; the draw is a permutation and a λ in [0, 1],
    reproducible under the client's per-round seed; α ≤ 0 is refused (weight 0 is "off")."""
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    perm = torch.tensor([2, 0, 1])
    want = torch.tensor([[4.0, 5.0], [1.5, 2.5], [3.5, 4.5]])  # 0.25·x_i + 0.75·x_perm(i)
    torch.testing.assert_close(mixup_batch(x, 0.25, perm), want)
    torch.manual_seed(3)
    lam, p = mixup_draw(16, 0.5)
    torch.manual_seed(3)
    lam2, p2 = mixup_draw(16, 0.5)
    assert lam2 == lam and torch.equal(p2, p)
    assert 0.0 <= lam <= 1.0 and sorted(p.tolist()) == list(range(16))
    with pytest.raises(ValueError, match="set its weight to 0"):
        mixup_draw(4, 0.0)
