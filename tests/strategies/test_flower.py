"""The drop-in Flower strategies (strategies/flower.py): hand values of each aggregation on
fake replies that carry only ``arrays`` and a ``num-examples`` metric, equality with the
project's own strategies on the same inputs, and a foreign Flower app
(tests/strategies/quickstart_app.py) run through Flower's simulation with each of them."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM

from strategies.fedau import FedAUStrategy, PMFLStrategy, psi_schedule
from strategies.flower import GNE, PMFL, FedAU, FedAvgM
from strategies.gne import GNEStrategy

from .helpers import FakeGrid, arrays_of, make_strategy, reply, train_messages

#: Flower node ids are unsigned 64-bit: half of them do not fit an int64
BIG = 2**63 + 5
NODES = [BIG + 1, BIG + 2, BIG + 3]


def zeros() -> dict[str, np.ndarray]:
    return {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}


def model(w: Any, b: Any) -> dict[str, np.ndarray]:
    return {"w": np.asarray(w, np.float32).reshape(2, 2), "b": np.asarray(b, np.float32)}


def record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


def send(strategy: Any, server_round: int, arrays: dict[str, np.ndarray], nodes=NODES) -> dict:
    """``configure_train`` over a grid of ``nodes``; the messages by destination node."""
    msgs = strategy.configure_train(server_round, record(arrays), ConfigRecord({}), FakeGrid(nodes))
    return {m.metadata.dst_node_id: m for m in msgs}


def answer(msg: Message, arrays: dict[str, np.ndarray], n: float = 10, **metrics: Any) -> Message:
    """A reply as any Flower ClientApp sends it: ``arrays`` and ``metrics`` (num-examples)."""
    content = RecordDict(
        {"arrays": record(arrays), "metrics": MetricRecord({"num-examples": n, **metrics})}
    )
    return Message(content, reply_to=msg)


# ------------------------------------------------------------------- construction
@pytest.mark.parametrize("cls", [GNE, FedAU, PMFL])
def test_flower_style_construction(cls):
    """Flower keywords only, no project config; FedAvg's keywords reach FedAvg."""
    s = cls(fraction_train=0.5, min_available_nodes=3, min_train_nodes=1)
    assert isinstance(s, FedAvg)
    assert (s.fraction_train, s.min_available_nodes, s.min_train_nodes) == (0.5, 3, 1)
    assert s.weighted_by_key == "num-examples"
    with pytest.raises(TypeError):
        cls(no_such_option=1)


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (GNE, {"server_lr": 0.0}, "server_lr"),
        (GNE, {"eps": -1.0}, "eps"),
        (FedAU, {"cutoff": 0}, "cutoff"),
        (FedAU, {"num_nodes": 0}, "num_nodes"),
        (FedAU, {"interval_timing": "during"}, "interval_timing"),
        (PMFL, {"history": 0}, "history"),
        (PMFL, {"psi_start": 1.5}, "psi_start"),
        (PMFL, {"num_rounds": 0}, "num_rounds"),
    ],
)
def test_bad_arguments_are_refused(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_fedavgm_is_flowers_own():
    """The project's FedAvgM strategy delegates its math to Flower's: nothing to add."""
    assert FedAvgM is FlowerFedAvgM


def test_aggregate_before_configure_is_an_error():
    with pytest.raises(Exception, match="configure_train must run"):
        GNE().aggregate_train(1, [])


# -------------------------------------------------------------------------- GNE
def test_gne_hand_values():
    """Orthogonal deltas of norms 1 and 2: Nash weights ∝ 1/‖Δ_k‖, i.e. [2/3, 1/3] (the
    sample weights are 0.1, 0.9); W ← W + η_g·Σ p_k Δ_k with η_g = 0.5."""
    s = GNE(server_lr=0.5, min_available_nodes=2, min_train_nodes=2)
    W = model([1, 2, 3, 4], [0.5, 0, -1])
    msgs = send(s, 1, W, NODES[:2])
    a = {"w": W["w"] + model([1, 0, 0, 0], [0, 0, 0])["w"], "b": W["b"]}
    b = {"w": W["w"] + model([0, 2, 0, 0], [0, 0, 0])["w"], "b": W["b"]}
    # replies in reverse order: the aggregation sorts them by node id
    new, metrics = s.aggregate_train(
        1,
        [answer(msgs[NODES[1]], b, n=90, loss=1.0), answer(msgs[NODES[0]], a, n=10, loss=3.0)],
    )
    assert s.last_status == "nash"
    assert list(s.last_weights) == NODES[:2]
    assert list(s.last_weights.values()) == pytest.approx([2 / 3, 1 / 3], rel=1e-5)
    got = arrays_of(new)
    np.testing.assert_allclose(got["w"], W["w"] + 0.5 * np.array([[2 / 3, 2 / 3], [0, 0]]), 1e-5)
    np.testing.assert_array_equal(got["b"], W["b"])
    assert got["w"].dtype == np.float32 and list(new.keys()) == ["w", "b"]
    assert metrics is not None and metrics["loss"] == pytest.approx(0.9 * 1.0 + 0.1 * 3.0)


def test_gne_equals_the_projects_gne_strategy():
    """Same inputs (global model, client models, sample counts) → same weights and model."""
    W = model([1, 2, 3, 4], [0.5, 0, -1])
    rng = np.random.default_rng(0)
    clients = [
        {k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in W.items()}
        for _ in range(3)
    ]
    ns = [10, 30, 60]
    ours = make_strategy(GNEStrategy, method="fedrane_wo_lra")
    msgs = train_messages(ours, 1, W)
    mine, _ = ours.aggregate_train(
        1,
        [
            reply(m, pid, c, n=n)
            for pid, (m, c, n) in enumerate(zip(msgs, clients, ns, strict=True))
        ],
    )
    s = GNE(min_available_nodes=3, min_train_nodes=3)
    sent = send(s, 1, W)
    theirs, _ = s.aggregate_train(
        1, [answer(sent[node], c, n=n) for node, c, n in zip(NODES, clients, ns, strict=True)]
    )
    assert s.last_status == ours.record["gne_status"] == "nash"
    assert list(s.last_weights.values()) == [
        ours.record["aggregation_weights"][str(p)] for p in range(3)
    ]
    for k in W:
        np.testing.assert_array_equal(arrays_of(theirs)[k], arrays_of(mine)[k])


def test_bad_replies_are_left_out_and_errors_skipped():
    """A reply with another shape, NaN or a non-finite weight is left out with a warning;
    a round without valid replies keeps the model (None)."""
    nodes = [*NODES, BIG + 4]
    s = GNE(min_available_nodes=4, min_train_nodes=4)
    W = zeros()
    msgs = send(s, 1, W, nodes)
    good = model([1, 0, 0, 0], [0, 0, 0])
    wrong_shape = {"w": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.float32)}
    nan = model([np.nan, 0, 0, 0], [0, 0, 0])
    new, _ = s.aggregate_train(
        1,
        [
            answer(msgs[nodes[0]], good),
            answer(msgs[nodes[1]], wrong_shape),
            answer(msgs[nodes[2]], nan),
            answer(msgs[nodes[3]], good, n=float("inf")),
        ],
    )
    assert list(s.last_weights) == [nodes[0]]
    np.testing.assert_allclose(arrays_of(new)["w"], good["w"])
    assert s.aggregate_train(2, []) == (None, None)


# ------------------------------------------------------------------------- FedAU
def test_fedau_hand_values_under_sampled_participation():
    """Three known nodes, one or two reply a round. "after" timing (PMFL Algorithm 2):
    round 1 node A (x = 1, its interval since it became known); round 2 node B (x = 2);
    round 3 A (intervals 1, 2: x = 1.5) and C (x = 3). W ← W + (1/K)·Σ x_k Δ_k, K = 3."""
    A, B, C = NODES
    s = FedAU(fraction_train=1.0, min_available_nodes=3, min_train_nodes=1)
    W = zeros()
    d = model([1, 0, 0, 0], [0, 0, 0])
    msgs = send(s, 1, W)
    new, _ = s.aggregate_train(1, [answer(msgs[A], d)])
    assert s.last_weights == {A: 1.0}
    W1 = arrays_of(new)
    np.testing.assert_allclose(W1["w"], d["w"] / 3, rtol=1e-6)

    msgs = send(s, 2, W1)
    new, _ = s.aggregate_train(2, [answer(msgs[B], {k: W1[k] + d[k] for k in d})])
    assert s.last_weights == {B: 2.0}
    W2 = arrays_of(new)
    np.testing.assert_allclose(W2["w"], W1["w"] + 2 * d["w"] / 3, rtol=1e-6)

    msgs = send(s, 3, W2)
    replies = [answer(msgs[C], {k: W2[k] + 2 * d[k] for k in d}), answer(msgs[A], W2)]
    new, _ = s.aggregate_train(3, replies)
    assert s.last_weights == {A: 1.5, C: 3.0}
    np.testing.assert_allclose(arrays_of(new)["w"], W2["w"] + 3.0 * 2 * d["w"] / 3, rtol=1e-6)
    assert sorted(s.node_index) == NODES and sorted(s.node_index.values()) == [0, 1, 2]


def test_fedau_before_timing_and_fixed_num_nodes():
    """``"before"`` (IBM/fedau's order): 1 at a first participation, then the mean of the
    earlier intervals; ``num_nodes`` fixes the divisor K."""
    A, B, _ = NODES
    s = FedAU(interval_timing="before", num_nodes=10, min_available_nodes=3, min_train_nodes=1)
    W = zeros()
    d = model([1, 0, 0, 0], [0, 0, 0])
    new, _ = s.aggregate_train(1, [answer(send(s, 1, W)[B], d)])
    np.testing.assert_allclose(arrays_of(new)["w"], d["w"] / 10, rtol=1e-6)
    s.aggregate_train(2, [])  # nobody: every known node's interval grows
    s.aggregate_train(3, [answer(send(s, 3, W)[B], d), answer(send(s, 3, W)[A], d)])
    assert s.last_weights == {A: 1.0, B: 1.0}  # B's earlier interval: 1 (round 1)
    s.aggregate_train(4, [answer(send(s, 4, W)[B], d)])
    assert s.last_weights == {B: 1.5}  # intervals 1 and 2


def test_fedau_weights_are_mean_participation_intervals():
    """Node A takes part every 2nd round, B every 4th, C never (cutoff 5): the weights
    converge to the intervals, x ≈ 1/p (FedAU's point), and C's cutoffs keep K = 3."""
    A, B, C = NODES
    s = FedAU(cutoff=5, min_available_nodes=3, min_train_nodes=1)
    W = zeros()
    for rnd in range(1, 41):
        msgs = send(s, rnd, W)
        part = [n for n, every in ((A, 2), (B, 4)) if rnd % every == 0]
        s.aggregate_train(rnd, [answer(msgs[n], W) for n in part])
        if part:
            weights = s.last_weights
    assert weights == {A: 2.0, B: 4.0}
    assert s.participation.counters([s.node_index[C]])["x"].tolist() == [5.0]
    assert s.num_known() == 3


def test_fedau_round_without_replies_keeps_the_model_and_counts():
    s = FedAU(cutoff=2, min_available_nodes=3, min_train_nodes=1)
    W = model([1, 2, 3, 4], [5, 6, 7])
    send(s, 1, W)
    new, metrics = s.aggregate_train(1, [])
    assert metrics is None
    np.testing.assert_array_equal(arrays_of(new)["w"], W["w"])
    s.aggregate_train(2, [])
    assert s.participation.counters(range(3))["R"].tolist() == [1, 1, 1]  # the cutoff fired


@pytest.mark.parametrize(
    "method, timing", [("fedau", "after"), ("fedau", "before"), ("pmfl", "after")]
)
def test_fedau_and_pmfl_equal_the_projects_strategies(method, timing):
    """The same rounds (known nodes, participants, client models) through the project's
    strategy (keyed by partition id) and the drop-in one (keyed by Flower node id, mapped in
    the same order): the same weights, ψ and models, bit for bit."""
    ours = make_strategy(
        PMFLStrategy if method == "pmfl" else FedAUStrategy,
        method=method,
        overrides=f"num_rounds=5 server.interval_timing={timing} server.cutoff=3",
    )
    kw: dict[str, Any] = {"cutoff": 3, "interval_timing": timing, "min_available_nodes": 3}
    mine: FedAU = (
        PMFL(history=ours.hp.history, num_rounds=5, **kw) if method == "pmfl" else FedAU(**kw)
    )
    rng = np.random.default_rng(1)
    W_ours = W_mine = zeros()
    for rnd, part in enumerate([[0], [1, 2], [], [0, 2], [1]], start=1):
        ours.record = {}
        msgs = train_messages(ours, rnd, W_ours)
        sent = send(mine, rnd, W_mine)
        models = {
            p: {k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in W_ours.items()}
            for p in part
        }
        new_ours, _ = ours.aggregate_train(rnd, [reply(msgs[p], p, models[p]) for p in part])
        new_mine, _ = mine.aggregate_train(rnd, [answer(sent[NODES[p]], models[p]) for p in part])
        assert {
            NODES[int(p)]: w for p, w in ours.record.get("aggregation_weights", {}).items()
        } == mine.last_weights
        assert ours.record.get("psi", 0.0) == mine.last_psi
        W_ours = arrays_of(new_ours) if new_ours is not None else W_ours
        W_mine = arrays_of(new_mine)
        for k in W_ours:
            np.testing.assert_array_equal(W_mine[k], W_ours[k])


# -------------------------------------------------------------------------- PMFL
def test_pmfl_hand_values():
    """H = 3, ψ from 1/2 over T = 3 rounds, two nodes always replying (x = 1, K = 2).
    t = 0: no history, W¹ = W⁰ + mean Δ; t = 1: ψ = 1/4, W² = ¾(W¹ + mean Δ) + ¼W⁰;
    t = 2: ψ = 0, W³ = W² + mean Δ."""
    A, B, _ = NODES
    s = PMFL(history=3, psi_start=0.5, num_rounds=3, min_available_nodes=2)
    W0 = model([4, 4, 4, 4], [0, 0, 0])
    W = W0
    expected = []
    for rnd in (1, 2, 3):
        msgs = send(s, rnd, W, [A, B])
        a = {k: W[k] + 1.0 for k in W}
        b = {k: W[k] + 3.0 for k in W}
        new, _ = s.aggregate_train(rnd, [answer(msgs[A], a), answer(msgs[B], b)])
        expected.append(s.last_psi)
        step = W["w"] + 2.0
        if rnd == 2:
            step = 0.75 * step + 0.25 * W0["w"]
        np.testing.assert_allclose(arrays_of(new)["w"], step, rtol=1e-6)
        assert s.last_weights == {A: 1.0, B: 1.0}
        W = arrays_of(new)
    assert expected == [0.0, psi_schedule(1, 3), 0.0] == [0.0, 0.25, 0.0]
    assert len(s.history) == 2


def test_pmfl_history_init_false_and_schedule_from_start():
    """``history_init=False``: W⁰ is never mixed in (ψ = 0 at t = 1). Without ``num_rounds``
    the schedule's T comes from ``start()``; mixing history without either is an error."""
    s = PMFL(history_init=False, num_rounds=5, min_available_nodes=1, min_train_nodes=1)
    W = zeros()
    for rnd in (1, 2):
        s.aggregate_train(rnd, [answer(send(s, rnd, W, NODES[:1])[NODES[0]], W)])
    assert s.last_psi == 0.0 and len(s.history) == 1
    s.aggregate_train(3, [answer(send(s, 3, W, NODES[:1])[NODES[0]], W)])
    assert s.last_psi == psi_schedule(2, 5)
    t = PMFL(min_available_nodes=1, min_train_nodes=1)
    t.aggregate_train(1, [answer(send(t, 1, W, NODES[:1])[NODES[0]], W)])
    with pytest.raises(ValueError, match="num_rounds"):
        t.aggregate_train(2, [answer(send(t, 2, W, NODES[:1])[NODES[0]], W)])


# ------------------------------------------------------------- a foreign Flower app
SIM_NODES, SIM_ROUNDS = 2, 3
STRATEGIES = {
    "gne": lambda: GNE(server_lr=1.0, min_available_nodes=SIM_NODES),
    "fedau": lambda: FedAU(fraction_train=0.5, min_train_nodes=1, min_available_nodes=SIM_NODES),
    "pmfl": lambda: PMFL(fraction_train=0.5, min_train_nodes=1, min_available_nodes=SIM_NODES),
    "fedavgm": lambda: FedAvgM(server_momentum=0.5, min_available_nodes=SIM_NODES),
}


@pytest.fixture(scope="module")
def simulated() -> dict[str, Any]:
    """One Flower simulation (``flwr.simulation.run_simulation``, Ray, 2 SuperNodes of one
    CPU each) of the quickstart app in which the ServerApp runs each strategy for 3 rounds
    (one Ray start for the four: ≈50 s on a busy 2-core machine)."""
    from flwr.simulation import run_simulation

    from . import quickstart_app

    results: dict[str, Any] = {}
    server = quickstart_app.server_app(STRATEGIES, results, SIM_NODES, SIM_ROUNDS)
    with pytest.MonkeyPatch.context() as mp:
        # Flower's Ray backend rewrites PYTHONPATH in this process: restore it afterwards
        mp.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        mp.setenv("FLWR_TELEMETRY_ENABLED", "0")
        mp.setenv("RAY_TMPDIR", f"/tmp/ray-flower-test-{os.getuid()}")
        backend = {
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": SIM_NODES},
        }
        run_simulation(server, quickstart_app.app, SIM_NODES, backend_config=backend)  # type: ignore[arg-type]
    return results


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_foreign_flower_app_runs_each_strategy(simulated, name):
    """Every round trained and was evaluated, the model moved towards the data's solution
    (the central loss fell), and FedAU/PMFL keyed their weights on the simulation's node ids."""
    strategy, result = simulated[name]
    assert sorted(result.train_metrics_clientapp) == list(range(1, SIM_ROUNDS + 1))
    assert sorted(result.evaluate_metrics_clientapp) == list(range(1, SIM_ROUNDS + 1))
    losses = [result.evaluate_metrics_serverapp[r]["loss"] for r in range(SIM_ROUNDS + 1)]
    assert losses[-1] < 0.7 * losses[0], losses
    w = result.arrays.to_numpy_ndarrays()[0]
    assert w.shape == (3,) and w.dtype == np.float32 and np.isfinite(w).all()
    if name in ("fedau", "pmfl"):
        assert len(strategy.node_index) == SIM_NODES
        assert set(strategy.last_weights) <= set(strategy.node_index)
        assert all(x >= 1.0 for x in strategy.last_weights.values())
    if name == "pmfl":
        assert strategy.num_rounds is None and len(strategy.history) == 2  # T from start()
    if name == "gne":
        assert strategy.last_status == "nash" and len(strategy.last_weights) == SIM_NODES
