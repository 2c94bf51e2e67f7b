import numpy as np
import pytest

from strategies.fedccl import FedCCLAUStrategy, FedCCLGNEStrategy, FedCCLStrategy

from .helpers import arrays_of, make_strategy, reply, train_messages

TEMPLATE = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}


def _sig(rows, dim=32, label=0):
    s = np.zeros((rows, dim), np.float32)
    s[:, 0] = 1
    return {"signals": s, "signal_labels": np.full(rows, label, np.int64)}


def test_global_signals_and_payload_for_next_round():
    s = make_strategy(FedCCLStrategy, method="fedccl")
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
    s = make_strategy(FedCCLStrategy, method="fedccl", overrides="server.max_payload_rows=5")
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


def test_state_round_trip():
    s = make_strategy(FedCCLStrategy, method="fedccl")
    msgs = train_messages(s)
    s.aggregate_train(1, [reply(msgs[0], 0, TEMPLATE, payload=_sig(2))])
    t = make_strategy(FedCCLStrategy, method="fedccl")
    t.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(t.global_sig, s.global_sig)


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
    s = make_strategy(FedCCLGNEStrategy, method="fedccl_gne")
    w_new = _two_clients_round_one(s)
    # parallel deltas of norms 1 and 3: Nash weights ∝ 1/‖Δ‖ (3/4, 1/4, up to GNE's ridge
    # ε), not the sample weights (0.1, 0.9) FedAvg would use
    w = pytest.approx({"0": 0.75, "1": 0.25}, rel=1e-4)
    assert s.record["gne_status"] == "nash" and s.record["aggregation_weights"] == w
    np.testing.assert_allclose(w_new, 0.75 * 1.0 + 0.25 * 3.0, rtol=1e-4)


def test_fedau_combination_weights_by_participation_and_keeps_both_states():
    s = make_strategy(FedCCLAUStrategy, method="fedccl_au", num_clients=2)
    w_new = _two_clients_round_one(s)
    # both nodes took part in round 1: x = Q* = 1 each, K = 2, so W + (Δ_0 + Δ_1)/2 = 2.0,
    # not the sample-weighted 2.8 of FedCCL's own server
    assert s.record["aggregation_weights"] == {"0": 1.0, "1": 1.0}
    np.testing.assert_allclose(w_new, 2.0)
    t = make_strategy(FedCCLAUStrategy, method="fedccl_au", num_clients=2)
    t.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(t.global_sig, s.global_sig)
    assert t.weights.state_dict() == s.weights.state_dict()
