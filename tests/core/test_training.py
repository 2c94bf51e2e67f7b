import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core.data import TensorSplit
from core.training import batch_indices, evaluate_model, numerics, pick_device


class _Linear(nn.Module):
    """The smallest model with the project's output shape (``.logits``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.drop = nn.Dropout(0.5)  # changes the logits unless in eval mode

    def forward(self, x: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.drop(self.fc(x)))


def _split(n: int, seed: int = 0) -> TensorSplit:
    g = torch.Generator().manual_seed(seed)
    return TensorSplit(torch.randn(n, 6, generator=g), torch.randint(0, 4, (n,), generator=g))


# ----------------------------------------------------------------------- evaluate_model
@pytest.mark.parametrize("batch_size", [8, 16, 37, 100])
def test_evaluate_model_is_the_per_sample_mean_over_the_whole_split(batch_size):
    """37 samples: batches of 8 leave a last batch of 5, so a loss averaged per batch, or
    a sum divided by the number of batches, differs from the per-sample mean."""
    torch.manual_seed(0)
    model, split = _Linear(), _split(37)
    model.train()
    loss, acc = evaluate_model(model, split, batch_size, torch.device("cpu"))
    assert not model.training  # eval mode (the dropout is off)
    with torch.no_grad():
        logits = model(split.x).logits
    assert loss == pytest.approx(F.cross_entropy(logits, split.y).item(), rel=1e-6)
    assert acc == (logits.argmax(1) == split.y).sum().item() / 37
    assert 0 < acc < 1  # not a degenerate model: the count of right answers matters


def test_evaluate_model_on_an_empty_split_is_nan():
    empty = TensorSplit(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long))
    loss, acc = evaluate_model(_Linear(), empty, 8, torch.device("cpu"))
    assert math.isnan(loss) and math.isnan(acc)


# -------------------------------------------------------------------------- pick_device
def test_pick_device_on_a_machine_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")
    for name in ("cuda", "cuda:1"):
        with pytest.raises(RuntimeError, match=rf"client.device='{name}' but CUDA is not avail"):
            pick_device(name)


def test_pick_device_auto_prefers_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto") == torch.device("cuda")
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert pick_device("cpu") == torch.device("cpu")


# ------------------------------------------------------------------------ batch_indices
def _sizes(n, batch_size, epochs=1, steps=None, seed=0, drop_last=False):
    g = torch.Generator().manual_seed(seed)
    return [len(i) for i in batch_indices(n, batch_size, g, epochs, steps, drop_last)]


def test_numerics_names_torch_and_the_cpu_kernels():
    capability = torch.backends.cpu.get_cpu_capability()
    assert numerics("cpu") == f"torch {torch.__version__}, cpu {capability}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_numerics_on_cuda_adds_the_device_name():
    assert numerics("cuda:0") == f"{numerics('cpu')}, {torch.cuda.get_device_name(0)}"


def test_batch_indices_drops_only_a_trailing_batch_of_one():
    assert _sizes(9, 4) == [4, 4]  # 4 + 4 + 1: the one is dropped
    assert _sizes(10, 4) == [4, 4, 2]  # a trailing two is kept
    assert _sizes(8, 4) == [4, 4]
    assert _sizes(3, 2) == [2]
    assert _sizes(9, 4, epochs=3) == [4, 4] * 3  # in every pass
    assert _sizes(1, 4) == [1] and _sizes(1, 4, epochs=2) == [1, 1]  # the whole split
    assert _sizes(5, 8) == [5]


def test_batch_indices_passes_are_permutations():
    g = torch.Generator().manual_seed(0)
    batches = batch_indices(10, 4, g, epochs=2)
    assert len(batches) == 6
    for p in range(2):
        idx = torch.cat(batches[3 * p : 3 * p + 3])
        assert sorted(idx.tolist()) == list(range(10))
    assert not torch.equal(torch.cat(batches[:3]), torch.cat(batches[3:]))  # re-shuffled
    g = torch.Generator().manual_seed(0)  # the same generator state: the same batches
    assert all(torch.equal(a, b) for a, b in zip(batches, batch_indices(10, 4, g, 2), strict=True))


def test_batch_indices_steps_counts_batches_across_passes():
    assert _sizes(9, 4, steps=5) == [4] * 5  # three passes, each without its batch of one
    assert _sizes(10, 4, steps=4) == [4, 4, 2, 4]
    assert _sizes(1, 4, steps=3) == [1, 1, 1]
    assert _sizes(9, 4, epochs=7, steps=1) == [4]  # steps overrides epochs


def test_batch_indices_with_batches_of_one():
    """``client.batch_size=1`` (the config allows it): every batch has one sample and none
    is a trailing remainder, so none is dropped; dropping them all trained nothing with
    ``epochs`` and never returned with ``steps``."""
    assert _sizes(5, 1) == [1] * 5
    assert _sizes(5, 1, epochs=2) == [1] * 10
    assert _sizes(5, 1, steps=7) == [1] * 7


def test_batch_indices_drop_last_keeps_only_full_batches():
    """``client.drop_last``: torch's ``DataLoader(drop_last=True)``, in every pass and in
    steps mode; a split smaller than one batch has no batches (not a hang with steps)."""
    assert _sizes(10, 4) == [4, 4, 2] and _sizes(10, 4, drop_last=True) == [4, 4]
    assert _sizes(10, 4, epochs=3, drop_last=True) == [4, 4] * 3
    assert _sizes(8, 4, drop_last=True) == [4, 4]
    assert _sizes(10, 4, steps=5, drop_last=True) == [4] * 5
    assert _sizes(3, 4, drop_last=True) == [] and _sizes(3, 4, steps=3, drop_last=True) == []
    assert _sizes(4, 4, drop_last=True) == [4] and _sizes(5, 1, drop_last=True) == [1] * 5


def test_batch_indices_of_an_empty_split():
    assert _sizes(0, 4) == [] and _sizes(0, 4, epochs=3) == []
    assert _sizes(0, 4, steps=3) == []  # nothing to draw from: no batch, not a hang
