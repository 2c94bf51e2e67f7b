"""Every loss against values computed by hand on tiny inputs, plus edge cases."""

import math

import pytest
import torch

from clients.losses import (
    divergence_penalty,
    lra_discrimination_loss,
    moon_loss,
    pmfl_loss,
    proximal_term,
    rcl_level_loss,
    rcl_loss,
    signal_contrast_global,
    signal_contrast_local,
    supcon_loss,
)

E1, E2, E3 = torch.eye(3)
DIAG = torch.tensor([1.0, 1.0, 0.0]) / math.sqrt(2)  # cos 1/√2 to E1 and E2


def lse(*xs: float) -> float:
    return math.log(sum(math.exp(x) for x in xs))


def test_proximal_term():
    w = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    g = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    assert proximal_term(w, g, mu=0.5).item() == pytest.approx(0.25 * (1 + 4 + 4))


def test_moon_loss_hand_values():
    z = torch.stack([E1, E2])
    z_glob = torch.stack([E1, DIAG])  # pos sims: 1, 1/√2
    z_prev = [torch.stack([E2, E2])]  # neg sims: 0, 1
    tau = 0.5
    expect = 0.5 * ((lse(2, 0) - 2) + (lse(2 / math.sqrt(2), 2) - 2 / math.sqrt(2)))
    assert moon_loss(z, z_glob, z_prev, tau).item() == pytest.approx(expect, rel=1e-5)


def test_moon_loss_empty_buffer_is_connected_zero():
    z = torch.randn(4, 3, requires_grad=True)
    loss = moon_loss(z, torch.randn(4, 3), [], 0.5)
    assert loss.item() == 0.0
    loss.backward()
    assert z.grad is not None


def test_supcon_hand_values():
    f = torch.stack([E1, E1, E2])
    y = torch.tensor([0, 0, 1])
    tau = 1.0
    # anchors 0 and 1: positive sim 1, denominator over k≠i: e^1 + e^0; anchor 2 has none
    expect = lse(1, 0) - 1
    assert supcon_loss(f, y, tau).item() == pytest.approx(expect, rel=1e-6)


def test_supcon_no_positive_and_batch_of_one():
    f = torch.randn(3, 4, requires_grad=True)
    assert supcon_loss(f, torch.tensor([0, 1, 2]), 0.1).item() == 0.0
    assert supcon_loss(f[:1], torch.tensor([0]), 0.1).item() == 0.0


def test_divergence_penalty_hand_values():
    f = torch.stack([E1, DIAG, E2])
    y = torch.tensor([0, 0, 0])
    tau, lam = 0.5, 0.7
    s = 1 / math.sqrt(2)  # 0.707 > 0.7: pairs (0,1), (1,2) are in P_i; (0,2) sim 0 is not
    a0 = math.log(1 + math.exp((s - 1) / tau))
    a1 = math.log(1 + 2 * math.exp((s - 1) / tau))
    expect = (a0 + a1 + a0) / 3
    assert divergence_penalty(f, y, tau, lam).item() == pytest.approx(expect, rel=1e-5)
    # λ above every similarity: no penalty
    assert divergence_penalty(f, y, tau, 0.9).item() == pytest.approx(0.0, abs=1e-7)


def test_rcl_level_is_supcon_plus_beta_penalty_and_fedscl():
    f = torch.randn(8, 5)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1])
    full = rcl_level_loss(f, y, tau=0.05, beta=2.0, lam=0.3)
    parts = supcon_loss(f, y, 0.05) + 2.0 * divergence_penalty(f, y, 0.05, 0.3)
    assert full.item() == pytest.approx(parts.item(), rel=1e-6)
    assert rcl_level_loss(f, y, 0.05, 0.0, 0.3).item() == pytest.approx(
        supcon_loss(f, y, 0.05).item(), rel=1e-6
    )


def test_rcl_hard_mining_hand_values():
    f = torch.stack([E1, DIAG, E2])
    y = torch.tensor([0, 0, 1])
    tau, lam, beta = 1.0, 0.7, 1.0
    s = 1 / math.sqrt(2)
    # anchor 0: hardest positive = least similar same class incl. self = s; negatives: E2 (0)
    # anchor 1: positive s; negative E2 (s); anchor 2: positive self (1); negatives E1 0, DIAG s
    scl = ((lse(s, 0) - s) + (lse(s, s) - s) + (lse(1, 0, s) - 1)) / 3
    # penalty: anchors 0 and 1 have another same-class sample at s ≥ λ: softplus((s−1)/τ)
    pen = 2 * math.log(1 + math.exp((s - 1) / tau)) / 3
    got = rcl_level_loss(f, y, tau, beta, lam, mining="hard").item()
    assert got == pytest.approx(scl + beta * pen, rel=1e-5)


def test_rcl_loss_means_over_levels_and_rejects_bad_mining():
    y = torch.tensor([0, 0, 1, 1])
    a, b = torch.randn(4, 3), torch.randn(4, 6)
    mean = (rcl_level_loss(a, y, 0.05, 1, 0.7) + rcl_level_loss(b, y, 0.05, 1, 0.7)) / 2
    assert rcl_loss([a, b], y).item() == pytest.approx(mean.item(), rel=1e-6)
    with pytest.raises(ValueError, match="allowed: paper, hard"):
        rcl_loss([a], y, mining="soft")


def test_rcl_small_tau_stable_and_single_class():
    f = torch.randn(16, 8, requires_grad=True)
    loss = rcl_loss([f], torch.zeros(16, dtype=torch.long), tau=0.05)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(f.grad).all()


def test_signal_contrast_local_hand_values():
    xi = torch.stack([E1, E2])
    signals = torch.stack([E1, DIAG, E2])
    sig_lab = torch.tensor([0, 0, 1])
    y = torch.tensor([0, 2])  # sample 1's class has no signal: skipped
    tau = 0.5
    s = 1 / math.sqrt(2)
    expect = lse(2, 2 * s, 0) - lse(2, 2 * s)
    got = signal_contrast_local(xi, y, signals, sig_lab, tau).item()
    assert got == pytest.approx(expect, rel=1e-5)
    assert signal_contrast_local(xi, torch.tensor([2, 2]), signals, sig_lab, tau).item() == 0


def test_signal_contrast_global_masks_classes():
    xi = torch.stack([E1, E3])
    U = torch.stack([E1, E2, E3])
    mask = torch.tensor([True, True, False])
    y = torch.tensor([0, 2])  # class 2 is masked: sample skipped and not in the softmax
    tau = 0.5
    expect = lse(1 / tau, 0) - 1 / tau
    got = signal_contrast_global(xi, y, U, mask, tau).item()
    assert got == pytest.approx(expect, rel=1e-5)
    assert signal_contrast_global(xi, y, U, torch.zeros(3, dtype=torch.bool), tau).item() == 0


def test_pmfl_loss_hand_values():
    z = torch.stack([E1])
    z_glob = torch.stack([DIAG])  # μ = 1/√2
    hist = [torch.stack([E1]), torch.stack([E2])]  # sims 1 (≥ μ: positive), 0 (negative)
    tau = 0.5
    s = 1 / math.sqrt(2)
    expect = lse(s / tau, 2, 0) - lse(s / tau, 2)
    assert pmfl_loss(z, z_glob, hist, tau).item() == pytest.approx(expect, rel=1e-5)
    assert pmfl_loss(z, z_glob, [], tau).item() == 0.0


def test_lra_discrimination_hand_values_and_batch_of_one():
    z = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]])
    tau = 0.8
    # identical views: positive Pearson = 1; between samples Pearson = 0.5
    expect = lse(1 / tau, 0.5 / tau, 0.5 / tau) - 1 / tau
    got = lra_discrimination_loss(z, z.clone(), tau).item()
    assert got == pytest.approx(expect, rel=1e-5)
    one = lra_discrimination_loss(z[:1], z[:1].clone(), tau)
    assert torch.isfinite(one) and one.item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("fn", ["moon", "pmfl", "lra", "supcon"])
def test_fp32_output_and_finite_gradients(fn):
    torch.manual_seed(0)
    z = torch.randn(6, 4, requires_grad=True)
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    loss = {
        "moon": lambda: moon_loss(z, torch.randn(6, 4), [torch.randn(6, 4)], 0.05),
        "pmfl": lambda: pmfl_loss(z, torch.randn(6, 4), [torch.randn(6, 4)] * 3, 0.05),
        "lra": lambda: lra_discrimination_loss(z, torch.randn(6, 4), 0.05),
        "supcon": lambda: supcon_loss(z, y, 0.01),
    }[fn]()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(z.grad).all()
