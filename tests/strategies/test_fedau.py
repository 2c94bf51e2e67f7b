import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Error, Message

from strategies.fedau import (
    FedAUStrategy,
    ParticipationWeights,
    PMFLStrategy,
    pmfl_step,
    pmfl_update,
    psi_schedule,
)

from .helpers import TEMPLATE, FakeGrid, arrays_of, make_strategy, reply, train_messages


# ----------------------------------------------------------------- Algorithm 2, lines 2–14
def test_algorithm2_replayed_by_hand():
    """Nodes 0, 1, 2 with cutoff C = 3; Q, R, x written out after each round."""
    w = ParticipationWeights(cutoff=3)
    rounds = [{0}, {0, 1}, {0}, set(), {1}, {2}, {0, 2}]
    expected = [  # (Q, R, x) of nodes 0, 1, 2 after each round
        # r1: Q→[1,1,1]; node0 first interval: x0 = Q* = 1
        ([0, 1, 1], [1, 0, 0], [1.0, 1.0, 1.0]),
        # r2: Q→[1,2,2]; node0 (1·1+1)/2 = 1; node1 first: x1 = Q* = 2
        ([0, 0, 2], [2, 1, 0], [1.0, 2.0, 1.0]),
        # r3: Q→[1,1,3]; node0 (2·1+1)/3 = 1; node2 hits the cutoff Q = C = 3: x2 = 3
        ([0, 1, 0], [3, 1, 1], [1.0, 2.0, 3.0]),
        # r4: nobody: only Q grows
        ([1, 2, 1], [3, 1, 1], [1.0, 2.0, 3.0]),
        # r5: Q→[2,3,2]; node1 takes part (and Q = C): (1·2 + 3)/2 = 2.5
        ([2, 0, 2], [3, 2, 1], [1.0, 2.5, 3.0]),
        # r6: Q→[3,1,3]; node0 cutoff: (3·1 + 3)/4 = 1.5; node2 takes part: (1·3 + 3)/2 = 3
        ([0, 1, 0], [4, 2, 2], [1.5, 2.5, 3.0]),
        # r7: Q→[1,2,1]; node0 (4·1.5 + 1)/5 = 1.4; node2 (2·3 + 1)/3 = 7/3
        ([0, 2, 0], [5, 2, 3], [1.4, 2.5, 7 / 3]),
    ]
    for part, (q, r, x) in zip(rounds, expected, strict=True):
        w.update(part, [0, 1, 2])
        c = w.counters([0, 1, 2])
        assert c["Q"].tolist() == q and c["R"].tolist() == r
        np.testing.assert_allclose(c["x"], x, rtol=1e-15)
        np.testing.assert_allclose(w.weights([2, 0, 1]), [x[2], x[0], x[1]], rtol=1e-15)


def test_weight_used_in_a_round_includes_that_rounds_interval():
    """Paper order: x^t is updated (lines 2–14) before line 17 uses it, so a first
    participation after 4 rounds is weighted 4 — FedAU's code would use 1 (reference §5)."""
    w = ParticipationWeights(cutoff=50)
    for _ in range(3):
        assert w.step([], [0, 1]).tolist() == []
    assert w.weights([1]).tolist() == [1.0]  # no interval recorded yet: unscaled default
    assert w.step([1], [0, 1]).tolist() == [4.0]
    assert w.step([1, 0], [0, 1]).tolist() == [(4.0 + 1.0) / 2, 5.0]  # aligned with the ids


def test_cutoff_records_an_interval_without_participation():
    w = ParticipationWeights(cutoff=4)
    for t in range(1, 13):
        w.update(set(), [7])
        c = w.counters([7])
        assert c["Q"].tolist() == [t % 4] and c["R"].tolist() == [t // 4]
    assert w.weights([7]).tolist() == [4.0]  # a never-seen node is capped at C
    w.update({7}, [7])  # interval 1 after three cutoffs: (3·4 + 1)/4
    assert w.weights([7]).tolist() == [13 / 4]


def test_new_unknown_and_absent_nodes():
    w = ParticipationWeights(cutoff=50)
    w.update(set(), [0])
    w.update(set(), [0])
    w.update({5}, [0])  # a participant is always treated as known: Q 0 → 1, x = 1
    w.update({0, 9}, [0, 5, 9])  # node 9 joins now: its first interval is 1
    assert w.counters([0, 5, 9])["Q"].tolist() == [0, 1, 0]
    np.testing.assert_allclose(w.weights([0, 5, 9]), [4.0, 1.0, 1.0])
    w.update(set(), [0])  # nodes 5 and 9 absent from known: left untouched
    assert w.counters([0, 5, 9])["Q"].tolist() == [1, 1, 0]
    assert w.weights([42]).tolist() == [1.0]  # never seen
    assert w.counters([42])["R"].tolist() == [0]


def _reference_algorithm2(history, cutoff):
    """Algorithm 2 lines 2–14 one node at a time with plain dicts."""
    Q, R, x = {}, {}, {}
    for part, known in history:
        for k in sorted(set(known) | set(part)):
            Q.setdefault(k, 0)
            R.setdefault(k, 0)
            x.setdefault(k, 1.0)
            Q[k] += 1
            if k in part or Q[k] == cutoff:
                x[k] = Q[k] if R[k] == 0 else (R[k] * x[k] + Q[k]) / (R[k] + 1)
                R[k] += 1
                Q[k] = 0
    return Q, R, x


def test_vectorised_matches_a_loop_reference_with_joining_nodes():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.02, 0.6, size=40)
    history = []
    for t in range(300):
        known = list(range(10 + t // 10))  # nodes keep joining
        part = {k for k in known if rng.random() < p[k]}
        history.append((part, known))
    w = ParticipationWeights(cutoff=7)
    for part, known in history:
        w.update(part, known)
    Q, R, x = _reference_algorithm2(history, cutoff=7)
    ids = sorted(Q)
    c = w.counters(ids)
    assert c["Q"].tolist() == [Q[k] for k in ids] and c["R"].tolist() == [R[k] for k in ids]
    np.testing.assert_allclose(c["x"], [x[k] for k in ids], rtol=1e-12)


def test_weights_estimate_inverse_participation_rate():
    rng = np.random.default_rng(1)
    p = np.array([0.1, 0.25, 0.5, 1.0])
    w = ParticipationWeights(cutoff=50)
    for _ in range(4000):
        w.update(set(np.flatnonzero(rng.random(4) < p).tolist()), range(4))
    np.testing.assert_allclose(w.weights(range(4)), 1 / p, rtol=0.1)


def test_state_round_trip_is_json_and_continues_identically():
    rng = np.random.default_rng(2)
    w = ParticipationWeights(cutoff=5)
    for _ in range(30):
        w.update(set(rng.choice(8, 3, replace=False).tolist()), range(8))
    w2 = ParticipationWeights()
    w2.load_state_dict(json.loads(json.dumps(w.state_dict())))
    assert w2.cutoff == 5
    for _ in range(30):
        part = set(rng.choice(8, 3, replace=False).tolist())
        assert w.step(sorted(part), range(8)).tolist() == w2.step(sorted(part), range(8)).tolist()
    assert w.state_dict() == w2.state_dict()
    with pytest.raises(ValueError, match="sorted"):
        w2.load_state_dict({**w.state_dict(), "ids": [3, 1, 2, 4, 5, 6, 7, 0]})
    with pytest.raises(ValueError, match="cutoff"):
        ParticipationWeights(cutoff=0)


def test_10000_nodes_bookkeeping():
    """10,000 nodes, 1,000 participants a round, against Algorithm 2 replayed node by node
    (the cost of a round is measured by bench/s3_server_cost.py)."""
    cutoff, nodes = 4, 10_000
    w = ParticipationWeights(cutoff=cutoff)
    rng = np.random.default_rng(0)
    known = range(nodes)
    Q, R, x = [0] * nodes, [0] * nodes, [1.0] * nodes
    for rnd in range(11):
        part = set() if rnd == 0 else set(rng.choice(nodes, 1_000, replace=False).tolist())
        w.update(part, known)
        for k in range(nodes):
            Q[k] += 1
            if k in part or Q[k] == cutoff:
                x[k] = Q[k] if R[k] == 0 else (R[k] * x[k] + Q[k]) / (R[k] + 1)
                R[k] += 1
                Q[k] = 0
        ids = sorted(part)
        np.testing.assert_allclose(w.weights(ids), [x[k] for k in ids], rtol=1e-12)
    c = w.counters(known)
    assert c["Q"].tolist() == Q and c["R"].tolist() == R
    np.testing.assert_allclose(w.weights(known), x, rtol=1e-12)
    assert int(c["R"].sum()) > 10 * 1_000  # participations plus cutoffs


# ------------------------------------------------------------------------------------ ψ
def test_psi_schedule():
    assert psi_schedule(0, 100) == 0.5 and psi_schedule(99, 100) == 0.0
    assert psi_schedule(0, 1) == 0.0 and psi_schedule(49, 99) == pytest.approx(0.25)
    assert psi_schedule(1, 3) == pytest.approx(0.25)
    assert psi_schedule(150, 100) == 0.0 and psi_schedule(-3, 100) == 0.5  # clipped
    with pytest.raises(ValueError, match="T="):
        psi_schedule(0, 0)


def test_psi_schedule_start():
    """``start`` scales the paper's line: 0.5 is eq. 11, 0 switches the mix off."""
    for t in (0, 10, 49, 99):
        assert psi_schedule(t, 100, 0.5) == psi_schedule(t, 100) == pytest.approx(0.5 - t / 198)
    assert psi_schedule(0, 100, 0.2) == pytest.approx(0.2)
    assert psi_schedule(49, 99, 0.2) == pytest.approx(0.1)
    assert psi_schedule(-3, 100, 0.2) == pytest.approx(0.2)  # clipped to [0, start]
    assert psi_schedule(0, 100, 0.0) == 0.0
    with pytest.raises(ValueError, match="start="):
        psi_schedule(0, 100, 1.5)


# ------------------------------------------------------------------- Algorithm 2 line 17
def _model(rng, dtype=np.float64):
    return [rng.normal(size=(3, 2)).astype(dtype), rng.normal(size=4).astype(dtype)]


def test_pmfl_update_reproduces_fedavg_exactly():
    rng = np.random.default_rng(0)
    W = _model(rng)
    locals_ = [_model(rng) for _ in range(3)]
    n = np.array([10.0, 30.0, 60.0])
    K = 5
    deltas = [[a - g for a, g in zip(loc, W, strict=True)] for loc in locals_]
    new = pmfl_update(W, deltas, K * n / n.sum(), K, history=[], psi=0.4)  # ψ ignored
    for i in range(2):
        fedavg = sum(nk * loc[i] for nk, loc in zip(n, locals_, strict=True)) / n.sum()
        np.testing.assert_allclose(new[i], fedavg, rtol=1e-12)
        assert new[i].dtype == np.float64


def test_pmfl_update_float32_accumulates_in_float64():
    rng = np.random.default_rng(1)
    W = _model(rng, np.float32)
    deltas = [[1e-4 * d for d in _model(rng, np.float32)] for _ in range(50)]
    x = rng.uniform(0.5, 3.0, size=50)
    new = pmfl_update(W, deltas, x, 80, history=[], psi=0.0, eta=2.0)
    for i in range(2):
        exact = W[i].astype(np.float64) + 2.0 / 80 * sum(
            xk * d[i].astype(np.float64) for xk, d in zip(x, deltas, strict=True)
        )
        assert new[i].dtype == np.float32  # one rounding of the float64 result: <= 1 ulp
        assert (np.abs(new[i] - exact) <= np.spacing(np.abs(exact).astype(np.float32))).all()


def test_pmfl_update_with_history_hand_values():
    W = [np.array([1.0, -2.0]), np.array([[4.0]])]
    deltas = [
        [np.array([2.0, 0.0]), np.array([[-4.0]])],
        [np.array([4.0, 8.0]), np.array([[0.0]])],
    ]
    hist = [[np.array([0.0, 2.0]), np.array([[1.0]])], [np.array([10.0, 0.0]), np.array([[3.0]])]]
    x = np.array([1.0, 0.5])
    new = pmfl_update(W, deltas, x, num_known=4, history=hist, psi=0.2, eta=1.0)
    # array 0: inner = [1, −2] + ([2, 0] + 0.5·[4, 8])/4 = [2, −1]; history mean [5, 1]
    #          0.8·[2, −1] + 0.2·[5, 1] = [2.6, −0.6]
    np.testing.assert_allclose(new[0], [2.6, -0.6], rtol=1e-15)
    # array 1: inner = 4 + (−4 + 0)/4 = 3; history mean 2; 0.8·3 + 0.2·2 = 2.8
    np.testing.assert_allclose(new[1], [[2.8]], rtol=1e-15)
    # one historical model (H − 1 = 1 exists yet): divisor 1, η = 2
    one = pmfl_update(W, deltas, x, 4, history=hist[:1], psi=0.5, eta=2.0)
    np.testing.assert_allclose(one[0], 0.5 * np.array([3.0, 0.0]) + 0.5 * np.array([0.0, 2.0]))
    assert W[0].tolist() == [1.0, -2.0] and deltas[0][0].tolist() == [2.0, 0.0]  # unmodified


@pytest.mark.parametrize("psi", [0.5, 0.25, 0.0])
def test_history_mix_moves_the_global_by_the_documented_fraction_of_the_update(psi):
    """METHODS.md / README: with H = 3 and every client moving u from the global each round,
    eq. (10) moves the global by (1−ψ)/(1+1.5ψ)·u a round once the history has settled
    (0.29·u at ψ = ½); without the mix (ψ = 0) by u, FedAU's step. The rounds go through
    :func:`pmfl_step`, which keeps the history; T is so large that ψ stays at ``psi``."""
    u = np.array([1.0, -0.5])
    w, history = [np.zeros(2)], []
    for t in range(60):
        step = pmfl_step(
            w,
            [[w[0] + u]],
            np.ones(1),
            1,
            history,
            history_len=3,
            t=t,
            num_rounds=10**12,
            psi_start=psi,
        )
        move, w, history = step.arrays[0] - w[0], step.arrays, step.history
    np.testing.assert_allclose(move, (1 - psi) / (1 + 1.5 * psi) * u, rtol=1e-9)


def test_pmfl_update_without_participants_only_mixes_history():
    W = [np.array([2.0])]
    assert pmfl_update(W, [], np.array([]), 3, history=[], psi=0.5)[0].tolist() == [2.0]
    mixed = pmfl_update(W, [], np.array([]), 3, history=[[np.array([0.0])]], psi=0.25)
    assert mixed[0].tolist() == [1.5]


def test_pmfl_update_integer_arrays_are_rounded():
    W = [np.array([10], dtype=np.int64)]
    new = pmfl_update(W, [[np.array([3], dtype=np.int64)]], np.array([1.0]), 2, [], 0.0)
    assert new[0].dtype == np.int64 and new[0].tolist() == [12]  # 11.5 → 12 (rint), not 11


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"x": np.array([1.0, 2.0])}, "weights"),
        ({"num_known": 0}, "num_known"),
        ({"psi": 1.5}, "psi"),
        ({"deltas": [[np.zeros(3)]]}, "delta 0"),
        ({"history": [[np.zeros(3)]]}, "history model 0"),
    ],
)
def test_pmfl_update_bad_arguments(kw, msg):
    args = {
        "global_params": [np.zeros(2)],
        "deltas": [[np.ones(2)]],
        "x": np.array([1.0]),
        "num_known": 1,
        "history": [],
        "psi": 0.0,
        **kw,
    }
    with pytest.raises(ValueError, match=msg):
        pmfl_update(**args)


# ------------------------------------------------------------------------------ strategies
def test_fedau_strategy_scales_by_intervals():
    s = make_strategy(FedAUStrategy, method="fedau", num_clients=2)
    zero = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    one = {"w": np.ones((2, 2), np.float32), "b": np.ones(3, np.float32)}
    msgs = train_messages(s, 1, zero)
    new, _ = s.aggregate_train(1, [reply(msgs[0], 0, one)])
    # round 1: node 0 takes part, x_0 = Q* = 1; K = 2 known nodes: W + (1/2)·1·Δ
    np.testing.assert_allclose(arrays_of(new)["w"], 0.5)
    assert s.record["aggregation_weights"] == {"0": 1.0}


@pytest.mark.parametrize(
    "timing, weights",
    [
        # after (PMFL Algorithm 2): x^t includes the interval that ends this round
        ("after", [{"0": 1.0}, {"1": 2.0}, {"1": 1.5}, {"0": 2.0, "1": 4 / 3}]),
        # before (IBM/fedau main.py:156-171): the mean of the intervals recorded earlier,
        # 1 at a node's first participation
        ("before", [{"0": 1.0}, {"1": 1.0}, {"1": 2.0}, {"0": 1.0, "1": 1.5}]),
    ],
)
def test_interval_timing_by_hand(timing, weights):
    """Two nodes, C = 50, participants per round {0}, {1}, {1}, {0, 1}. Intervals recorded:
    node 0 at rounds 1 and 4 (1, 3), node 1 at rounds 2, 3 and 4 (2, 1, 1). ``after`` weighs
    round t's update by the mean including round t's interval, ``before`` by the mean of the
    earlier ones (1 when there are none)."""
    s = make_strategy(
        FedAUStrategy,
        method="fedau",
        num_clients=2,
        overrides=f"num_rounds=4 server.interval_timing={timing}",
    )
    assert s.hp.interval_timing == timing
    w = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    one = {k: np.ones_like(v) for k, v in w.items()}
    for rnd, (part, expected) in enumerate(zip([[0], [1], [1], [0, 1]], weights, strict=True), 1):
        msgs = train_messages(s, rnd, w)
        by_pid = dict(zip([0, 1], msgs, strict=True))
        new, _ = s.aggregate_train(rnd, [reply(by_pid[p], p, one) for p in part])
        assert s.record["aggregation_weights"] == pytest.approx(expected), (timing, rnd)
        # K = 2 known nodes: W + (1/2)·Σ x_k·(1 − W)
        x = sum(expected.values())
        np.testing.assert_allclose(arrays_of(new)["w"], w["w"] + 0.5 * x * (1 - w["w"]), rtol=1e-6)
        w = arrays_of(new)


def test_interval_timing_rejects_other_values():
    with pytest.raises(Exception, match="interval_timing"):
        make_strategy(
            FedAUStrategy, method="fedau", num_clients=2, overrides="server.interval_timing=never"
        )


def test_pmfl_strategy_mixes_history_and_uniform_ablation():
    s = make_strategy(PMFLStrategy, method="pmfl", num_clients=2, overrides="num_rounds=5")
    w0 = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    w1 = {"w": np.ones((2, 2), np.float32), "b": np.ones(3, np.float32)}
    msgs = train_messages(s, 1, w0)
    s.aggregate_train(1, [reply(msgs[0], 0, w1), reply(msgs[1], 1, w1)])
    assert s.record["psi"] == 0.0 and len(s.history) == 1  # no history before round 1
    msgs = train_messages(s, 2, w1)
    w2 = {"w": np.full((2, 2), 2.0, np.float32), "b": np.full(3, 2.0, np.float32)}
    new, _ = s.aggregate_train(2, [reply(msgs[0], 0, w2), reply(msgs[1], 1, w2)])
    psi = psi_schedule(1, s.cfg["num_rounds"])
    assert s.record["psi"] == pytest.approx(psi) == 0.375  # round 2 of 5: 1/2 − 1/8
    np.testing.assert_allclose(arrays_of(new)["w"], (1 - psi) * 2.0 + psi * 0.0, rtol=1e-6)
    low = make_strategy(
        PMFLStrategy, method="pmfl", num_clients=2, overrides="server.psi_start=0.1 num_rounds=5"
    )
    low.aggregate_train(1, [reply(m, i, w1) for i, m in enumerate(train_messages(low, 1, w0))])
    msgs = train_messages(low, 2, w1)
    new, _ = low.aggregate_train(2, [reply(msgs[0], 0, w2), reply(msgs[1], 1, w2)])
    psi = psi_schedule(1, low.cfg["num_rounds"], 0.1)
    assert low.record["psi"] == pytest.approx(psi) == pytest.approx(0.075)  # 0.1·(1 − 1/4)
    np.testing.assert_allclose(arrays_of(new)["w"], (1 - psi) * 2.0, rtol=1e-6)
    with pytest.raises(ValueError, match="psi_start"):
        make_strategy(PMFLStrategy, method="pmfl", overrides="server.psi_start=-0.5")
    u = make_strategy(PMFLStrategy, method="pmfl_wo_awc", num_clients=4)
    msgs = train_messages(u, 1, w0)
    new, _ = u.aggregate_train(1, [reply(msgs[0], 0, w1)])
    np.testing.assert_allclose(arrays_of(new)["w"], 1.0)  # plain mean of the participants


def test_a_round_without_results_still_counts_and_mixes_history():
    """Algorithm 2 counts every round for every known node (the cutoff fires without
    participation); eq. 10 without updates moves W towards the historical globals."""
    s = make_strategy(
        PMFLStrategy, method="pmfl", num_clients=2, overrides="num_rounds=5 server.cutoff=2"
    )
    w0 = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    w1 = {"w": np.ones((2, 2), np.float32), "b": np.ones(3, np.float32)}
    msgs = train_messages(s, 1, w0)
    new, _ = s.aggregate_train(1, [reply(msgs[0], 0, w1), reply(msgs[1], 1, w1)])
    np.testing.assert_allclose(arrays_of(new)["w"], 1.0)  # x = 1 each, K = 2
    train_messages(s, 2, arrays_of(new))
    new, _ = s.aggregate_train(2, [])  # every reply lost
    psi = psi_schedule(1, 5)
    np.testing.assert_allclose(arrays_of(new)["w"], (1 - psi) * 1.0, rtol=1e-6)  # history: W⁰ = 0
    assert s.weights.counters([0, 1])["Q"].tolist() == [1, 1]
    train_messages(s, 3, arrays_of(new))
    s.aggregate_train(3, [])
    c = s.weights.counters([0, 1])  # Q reached the cutoff: x = (1·1 + 2)/2
    assert c["Q"].tolist() == [0, 0] and c["R"].tolist() == [2, 2] and c["x"].tolist() == [1.5, 1.5]
    fedau = make_strategy(FedAUStrategy, method="fedau", num_clients=2)
    train_messages(fedau, 1, w1)
    new, _ = fedau.aggregate_train(1, [])  # no history: the model stays, the round counts
    np.testing.assert_array_equal(arrays_of(new)["w"], 1.0)
    assert fedau.weights.counters([0, 1])["Q"].tolist() == [1, 1]


def test_rounds_without_participants_count_in_the_run_loop():
    """StrategyBase.run sends an empty round through aggregate_train like any other: FedAU's
    counters advance for every known node and the model is kept (no history)."""

    class Nobody:
        def select(self, server_round, connected):
            return []

    s = make_strategy(FedAUStrategy, method="fedau", num_clients=2)
    s.participation = Nobody()
    start = ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()})
    out = s.run(FakeGrid([100, 101]), start, num_rounds=2)
    assert s.weights.counters([0, 1])["Q"].tolist() == [2, 2]
    np.testing.assert_array_equal(arrays_of(out)["w"], TEMPLATE["w"])


def test_server_lr_scales_the_weighted_step_before_the_history_mix():
    """η_g = 0.5, written out by hand from ``W ← (1−ψ)(W + η_g·(1/K)·Σ x_k Δ_k) +
    ψ/(H−1)·Σ W^{t−h}`` over two rounds (K = 2 known nodes, T = 5): round 1 only node 0
    (x_0 = 1, no history); round 2 both, node 1's first interval x_1 = 2, and for PMFL (H = 3)
    ψ = 0.375 with the one historical global W⁰ (FedAU, H = 1: ψ = 0)."""
    eta, K = 0.5, 2
    W0 = {
        "w": np.array([[1.0, -2.0], [0.5, 4.0]], np.float32),
        "b": np.array([0, 1, 2], np.float32),
    }
    a1 = {k: v + np.float32(2.0) for k, v in W0.items()}  # node 0, round 1
    a2 = {k: v * np.float32(-1.0) for k, v in W0.items()}  # node 0, round 2 (absolute models)
    b2 = {k: np.full_like(v, 3.0) for k, v in W0.items()}  # node 1, round 2
    w0, x_a1, x_a2, x_b2 = (
        {k: v.astype(np.float64) for k, v in d.items()} for d in (W0, a1, a2, b2)
    )
    W1 = {k: w0[k] + eta / K * 1.0 * (x_a1[k] - w0[k]) for k in w0}
    inner = {k: W1[k] + eta / K * (1.0 * (x_a2[k] - W1[k]) + 2.0 * (x_b2[k] - W1[k])) for k in w0}
    for cls, method, psi in ((FedAUStrategy, "fedau", 0.0), (PMFLStrategy, "pmfl", 0.375)):
        s = make_strategy(
            cls, method=method, num_clients=K, overrides=f"num_rounds=5 server.server_lr={eta}"
        )
        assert s.hp.server_lr == eta
        msgs = train_messages(s, 1, W0)
        new, _ = s.aggregate_train(1, [reply(msgs[0], 0, a1)])
        assert s.record["aggregation_weights"] == {"0": 1.0}
        for k in W0:
            np.testing.assert_allclose(arrays_of(new)[k], W1[k], rtol=1e-6)
        assert arrays_of(new)["w"][0, 0] == 1.5  # 1 + 0.5·(1/2)·1·2
        msgs = train_messages(s, 2, arrays_of(new))
        new, _ = s.aggregate_train(2, [reply(msgs[0], 0, a2), reply(msgs[1], 1, b2)])
        assert s.record["aggregation_weights"] == {"0": 1.0, "1": 2.0}
        assert s.record["psi"] == pytest.approx(psi)  # eq. 11: 1/2 − 1/(2·4) for t = 1 of 5
        for k in W0:
            expected = (1 - psi) * inner[k] + psi * w0[k]
            np.testing.assert_allclose(arrays_of(new)[k], expected, rtol=1e-6, atol=1e-7)
        # w₀₀: inner = 1.5 + 0.25·((−1 − 1.5) + 2·(3 − 1.5)) = 1.625, W⁰₀₀ = 1
        assert arrays_of(new)["w"][0, 0] == pytest.approx((1 - psi) * 1.625 + psi * 1.0)


def test_pmfl_fixes_num_rounds_on_resume_fedau_does_not():
    """ψ = psi_start·(1 − t/(T−1)) needs T = num_rounds; FedAU (history 1) has no ψ."""
    from fl_app.config import load_config

    assert PMFLStrategy.fixed_on_resume(load_config("tiny", "pmfl")) == {"num_rounds"}
    assert FedAUStrategy.fixed_on_resume(load_config("tiny", "fedau")) == frozenset()
    wo_hgm = load_config("tiny", "pmfl_wo_hgm")
    assert PMFLStrategy.fixed_on_resume(wo_hgm) == frozenset()


def test_pmfl_strategy_mixes_the_last_h_minus_1_globals_and_drops_older_ones():
    """Four rounds with H = 3: each update from the current global W mixes in the mean of
    the two globals before W (H − 1 = 2; never W itself), and older ones leave the history.
    Both clients step +1 from the global model each round, so the weighted step is +1
    (x = 1 each, K = 2) and eq. (10) is the only other term."""
    T = 6
    s = make_strategy(PMFLStrategy, method="pmfl", num_clients=2, overrides=f"num_rounds={T}")
    assert s.hp.history == 3
    globals_ = [np.zeros(3)]  # W⁰, W¹, ... as the strategy returns them ("b")
    w = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    for t in range(1, 5):
        msgs = train_messages(s, t, w)
        stepped = {k: v + 1 for k, v in w.items()}
        new, _ = s.aggregate_train(t, [reply(msgs[0], 0, stepped), reply(msgs[1], 1, stepped)])
        past = globals_[-3:-1] if t > 1 else []  # W^{t−2}, W^{t−1}: H − 1 = 2 of them
        psi = psi_schedule(t - 1, T) if past else 0.0
        expected = (1 - psi) * (globals_[-1] + 1) + psi * (np.mean(past, axis=0) if past else 0)
        w = arrays_of(new)
        np.testing.assert_allclose(w["b"], expected, rtol=1e-6)
        globals_.append(expected)
        assert len(s.history) == min(t, 2)
    np.testing.assert_allclose(s.history[0][1], globals_[2], rtol=1e-6)  # W⁰, W¹ dropped


def test_a_selected_node_that_fails_counts_as_absent_for_fedau():
    """Node 1 is asked to train and fails: its interval grows as for a node not selected,
    and the round's update is node 0's alone, weighted by its own interval."""
    s = make_strategy(FedAUStrategy, method="fedau", num_clients=2)
    w0 = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    one = {"w": np.ones((2, 2), np.float32), "b": np.ones(3, np.float32)}
    msgs = train_messages(s, 1, w0)
    failed = Message(Error(code=2, reason="ValueError: boom"), reply_to=msgs[1])
    new, _ = s.aggregate_train(1, [reply(msgs[0], 0, one), failed])
    assert s.record["aggregation_weights"] == {"0": 1.0}
    assert [f["pid"] for f in s.record["failures"]] == [1]
    np.testing.assert_allclose(arrays_of(new)["w"], 0.5)  # W + (1/K)·x₀·Δ₀, K = 2
    c = s.weights.counters([0, 1])
    assert c["Q"].tolist() == [0, 1]  # node 0 closed its interval; node 1's goes on


# ------------------------------------------- the history of globals: with or without W⁰
def _pmfl_rounds(s, w, rounds):
    """Run ``rounds`` (server rounds) on ``s`` from the global ``w``; both clients step +1
    from the global each round (x = 1 each, K = 2: the weighted step is +1). Returns the
    globals each round returned, the history after each round (as the W indices it holds,
    read off the constant "b" entries) and each round's ψ."""
    out, hist, psis = [], [], []
    for rnd in rounds:
        msgs = train_messages(s, rnd, w)
        stepped = {k: v + 1 for k, v in w.items()}
        new, _ = s.aggregate_train(rnd, [reply(msgs[0], 0, stepped), reply(msgs[1], 1, stepped)])
        w = arrays_of(new)
        out.append(w)
        hist.append([float(m[1][0]) for m in s.history])  # "b" is the second array
        psis.append(s.record["psi"])
    return out, hist, psis


@pytest.mark.parametrize("init", [True, False])
def test_pmfl_history_round_by_round_with_and_without_w0(init):
    """Round ``server_round`` = paper round t = server_round − 1 starts from W^t and mixes
    eq. (10)'s W^{t−h}, h = 1..H−1 (H = 3), that exist. ``history_init: true`` (eq. 10 as
    written): t = 0 nothing (ψ = 0), t = 1 W⁰, t = 2 W⁰ W¹, t = 3 W¹ W², t = 4 W² W³.
    ``false`` (aggregated globals only): t = 0 and t = 1 nothing (ψ = 0 until an aggregated
    global exists), t = 2 W¹ alone, then as with W⁰. The globals W^t are computed by hand
    (W⁰ = 0), so each round's mix is checked, not only the bookkeeping."""
    T = 6
    s = make_strategy(
        PMFLStrategy,
        method="pmfl" if init else "pmfl_hist",
        num_clients=2,
        overrides=f"num_rounds={T}",
    )
    assert s.hp.history == 3 and s.hp.history_init is init
    w0 = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    got, hist, psis = _pmfl_rounds(s, w0, range(1, 6))
    W = [0.0]  # W⁰, W¹, ... ("b" entries, all equal)
    mixed = []  # per round t: the indices of the globals mixed in
    for t in range(5):
        past = [j for j in (t - 2, t - 1) if j >= (0 if init else 1)]
        psi = psi_schedule(t, T) if past else 0.0
        assert psis[t] == pytest.approx(psi)
        W.append((1 - psi) * (W[t] + 1) + psi * (np.mean([W[j] for j in past]) if past else 0.0))
        np.testing.assert_allclose(got[t]["b"], W[t + 1], rtol=1e-6)
        mixed.append(past)
    if init:
        assert mixed == [[], [0], [0, 1], [1, 2], [2, 3]]
        assert psis[0] == 0.0 and psis[1] == pytest.approx(0.4)  # 1/2 − 1/(2·5)
    else:
        assert mixed == [[], [], [1], [1, 2], [2, 3]]
        assert psis[:2] == [0.0, 0.0] and psis[2] == pytest.approx(0.3)
    # the history after each round holds the globals the next round mixes, oldest first
    for t in range(5):
        want = [W[j] for j in range(max(0 if init else 1, t - 1), t + 1)]
        assert hist[t] == pytest.approx(want)
    # W¹ is the same; W² is mixed with W⁰ = 0 (ψ = 0.4) or not at all, and from t = 3 on
    # the two readings mix the same rounds (of different values)
    assert W[1] == 1.0 and W[2] == pytest.approx(1.2 if init else 2.0)


@pytest.mark.parametrize("method", ["pmfl", "pmfl_hist"])
@pytest.mark.parametrize("stop", [1, 2, 3])
def test_pmfl_history_survives_a_checkpoint(method, stop, tmp_path):
    """The strategy state written by the run's Checkpoint (npz + JSON) after round ``stop``
    and loaded into a fresh strategy continues exactly as the uninterrupted one: after round
    1 ``pmfl_hist`` has an empty history (W⁰ left out) that must stay empty in the state,
    after round 2 one aggregated global, after round 3 two."""
    from fl_app.server_app import Checkpoint

    T = 6
    ref = make_strategy(PMFLStrategy, method=method, num_clients=2, overrides=f"num_rounds={T}")
    w0 = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    want, want_hist, want_psi = _pmfl_rounds(ref, w0, range(1, 6))

    first = make_strategy(PMFLStrategy, method=method, num_clients=2, overrides=f"num_rounds={T}")
    got, _, _ = _pmfl_rounds(first, w0, range(1, stop + 1))
    assert len(first.history) == (min(stop, 2) if method == "pmfl" else min(stop - 1, 2))
    ckpt = Checkpoint(tmp_path)
    rec = ArrayRecord({k: Array(v) for k, v in got[-1].items()})
    ckpt.save(stop, rec, {"strategy": first.state_dict()})
    rnd, arrays, state = ckpt.load()
    assert rnd == stop
    second = make_strategy(PMFLStrategy, method=method, num_clients=2, overrides=f"num_rounds={T}")
    second.load_state_dict(state["strategy"])
    rest, rest_hist, rest_psi = _pmfl_rounds(second, arrays_of(arrays), range(stop + 1, 6))
    for a, b in zip(want[stop:], rest, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert rest_hist == want_hist[stop:] and rest_psi == want_psi[stop:]


def test_history_init_changes_nothing_without_history():
    """``history_init`` only decides whether W⁰ enters the history: with H = 1 (FedAU,
    ``pmfl_wo_hgm``) there is none, and both values give the same models."""
    w0 = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    runs = []
    for init in ("true", "false"):
        s = make_strategy(
            PMFLStrategy,
            method="pmfl_wo_hgm",
            num_clients=2,
            overrides=f"num_rounds=5 server.history_init={init}",
        )
        runs.append(_pmfl_rounds(s, w0, range(1, 4)))
        assert s.history == []
    assert runs[0][2] == runs[1][2] == [0.0, 0.0, 0.0]
    for a, b in zip(runs[0][0], runs[1][0], strict=True):
        np.testing.assert_array_equal(a["w"], b["w"])
