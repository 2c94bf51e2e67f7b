"""Adversarial training and robustness evaluation, for every method (FedCCL Appendix A).

- ``client.adversarial: true`` makes any client train on PGD examples (FedCCL Eqs. 19–20)
  in place of the clean batch: the cross-entropy and every other term of the method's loss
  see the adversarial inputs. FedCCL with it is FedCCL+ (Eqs. 21–23: CE and both signal
  contrasts on adversarial features), FedAvg with it is the paper's FedAvg+ (Table 8).
- ``evaluation.robust: true`` adds the global model's accuracy under FGSM and PGD
  (``evaluation.robust_steps``, 20 by default) to each evaluation (Table 8's "FGSM" and
  "PGD-20" columns), both of radius ``evaluation.robust_eps``.

Attacks are L∞ balls in the standardised input space (the model's input), on the
cross-entropy of the model's logits; inputs are not clipped to the pixel range (domain
transforms such as noise already leave it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.data import TensorSplit


def pgd_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    alpha: float,
    steps: int,
    random_start: bool = True,
) -> torch.Tensor:
    """L∞ projected gradient ascent on the cross-entropy (Madry et al.; FedCCL Eq. 20):
    ``x ← Π_{‖x−x₀‖∞≤ε}(x + α·sign(∇ₓ CE))``, ``steps`` times, from a uniform random point of
    the ball when ``random_start`` (drawn from torch's global CPU generator on every device,
    so a seeded run starts from the same points on CPU and GPU). ``steps=1, alpha=eps,
    random_start=False`` is FGSM.
    Returns detached inputs within ``eps`` of ``x``; neither the model's mode nor its
    parameters' ``.grad`` change (the gradient is taken with respect to the input only)."""
    x0 = x.detach()
    x_adv = x0.clone()
    if random_start:  # drawn by the CPU's generator, so a GPU run starts where a CPU run does
        noise = torch.empty(x0.shape, dtype=x0.dtype, pin_memory=x0.is_cuda).uniform_(-eps, eps)
        x_adv = x_adv + noise.to(x0.device, non_blocking=True)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        loss = F.cross_entropy(model(x_adv).logits, y)
        (grad,) = torch.autograd.grad(loss, x_adv)
        x_adv = x_adv.detach() + alpha * grad.sign()
        x_adv = torch.min(torch.max(x_adv, x0 - eps), x0 + eps)
    return x_adv.detach()


def robust_accuracy(
    model: nn.Module,
    split: TensorSplit,
    eps: float,
    pgd_steps: int,
    samples: int,
    batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Accuracy of ``model`` (put in eval mode) on the first ``samples`` examples of
    ``split`` under FGSM (one step of size ε) and PGD (``pgd_steps`` steps of 2.5·ε/pgd_steps
    from a random start, Madry et al.'s rule; ε/8 for PGD-20):
    ``{"robust_fgsm": …, "robust_pgd": …}`` in [0, 1] (FedCCL Table 8)."""
    n = min(len(split), samples)
    if n == 0:
        raise ValueError("robust_accuracy needs at least one example")
    x, y = split.x[:n].to(device), split.y[:n].to(device)
    model.eval()
    out: dict[str, float] = {}
    for name, steps, alpha, rand in (
        ("robust_fgsm", 1, eps, False),
        ("robust_pgd", pgd_steps, 2.5 * eps / pgd_steps, True),
    ):
        correct = 0
        for s in range(0, n, batch_size):
            xb, yb = x[s : s + batch_size], y[s : s + batch_size]
            xa = pgd_attack(model, xb, yb, eps, alpha, steps, rand)
            with torch.no_grad():
                correct += int((model(xa).logits.argmax(1) == yb).sum())
        out[name] = correct / n
    return out
