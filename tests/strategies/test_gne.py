import logging

import numpy as np
import pytest

from strategies.gne import (
    GNEStrategy,
    NashSolveError,
    aggregation_weights,
    gram_weights,
    nash_utilities,
    nash_weights,
)

from .helpers import arrays_of, make_strategy, reply, train_messages


def _gram(d):
    return d @ d.T


def _residual(G, p, eps=1e-6):
    M = G / np.linalg.norm(G) + eps * np.eye(len(G))
    return np.linalg.norm(M @ p - 1 / p) / np.linalg.norm(1 / p)


# ------------------------------------------------------------------------ nash_weights
def test_orthogonal_deltas_give_weights_inverse_to_norms():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(30, 3)))
    norms = np.array([1.0, 2.0, 5.0])
    d = (q * norms).T  # three orthogonal deltas with norms 1, 2, 5
    p = nash_weights(_gram(d), eps=0.0)
    np.testing.assert_allclose(p[0] / p[1], 2.0, rtol=1e-6)
    np.testing.assert_allclose(p[0] / p[2], 5.0, rtol=1e-6)
    w, status = aggregation_weights(d, np.array([1, 1, 100]))
    assert status == "nash"
    np.testing.assert_allclose(w, (1 / norms) / (1 / norms).sum(), rtol=1e-4)


def test_returns_raw_solution_with_quadratic_form_equal_to_k():
    d = np.random.default_rng(1).normal(size=(5, 40))
    G = _gram(d)
    p = nash_weights(G, eps=0.0)
    M = G / np.linalg.norm(G)
    assert p @ M @ p == pytest.approx(5.0, rel=1e-8)  # raw p, not normalised
    assert p.sum() != pytest.approx(1.0)


def test_equal_deltas_give_uniform_weights():
    d = np.tile(np.array([[1.0, -2.0, 0.5]]), (4, 1))
    w, status = aggregation_weights(d, np.array([1, 2, 3, 4]))
    assert status == "nash"
    np.testing.assert_allclose(w, 0.25, rtol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_stationarity_and_positive_utilities_on_random_deltas(seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(8, 50)) * rng.uniform(0.1, 10, size=(8, 1))  # mixed scales
    G = _gram(d)
    p = nash_weights(G, init=rng.uniform(0.1, 1, size=8))
    assert (p > 0).all()
    assert _residual(G, p) < 1e-8
    assert (nash_utilities(d, p) > 0).all()
    # the normalised weights keep positive utilities too (a positive rescaling)
    w, status = aggregation_weights(d, np.ones(8))
    assert status == "nash" and (nash_utilities(d, w) > 0).all()
    np.testing.assert_allclose(w, p / p.sum(), rtol=1e-6)


def test_solution_does_not_depend_on_init_or_delta_scale():
    d = np.random.default_rng(3).normal(size=(6, 20)) + 0.3
    G = _gram(d)
    p1 = nash_weights(G)
    p2 = nash_weights(1e-8 * G, init=np.arange(1.0, 7.0) * 1e5)
    np.testing.assert_allclose(p1, p2, rtol=1e-6)


def test_single_client():
    assert nash_weights(np.array([[4.0]]), eps=0.0) == pytest.approx([1.0])
    w, status = aggregation_weights(np.array([[0.5, -1.0]]), np.array([7]))
    assert w.tolist() == [1.0] and status == "nash"


def test_k100_solves():
    """100 clients (the solver's speed is measured by bench/s3_server_cost.py)."""
    rng = np.random.default_rng(1)
    d = rng.normal(size=(100, 10_000)) + 0.1
    G = _gram(d)
    n = rng.integers(10, 1000, size=100)
    w, status = gram_weights(G, n)
    assert status == "nash" and w.sum() == pytest.approx(1.0) and (w > 0).all()
    p = nash_weights(G, init=n / n.sum())
    assert _residual(G, p) < 1e-8 and (nash_utilities(d, p) > 0).all()
    np.testing.assert_allclose(w, p / p.sum(), rtol=1e-12)  # the solution, normalised
    assert not np.allclose(w, n / n.sum(), rtol=1e-3)  # not the sample weights


def test_nearly_opposite_deltas_stay_finite():
    rng = np.random.default_rng(2)
    g = rng.normal(size=20)
    d = np.stack([g, -g + 1e-6 * rng.normal(size=20)])
    w, status = aggregation_weights(d, np.array([1, 3]))
    assert status == "nash"
    assert np.isfinite(w).all() and (w > 0).all() and w.sum() == pytest.approx(1.0)
    p = nash_weights(_gram(d))  # bounded by ε: p ~ 1/√ε
    assert np.isfinite(p).all() and p.max() < 1e4


def test_a_solution_that_works_against_a_client_falls_back(caplog):
    """Two nearly dependent deltas (Δ2 ≈ −0.3·Δ1): the ridge keeps the solve finite, but its
    raw p_2 > 1/√ε makes client 1's utility Δ_2ᵀ(Σ p_l Δ_l) negative, which METHODS.md's
    check forbids; the weights fall back to the sample fractions, with the reason."""
    d = np.array([[1.0, 0.0], [-0.3, 1e-4]])
    p = nash_weights(_gram(d))
    assert p.max() > 1e3 and (_gram(d) @ p).min() < 0  # what the solver alone returns
    with caplog.at_level(logging.WARNING, logger="fl_app"):
        w, status = aggregation_weights(d, np.array([1, 3]))
    assert w.tolist() == [0.25, 0.75]
    assert status.startswith("fallback: client 1's utility") and "not positive" in status
    assert "falling back to sample weights" in caplog.text
    named = gram_weights(_gram(d), np.array([1, 3]), ids=[7, 4])[1]  # e.g. partition ids
    assert named.startswith("fallback: client 4's utility")


def test_exactly_opposite_deltas_without_ridge_raise_and_fall_back(caplog):
    g = np.random.default_rng(4).normal(size=10)
    d = np.stack([g, -g])
    with pytest.raises(NashSolveError, match="unbounded"):
        nash_weights(_gram(d), eps=0.0)  # uniform start lies in the null space
    with pytest.raises(NashSolveError, match="p_max|no convergence"):
        nash_weights(_gram(d), init=np.array([1.0, 3.0]), eps=0.0)  # diverges
    with caplog.at_level(logging.WARNING, logger="fl_app"):
        w, status = aggregation_weights(d, np.array([1, 3]), eps=0.0)
    assert status.startswith("fallback: ") and w.tolist() == [0.25, 0.75]
    assert "falling back" in caplog.text


# --------------------------------------------------------------- degenerate / fallback
def test_degenerate_input_falls_back_to_sample_weights(caplog):
    with caplog.at_level(logging.WARNING, logger="fl_app"):
        w, status = aggregation_weights(np.zeros((3, 5)), np.array([1, 1, 2]))
    np.testing.assert_allclose(w, [0.25, 0.25, 0.5])
    assert status == "fallback: all deltas are zero" and "GNE" in caplog.text
    d = np.ones((2, 4))
    d[1, 2] = np.nan
    w, status = aggregation_weights(d, np.array([1, 3]))
    assert status.startswith("fallback: ") and "non-finite" in status
    assert w.tolist() == [0.25, 0.75]
    w, status = gram_weights(np.full((2, 2), np.inf), np.array([1, 1]))
    assert status.startswith("fallback") and w.tolist() == [0.5, 0.5]


@pytest.mark.parametrize(
    ("gram", "reason"),
    [
        (np.zeros((2, 2)), "all deltas are zero"),
        (np.full((2, 2), np.nan), "non-finite"),
        (np.ones((2, 3)), "must be square"),
        (np.array([[1.0, np.inf]] * 2), "non-finite"),
    ],
)
def test_nash_weights_raises_on_degenerate_gram(gram, reason):
    with pytest.raises(NashSolveError, match=reason):
        nash_weights(gram)


def test_bad_init_and_iteration_cap_raise():
    G = _gram(np.random.default_rng(5).normal(size=(3, 8)))
    with pytest.raises(NashSolveError, match="init"):
        nash_weights(G, init=np.array([1.0, 0.0, 1.0]))
    with pytest.raises(NashSolveError, match="no convergence"):
        nash_weights(G, init=np.array([1.0, 1e-6, 1e6]), max_iter=1)


def test_zero_delta_is_dropped():
    d = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    w, status = aggregation_weights(d, np.array([1, 1, 1]))
    assert status == "nash" and w[1] == 0.0 and w.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(w[0] / w[2], 2.0, rtol=1e-4)  # orthogonal: ∝ 1/‖Δ‖


def test_a_negligible_delta_cannot_take_the_weight():
    """Nash weights grow as 1/‖Δ_k‖: a client returning the global model plus 10⁻⁶ noise
    would take almost all the weight (0.96 for a 10⁻³-scaled delta) and stall training. A
    delta below NEGLIGIBLE_DELTA of the longest counts as zero; just above it, it stays in
    the bargaining as the method has it."""
    rng = np.random.default_rng(0)
    honest = rng.normal(size=(4, 1000)) * 0.1
    for scale in (1e-6, 0.9e-3):
        tiny = rng.normal(size=(1, 1000)) * 0.1 * scale
        w, status = aggregation_weights(np.vstack([honest, tiny]), np.full(5, 100.0))
        assert status == "nash" and w[4] == 0.0 and w[:4] == pytest.approx([0.25] * 4, rel=0.1)
    w, _ = aggregation_weights(np.vstack([honest, honest[:1] * 2e-3]), np.full(5, 100.0))
    assert w[4] > 0.5  # kept: Nash bargaining favours short deltas


def test_non_positive_sample_counts_use_uniform_fallback():
    w, status = aggregation_weights(np.zeros((2, 3)), np.array([0, 0]))
    assert status.startswith("fallback") and w.tolist() == [0.5, 0.5]
    w, status = aggregation_weights(np.eye(2), np.array([0, 5]))  # init still positive
    assert status == "nash" and w == pytest.approx([0.5, 0.5])


# ------------------------------------------------------------------------- strategy
def test_strategy_applies_convex_combination():
    s = make_strategy(GNEStrategy, method="fedrane_wo_lra")
    msgs = train_messages(s)
    a = {"w": np.full((2, 2), 1.0, np.float32), "b": np.zeros(3, np.float32)}
    b = {"w": np.full((2, 2), 1.0, np.float32), "b": np.zeros(3, np.float32)}
    new, _ = s.aggregate_train(1, [reply(msgs[0], 0, a), reply(msgs[1], 1, b, n=90)])
    np.testing.assert_allclose(arrays_of(new)["w"], 1.0, rtol=1e-6)  # equal deltas: same point
    assert s.record["gne_status"] == "nash"
    assert s.record["aggregation_weights"] == {"0": pytest.approx(0.5), "1": pytest.approx(0.5)}


def test_strategy_server_lr_scales_the_nash_step():
    """``W ← W + η_g·Σ p_k Δ_k``: orthogonal deltas of norms 2 and 1 have Nash weights
    ∝ 1/‖Δ_k‖, normalised [1/3, 2/3] (not the sample weights 0.1, 0.9); η_g = 0.5 halves the
    step, η_g = 1 takes it whole."""
    W = {
        "w": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32),
        "b": np.array([0.5, 0.0, -1.0], np.float32),
    }
    a = {"w": W["w"] + np.array([[2.0, 0.0], [0.0, 0.0]], np.float32), "b": W["b"]}  # ‖Δ‖ = 2
    b = {"w": W["w"], "b": W["b"] + np.array([0.0, 1.0, 0.0], np.float32)}  # ‖Δ‖ = 1
    p = np.array([1 / 2, 1.0]) / 1.5
    got = {}
    for eta in (0.5, 1.0):
        s = make_strategy(GNEStrategy, method="fedrane_wo_lra", overrides=f"server.server_lr={eta}")
        assert s.hp.server_lr == eta
        msgs = train_messages(s, 1, W)
        new, _ = s.aggregate_train(1, [reply(msgs[0], 0, a), reply(msgs[1], 1, b, n=90)])
        assert s.record["gne_status"] == "nash"
        weights = s.record["aggregation_weights"]
        assert [weights["0"], weights["1"]] == pytest.approx(p, rel=1e-5)
        got[eta] = arrays_of(new)
        expected = {  # W + η·(p₀Δ₀ + p₁Δ₁), per array, in float64
            k: W[k] + eta * (p[0] * (a[k] - W[k]) + p[1] * (b[k] - W[k])).astype(np.float64)
            for k in W
        }
        for k in W:
            np.testing.assert_allclose(got[eta][k], expected[k], rtol=1e-5, atol=1e-7)
    # by hand: w₀₀ = 1 + η·(1/3)·2, b₁ = 0 + η·(2/3)·1; every other entry stays
    assert got[0.5]["w"][0, 0] == pytest.approx(4 / 3, rel=1e-6)
    assert got[0.5]["b"][1] == pytest.approx(1 / 3, rel=1e-5)
    assert got[1.0]["w"][0, 0] == pytest.approx(5 / 3, rel=1e-6)
    assert got[1.0]["b"][1] == pytest.approx(2 / 3, rel=1e-5)
    np.testing.assert_array_equal(got[0.5]["w"].ravel()[1:], W["w"].ravel()[1:])
    np.testing.assert_array_equal(got[0.5]["b"][[0, 2]], W["b"][[0, 2]])


def test_uniform_weighting_is_gnes_start_and_fallback():
    """With ``server.weighting: uniform`` GNE starts from (and falls back to) equal weights,
    not the sample fractions: opposite deltas have no positive-utility Nash point, so the
    fallback weights decide the step."""
    a = {"w": np.full((2, 2), 1.0, np.float32), "b": np.zeros(3, np.float32)}
    b = {"w": np.full((2, 2), -2.0, np.float32), "b": np.zeros(3, np.float32)}
    got = {}
    for weighting in ("samples", "uniform"):
        s = make_strategy(
            GNEStrategy, method="fedrane_wo_lra", overrides=f"server.weighting={weighting}"
        )
        msgs = train_messages(s)
        new, _ = s.aggregate_train(1, [reply(msgs[0], 0, a, n=10), reply(msgs[1], 1, b, n=30)])
        assert s.record["gne_status"].startswith("fallback")
        got[weighting] = (s.record["aggregation_weights"], arrays_of(new)["w"][0, 0])
    assert got["samples"][0] == {"0": pytest.approx(0.25), "1": pytest.approx(0.75)}
    assert got["samples"][1] == pytest.approx(0.25 * 1.0 + 0.75 * -2.0)
    assert got["uniform"][0] == {"0": pytest.approx(0.5), "1": pytest.approx(0.5)}
    assert got["uniform"][1] == pytest.approx(-0.5)
