import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.pmfl import STATE_KEY
from core.state import StateStore


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


def test_buffer_holds_the_n_iterates_before_the_current_one(make_client, global_weights):
    """PMFL §IV: at step e the buffer is {w^{e−N}, …, w^{e−1}}, never the current model;
    it is saved oldest first and the round's final iterate is not in it."""
    c = make_client("pmfl", overrides="client.buffer_size=3 client.steps=5")
    seen = []  # per step: (weights the loss is computed with, buffer oldest → newest)
    loss = c.loss

    def spy(x, y, out):
        seen.append((c.state_dict_cpu(), c.frozen.states(c.buffer_order())))
        return loss(x, y, out)

    c.loss = spy
    _, _, m = c.fit(global_weights(c), {"server-round": 1})
    starts = [w for w, _ in seen]
    assert len(starts) == 5 and not _same(starts[0], starts[1])
    for e, (current, buffer) in enumerate(seen):
        want = starts[max(0, e - 3) : e]
        assert len(buffer) == len(want)
        assert all(_same(b, w) for b, w in zip(buffer, want, strict=True))
        assert not any(_same(b, current) for b in buffer)
    saved = c.store.load(0, STATE_KEY)
    assert m["pmfl_buffer"] == 3 and all(
        _same(s, w) for s, w in zip(saved, starts[2:], strict=True)
    )
    assert not any(_same(s, c.model.state_dict()) for s in saved)


def test_history_changes_the_update(make_client, global_weights, tmp_path):
    from core.state import StateStore

    w0 = global_weights(make_client("pmfl"))
    with_hist = make_client("pmfl", overrides="client.steps=3", store=StateStore(tmp_path / "a"))
    with_hist.fit(w0, {"server-round": 1})
    a = make_client("pmfl", overrides="client.steps=3", store=StateStore(tmp_path / "a")).fit(
        w0, {"server-round": 2}
    )[0]
    b = make_client("pmfl", overrides="client.steps=3", store=StateStore(tmp_path / "b")).fit(
        w0, {"server-round": 2}
    )[0]
    assert not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_without_mct_no_buffer(make_client, global_weights):
    c = make_client("pmfl_wo_mct", overrides="client.steps=3")
    _, _, m = c.fit(global_weights(c), {"server-round": 1})
    assert m["pmfl_buffer"] == 0 and c.store.load(0, STATE_KEY) is None


def test_first_participation_contrast_is_inert(make_client, global_weights):
    """In a node's first round its buffer holds only this round's iterates, which start from
    the global model: with short local training (4 steps here) each stays at least as
    similar to the current representation as the global one (the first is the global model
    itself, a tie), so every buffered model is a positive, ``neg`` is empty and
    ``ℓ_con = 0`` with no gradient: the update equals PMFL without the contrast (README,
    "PMFL's buffer"). The term acts once older iterates are in the buffer
    (``test_history_changes_the_update``)."""
    w0 = global_weights(make_client("pmfl"))
    with_mct = make_client("pmfl", overrides="client.steps=4").fit(w0, {"server-round": 1})[0]
    without = make_client("pmfl_wo_mct", overrides="client.steps=4").fit(w0, {"server-round": 1})[0]
    assert all(np.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(with_mct, without, strict=True))


@pytest.mark.parametrize(("method", "mu"), [("pmfl", None), ("pmfl_literal", 1.0)])
def test_threshold_reading_reaches_the_loss(method, mu, make_client, global_weights, monkeypatch):
    """``client.threshold``: ``current`` passes no fixed μ (μ_i = sim(z_i, Z_g,i)),
    ``literal`` the paper's μ = Sim(z^{tE}, Z^t) = 1. In a second round (buffer from the
    first) with the literal threshold every buffered model is a negative at every step:
    ``ℓ_con = LSE(all) − sim(z, Z_g)/τ``, the global model the only positive."""
    import clients.pmfl as pmfl_module

    calls = []
    real = pmfl_module.pmfl_loss

    def spy(z, z_glob, z_hist, tau, present=None, mu_=None):
        out = real(z, z_glob, z_hist, tau, present, mu_)
        calls.append((z.detach(), z_glob.detach(), z_hist.detach(), tau, mu_, out.item()))
        return out

    monkeypatch.setattr(pmfl_module, "pmfl_loss", spy)
    w0 = global_weights(make_client(method))
    w1 = make_client(method, overrides="client.steps=3").fit(w0, {"server-round": 1})[0]
    store = make_client(method).store  # the same tmp_path store as the first round's
    assert store.load(0, STATE_KEY) is not None
    calls.clear()
    make_client(method, overrides="client.steps=3", store=store).fit(w1, {"server-round": 2})
    assert len(calls) == 3 and all(c[4] == mu for c in calls)
    if mu is None:
        return
    for z, z_glob, z_hist, tau, _, value in calls:
        s_g = F.cosine_similarity(z, z_glob, dim=1)
        s_h = F.cosine_similarity(z[None], z_hist, dim=2).T
        assert (s_h < 1).all()  # so none reaches μ = 1
        logits = torch.cat([s_g[:, None], s_h], dim=1) / tau
        expect = (torch.logsumexp(logits, dim=1) - logits[:, 0]).mean().item()
        assert value == pytest.approx(expect, rel=1e-5)


def test_literal_threshold_acts_from_the_first_participation(make_client, global_weights):
    """With μ = 1 this round's own iterates are negatives too, so unlike the current reading
    (``test_first_participation_contrast_is_inert``) the first round's update differs from
    PMFL without the contrast."""
    w0 = global_weights(make_client("pmfl"))
    lit = make_client("pmfl_literal", overrides="client.steps=4").fit(w0, {"server-round": 1})[0]
    without = make_client("pmfl_wo_mct", overrides="client.steps=4").fit(w0, {"server-round": 1})[0]
    assert not all(np.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(lit, without, strict=True))


class _Eager:
    """``StepGraph``'s stand-in: every step eagerly (the graph's own replays are checked on
    the CPU in test_step_graph.py and on a GPU in test_gpu.py)."""

    def __init__(self, step, size, device):
        self.step, self.size = step, size

    def __call__(self, idx):
        self.step(idx)

    def close(self):
        pass


@pytest.mark.parametrize(
    "overrides",
    [
        "client.steps=3",
        "client.steps=4 client.buffer_size=3",
        "client.steps=4 client.buffer_size=3 client.threshold=literal",
    ],
)
def test_fixed_buffer_of_a_graphed_round_trains_like_the_growing_one(
    overrides, make_client, global_weights, monkeypatch, tmp_path
):
    """With a CUDA graph the buffer has all N slots from the start (the empty ones masked) and
    its fill count and oldest slot live on the device: over three rounds, in which it fills
    and wraps, the weights, metrics and saved buffers are those of the growing buffer, bit
    for bit."""

    def three_rounds(graphed: bool) -> tuple[list, list, list]:
        monkeypatch.setattr("clients.base.graph_applies", lambda *args: graphed)
        monkeypatch.setattr("clients.base.StepGraph", _Eager)
        store = StateStore(tmp_path / str(graphed))
        weights, metrics, orders = global_weights(make_client("pmfl")), [], []
        for rnd in (1, 2, 3):
            client = make_client("pmfl", overrides=overrides, store=store)
            weights, _, m = client.fit(weights, {"server-round": rnd})
            assert (client.ring is not None) is graphed
            metrics.append((m["pmfl_buffer"], m["train_loss"]))
            orders.append(client.buffer_order())
        saved = store.load(0, STATE_KEY)
        assert saved is not None and len(saved) == int(metrics[-1][0])
        return weights, metrics + orders, [v.numpy() for s in saved for v in s.values()]

    growing, fixed = three_rounds(False), three_rounds(True)
    assert growing[1] == fixed[1]
    for a, b in zip(growing[0] + growing[2], fixed[0] + fixed[2], strict=True):
        assert np.array_equal(a, b)
