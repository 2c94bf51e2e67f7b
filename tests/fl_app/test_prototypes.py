import warnings

import numpy as np
import pytest

from fl_app.prototypes import (
    PayloadError,
    cluster_means,
    finch_partition,
    global_signals,
    local_signals,
    max_signals,
    validate_signals,
)

D = 16
DIRS = np.eye(D)[:3]


def _blobs(seed=0, sizes=(20, 20, 20), noise=0.05):
    """Points around three orthogonal unit directions in 16-d (seeded)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([DIRS[i] + noise * rng.normal(size=(k, D)) for i, k in enumerate(sizes)])


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


# ---- FINCH partitions and cluster means -------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("method", ["finch", "mean"])
def test_one_to_three_points_are_one_cluster_equal_to_the_normalised_mean(n, method):
    x = np.random.default_rng(n).normal(size=(n, 8)) * 3
    assert finch_partition(x).tolist() == [0] * n
    m = cluster_means(x, method)
    np.testing.assert_allclose(m, _unit(_unit(x).mean(0))[None], rtol=1e-12)


@pytest.mark.parametrize(("n", "counts"), [(4, {1, 2}), (5, {1, 2})])
def test_four_and_five_points_give_one_or_two_clusters(n, counts):
    seen = {
        len(set(finch_partition(np.random.default_rng(s).normal(size=(n, 8))).tolist()))
        for s in range(50)
    }
    assert seen == counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_separable_blobs_give_one_mean_per_direction(seed):
    x = _blobs(seed)
    labels = finch_partition(x)
    assert sorted(set(labels.tolist())) == [0, 1, 2]
    assert all(len(set(labels[i * 20 : (i + 1) * 20].tolist())) == 1 for i in range(3))
    m = cluster_means(x)
    assert m.shape == (3, D)
    np.testing.assert_allclose(np.linalg.norm(m, axis=1), 1.0)
    cos = m @ DIRS.T
    assert (cos.max(axis=1) > 0.99).all()
    assert sorted(cos.argmax(axis=1).tolist()) == [0, 1, 2]  # one mean per blob


def test_early_exit_flag_does_not_change_finch_partitions():
    """Documents a finch-clust 0.2.3 quirk the module docstring relies on."""
    from finch import FINCH

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in (0, 21, 28):
            x = _unit(_blobs(seed)).astype(np.float32)
            runs = [
                FINCH(data=x, distance="cosine", ensure_early_exit=e, ann_threshold=len(x))[0]
                for e in (True, False)
            ]
            np.testing.assert_array_equal(*runs)


def test_mean_method_is_one_plain_normalised_mean():
    x = _blobs(0)
    m = cluster_means(x, "mean")
    assert m.shape == (1, D)
    np.testing.assert_allclose(m[0], _unit(_unit(x).mean(0)), rtol=1e-12)


def test_unknown_method_and_bad_shapes_rejected():
    x = _blobs(0)
    with pytest.raises(ValueError, match="finch, mean"):
        cluster_means(x, "kmeans")
    with pytest.raises(ValueError, match="finch, mean"):
        local_signals(x, np.zeros(len(x), int), 2, method="kmeans")
    with pytest.raises(ValueError, match=r"expected \(n, d\)"):
        cluster_means(np.zeros((0, D)))
    with pytest.raises(ValueError, match=r"expected \(n, d\)"):
        finch_partition(np.zeros(5))


# ---- local signals (client) -------------------------------------------------------------


def test_local_signals_per_class_with_one_class_absent():
    x = _blobs(0)
    labels = np.repeat([0, 1, 3], 20)  # class 2 absent
    sig, lab = local_signals(x, labels, num_classes=4)
    assert sig.dtype == np.float32 and lab.dtype == np.int64
    assert sig.shape == (len(lab), D) and set(lab.tolist()) == {0, 1, 3}
    assert lab.tolist() == sorted(lab.tolist())  # classes in ascending order
    for c, direction in zip([0, 1, 3], DIRS, strict=True):
        # FINCH splits each single-blob class into its sub-clusters
        assert 1 <= (lab == c).sum() < 20
        np.testing.assert_array_equal(sig[lab == c], cluster_means(x[labels == c]).astype("f4"))
        assert (sig[lab == c] @ direction > 0.95).all()
    np.testing.assert_allclose(np.linalg.norm(sig, axis=1), 1.0, rtol=1e-6)


def test_local_signals_several_clusters_per_class_and_mean_ablation():
    x = np.r_[_blobs(0), -DIRS[:2]]
    labels = np.r_[np.zeros(60, int), 1, 1]  # class 0 = three blobs, class 1 = two points
    sig, lab = local_signals(x, labels, num_classes=3)
    assert lab.tolist() == [0, 0, 0, 1]
    np.testing.assert_allclose(sig[3], _unit(-DIRS[0] - DIRS[1]), rtol=1e-6)
    sig_m, lab_m = local_signals(x, labels, num_classes=3, method="mean")
    assert lab_m.tolist() == [0, 1]
    np.testing.assert_allclose(sig_m[0], _unit(_unit(x[:60]).mean(0)), rtol=1e-6)


def test_local_signals_skip_rows_without_direction():
    x = np.r_[_blobs(0)[:20], np.zeros((2, D)), np.full((1, D), np.nan)]
    labels = np.r_[np.zeros(20, int), 1, 1, 0]
    sig, lab = local_signals(x, labels, num_classes=2)
    assert set(lab.tolist()) == {0} and np.isfinite(sig).all()  # class 1 had only zero rows
    np.testing.assert_array_equal(sig, local_signals(x[:20], labels[:20], 2)[0])
    empty_sig, empty_lab = local_signals(np.zeros((0, D)), np.zeros(0, int), 2)
    assert empty_sig.shape == (0, D) and empty_lab.shape == (0,)


def test_local_signals_reject_labels_out_of_range():
    with pytest.raises(ValueError, match=r"0\.\.1"):
        local_signals(np.ones((2, D)), np.array([0, 2]), num_classes=2)


def test_local_signals_pass_validation():
    x = _blobs(2)
    labels = np.random.default_rng(0).integers(0, 5, len(x))
    sig, lab = local_signals(x, labels, num_classes=5)
    s2, l2 = validate_signals(sig, lab, dim=D, num_classes=5, max_rows=100)
    np.testing.assert_allclose(s2, sig, atol=1e-6)
    np.testing.assert_array_equal(l2, lab)


# ---- global signals (server, Eq. 15) ----------------------------------------------------


def test_global_signals_mask_normalisation_and_zero_rows():
    x = _blobs(0)
    sig, lab = local_signals(x, np.repeat([0, 1, 3], 20), num_classes=4)
    U, mask = global_signals(np.r_[sig, sig], np.r_[lab, lab], num_classes=4)
    assert U.dtype == np.float32 and U.shape == (4, D) and mask.dtype == bool
    assert mask.tolist() == [True, True, False, True]
    np.testing.assert_allclose(np.linalg.norm(U[mask], axis=1), 1.0, rtol=1e-6)
    assert np.all(U[2] == 0)
    assert (np.sum(U[[0, 1, 3]] * DIRS, axis=1) > 0.99).all()


def test_global_signal_is_the_mean_of_cluster_centres_not_of_signals():
    """Clusters count equally (Eq. 15), whatever their size; 'mean' weights every signal."""
    x = _blobs(1, sizes=(40, 10, 10))  # 40 signals near e0, 10 near e1, 10 near e2
    lab = np.zeros(len(x), np.int64)
    U, _ = global_signals(x, lab, num_classes=1)
    centres = cluster_means(x)
    assert len(centres) == 3
    np.testing.assert_allclose(U[0], _unit(centres.mean(0)), rtol=1e-5)
    assert U[0] @ (_unit(np.ones(3)) @ DIRS) > 0.99
    U_mean, _ = global_signals(x, lab, num_classes=1, method="mean")
    np.testing.assert_allclose(U_mean[0], _unit(_unit(x).mean(0)), rtol=1e-5)
    assert U_mean[0][0] > 0.8  # dominated by the large group


def test_global_signals_single_signal_and_empty_pool():
    s = _unit(np.random.default_rng(0).normal(size=(1, D)))
    U, mask = global_signals(s, np.array([2]), num_classes=3)
    assert mask.tolist() == [False, False, True]
    np.testing.assert_allclose(U[2], s[0], rtol=1e-6)
    U0, mask0 = global_signals(np.zeros((0, D), np.float32), np.zeros(0, np.int64), 3)
    assert not mask0.any() and U0.shape == (3, D) and not U0.any()


def test_signals_are_deterministic():
    x = _unit(np.abs(np.random.default_rng(5).normal(size=(300, 32))))
    labels = np.random.default_rng(6).integers(0, 3, 300)
    a = local_signals(x, labels, 3)
    b = local_signals(x, labels, 3)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(global_signals(*a, 3)[0], global_signals(*b, 3)[0])


# ---- payload validation (untrusted clients) ---------------------------------------------

GOOD = (np.eye(4, 8, dtype=np.float32) * 3, np.array([0, 1, 2, 1]))


@pytest.mark.parametrize(
    ("sig", "lab", "msg"),
    [
        (np.ones((3, 5), np.float32), np.zeros(3, int), r"shape \(3, 5\), expected \(M, 8\)"),
        (np.ones(8, np.float32), np.zeros(1, int), r"shape \(8,\), expected \(M, 8\)"),
        (np.ones((3, 8), dtype=object), np.zeros(3, int), "float array, got dtype object"),
        (np.ones((3, 8), np.int64), np.zeros(3, int), "float array, got dtype int64"),
        (np.ones((3, 8), np.complex64), np.zeros(3, int), "float array, got dtype complex64"),
        (np.r_[np.ones((1, 8)), np.full((1, 8), np.nan)], np.zeros(2, int), "row 1 .*NaN"),
        (np.full((2, 8), np.inf, np.float32), np.zeros(2, int), "row 0 holds NaN or Inf"),
        (np.ones((2, 8), np.float32), np.array([0, 10]), "label 10 outside 0..9"),
        (np.ones((2, 8), np.float32), np.array([-1, 0]), "label -1 outside 0..9"),
        (np.ones((2, 8), np.float32), np.array([0.5, 1.0]), "must be integers.*float64"),
        (np.ones((2, 8), np.float32), np.array([True, False]), "must be integers.*bool"),
        (np.ones((11, 8), np.float32), np.zeros(11, int), "11 signals exceed the limit of 10"),
        (np.r_[np.ones((1, 8)), np.zeros((1, 8))], np.zeros(2, int), "row 1 is a zero row"),
        (np.ones((2, 8), np.float32), np.zeros(3, int), r"signal_labels has shape \(3,\)"),
        (np.ones((2, 8), np.float32), np.zeros((2, 1), int), r"signal_labels has shape \(2, 1\)"),
    ],
)
def test_validate_rejects_bad_payloads(sig, lab, msg):
    with pytest.raises(PayloadError, match=msg):
        validate_signals(sig, lab, dim=8, num_classes=10, max_rows=10)


def test_a_client_sends_at_most_half_its_samples_of_a_class_as_signals():
    """FINCH's coarsest partition of n points has at most max(1, n // 2) clusters (checked
    on random and duplicated points), so more signals of a class than that are not a
    ClientApp's: the payload is refused, which also bounds the server's pooled FINCH."""
    assert [max_signals(n) for n in (0, 1, 2, 3, 4, 9)] == [0, 1, 1, 1, 2, 4]
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 5, 8, 13, 40):
        x = rng.normal(size=(n, 8)).astype(np.float32)
        for pts in (x, np.repeat(x[: max(1, n // 3)], 3, axis=0)[:n]):
            assert len(cluster_means(pts, "finch")) <= max_signals(n)
    sig = np.ones((3, 8), np.float32)
    ok = validate_signals(sig, [0, 0, 1], dim=8, num_classes=2, max_rows=10, class_counts=[4, 1])
    assert len(ok[0]) == 3
    with pytest.raises(PayloadError, match="2 signals of class 1 from a client with 3 training"):
        validate_signals(sig, [0, 1, 1], dim=8, num_classes=2, max_rows=10, class_counts=[4, 3])
    with pytest.raises(PayloadError, match="1 signals of class 1 from a client with 0 training"):
        validate_signals(sig[:1], [1], dim=8, num_classes=2, max_rows=10, class_counts=[4, 0])


def test_payload_error_is_a_value_error():
    assert issubclass(PayloadError, ValueError)


def test_validate_accepts_and_normalises_copies():
    sig, lab = GOOD
    s, out = validate_signals(sig, lab.astype(np.uint8), dim=8, num_classes=10, max_rows=10)
    assert s.dtype == np.float32 and out.dtype == np.int64
    np.testing.assert_allclose(np.linalg.norm(s, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(out, lab)
    s[0, 0] = 99
    assert sig[0, 0] == 3  # a copy


def test_validate_extreme_but_finite_values_and_empty_payload():
    big = np.full((1, 8), 1e300)
    tiny = np.full((1, 8), 1e-310)  # subnormal
    s, _ = validate_signals(np.r_[big, tiny], [0, 1], dim=8, num_classes=2, max_rows=2)
    np.testing.assert_allclose(s, np.full((2, 8), 8**-0.5), rtol=1e-6)
    s0, l0 = validate_signals(np.zeros((0, 8)), np.zeros(0, int), dim=8, num_classes=2, max_rows=2)
    assert s0.shape == (0, 8) and s0.dtype == np.float32 and l0.dtype == np.int64
