import torch

from fl_app.state import StateStore, get_store


def test_round_trip_lru_and_disk(tmp_path):
    s = StateStore(tmp_path, cache_items=1)
    s.save(0, "k", [{"w": torch.ones(2)}])
    s.save(1, "k", {"w": torch.zeros(3)})  # evicts client 0 from memory
    assert len(s._cache) == 1
    assert torch.equal(s.load(0, "k")[0]["w"], torch.ones(2))
    assert StateStore(tmp_path).load(1, "k")["w"].shape == (3,)  # a fresh process reads disk
    assert s.load(2, "k") is None
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_value_saved_by_another_process_is_read_again(tmp_path):
    """Two Ray actors share the directory: actor a must not serve its cached copy of a
    client that actor b trained since (MOON's previous model, PMFL's buffer)."""
    a, b = StateStore(tmp_path), StateStore(tmp_path)
    a.save(0, "k", {"w": torch.zeros(2)})
    assert torch.equal(b.load(0, "k")["w"], torch.zeros(2))
    b.save(0, "k", {"w": torch.ones(2)})
    assert torch.equal(a.load(0, "k")["w"], torch.ones(2))
    a.save(0, "k", {"w": torch.full((2,), 2.0)})
    assert torch.equal(b.load(0, "k")["w"], torch.full((2,), 2.0))
    (tmp_path / "client_0" / "k.pt").unlink()  # state removed: no stale copy either
    assert a.load(0, "k") is None and b.load(0, "k") is None


def test_one_store_per_directory(tmp_path):
    assert get_store(tmp_path / "a") is get_store(tmp_path / "a")
