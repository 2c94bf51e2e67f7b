import os
import time

import pytest
import torch

from core.state import (
    STALE_TMP_S,
    Lineage,
    RoundState,
    StateStore,
    get_store,
    start_session,
)


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
    (tmp_path / "client_0" / "k" / "r0s0.pt").unlink()  # state removed: no stale copy either
    assert a.load(0, "k") is None and b.load(0, "k") is None


def test_unreadable_or_refused_versions_are_skipped_for_older_ones(tmp_path, caplog):
    s = StateStore(tmp_path)
    for rnd in (1, 2, 3):
        s.save(0, "k", _w(rnd), server_round=rnd, lineage=Lineage(checkpoint=rnd - 1))
    s.save(0, "k", _w(4), server_round=4, lineage=Lineage(checkpoint=2))
    assert [r for r, _, _ in s.versions(0, "k")] == [2, 4]
    newest = s.versions(0, "k")[-1][2]
    newest.write_bytes(b"")  # a crash before the data reached the disk
    fresh = StateStore(tmp_path)
    with caplog.at_level("WARNING", logger="core.state"):
        assert fresh.load(0, "k", server_round=5)["w"][0] == 2
        assert fresh.load(0, "k", server_round=5, check=lambda v: "too old") is None
    assert f"client 0: skipping saved state {newest}: unreadable (" in caplog.text
    assert "r2s0.pt: too old; using an older version, if any" in caplog.text


def test_a_save_keeps_for_a_resume_the_version_load_used_not_the_one_it_skipped(tmp_path):
    """Round 3's version is cut short; round 5 (checkpoint 4) trains from round 2's. Its
    save must keep round 2's for a resume from checkpoint 4, and drop round 3's."""
    s = StateStore(tmp_path)
    s.save(0, "k", _w(2), server_round=2, lineage=Lineage(checkpoint=1))
    s.save(0, "k", _w(3), server_round=3, lineage=Lineage(checkpoint=2))
    r3 = s.versions(0, "k")[-1][2]
    r3.write_bytes(b"")
    fresh = StateStore(tmp_path)
    assert fresh.load(0, "k", server_round=5, lineage=Lineage(checkpoint=4))["w"][0] == 2
    fresh.save(0, "k", _w(5), server_round=5, lineage=Lineage(checkpoint=4))
    assert [r for r, _, _ in fresh.versions(0, "k")] == [2, 5]
    assert StateStore(tmp_path).load(0, "k", server_round=5)["w"][0] == 2  # the resume's


def test_a_save_removes_temp_files_a_killed_save_left_but_not_fresh_ones(tmp_path):
    s = StateStore(tmp_path)
    s.save(0, "k", _w(1))
    folder = tmp_path / "client_0" / "k"
    stale, fresh = folder / "a.tmp", folder / "b.tmp"  # another save may be writing b
    stale.write_bytes(b"x"), fresh.write_bytes(b"y")
    old = time.time() - STALE_TMP_S - 5
    os.utime(stale, (old, old))
    s.save(0, "k", _w(2))
    assert not stale.exists() and fresh.exists()
    assert s.load(0, "k")["w"][0] == 2


def test_one_store_per_directory(tmp_path):
    assert get_store(tmp_path / "a") is get_store(tmp_path / "a")


def _w(x: float) -> dict:
    return {"w": torch.full((2,), float(x))}


def test_a_round_reads_the_newest_version_before_it_and_at_most_two_stay_on_disk(tmp_path):
    s = StateStore(tmp_path)
    s.save(0, "k", _w(1), server_round=1, lineage=Lineage(checkpoint=0))
    s.save(0, "k", _w(3), server_round=3, lineage=Lineage(checkpoint=2))
    assert s.load(0, "k", server_round=3)["w"][0] == 1  # not this round's own save
    assert s.load(0, "k", server_round=4)["w"][0] == 3
    assert s.load(0, "k", server_round=1) is None
    s.save(0, "k", _w(5), server_round=5, lineage=Lineage(checkpoint=4))
    # round 3's version is what a resume from checkpoint 4 needs; round 1's is gone
    assert [r for r, _, _ in s.versions(0, "k")] == [3, 5]
    s.save(0, "k", _w(6), server_round=6, lineage=Lineage(checkpoint=4))
    assert [r for r, _, _ in s.versions(0, "k")] == [3, 6]


def test_a_resumed_session_ignores_state_saved_after_its_checkpoint(tmp_path):
    """Session 0 ran rounds 1-4 with its last checkpoint at round 2 and stopped; session 1
    resumes from round 2 and must see round 2's state, not the discarded rounds 3-4."""
    s = StateStore(tmp_path)
    for rnd in (1, 2, 3, 4):
        s.save(0, "k", _w(rnd), server_round=rnd, lineage=Lineage(checkpoint=2 * (rnd > 2)))
    assert s.load(0, "k", server_round=5)["w"][0] == 4  # session 0 itself
    resumed = Lineage(resumed=(2,), checkpoint=2)
    view = RoundState(StateStore(tmp_path), 3, resumed)  # a fresh process, too
    assert view.load(0, "k")["w"][0] == 2
    assert s.load(0, "k", 3, resumed)["w"][0] == 2  # and not this process' cached round 4
    view.save(0, "k", _w(30))
    assert [(r, sess) for r, sess, _ in s.versions(0, "k")] == [(2, 0), (3, 1)]
    assert s.load(0, "k", 4, resumed)["w"][0] == 30
    # a second resume, from round 3 of session 1: session 0 counts up to 2, session 1 up to 3
    again = Lineage(resumed=(2, 3), checkpoint=3)
    assert s.load(0, "k", 4, again)["w"][0] == 30
    assert s.load(0, "k", 4, Lineage(resumed=(2, 2), checkpoint=2))["w"][0] == 2


def test_a_second_resume_from_the_same_checkpoint_is_a_new_session(tmp_path):
    """Session 1 resumed from round 2, saved round 3's state and stopped before another
    checkpoint; the next resume starts from round 2 again. It is session 2, for which
    session 1's round 3 is not history: a client that does not train in round 3 this time
    reads round 2's state at round 4, not the abandoned attempt's."""
    s, token_dir = StateStore(tmp_path / "store"), tmp_path / "token"
    assert start_session(token_dir, Lineage()) == Lineage()  # the first start: session 0
    s.save(0, "k", _w(2), server_round=2, lineage=Lineage(checkpoint=2))
    first = start_session(token_dir, Lineage(resumed=(2,), checkpoint=2))
    assert first.session == 1
    s.save(0, "k", _w(3), server_round=3, lineage=first)
    second = start_session(token_dir, Lineage(resumed=(2,), checkpoint=2))
    assert second == Lineage(resumed=(2, 2), checkpoint=2)
    assert s.load(0, "k", 4, second)["w"][0] == 2
    assert s.load(0, "k", 4, first)["w"][0] == 3  # what the reused session number read
    # a resume from a checkpoint session 2 wrote (round 5) continues its lineage
    assert start_session(token_dir, Lineage(resumed=(2, 2, 5), checkpoint=5)).session == 3


def test_lineage_travels_in_the_train_config():
    lin = Lineage(resumed=(10, 20), checkpoint=30)
    assert Lineage.from_config(lin.to_config()) == lin
    assert Lineage.from_config({}) == Lineage()
    assert lin.session == 2 and lin.valid(10, 0) and not lin.valid(11, 0)
    assert lin.valid(25, 2) and not lin.valid(1, 3)
    with pytest.raises(ValueError, match="state-resumed='1,x'"):
        Lineage.from_config({"state-resumed": "1,x"})
