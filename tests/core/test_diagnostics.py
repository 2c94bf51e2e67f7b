"""Diagnostics against values computed by hand."""

import math

import numpy as np
import pytest
import torch

from core.diagnostics import _delta_chunks, delta_gram, effective_rank, update_diagnostics
from tests.core.reference import cosine_to_global, update_deviation


def entropy_rank(*weights: float) -> float:
    total = sum(weights)
    return math.exp(-sum(w / total * math.log(w / total) for w in weights if w > 0))


# --------------------------------------------------------------------------- effective rank
def test_effective_rank_isotropic_features_give_d():
    d = 5
    feats = np.vstack([np.eye(d), -np.eye(d)])  # zero mean, covariance ∝ I
    assert effective_rank(feats) == pytest.approx(d)
    assert effective_rank(feats, covariance=False) == pytest.approx(d)


def test_effective_rank_identity_centred_and_raw():
    # eye(d) − mean has d − 1 equal singular values and one zero
    assert effective_rank(np.eye(7)) == pytest.approx(6.0)
    assert effective_rank(np.eye(7), covariance=False) == pytest.approx(7.0)


def test_effective_rank_rank_one():
    line = np.outer(np.arange(1.0, 6.0), [1.0, -2.0, 0.5, 3.0])
    assert effective_rank(line) == pytest.approx(1.0)
    assert effective_rank(line, covariance=False) == pytest.approx(1.0)
    # an affine line: covariance rank 1, the raw matrix has rank 2
    shifted = line + np.array([5.0, 0.0, 1.0, 0.0])
    assert effective_rank(shifted) == pytest.approx(1.0)
    assert effective_rank(shifted, covariance=False) > 1.1


def test_effective_rank_hand_value_unequal_spectrum():
    feats = np.array([[3.0, 0.0], [-3.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    # singular values √18, √2; covariance eigenvalues ∝ 18, 2 → p = (0.9, 0.1)
    assert effective_rank(feats) == pytest.approx(entropy_rank(0.9, 0.1))
    # raw matrix: p ∝ (3√2, √2) = (0.75, 0.25)
    assert effective_rank(feats, covariance=False) == pytest.approx(entropy_rank(0.75, 0.25))


def test_effective_rank_accepts_tensors_and_degenerate_inputs():
    feats = np.random.default_rng(0).normal(size=(20, 6))
    t = torch.tensor(feats, dtype=torch.float32, requires_grad=True)
    assert effective_rank(t) == pytest.approx(effective_rank(feats), rel=1e-5)
    assert 1.0 <= effective_rank(feats) <= 6.0
    assert effective_rank(np.ones((1, 4))) == 0.0  # one sample: zero covariance
    assert effective_rank(np.ones((1, 4)), covariance=False) == pytest.approx(1.0)
    assert effective_rank(np.zeros((3, 4))) == 0.0
    with pytest.raises(ValueError):
        effective_rank(np.zeros(4))


# --------------------------------------------------------------------------- deviation / cosines
def test_update_deviation_hand_values():
    assert update_deviation(np.tile([1.0, 2.0], (3, 1))) == pytest.approx(0.0)
    assert update_deviation(np.array([[1.0, 0.0], [3.0, 0.0]])) == pytest.approx(0.0)
    # opposite: the mean is zero, so each cosine is 0 by convention
    assert update_deviation(np.array([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(2.0)
    # orthogonal unit updates: mean (½, ½), each cosine 1/√2
    assert update_deviation(np.eye(2)) == pytest.approx(2 * (1 - 1 / math.sqrt(2)))
    # a zero update contributes 1; the other is parallel to the mean
    assert update_deviation(np.array([[1.0, 0.0], [0.0, 0.0]])) == pytest.approx(1.0)
    assert update_deviation(np.zeros((0, 3))) == 0.0


def test_update_deviation_three_clients_hand_value():
    deltas = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 2.0]])  # mean (4/3, 4/3) ∥ (1, 1)
    expect = 2 * (1 - 1 / math.sqrt(2)) + 0.0
    assert update_deviation(deltas) == pytest.approx(expect)


def test_cosine_to_global_hand_values():
    g = np.array([1.0, 0.0])
    deltas = np.array([[1.0, 1.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(cosine_to_global(g, deltas), [1 / math.sqrt(2), 0.0, -1.0, 0.0])
    np.testing.assert_array_equal(cosine_to_global(np.zeros(2), deltas), np.zeros(4))


def test_cosine_to_global_flattens_and_checks_sizes():
    g = np.ones((2, 2))
    deltas = np.stack([np.ones((2, 2)), -np.ones((2, 2))])  # (K, 2, 2)
    np.testing.assert_allclose(cosine_to_global(g, deltas), [1.0, -1.0])
    with pytest.raises(ValueError):
        cosine_to_global(np.ones(3), np.ones((2, 4)))


def test_round_diagnostics_of_two_opposite_deltas():
    """Edge case: two opposite deltas have a zero mean, so each has cosine 0 to it by
    convention (Dev = K); the global update is along the first."""
    g0 = [np.zeros((2, 2), np.float32), np.zeros(3, np.float32)]
    clients = [[np.full_like(g, v) for g in g0] for v in (1.0, -1.0)]
    gram = delta_gram(g0, clients)
    np.testing.assert_allclose(gram, [[7.0, -7.0], [-7.0, 7.0]])
    diag = update_diagnostics(g0, [np.full_like(g, 0.5) for g in g0], clients, gram)
    assert diag["update_deviation"] == pytest.approx(2.0)
    assert diag["cos_global_client"] == [pytest.approx(1.0), pytest.approx(-1.0)]
    assert diag["global_update_norm"] == pytest.approx(0.5 * math.sqrt(7))


def test_round_diagnostics_match_the_reference_functions_on_uneven_deltas():
    """delta_gram and update_diagnostics (blocked, from the Gram matrix) against
    update_deviation and cosine_to_global on the stacked deltas, with deltas of very
    different norms and directions (one opposite to the first), an integer array that is
    left out, and blocks smaller than an array (``chunk``)."""
    rng = np.random.default_rng(11)
    g0 = [rng.normal(size=(2, 2)).astype(np.float32), rng.normal(size=3).astype(np.float32)]
    base = rng.normal(size=7)
    flats = [base * 3 + rng.normal(size=7) * 0.5, base * 0.2 + rng.normal(size=7), -base]
    clients = [
        [(g0[0] + f[:4].reshape(2, 2)).astype(np.float32), (g0[1] + f[4:]).astype(np.float32)]
        for f in flats
    ]
    deltas = np.stack(
        [np.concatenate([(a - g).ravel() for a, g in zip(c, g0, strict=True)]) for c in clients]
    )
    counter = np.array([5], np.int64)  # e.g. a BatchNorm step counter: not a float array
    gram = delta_gram([*g0, counter], [[*c, counter + 1] for c in clients])
    np.testing.assert_allclose(gram, deltas.astype(np.float64) @ deltas.T, rtol=1e-5)
    new = [g0[0] + 0.1, g0[1] - 0.4]
    u = np.concatenate([(n - g).ravel() for n, g in zip(new, g0, strict=True)]).astype(np.float64)
    diag = update_diagnostics(g0, new, clients, gram)
    assert diag["update_deviation"] == pytest.approx(update_deviation(deltas), rel=1e-5)
    assert diag["global_update_norm"] == pytest.approx(np.linalg.norm(u), rel=1e-5)
    np.testing.assert_allclose(diag["cos_global_client"], cosine_to_global(u, deltas), rtol=1e-5)
    chunks = list(_delta_chunks(g0, clients, None, chunk=2))
    assert [d.shape for d, _ in chunks] == [(3, 2), (3, 2), (3, 2), (3, 1)]
