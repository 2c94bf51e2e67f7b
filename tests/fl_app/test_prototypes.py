import numpy as np
import pytest

from fl_app.prototypes import (
    PayloadError,
    cluster_means,
    finch_partition,
    global_signals,
    local_signals,
    validate_signals,
)


def _blobs(seed=0, per=20, d=16):
    rng = np.random.default_rng(seed)
    dirs = np.eye(d)[:3]
    x = np.concatenate([dirs[i] + 0.05 * rng.normal(size=(per, d)) for i in range(3)])
    return x, dirs


@pytest.mark.parametrize("n", [1, 2, 3])
def test_tiny_inputs_are_one_cluster_equal_to_the_mean(n):
    x = np.random.default_rng(n).normal(size=(n, 8))
    assert finch_partition(x).tolist() == [0] * n
    m = cluster_means(x)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    ref = xn.mean(0) / np.linalg.norm(xn.mean(0))
    np.testing.assert_allclose(m, ref[None], rtol=1e-6)


def test_separable_blobs_give_their_directions():
    x, dirs = _blobs()
    m = cluster_means(x)
    assert len(m) == 3
    cos = m @ dirs.T
    assert (cos.max(axis=1) > 0.99).all()
    np.testing.assert_array_equal(cluster_means(x), m)  # deterministic


def test_mean_method_is_one_signal():
    x, _ = _blobs()
    assert cluster_means(x, "mean").shape == (1, 16)
    with pytest.raises(ValueError, match="finch, mean"):
        cluster_means(x, "kmeans")


def test_local_and_global_signals():
    x, _ = _blobs()
    labels = np.repeat([0, 1, 3], 20)  # class 2 absent
    sig, lab = local_signals(x, labels, num_classes=4)
    assert sig.dtype == np.float32 and lab.dtype == np.int64 and set(lab) == {0, 1, 3}
    U, mask = global_signals(np.concatenate([sig, sig]), np.concatenate([lab, lab]), 4)
    assert mask.tolist() == [True, True, False, True]
    np.testing.assert_allclose(np.linalg.norm(U[mask], axis=1), 1.0, rtol=1e-5)
    assert np.all(U[2] == 0)


GOOD = (np.eye(4, 8, dtype=np.float32), np.array([0, 1, 2, 1]))


@pytest.mark.parametrize(
    ("sig", "lab", "msg"),
    [
        (np.zeros((3, 5), np.float32) + 1, np.zeros(3, int), r"expected \(M, 8\)"),
        (np.ones((3, 8), dtype=object), np.zeros(3, int), "float array"),
        (np.ones((3, 8), np.int64), np.zeros(3, int), "float array"),
        (np.full((2, 8), np.nan, np.float32), np.zeros(2, int), "NaN"),
        (np.ones((2, 8), np.float32), np.array([0, 10]), "outside 0..9"),
        (np.ones((2, 8), np.float32), np.array([0.5, 1.0]), "integers"),
        (np.ones((20, 8), np.float32), np.zeros(20, int), "exceed the limit"),
        (np.zeros((2, 8), np.float32), np.zeros(2, int), "zero row"),
        (np.ones((2, 8), np.float32), np.zeros(3, int), "signal_labels has shape"),
    ],
)
def test_validate_rejects_bad_payloads(sig, lab, msg):
    with pytest.raises(PayloadError, match=msg):
        validate_signals(sig, lab, dim=8, num_classes=10, max_rows=10)


def test_validate_accepts_and_normalises():
    s, lab = validate_signals(GOOD[0] * 3, GOOD[1], dim=8, num_classes=10, max_rows=10)
    np.testing.assert_allclose(np.linalg.norm(s, axis=1), 1.0)
    assert lab.dtype == np.int64
