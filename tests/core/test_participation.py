import json

import numpy as np
import pytest

from core.participation import (
    PATTERNS,
    AllParticipation,
    BernoulliParticipation,
    CyclicParticipation,
    MarkovParticipation,
    UniformParticipation,
    _round_rng,
    build_participation,
    participation_probabilities,
)

# each probability repeated over many nodes: rates are averaged over nodes and rounds
LEVELS = np.array([0.0, 0.02, 0.05, 0.1, 0.3, 0.6, 0.9, 1.0])
NODES_PER_LEVEL = 150
P = np.repeat(LEVELS, NODES_PER_LEVEL)


def _rates_per_level(model, rounds):
    """Empirical on-rate of each probability level over rounds 1..rounds."""
    ids = range(len(P))
    hits = np.zeros(len(P))
    for t in range(1, rounds + 1):
        hits[model.select(t, ids)] += 1
    return (hits / rounds).reshape(len(LEVELS), NODES_PER_LEVEL).mean(axis=1)


def _factory_kwargs(**over):
    kw = dict(
        num_clients=20,
        label_counts=np.random.default_rng(5).integers(0, 30, size=(20, 4)) + 1,
        seed=3,
        fraction=0.3,
        min_clients=1,
        beta=0.5,
        mean=0.3,
        floor=0.02,
        p01=0.05,
        period=10,
    )
    return {**kw, **over}


class _FixedZ:
    """Stands in for a Generator whose Dirichlet draw is known."""

    def __init__(self, z):
        self.z = np.asarray(z, dtype=float)

    def dirichlet(self, alpha):
        assert len(alpha) == len(self.z)
        return self.z


# -------------------------------------------------------------------------- probabilities
def test_probabilities_have_requested_mean_and_floor():
    counts = np.random.default_rng(0).integers(0, 50, size=(250, 10)) + 1
    p = participation_probabilities(
        counts, beta=0.1, mean=0.1, floor=0.02, rng=np.random.default_rng(1)
    )
    assert p.shape == (250,)
    assert p.mean() == pytest.approx(0.1, abs=1e-9)
    assert p.min() >= 0.02 and p.max() <= 1.0 and p.std() > 0.01


def test_probabilities_follow_eq12_with_fixed_z():
    counts = np.array([[9, 1, 0], [1, 9, 0], [0, 0, 10], [5, 5, 0], [0, 1, 9]])
    z = np.array([0.7, 0.3, 0.0])
    p = participation_probabilities(counts, beta=1.0, mean=0.2, floor=0.05, rng=_FixedZ(z))
    score = (counts / counts.sum(axis=1, keepdims=True)) @ z  # 0.66, 0.34, 0, 0.5, 0.03
    r = 1.5 / (5 * 0.2 - 2 * 0.05)  # nodes 0, 1, 3 scaled, nodes 2 and 4 at the floor
    np.testing.assert_allclose(p, [0.66 / r, 0.34 / r, 0.05, 0.5 / r, 0.05], rtol=1e-9)
    assert score[4] / r < 0.05 and p.mean() == pytest.approx(0.2, abs=1e-9)


def test_probabilities_capped_at_one_keep_the_mean():
    counts = np.array([[10, 0], [0, 10], [5, 5], [1, 9]])
    p = participation_probabilities(counts, beta=1.0, mean=0.9, floor=0.1, rng=_FixedZ([0.8, 0.2]))
    # scores 0.8, 0.2, 0.5, 0.26: nodes 0 and 2 capped at 1, the others share 1.6
    np.testing.assert_allclose(p, [1.0, 0.2 / 0.2875, 1.0, 0.26 / 0.2875], rtol=1e-9)
    np.testing.assert_array_equal(
        participation_probabilities(counts, 1.0, 1.0, 0.1, np.random.default_rng(0)), 1.0
    )
    floor_only = participation_probabilities(counts, 1.0, 0.1, 0.1, np.random.default_rng(0))
    np.testing.assert_allclose(floor_only, 0.1)


def test_unattainable_mean_is_an_error():
    counts = np.array([[10, 0], [0, 10], [0, 10], [0, 10]])  # 3 of 4 nodes score 0
    with pytest.raises(ValueError, match="unattainable"):
        participation_probabilities(counts, 1.0, 0.5, 0.02, _FixedZ([1.0, 0.0]))


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"beta": 0}, "beta"),
        ({"beta": -1}, "beta"),
        ({"mean": 0}, "mean"),
        ({"mean": 1.5}, "mean"),
        ({"floor": -0.1}, "floor"),
        ({"floor": 0.5}, "floor"),
        ({"label_counts": np.array([[1, 2], [0, 0]])}, "label_counts"),
        ({"label_counts": np.array([[1, -2], [1, 1]])}, "label_counts"),
        ({"label_counts": np.ones(3)}, "label_counts"),
    ],
)
def test_bad_probability_arguments(kw, msg):
    args = {"label_counts": np.ones((3, 2)), "beta": 0.1, "mean": 0.1, "floor": 0.02, **kw}
    with pytest.raises(ValueError, match=msg):
        participation_probabilities(rng=np.random.default_rng(0), **args)


# ------------------------------------------------------------------------------- patterns
def test_bernoulli_rates():
    rates = _rates_per_level(BernoulliParticipation(P, seed=0), 1500)
    np.testing.assert_allclose(rates, LEVELS, atol=0.01)


def test_markov_keeps_rate_p_where_paper_formula_would_not():
    model = MarkovParticipation(P, p01=0.05, seed=0)
    rates = _rates_per_level(model, 3000)
    np.testing.assert_allclose(rates, LEVELS, atol=0.012)
    # the paper's p10 = (1 − p)·p01 would keep the rate p01/(p01 + p10) = 1/(2 − p) ≥ 1/2;
    # the chain's own transitions keep p (the simulated rates above agree with them)
    levels = LEVELS[1:-2]  # 0.02 .. 0.6
    p01_k, p10_k = MarkovParticipation.transition_probabilities(levels, 0.05)
    np.testing.assert_allclose(p01_k / (p01_k + p10_k), levels)
    assert not np.allclose(p10_k, (1 - levels) * 0.05)


def test_markov_transitions_and_clipping():
    p01_k, p10_k = MarkovParticipation.transition_probabilities(LEVELS, 0.05)
    valid = LEVELS >= 0.05 / 1.05
    np.testing.assert_allclose(p10_k[valid], 0.05 * (1 - LEVELS[valid]) / LEVELS[valid])
    np.testing.assert_allclose(p01_k[valid], 0.05)
    # below the validity bound p10 is clipped to 1 and p01 lowered so the rate stays p
    np.testing.assert_allclose(p10_k[~valid], 1.0)
    np.testing.assert_allclose(p01_k[~valid], LEVELS[~valid] / (1 - LEVELS[~valid]))
    np.testing.assert_allclose(p01_k / (p01_k + p10_k), LEVELS)
    assert p10_k[-1] == 0.0  # p = 1: never leaves the on state


def test_markov_spells_are_persistent():
    """A high-p node stays on for long spells (mean 1/p10), unlike Bernoulli."""
    model = MarkovParticipation(np.array([0.5]), p01=0.05, seed=2)
    states = np.array([bool(model.select(t, [0])) for t in range(1, 4001)])
    switches = np.count_nonzero(states[1:] != states[:-1])
    assert switches < 4000 * 0.1  # Bernoulli(0.5) would switch about 2000 times


def test_cyclic_rates_and_blocks():
    m = CyclicParticipation(P, period=100, seed=0)
    np.testing.assert_allclose(_rates_per_level(m, 1000), LEVELS, atol=1e-12)  # whole cycles
    on = np.zeros((100, len(P)), dtype=bool)
    for t in range(1, 101):
        on[t - 1, m.select(t, range(len(P)))] = True
    counts = on.sum(axis=0)
    np.testing.assert_array_equal(counts, np.round(P * 100))
    # one contiguous (circular) block per cycle: at most one off→on switch
    rises = np.count_nonzero(on & ~np.roll(on, 1, axis=0), axis=0)
    assert rises.max() <= 1


def test_cyclic_rounds_p_times_period_up_without_float_noise():
    m = CyclicParticipation(np.array([0.07, 0.0237, 0.5]), period=100, seed=1)
    assert m.on_rounds_per_cycle().tolist() == [7, 3, 50]
    m10 = CyclicParticipation(np.array([0.25]), period=10, seed=1)
    assert sum(bool(m10.select(t, [0])) for t in range(1, 101)) == 30  # ceil(2.5) per cycle


def test_nobody_selected_returns_empty_list():
    for model in (
        BernoulliParticipation(np.zeros(4), seed=0),
        MarkovParticipation(np.zeros(4), seed=0),
        CyclicParticipation(np.zeros(4), seed=0),
    ):
        assert all(model.select(t, range(4)) == [] for t in range(1, 50))
    assert UniformParticipation(4, 0.5, 0, seed=0).select(1, []) == []


def test_only_available_nodes_sorted_ints():
    m = BernoulliParticipation(np.ones(5), seed=0)
    assert m.select(1, [3, 1, 3]) == [1, 3]
    assert AllParticipation().select(1, (4, 0, 2)) == [0, 2, 4]
    for name in ("uniform", "bernoulli", "markov", "cyclic"):
        model = build_participation(name, **_factory_kwargs(mean=0.6))
        for t in range(1, 30):
            chosen = model.select(t, [1, 5, 7, 11, 19])
            assert chosen == sorted(chosen) and set(chosen) <= {1, 5, 7, 11, 19}
            assert all(type(k) is int for k in chosen)


def test_draws_of_a_node_do_not_depend_on_who_else_is_available():
    m = BernoulliParticipation(np.full(10, 0.5), seed=4)
    full = [m.select(t, range(10)) for t in range(1, 40)]
    part = [m.select(t, [2, 3]) for t in range(1, 40)]
    assert part == [[k for k in s if k in (2, 3)] for s in full]


def test_uniform_fraction_and_minimum():
    m = UniformParticipation(num_clients=100, fraction=0.1, min_clients=3, seed=0)
    assert len(m.select(1, range(100))) == 10
    assert len(m.select(2, range(10))) == 3  # round(1.0) = 1 < min_clients
    assert len(m.select(3, range(2))) == 2  # capped at the available ones
    assert len(m.select(4, range(25))) == 3  # max(3, round(2.5) = 2)
    assert len(set(m.select(5, range(100)))) == 10  # without replacement
    seen = np.zeros(100)
    for t in range(1, 2001):
        seen[m.select(t, range(100))] += 1
    np.testing.assert_allclose(seen / 2000, 0.1, atol=0.03)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"fraction": 0.0}, "fraction"),
        ({"fraction": 1.5}, "fraction"),
        ({"min_clients": -1}, "min_clients"),
        ({"num_clients": 0}, "num_clients"),
        ({"seed": -1}, "seed"),
    ],
)
def test_uniform_bad_arguments(kw, msg):
    args = {"num_clients": 10, "fraction": 0.5, "min_clients": 1, "seed": 0, **kw}
    with pytest.raises(ValueError, match=msg):
        UniformParticipation(**args)


def test_pattern_bad_arguments():
    with pytest.raises(ValueError, match="p"):
        BernoulliParticipation(np.array([0.5, 1.2]), seed=0)
    with pytest.raises(ValueError, match="p01"):
        MarkovParticipation(np.array([0.5]), p01=0.0, seed=0)
    with pytest.raises(ValueError, match="period"):
        CyclicParticipation(np.array([0.5]), period=0, seed=0)
    with pytest.raises(ValueError, match="available"):
        BernoulliParticipation(np.ones(3), seed=0).select(1, [0, 3])
    with pytest.raises(ValueError, match="1-based"):
        BernoulliParticipation(np.ones(3), seed=0).select(0, [0])


# ------------------------------------------------------------ reproducibility and resume
@pytest.mark.parametrize("name", ["uniform", "bernoulli", "markov", "cyclic"])
def test_same_seed_same_sequence_other_seed_differs(name):
    a, b = (
        build_participation(name, **_factory_kwargs()),
        build_participation(name, **_factory_kwargs()),
    )
    seq_a = [a.select(t, range(20)) for t in range(1, 200)]
    assert seq_a == [b.select(t, range(20)) for t in range(1, 200)]
    c = build_participation(name, **_factory_kwargs(seed=4))
    assert seq_a != [c.select(t, range(20)) for t in range(1, 200)]
    # a round asked again (or out of order) gives the same answer
    assert [a.select(t, range(20)) for t in (50, 7, 50, 199)] == [
        seq_a[49],
        seq_a[6],
        seq_a[49],
        seq_a[198],
    ]


@pytest.mark.parametrize("name", PATTERNS)
def test_state_round_trip_continues_identical_sequence(name):
    original = build_participation(name, **_factory_kwargs())
    for t in range(1, 40):
        original.select(t, range(20))
    state = json.loads(json.dumps(original.state_dict()))  # must be plain JSON
    assert state["kind"] == name
    # the resumed model is built with other label counts (other nodes connected at start)
    resumed = build_participation(name, **_factory_kwargs(label_counts=np.ones((20, 4)), seed=99))
    resumed.load_state_dict(state)
    assert [original.select(t, range(20)) for t in range(40, 120)] == [
        resumed.select(t, range(20)) for t in range(40, 120)
    ]


def test_state_of_another_model_is_rejected():
    state = build_participation("markov", **_factory_kwargs()).state_dict()
    with pytest.raises(ValueError, match="markov"):
        build_participation("cyclic", **_factory_kwargs()).load_state_dict(state)


# ------------------------------------------------------------------------------- factory
def test_factory_builds_each_pattern():
    classes = {
        "uniform": UniformParticipation,
        "all": AllParticipation,
        "bernoulli": BernoulliParticipation,
        "markov": MarkovParticipation,
        "cyclic": CyclicParticipation,
    }
    assert set(PATTERNS) == set(classes)
    for name, cls in classes.items():
        model = build_participation(name, **_factory_kwargs())
        assert type(model) is cls and model.kind == name
    markov = build_participation("markov", **_factory_kwargs(p01=0.2))
    assert markov.p01 == 0.2 and markov.p.mean() == pytest.approx(0.3, abs=1e-9)
    assert build_participation("cyclic", **_factory_kwargs()).period == 10


def test_description_names_the_pattern_and_each_nodes_probability():
    """What a run's participation.json holds: the truth that FedAU's and PMFL's estimates
    of each node's participation approach."""
    for name in ("bernoulli", "markov", "cyclic"):
        model = build_participation(name, **_factory_kwargs())
        assert model.description() == {"kind": name, "p": model.p.tolist()}
    for name in ("all", "uniform"):
        assert build_participation(name, **_factory_kwargs()).description() == {"kind": name}


def test_factory_errors():
    with pytest.raises(ValueError, match="uniform, all, bernoulli, markov, cyclic"):
        build_participation("random", **_factory_kwargs())
    with pytest.raises(ValueError, match="one row per client"):
        build_participation("bernoulli", **_factory_kwargs(num_clients=21))
    with pytest.raises(ValueError, match="beta"):
        build_participation("cyclic", **_factory_kwargs(beta=0))
    # uniform and all do not need label counts
    assert build_participation("all", **_factory_kwargs(label_counts=None)).select(1, [2]) == [2]


# --------------------------------------------------------------------------- RNG streams
def test_streams_are_independent_of_the_data_partitions_generator():
    """``default_rng([seed, 0, 0])`` is ``default_rng(seed)``, the data partition's generator
    (numpy pads entropy with zeros): PMFL's ``Z`` was once the first class's Dirichlet split.
    Every (stream, round) now draws other numbers than ``default_rng(seed)`` and than each
    other."""
    for seed in (0, 1, 7):
        data = np.random.default_rng(seed).random(4)
        draws = {
            (tag, t): _round_rng(seed, tag, t).random(4).tobytes()
            for tag in range(5)
            for t in (0, 1, 2)
        }
        assert data.tobytes() not in draws.values()
        assert len(set(draws.values())) == len(draws)
        assert _round_rng(seed, 2, 1).random(4).tobytes() == draws[(2, 1)]  # reproducible


def test_pmfl_vector_z_is_not_the_partitioners_first_dirichlet_draw():
    seed, counts = 1, np.random.default_rng(0).integers(0, 50, size=(250, 10)) + 1
    # the coupling fixed: a Dirichlet's leading gammas are the partitioner's (class 0, 250
    # nodes), so a Z drawn from default_rng(seed) is that split's first 10 shares, renormalised
    split = np.random.default_rng(seed).dirichlet(np.full(250, 0.1))[:10]
    coupled = np.random.default_rng(seed).dirichlet(np.full(10, 0.1))
    np.testing.assert_allclose(coupled, split / split.sum())
    p = build_participation(
        "bernoulli",
        **_factory_kwargs(num_clients=250, label_counts=counts, beta=0.1, mean=0.1, seed=seed),
    ).p
    with_coupled_z = participation_probabilities(
        counts, 0.1, 0.1, 0.02, np.random.default_rng(seed)
    )
    assert not np.allclose(p, with_coupled_z)
