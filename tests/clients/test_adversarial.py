"""Adversarial training (any client) and FGSM / PGD-20 evaluation (FedCCL Appendix A, Table 8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import clients.adversarial
import clients.base
from clients.adversarial import pgd_attack, robust_accuracy
from core.data import TensorSplit
from core.models import ModelOutput
from core.params import ConfigError
from fl_app.config import load_config


class Linear(nn.Module):
    """logits = W x on flattened inputs, with the ModelOutput interface."""

    def __init__(self, d: int, c: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, c, bias=False)

    def forward(self, x: torch.Tensor) -> ModelOutput:
        h = x.flatten(1)
        return ModelOutput([h], h, h, self.fc(h))


def test_fgsm_is_the_hand_computed_sign_step():
    torch.manual_seed(0)
    model, x, y = Linear(6, 3), torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    # ∂CE/∂x_i = Wᵀ(softmax(W x_i) − e_{y_i}) / B: its sign is the FGSM direction
    W = model.fc.weight.detach()
    grad = (F.softmax(x @ W.T, dim=1) - F.one_hot(y, 3)) @ W
    expected = x + 0.1 * grad.sign()
    got = pgd_attack(model, x, y, eps=0.1, alpha=0.1, steps=1, random_start=False)
    torch.testing.assert_close(got, expected)


def test_pgd_stays_in_the_ball_and_leaves_the_model_alone():
    torch.manual_seed(1)
    model, x, y = Linear(6, 3), torch.randn(8, 6), torch.randint(0, 3, (8,))
    model.train()
    xa = pgd_attack(model, x, y, eps=0.2, alpha=0.15, steps=4)
    assert float((xa - x).abs().max()) <= 0.2 + 1e-6 and not xa.requires_grad
    assert model.training and model.fc.weight.grad is None
    ce = F.cross_entropy
    assert ce(model(xa).logits, y) > ce(model(x).logits, y)  # the attack raises the loss


def test_robust_accuracy_equals_clean_accuracy_for_a_vanishing_radius(make_client, global_weights):
    c = make_client("fedavg")
    c.fit(global_weights(c), {"server-round": 1})
    test = c.data.test
    out = robust_accuracy(c.model, test, 1e-7, 20, 10_000, 16, torch.device("cpu"))
    with torch.no_grad():
        clean = (c.model(test.x).logits.argmax(1) == test.y).float().mean().item()
    assert out == pytest.approx({"robust_fgsm": clean, "robust_pgd": clean})
    big = robust_accuracy(c.model, test, 1.0, 20, 10_000, 16, torch.device("cpu"))
    assert big["robust_fgsm"] < clean and big["robust_pgd"] < clean
    with pytest.raises(ValueError, match="at least one"):
        robust_accuracy(c.model, TensorSplit(test.x[:0], test.y[:0]), 0.1, 20, 10, 16, c.device)


def test_robust_accuracy_runs_fgsm_and_the_configured_pgd(monkeypatch):
    """FGSM is one step of ε without random start; PGD-k is k steps of 2.5·ε/k from one."""
    calls = []

    def recording_attack(model, x, y, eps, alpha, steps, random_start=True):
        calls.append((eps, alpha, steps, random_start, len(x)))
        return x

    monkeypatch.setattr(clients.adversarial, "pgd_attack", recording_attack)
    model, x = Linear(6, 3), torch.randn(10, 6)
    split = TensorSplit(x, model(x).logits.argmax(1).detach())  # labels the model predicts
    out = robust_accuracy(model, split, 0.2, 8, samples=7, batch_size=4, device=torch.device("cpu"))
    assert out == {"robust_fgsm": 1.0, "robust_pgd": 1.0}  # identity attack: clean accuracy
    assert calls == [
        (0.2, 0.2, 1, False, 4),
        (0.2, 0.2, 1, False, 3),
        (0.2, pytest.approx(0.0625), 8, True, 4),
        (0.2, pytest.approx(0.0625), 8, True, 3),
    ]


def test_adversarial_training_replaces_the_batch_before_the_forward(
    make_client, global_weights, monkeypatch
):
    """The loop hands PGD's output to the forward pass and the loss: with an attack that
    returns its input, training equals clean training; with the real one, it differs."""
    calls = []

    def identity_attack(model, x, y, eps, alpha, steps):
        calls.append((eps, alpha, steps))
        return x

    clean = make_client("fedccl")
    w0 = global_weights(clean)
    w_clean = clean.fit(w0, {"server-round": 1})[0]
    monkeypatch.setattr(clients.base, "pgd_attack", identity_attack)
    adv = make_client("fedccl_plus", overrides="client.adv_steps=2")
    w_same = adv.fit(w0, {"server-round": 1})[0]
    assert calls and set(calls) == {(0.3, 0.075, 2)}
    assert all(np.array_equal(a, b) for a, b in zip(w_clean, w_same, strict=True))
    monkeypatch.undo()
    adv = make_client("fedccl_plus", overrides="client.adv_steps=2")
    w_adv = adv.fit(w0, {"server-round": 1})[0]
    assert not all(np.array_equal(a, b) for a, b in zip(w_clean, w_adv, strict=True))


def test_fedavg_plus_preset_and_bad_attack_settings():
    cfg = load_config("tiny", "fedavg_plus")
    assert cfg["client"]["name"] == "fedavg" and cfg["client"]["adversarial"]
    assert cfg["evaluation"]["robust"]
    bad_settings = (
        "client.adv_eps=0",
        "client.adv_steps=0",
        "evaluation.robust_eps=-0.1",
        "evaluation.robust_steps=0",
        "evaluation.robust_samples=0",
    )
    for bad in bad_settings:
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config("tiny", "fedavg", bad)
