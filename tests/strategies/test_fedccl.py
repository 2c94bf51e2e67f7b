import builtins
import io
import logging
import warnings

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies.fedau import FedAUStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.fedccl import (
    PayloadError,
    cluster_means,
    finch_partition,
    global_signals,
    local_signals,
    max_signals,
    validate_signals,
)
from strategies.gne import GNEStrategy

from .helpers import arrays_of, make_strategy, reply, train_messages

TEMPLATE = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}


def _sig(rows, dim=32, label=0):
    s = np.zeros((rows, dim), np.float32)
    s[:, 0] = 1
    return {"signals": s, "signal_labels": np.full(rows, label, np.int64)}


def test_global_signals_and_payload_for_next_round():
    s = make_strategy(FedAvgStrategy, method="fedccl")
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
    s = make_strategy(FedAvgStrategy, method="fedccl", overrides="server.max_payload_rows=5")
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


def test_more_signals_of_a_class_than_its_samples_allow_are_rejected():
    """Each node reported 10 training samples of every class: at most 5 signals a class."""
    s = make_strategy(FedAvgStrategy, method="fedccl")
    msgs = train_messages(s)
    s.aggregate_train(
        1,
        [
            reply(msgs[0], 0, TEMPLATE, payload=_sig(5)),
            reply(msgs[1], 1, TEMPLATE, payload=_sig(6)),
        ],
    )
    [failure] = s.record["failures"][:1]
    assert failure["pid"] == 1 and "6 signals of class 0 from a client with 10" in failure["reason"]
    assert s.record["num_results"] == 1 and s.record["num_local_signals"] == 5


def _npy(arr, **kw):
    buf = io.BytesIO()
    np.save(buf, arr, **kw)
    return buf.getvalue()


class _Evil:
    """Pickles to a call of ``exec`` that marks ``builtins``: unpickling it runs code."""

    def __reduce__(self):
        return (exec, ("import builtins; builtins.FEDCCL_UNPICKLED = True",))


def test_hostile_payloads_are_dropped_undecoded_or_unpickled_with_a_logged_reason(
    caplog, monkeypatch
):
    """Through the real reply path (Flower ``Array``s as they arrive): a pickled object
    array, an ``stype`` other than numpy's, truncated bytes and a payload larger than
    ``max_payload_rows`` signals can take are each dropped with a logged reason; nothing is
    unpickled, and the oversized one is not even decoded."""
    s = make_strategy(
        FedAvgStrategy, method="fedccl", num_clients=4, overrides="server.max_payload_rows=5"
    )
    msgs = train_messages(s)
    labels = Array(np.zeros(2, np.int64))
    evil = _npy(np.array([_Evil()], dtype=object), allow_pickle=True)
    big = np.zeros((5000, 32), np.float32)  # declared as 2 rows, 640 kB of bytes
    bad = {
        "pickled": Array(dtype="object", shape=(1,), stype="numpy.ndarray", data=evil),
        "stype": Array(dtype="float32", shape=(2, 32), stype="pickle", data=evil),
        "truncated": Array(
            dtype="float32", shape=(2, 32), stype="numpy.ndarray", data=_npy(big)[:200]
        ),
        "oversized": Array(dtype="float32", shape=(2, 32), stype="numpy.ndarray", data=_npy(big)),
    }
    replies = []
    for i, sig in enumerate(bad.values()):
        r = reply(msgs[i], i, TEMPLATE)
        r.content["payload"] = ArrayRecord({"signals": sig, "signal_labels": labels})
        replies.append(r)
    decoded = []
    numpy = Array.numpy
    monkeypatch.setattr(Array, "numpy", lambda a: decoded.append(len(a.data)) or numpy(a))
    with caplog.at_level(logging.WARNING, logger="fl_app"):
        s.aggregate_train(1, replies)
    assert not hasattr(builtins, "FEDCCL_UNPICKLED")
    reasons = [f["reason"] for f in s.record["failures"]]
    assert [f["pid"] for f in s.record["failures"]] == [0, 1, 2, 3]
    assert "'signals' cannot be decoded" in reasons[0] and "allow_pickle" in reasons[0]
    assert "'signals' cannot be decoded" in reasons[1] and "pickle" in reasons[1]
    assert "'signals' cannot be decoded" in reasons[2]
    assert "exceeds the" in reasons[3] and "(not decoded)" in reasons[3]
    assert len(_npy(big)) not in decoded  # the oversized payload never reached np.load
    assert s.record["num_results"] == 0
    for reason in reasons:
        assert reason[:40] in caplog.text


def _sig_at(rows, axis, label, dim=32):
    """``rows`` identical unit signals along feature ``axis``, all of class ``label``."""
    s = np.zeros((rows, dim), np.float32)
    s[:, axis] = 1
    return {"signals": s, "signal_labels": np.full(rows, label, np.int64)}


def _skip_scenario(strategy):
    """Round 1: clients 0 and 1 reply; round 2: only client 0 replies, with new signals.
    Returns the round-3 payload sent to client 0 (as numpy arrays)."""
    msgs = train_messages(strategy, 1)
    strategy.aggregate_train(
        1,
        [
            reply(msgs[0], 0, TEMPLATE, payload=_sig_at(2, axis=0, label=0)),
            reply(msgs[1], 1, TEMPLATE, payload=_sig_at(1, axis=1, label=3)),
        ],
    )
    msgs = train_messages(strategy, 2)
    strategy.aggregate_train(2, [reply(msgs[0], 0, TEMPLATE, payload=_sig_at(1, axis=2, label=5))])
    pay = train_messages(strategy, 3)[0].content["payload"]
    return {k: v.numpy() for k, v in pay.items()}


def test_local_signals_persist_through_skipped_rounds():
    """The server keeps each client's latest signals (module docstring; METHODS.md "the
    server sends all local signals"): after round 2, where client 1 did not reply, the
    round-3 payload still carries client 1's round-1 signal, client 0's round-2 signals
    replace its round-1 ones, and the global signals cover both clients' classes."""
    s = make_strategy(FedAvgStrategy, method="fedccl")
    pay = _skip_scenario(s)
    assert s.record["num_local_signals"] == 2
    assert pay["local_labels"].tolist() == [5, 3]  # sorted by pid: client 0, then client 1
    np.testing.assert_array_equal(pay["local_signals"][0], _sig_at(1, 2, 5)["signals"][0])
    np.testing.assert_array_equal(pay["local_signals"][1], _sig_at(1, 1, 3)["signals"][0])
    assert np.flatnonzero(pay["global_mask"]).tolist() == [3, 5]
    np.testing.assert_allclose(pay["global_signals"][3], _sig_at(1, 1, 3)["signals"][0])
    np.testing.assert_allclose(pay["global_signals"][5], _sig_at(1, 2, 5)["signals"][0])


def _assert_same_fedccl_state(t, s):
    assert sorted(t.local) == sorted(s.local) == [0, 1]
    for pid in s.local:
        for a, b in zip(t.local[pid], s.local[pid], strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(t.global_sig, s.global_sig)
    assert t.global_mask.dtype == bool
    np.testing.assert_array_equal(t.global_mask, s.global_mask)


def test_state_round_trip(tmp_path):
    """A restored server has the same local signals of every client (including one that
    skipped the last round), global signals and mask, both from the state dict directly and
    through the run's real checkpoint files; so it sends the same next-round payload."""
    from flwr.app import Array, ArrayRecord

    from fl_app.server_app import Checkpoint

    s = make_strategy(FedAvgStrategy, method="fedccl")
    pay = _skip_scenario(s)
    t = make_strategy(FedAvgStrategy, method="fedccl")
    t.load_state_dict(s.state_dict())
    _assert_same_fedccl_state(t.exchange, s.exchange)

    ckpt = Checkpoint(tmp_path)
    ckpt.save(
        2, ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()}), {"strategy": s.state_dict()}
    )
    _, _, state = ckpt.load()
    u = make_strategy(FedAvgStrategy, method="fedccl")
    u.load_state_dict(state["strategy"])
    _assert_same_fedccl_state(u.exchange, s.exchange)
    pay_u = {k: v.numpy() for k, v in train_messages(u, 3)[0].content["payload"].items()}
    assert sorted(pay_u) == sorted(pay)
    for k in pay:
        np.testing.assert_array_equal(pay_u[k], pay[k])


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
    s = make_strategy(GNEStrategy, method="fedccl_gne")
    w_new = _two_clients_round_one(s)
    # parallel deltas of norms 1 and 3: Nash weights ∝ 1/‖Δ‖ (3/4, 1/4, up to GNE's ridge
    # ε), not the sample weights (0.1, 0.9) FedAvg would use
    w = pytest.approx({"0": 0.75, "1": 0.25}, rel=1e-4)
    assert s.record["gne_status"] == "nash" and s.record["aggregation_weights"] == w
    np.testing.assert_allclose(w_new, 0.75 * 1.0 + 0.25 * 3.0, rtol=1e-4)


def test_fedau_combination_weights_by_participation_and_keeps_both_states():
    s = make_strategy(FedAUStrategy, method="fedccl_au", num_clients=2)
    w_new = _two_clients_round_one(s)
    # both nodes took part in round 1: x = Q* = 1 each, K = 2, so W + (Δ_0 + Δ_1)/2 = 2.0,
    # not the sample-weighted 2.8 of FedCCL's own server
    assert s.record["aggregation_weights"] == {"0": 1.0, "1": 1.0}
    np.testing.assert_allclose(w_new, 2.0)
    t = make_strategy(FedAUStrategy, method="fedccl_au", num_clients=2)
    t.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(t.exchange.global_sig, s.exchange.global_sig)
    assert t.weights.state_dict() == s.weights.state_dict()


def test_a_checkpoint_of_the_former_combination_classes_still_loads(tmp_path):
    """Before the exchange was composed, ``FedCCLMStrategy.state_dict`` put the signal
    state (``local``, ``global_sig``, ``global_mask``) beside the aggregator's (FedAvgM's
    ``momentum_vector``) at the top level; a resume of such a checkpoint restores both, and
    the next round's payload is the one the checkpointed server would have sent."""
    from fl_app.server_app import Checkpoint
    from strategies.fedavg import FedAvgMStrategy

    s = make_strategy(FedAvgMStrategy, method="fedccl_m")
    pay = _skip_scenario(s)
    state = s.state_dict()
    old = {**{k: v for k, v in state.items() if k != "exchange"}, **state["exchange"]}
    assert sorted(old) == ["global_mask", "global_sig", "local", "momentum_vector"]
    ckpt = Checkpoint(tmp_path)
    ckpt.save(2, ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()}), {"strategy": old})
    _, _, loaded = ckpt.load()
    u = make_strategy(FedAvgMStrategy, method="fedccl_m")
    u.load_state_dict(loaded["strategy"])
    _assert_same_fedccl_state(u.exchange, s.exchange)
    for a, b in zip(u.momentum, s.momentum, strict=True):
        np.testing.assert_array_equal(a, b)
    pay_u = {k: v.numpy() for k, v in train_messages(u, 3)[0].content["payload"].items()}
    assert sorted(pay_u) == sorted(pay)
    for k in pay:
        np.testing.assert_array_equal(pay_u[k], pay[k])


# ==== the signal math (FINCH, local and global signals, payload checks) ====
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
