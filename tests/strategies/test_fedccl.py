import builtins
import io
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies.fedau import FedAUStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.gne import GNEStrategy

from .helpers import arrays_of, make_strategy, reply, train_messages

TEMPLATE = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}


def _sig(rows, dim=32, label=0):
    s = np.zeros((rows, dim), np.float32)
    s[:, 0] = 1
    return {"signals": s, "signal_labels": np.full(rows, label, np.int64)}


def test_global_signals_and_payload_for_next_round():
    s = make_strategy(FedAvgStrategy, method="fedccl")
    msgs = train_messages(s)
    assert all("payload" not in m.content.array_records for m in msgs)  # round 1: CE only
    s.aggregate_train(
        1,
        [
            reply(msgs[0], 0, TEMPLATE, payload=_sig(2)),
            reply(msgs[1], 1, TEMPLATE, payload=_sig(1, label=3)),
        ],
    )
    assert s.record["num_local_signals"] == 3 and s.record["classes_with_signal"] == 2
    nxt = train_messages(s, 2)
    pay = {k: v.numpy() for k, v in nxt[0].content["payload"].items()}
    assert pay["local_signals"].shape == (3, 32)
    assert pay["global_mask"].tolist() == [True, False, False, True] + [False] * 6


def test_malformed_or_oversized_payload_rejected():
    s = make_strategy(FedAvgStrategy, method="fedccl", overrides="server.max_payload_rows=5")
    msgs = train_messages(s)
    bad = {"signals": np.ones((2, 7), np.float32), "signal_labels": np.zeros(2, np.int64)}
    s.aggregate_train(
        1,
        [
            reply(msgs[0], 0, TEMPLATE, payload=bad),
            reply(msgs[1], 1, TEMPLATE, payload=_sig(6)),
            reply(msgs[2], 2, TEMPLATE),
        ],
    )
    reasons = [f["reason"] for f in s.record["failures"]]
    assert "expected (M, 32)" in reasons[0] and "exceed the limit" in reasons[1]
    assert "must hold exactly" in reasons[2] and s.record["num_results"] == 0


def test_more_signals_of_a_class_than_its_samples_allow_are_rejected():
    """Each node reported 10 training samples of every class: at most 5 signals a class."""
    s = make_strategy(FedAvgStrategy, method="fedccl")
    msgs = train_messages(s)
    s.aggregate_train(
        1,
        [
            reply(msgs[0], 0, TEMPLATE, payload=_sig(5)),
            reply(msgs[1], 1, TEMPLATE, payload=_sig(6)),
        ],
    )
    [failure] = s.record["failures"][:1]
    assert failure["pid"] == 1 and "6 signals of class 0 from a client with 10" in failure["reason"]
    assert s.record["num_results"] == 1 and s.record["num_local_signals"] == 5


def _npy(arr, **kw):
    buf = io.BytesIO()
    np.save(buf, arr, **kw)
    return buf.getvalue()


class _Evil:
    """Pickles to a call of ``exec`` that marks ``builtins``: unpickling it runs code."""

    def __reduce__(self):
        return (exec, ("import builtins; builtins.FEDCCL_UNPICKLED = True",))


def test_hostile_payloads_are_dropped_undecoded_or_unpickled_with_a_logged_reason(
    caplog, monkeypatch
):
    """Through the real reply path (Flower ``Array``s as they arrive): a pickled object
    array, an ``stype`` other than numpy's, truncated bytes and a payload larger than
    ``max_payload_rows`` signals can take are each dropped with a logged reason; nothing is
    unpickled, and the oversized one is not even decoded."""
    s = make_strategy(
        FedAvgStrategy, method="fedccl", num_clients=4, overrides="server.max_payload_rows=5"
    )
    msgs = train_messages(s)
    labels = Array(np.zeros(2, np.int64))
    evil = _npy(np.array([_Evil()], dtype=object), allow_pickle=True)
    big = np.zeros((5000, 32), np.float32)  # declared as 2 rows, 640 kB of bytes
    bad = {
        "pickled": Array(dtype="object", shape=(1,), stype="numpy.ndarray", data=evil),
        "stype": Array(dtype="float32", shape=(2, 32), stype="pickle", data=evil),
        "truncated": Array(
            dtype="float32", shape=(2, 32), stype="numpy.ndarray", data=_npy(big)[:200]
        ),
        "oversized": Array(dtype="float32", shape=(2, 32), stype="numpy.ndarray", data=_npy(big)),
    }
    replies = []
    for i, sig in enumerate(bad.values()):
        r = reply(msgs[i], i, TEMPLATE)
        r.content["payload"] = ArrayRecord({"signals": sig, "signal_labels": labels})
        replies.append(r)
    decoded = []
    numpy = Array.numpy
    monkeypatch.setattr(Array, "numpy", lambda a: decoded.append(len(a.data)) or numpy(a))
    with caplog.at_level(logging.WARNING, logger="fl_app"):
        s.aggregate_train(1, replies)
    assert not hasattr(builtins, "FEDCCL_UNPICKLED")
    reasons = [f["reason"] for f in s.record["failures"]]
    assert [f["pid"] for f in s.record["failures"]] == [0, 1, 2, 3]
    assert "'signals' cannot be decoded" in reasons[0] and "allow_pickle" in reasons[0]
    assert "'signals' cannot be decoded" in reasons[1] and "pickle" in reasons[1]
    assert "'signals' cannot be decoded" in reasons[2]
    assert "exceeds the" in reasons[3] and "(not decoded)" in reasons[3]
    assert len(_npy(big)) not in decoded  # the oversized payload never reached np.load
    assert s.record["num_results"] == 0
    for reason in reasons:
        assert reason[:40] in caplog.text


def _sig_at(rows, axis, label, dim=32):
    """``rows`` identical unit signals along feature ``axis``, all of class ``label``."""
    s = np.zeros((rows, dim), np.float32)
    s[:, axis] = 1
    return {"signals": s, "signal_labels": np.full(rows, label, np.int64)}


def _skip_scenario(strategy):
    """Round 1: clients 0 and 1 reply; round 2: only client 0 replies, with new signals.
    Returns the round-3 payload sent to client 0 (as numpy arrays)."""
    msgs = train_messages(strategy, 1)
    strategy.aggregate_train(
        1,
        [
            reply(msgs[0], 0, TEMPLATE, payload=_sig_at(2, axis=0, label=0)),
            reply(msgs[1], 1, TEMPLATE, payload=_sig_at(1, axis=1, label=3)),
        ],
    )
    msgs = train_messages(strategy, 2)
    strategy.aggregate_train(2, [reply(msgs[0], 0, TEMPLATE, payload=_sig_at(1, axis=2, label=5))])
    pay = train_messages(strategy, 3)[0].content["payload"]
    return {k: v.numpy() for k, v in pay.items()}


def test_local_signals_persist_through_skipped_rounds():
    """The server keeps each client's latest signals (module docstring; METHODS.md "the
    server sends all local signals"): after round 2, where client 1 did not reply, the
    round-3 payload still carries client 1's round-1 signal, client 0's round-2 signals
    replace its round-1 ones, and the global signals cover both clients' classes."""
    s = make_strategy(FedAvgStrategy, method="fedccl")
    pay = _skip_scenario(s)
    assert s.record["num_local_signals"] == 2
    assert pay["local_labels"].tolist() == [5, 3]  # sorted by pid: client 0, then client 1
    np.testing.assert_array_equal(pay["local_signals"][0], _sig_at(1, 2, 5)["signals"][0])
    np.testing.assert_array_equal(pay["local_signals"][1], _sig_at(1, 1, 3)["signals"][0])
    assert np.flatnonzero(pay["global_mask"]).tolist() == [3, 5]
    np.testing.assert_allclose(pay["global_signals"][3], _sig_at(1, 1, 3)["signals"][0])
    np.testing.assert_allclose(pay["global_signals"][5], _sig_at(1, 2, 5)["signals"][0])


def _assert_same_fedccl_state(t, s):
    assert sorted(t.local) == sorted(s.local) == [0, 1]
    for pid in s.local:
        for a, b in zip(t.local[pid], s.local[pid], strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(t.global_sig, s.global_sig)
    assert t.global_mask.dtype == bool
    np.testing.assert_array_equal(t.global_mask, s.global_mask)


def test_state_round_trip(tmp_path):
    """A restored server has the same local signals of every client (including one that
    skipped the last round), global signals and mask, both from the state dict directly and
    through the run's real checkpoint files; so it sends the same next-round payload."""
    from flwr.app import Array, ArrayRecord

    from fl_app.server_app import Checkpoint

    s = make_strategy(FedAvgStrategy, method="fedccl")
    pay = _skip_scenario(s)
    t = make_strategy(FedAvgStrategy, method="fedccl")
    t.load_state_dict(s.state_dict())
    _assert_same_fedccl_state(t.exchange, s.exchange)

    ckpt = Checkpoint(tmp_path)
    ckpt.save(
        2, ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()}), {"strategy": s.state_dict()}
    )
    _, _, state = ckpt.load()
    u = make_strategy(FedAvgStrategy, method="fedccl")
    u.load_state_dict(state["strategy"])
    _assert_same_fedccl_state(u.exchange, s.exchange)
    pay_u = {k: v.numpy() for k, v in train_messages(u, 3)[0].content["payload"].items()}
    assert sorted(pay_u) == sorted(pay)
    for k in pay:
        np.testing.assert_array_equal(pay_u[k], pay[k])


def _two_clients_round_one(strategy):
    """Round 1 with client 0 (w = 1, 10 samples, 2 signals of class 0) and client 1 (w = 3,
    90 samples, 1 signal of class 3); returns the new global ``w``."""
    msgs = train_messages(strategy)
    a = {"w": np.full((2, 2), 1.0, np.float32), "b": np.zeros(3, np.float32)}
    b = {"w": np.full((2, 2), 3.0, np.float32), "b": np.zeros(3, np.float32)}
    new, _ = strategy.aggregate_train(
        1,
        [
            reply(msgs[0], 0, a, n=10, payload=_sig(2)),
            reply(msgs[1], 1, b, n=90, payload=_sig(1, label=3)),
        ],
    )
    assert strategy.record["classes_with_signal"] == 2
    pay = train_messages(strategy, 2)[0].content["payload"]
    assert pay["local_signals"].numpy().shape == (3, 32)  # signals go out whatever the weights
    return arrays_of(new)["w"]


def test_gne_combination_weights_models_by_nash_and_still_publishes_signals():
    s = make_strategy(GNEStrategy, method="fedccl_gne")
    w_new = _two_clients_round_one(s)
    # parallel deltas of norms 1 and 3: Nash weights ∝ 1/‖Δ‖ (3/4, 1/4, up to GNE's ridge
    # ε), not the sample weights (0.1, 0.9) FedAvg would use
    w = pytest.approx({"0": 0.75, "1": 0.25}, rel=1e-4)
    assert s.record["gne_status"] == "nash" and s.record["aggregation_weights"] == w
    np.testing.assert_allclose(w_new, 0.75 * 1.0 + 0.25 * 3.0, rtol=1e-4)


def test_fedau_combination_weights_by_participation_and_keeps_both_states():
    s = make_strategy(FedAUStrategy, method="fedccl_au", num_clients=2)
    w_new = _two_clients_round_one(s)
    # both nodes took part in round 1: x = Q* = 1 each, K = 2, so W + (Δ_0 + Δ_1)/2 = 2.0,
    # not the sample-weighted 2.8 of FedCCL's own server
    assert s.record["aggregation_weights"] == {"0": 1.0, "1": 1.0}
    np.testing.assert_allclose(w_new, 2.0)
    t = make_strategy(FedAUStrategy, method="fedccl_au", num_clients=2)
    t.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(t.exchange.global_sig, s.exchange.global_sig)
    assert t.weights.state_dict() == s.weights.state_dict()


def test_a_checkpoint_of_the_former_combination_classes_still_loads(tmp_path):
    """Before the exchange was composed, ``FedCCLMStrategy.state_dict`` put the signal
    state (``local``, ``global_sig``, ``global_mask``) beside the aggregator's (FedAvgM's
    ``momentum_vector``) at the top level; a resume of such a checkpoint restores both, and
    the next round's payload is the one the checkpointed server would have sent."""
    from fl_app.server_app import Checkpoint
    from strategies.fedavg import FedAvgMStrategy

    s = make_strategy(FedAvgMStrategy, method="fedccl_m")
    pay = _skip_scenario(s)
    state = s.state_dict()
    old = {**{k: v for k, v in state.items() if k != "exchange"}, **state["exchange"]}
    assert sorted(old) == ["global_mask", "global_sig", "local", "momentum_vector"]
    ckpt = Checkpoint(tmp_path)
    ckpt.save(2, ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()}), {"strategy": old})
    _, _, loaded = ckpt.load()
    u = make_strategy(FedAvgMStrategy, method="fedccl_m")
    u.load_state_dict(loaded["strategy"])
    _assert_same_fedccl_state(u.exchange, s.exchange)
    for a, b in zip(u.momentum, s.momentum, strict=True):
        np.testing.assert_array_equal(a, b)
    pay_u = {k: v.numpy() for k, v in train_messages(u, 3)[0].content["payload"].items()}
    assert sorted(pay_u) == sorted(pay)
    for k in pay:
        np.testing.assert_array_equal(pay_u[k], pay[k])
