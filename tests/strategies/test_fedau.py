import time

import numpy as np
import pytest

from strategies.fedau import (
    FedAUStrategy,
    ParticipationWeights,
    PMFLStrategy,
    pmfl_update,
    psi_schedule,
)

from .helpers import arrays_of, make_strategy, reply, train_messages


def test_algorithm2_replayed_by_hand():
    """Nodes 0,1,2, cutoff C=3. Participation: r1 {0}, r2 {0,1}, r3 {0}, r4 {}, r5 {1}."""
    w = ParticipationWeights(cutoff=3)
    rounds = [{0}, {0, 1}, {0}, set(), {1}]
    expected = [  # (Q, R, x) per node after each round
        ([0, 1, 1], [1, 0, 0], [1.0, 1.0, 1.0]),  # node0 first: x = Q* = 1
        ([0, 0, 2], [2, 1, 0], [1.0, 2.0, 1.0]),  # node1 first: x = 2
        ([0, 1, 0], [3, 1, 1], [1.0, 2.0, 3.0]),  # node2 hits cutoff Q=3: x = 3
        ([1, 2, 1], [3, 1, 1], [1.0, 2.0, 3.0]),  # nobody: only Q grows
        ([2, 0, 2], [3, 2, 1], [1.0, 2.5, 3.0]),  # node1: (1·2 + 3)/2 = 2.5
    ]
    for part, (q, r, x) in zip(rounds, expected, strict=True):
        w.update(part, [0, 1, 2])
        assert w.Q.tolist() == q and w.R.tolist() == r
        np.testing.assert_allclose(w.weights([0, 1, 2]), x)


def test_unknown_node_weight_is_one_and_state_round_trip():
    w = ParticipationWeights(cutoff=50)
    w.update({3}, [1, 3, 7])
    assert w.weights([99]).tolist() == [1.0]
    w2 = ParticipationWeights()
    w2.load_state_dict(w.state_dict())
    w.update({1}, [1, 3, 7])
    w2.update({1}, [1, 3, 7])
    assert w.weights([1, 3, 7]).tolist() == w2.weights([1, 3, 7]).tolist()


def test_10000_nodes_fast():
    w = ParticipationWeights(cutoff=50)
    rng = np.random.default_rng(0)
    known = range(10_000)
    t0 = time.perf_counter()
    for _ in range(10):
        w.update(set(rng.choice(10_000, 1_000, replace=False).tolist()), known)
    assert (time.perf_counter() - t0) / 10 < 0.1


def test_psi_schedule():
    assert psi_schedule(0, 100) == 0.5 and psi_schedule(99, 100) == 0.0
    assert psi_schedule(0, 1) == 0.0 and psi_schedule(49, 99) == pytest.approx(0.25)


def test_pmfl_update_reproduces_fedavg_exactly():
    rng = np.random.default_rng(0)
    W = [rng.normal(size=(3, 2)), rng.normal(size=4)]
    locals_ = [[rng.normal(size=(3, 2)), rng.normal(size=4)] for _ in range(3)]
    n = np.array([10.0, 30.0, 60.0])
    K = 5
    deltas = [[a - g for a, g in zip(loc, W, strict=True)] for loc in locals_]
    x = K * n / n.sum()
    new = pmfl_update(W, deltas, x, K, history=[], psi=0.4)
    for i in range(2):
        fedavg = sum(nk * loc[i] for nk, loc in zip(n, locals_, strict=True)) / n.sum()
        np.testing.assert_allclose(new[i], fedavg, rtol=1e-12)


def test_pmfl_update_with_history_hand_values():
    W = [np.array([1.0])]
    deltas = [[np.array([2.0])], [np.array([4.0])]]
    hist = [[np.array([0.0])], [np.array([10.0])]]
    new = pmfl_update(W, deltas, np.array([1.0, 0.5]), num_known=4, history=hist, psi=0.2)
    inner = 1.0 + (1.0 * 2.0 + 0.5 * 4.0) / 4  # 2.0
    assert new[0][0] == pytest.approx(0.8 * inner + 0.2 * 5.0)


def test_fedau_strategy_scales_by_intervals():
    s = make_strategy(FedAUStrategy, method="fedau", num_clients=2)
    zero = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    one = {"w": np.ones((2, 2), np.float32), "b": np.ones(3, np.float32)}
    msgs = train_messages(s, 1, zero)
    new, _ = s.aggregate_train(1, [reply(msgs[0], 0, one)])
    # round 1: node 0 takes part, x_0 = Q* = 1; K = 2 known nodes: W + (1/2)·1·Δ
    np.testing.assert_allclose(arrays_of(new)["w"], 0.5)
    assert s.record["aggregation_weights"] == {"0": 1.0}


def test_pmfl_strategy_mixes_history_and_uniform_ablation():
    s = make_strategy(PMFLStrategy, method="pmfl", num_clients=2)
    w0 = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    w1 = {"w": np.ones((2, 2), np.float32), "b": np.ones(3, np.float32)}
    msgs = train_messages(s, 1, w0)
    s.aggregate_train(1, [reply(msgs[0], 0, w1), reply(msgs[1], 1, w1)])
    assert s.record["psi"] == 0.0 and len(s.history) == 1  # no history before round 1
    msgs = train_messages(s, 2, w1)
    w2 = {"w": np.full((2, 2), 2.0, np.float32), "b": np.full(3, 2.0, np.float32)}
    new, _ = s.aggregate_train(2, [reply(msgs[0], 0, w2), reply(msgs[1], 1, w2)])
    psi = psi_schedule(1, s.cfg["num_rounds"])
    np.testing.assert_allclose(arrays_of(new)["w"], (1 - psi) * 2.0 + psi * 0.0, rtol=1e-6)
    u = make_strategy(PMFLStrategy, method="pmfl_wo_awc", num_clients=4)
    msgs = train_messages(u, 1, w0)
    new, _ = u.aggregate_train(1, [reply(msgs[0], 0, w1)])
    np.testing.assert_allclose(arrays_of(new)["w"], 1.0)  # plain mean of the participants
