import numpy as np
import pytest
import torch

from clients.moon import STATE_KEY


def test_first_participation_is_ce_only_and_saves_previous_model(make_client, global_weights):
    c = make_client("moon")
    w0 = global_weights(c)
    _, _, m = c.fit(w0, {"server-round": 1})
    assert m["moon_negatives"] == 0
    saved = c.store.load(0, STATE_KEY)
    assert len(saved) == 1
    assert torch.equal(next(iter(saved[0].values())), next(iter(c.model.state_dict().values())))


def test_second_participation_depends_on_first(make_client, global_weights, tmp_path):
    """The state is used: the same second round gives different weights when the client's
    first round (its stored previous model) was different."""
    from core.state import StateStore

    w0 = global_weights(make_client("moon"))
    results = []
    for lr in (0.05, 0.2):
        store = StateStore(tmp_path / f"s{lr}")
        first = make_client("moon", overrides=f"client.lr={lr}", store=store)
        first.fit(w0, {"server-round": 1})
        second = make_client("moon", store=StateStore(tmp_path / f"s{lr}"))  # fresh cache
        new, _, m = second.fit(w0, {"server-round": 3})
        assert m["moon_negatives"] == 1
        results.append(new)
    assert not all(np.array_equal(a, b) for a, b in zip(*results, strict=True))


def test_buffer_is_fifo_of_size_m(make_client, global_weights):
    """With M = 2, after rounds 1, 2, 3 the stored buffer holds exactly the models trained in
    rounds 2 and 3 (the newest two, oldest first), not rounds 1 and 2 or another order."""
    c = make_client("moon", overrides="client.buffer_size=2")
    w0 = global_weights(c)
    trained = []
    for rnd in (1, 2, 3):
        new, _, _ = make_client("moon", overrides="client.buffer_size=2", store=c.store).fit(
            w0, {"server-round": rnd}
        )
        trained.append(new)
        saved = c.store.load(0, STATE_KEY)
        expected = trained[-2:]
        assert len(saved) == len(expected)
        for state, weights in zip(saved, expected, strict=True):
            for t, a in zip(state.values(), weights, strict=True):
                np.testing.assert_array_equal(t.numpy(), a)
    # the three rounds trained different models, so the comparison above tells them apart
    assert not all(np.array_equal(a, b) for a, b in zip(trained[0], trained[1], strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(trained[1], trained[2], strict=True))


def test_state_survives_skipped_rounds_on_disk(make_client, global_weights, tmp_path):
    from core.state import StateStore

    store = StateStore(tmp_path / "st", cache_items=1)
    w0 = global_weights(make_client("moon"))
    make_client("moon", pid=0, store=store).fit(w0, {"server-round": 1})
    make_client("moon", pid=1, store=store).fit(w0, {"server-round": 2})  # evicts pid 0
    assert store.versions(0, STATE_KEY)  # on disk, not only in the evicted cache
    _, _, m = make_client("moon", pid=0, store=store).fit(w0, {"server-round": 5})
    assert m["moon_negatives"] == 1


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_corrupt_or_foreign_saved_state_is_skipped_for_the_older_one(
    make_client, global_weights, caplog, damage
):
    """A newest version cut short (a crash while the OS still held it) or of another model
    is skipped with a warning naming it; the node trains with the version before, and its
    next save replaces the bad one, so the round after is whole again."""
    from core.state import Lineage, RoundState, StateStore

    store = make_client("moon").store
    w0 = global_weights(make_client("moon"))

    def fit(rnd: int) -> float:
        view = RoundState(StateStore(store.root), rnd, Lineage(checkpoint=1))  # nothing cached
        client = make_client("moon", overrides="client.buffer_size=2", store=view)
        return client.fit(w0, {"server-round": rnd})[2]["moon_negatives"]

    fit(1), fit(2)
    newest = store.versions(0, STATE_KEY)[-1][2]
    if damage == "truncated":
        newest.write_bytes(newest.read_bytes()[:100])
    else:
        torch.save([{"w": torch.ones(3)}], newest)
    with caplog.at_level("WARNING", logger="core.state"):
        assert fit(3) == 1  # round 1's buffer of one, not round 2's of two
    assert f"client 0: skipping saved state {newest}: " in caplog.text
    why = "unreadable (RuntimeError" if damage == "truncated" else "not a state dict of this"
    assert why in caplog.text
    caplog.clear()
    assert [r for r, _, _ in store.versions(0, STATE_KEY)] == [1, 3]  # round 2's is gone
    with caplog.at_level("WARNING", logger="core.state"):
        assert fit(4) == 2
    assert caplog.text == ""
