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


def test_one_store_per_directory(tmp_path):
    assert get_store(tmp_path / "a") is get_store(tmp_path / "a")
