import numpy as np
import pytest

from fl_app.participation import (
    BernoulliParticipation,
    CyclicParticipation,
    MarkovParticipation,
    UniformParticipation,
    build_participation,
    participation_probabilities,
)

P = np.array([0.05, 0.1, 0.3, 0.6, 0.9])


def _rates(model, rounds=6000, n=5):
    hits = np.zeros(n)
    for t in range(1, rounds + 1):
        for k in model.select(t, range(n)):
            hits[k] += 1
    return hits / rounds


def test_probabilities_have_requested_mean_and_floor():
    counts = np.random.default_rng(0).integers(0, 50, size=(250, 10)) + 1
    p = participation_probabilities(
        counts, beta=0.1, mean=0.1, floor=0.02, rng=np.random.default_rng(1)
    )
    assert p.mean() == pytest.approx(0.1, abs=1e-6) and p.min() >= 0.02 - 1e-12
    assert p.max() <= 1.0 and p.std() > 0.01


@pytest.mark.parametrize(
    ("kw", "msg"), [({"beta": 0}, "beta"), ({"mean": 1.5}, "mean"), ({"floor": 0.5}, "floor")]
)
def test_bad_probability_arguments(kw, msg):
    args = {"beta": 0.1, "mean": 0.1, "floor": 0.02, **kw}
    with pytest.raises(ValueError, match=msg):
        participation_probabilities(np.ones((3, 2)), rng=np.random.default_rng(0), **args)


def test_bernoulli_rates():
    np.testing.assert_allclose(_rates(BernoulliParticipation(P, seed=0)), P, atol=0.02)


def test_markov_keeps_rate_p_where_paper_formula_would_not():
    np.testing.assert_allclose(
        _rates(MarkovParticipation(P, p01=0.05, seed=0), 20000), P, atol=0.04
    )
    # the paper's p10 = (1-p)·p01 would give a stationary rate p01/(p01 + p10) ≠ p
    paper_rate = 0.05 / (0.05 + (1 - P) * 0.05)
    assert np.abs(paper_rate - P).max() > 0.3


def test_cyclic_rates_and_blocks():
    m = CyclicParticipation(P, period=100, seed=0)
    np.testing.assert_allclose(_rates(m, 1000), P, atol=0.011)


def test_uniform_fraction_and_minimum():
    m = UniformParticipation(fraction=0.1, min_clients=3, seed=0)
    assert len(m.select(1, range(100))) == 10
    assert len(m.select(2, range(10))) == 3
    assert len(m.select(3, range(2))) == 2


def test_reproducible_and_state_round_trip():
    counts = np.ones((20, 4))
    kw = dict(
        num_clients=20,
        label_counts=counts,
        seed=3,
        fraction=0.3,
        min_clients=1,
        beta=0.5,
        mean=0.3,
        floor=0.02,
        p01=0.05,
        period=10,
    )
    for name in ("uniform", "bernoulli", "markov", "cyclic"):
        a, b = build_participation(name, **kw), build_participation(name, **kw)
        seq_a = [a.select(t, range(20)) for t in range(1, 30)]
        assert seq_a == [b.select(t, range(20)) for t in range(1, 30)]
        c = build_participation(name, **kw)
        for t in range(1, 10):
            c.select(t, range(20))
        d = build_participation(name, **kw)
        d.load_state_dict(c.state_dict())
        assert [c.select(t, range(20)) for t in range(10, 20)] == [
            d.select(t, range(20)) for t in range(10, 20)
        ]


def test_only_available_nodes_and_unknown_name():
    m = BernoulliParticipation(np.ones(5), seed=0)
    assert m.select(1, [1, 3]) == [1, 3]
    with pytest.raises(ValueError, match="choose one of"):
        build_participation(
            "random",
            num_clients=2,
            label_counts=np.ones((2, 2)),
            seed=0,
            fraction=1,
            min_clients=1,
            beta=1,
            mean=0.5,
            floor=0,
            p01=0.1,
            period=10,
        )
