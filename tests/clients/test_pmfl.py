import numpy as np

from clients.pmfl import STATE_KEY


def test_buffer_holds_n_most_recent_iterates_across_rounds(make_client, global_weights):
    c = make_client("pmfl", overrides="client.buffer_size=3 client.steps=5")
    w0 = global_weights(c)
    _, _, m = c.fit(w0, {"server-round": 1})
    assert m["pmfl_buffer"] == 3 and len(c.store.load(0, STATE_KEY)) == 3
    last = c.store.load(0, STATE_KEY)[-1]
    final = c.model.state_dict()
    assert all(np.array_equal(last[k].numpy(), final[k].numpy()) for k in final)


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
