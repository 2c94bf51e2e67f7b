import numpy as np

from clients.pmfl import STATE_KEY


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
    from fl_app.state import StateStore

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
