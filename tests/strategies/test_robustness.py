"""Property-based: random malformed results and payloads thrown at every strategy. No crash,
and nothing accepted that should not be."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies.fedau import FedAUStrategy, PMFLStrategy
from strategies.fedavg import FedAdamStrategy, FedAvgMStrategy, FedAvgStrategy
from strategies.gne import GNEStrategy

from .helpers import (
    NUM_TEST,
    NUM_TRAIN,
    TEMPLATE,
    eval_messages,
    eval_reply,
    make_strategy,
    train_messages,
)

STRATEGIES = [
    (FedAvgStrategy, "fedavg", ""),
    (GNEStrategy, "fedrane_wo_lra", ""),
    (FedAUStrategy, "fedau", ""),
    (PMFLStrategy, "pmfl", ""),
    (FedAvgStrategy, "fedccl", ""),  # FedAvg holding FedCCL's signal exchange
    (FedAvgMStrategy, "fedavg", "server.name=fedavgm"),
    (FedAdamStrategy, "fedavg", "server.name=fedadam"),
]

values = st.sampled_from([0.0, 1.0, -3.5, np.nan, np.inf, -np.inf, 1e30])
MAX_UPDATE_NORM = 1e4  # server.max_update_norm of the tiny preset
dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.float16])


@st.composite
def arrays_entry(draw, good=False):
    modes = ["good"] * 3 + ["shape", "dtype", "value", "missing", "extra"]
    mode = "good" if good else draw(st.sampled_from(modes))
    out = {k: v.copy() + draw(st.floats(-1, 1)) for k, v in TEMPLATE.items()}
    if mode == "shape":
        out["w"] = np.zeros((draw(st.integers(1, 3)), 3), np.float32)
    elif mode == "dtype":
        out["b"] = out["b"].astype(draw(dtypes))
    elif mode == "value":
        out["w"][0, 0] = draw(values)
    elif mode == "missing":
        out.pop("b")
    elif mode == "extra":
        out["z"] = np.zeros(2, np.float32)
    return out


# partition ids as a reply may claim them: a valid one is the partition the message went to
pids = st.sampled_from([0, 1, 2, 5, -1, 1.5, 2.0, True])
# num-examples: positive and at most the partition's training-set size NUM_TRAIN to be valid
counts = st.sampled_from([10, 3, NUM_TRAIN, 0, -5, NUM_TRAIN + 1, 10**12, 2.5])
metric_values = st.sampled_from([0.5, 2.0, 0.5, 2.0, np.nan, np.inf, [1.0, 2.0]])


@st.composite
def a_reply(draw, msg, sent_to, needs_payload):
    """A reply, meant valid half the time (every field drawn from its valid values; the
    arrays' random shift can still exceed the update-norm bound), otherwise with every field
    drawn from valid and invalid values; ``valid`` says what it is, whatever was meant."""
    meant_valid = draw(st.booleans())
    arrays = draw(arrays_entry(good=meant_valid))
    n = draw(st.sampled_from([10, 3, NUM_TRAIN]) if meant_valid else counts)
    pid = sent_to if meant_valid else draw(pids)
    loss = draw(st.sampled_from([0.5, 2.0]) if meant_valid else metric_values)
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": n, "loss": loss}),
        }
    )
    if meant_valid or draw(st.booleans()):
        content["info"] = ConfigRecord({"partition-id": pid})
    kinds = ["none"] * 3 + ["good"] * 3 + ["shape", "labels", "nan", "junk"]
    good_kind = "good" if needs_payload else "none"
    kind = good_kind if meant_valid else draw(st.sampled_from(kinds))
    if kind != "none":
        sig = np.zeros((2, 32), np.float32)
        sig[:, 1] = 1
        lab = np.array([0, 1], np.int64)
        if kind == "shape":
            sig = np.ones((2, 5), np.float32)
        elif kind == "labels":
            lab = np.array([0, 99], np.int64)
        elif kind == "nan":
            sig[0, 0] = np.nan
        payload = {"signals": sig, "signal_labels": lab}
        if kind == "junk":
            payload = {"x": np.ones(3, np.float64)}
        content["payload"] = ArrayRecord({k: Array(v) for k, v in payload.items()})
    valid = (
        set(arrays) == set(TEMPLATE)
        and all(
            arrays[k].shape == TEMPLATE[k].shape and arrays[k].dtype == TEMPLATE[k].dtype
            for k in arrays
        )
        and all(np.isfinite(a).all() for a in arrays.values())
        and type(n) is int
        and 0 < n <= NUM_TRAIN
        and not isinstance(loss, list)
        and np.isfinite(loss)
        and "info" in content
        and type(pid) is int
        and pid == sent_to
        # the round-1 global is TEMPLATE: the update norm is that of the arrays themselves
        and np.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays.values()))
        <= MAX_UPDATE_NORM
    )
    return Message(content, reply_to=msg), valid, kind, pid


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data(), which=st.integers(0, len(STRATEGIES) - 1))
def test_malformed_results_never_crash_and_are_never_accepted(data, which):
    cls, method, overrides = STRATEGIES[which]
    s = make_strategy(cls, method=method, overrides=overrides)
    msgs = train_messages(s)
    needs_payload = s.exchange is not None
    drawn = [
        data.draw(a_reply(msgs[i % 3], i % 3, needs_payload))
        for i in range(data.draw(st.integers(1, 4)))
    ]
    replies = [r for r, _, _, _ in drawn]
    assert s.cfg["server"]["max_update_norm"] == MAX_UPDATE_NORM
    new, _ = s.aggregate_train(1, replies)
    accepted_ok = [
        ok and ((kind == "good") if needs_payload else kind == "none") for _, ok, kind, _ in drawn
    ]
    # exactly the acceptable replies are taken, one per partition (a later reply for the same
    # partition is a duplicate): neither an invalid one accepted nor a valid one refused
    ok_pids = {pid for (_, _, _, pid), ok in zip(drawn, accepted_ok, strict=True) if ok}
    assert s.record["num_results"] == len(ok_pids)
    if ok_pids:
        assert set(s.record["clients"]) == {str(p) for p in ok_pids}
    if new is not None:
        for k in TEMPLATE:
            arr = new[k].numpy()
            assert arr.shape == TEMPLATE[k].shape and np.isfinite(arr).all()
            assert arr.dtype == TEMPLATE[k].dtype  # sent in the model's dtype
    if s.record["num_results"] == 0:  # nothing accepted: the model stays (FedAU/PMFL count
        # the round and return it unchanged: no historical global yet in round 1)
        assert new is None or all(np.array_equal(new[k].numpy(), TEMPLATE[k]) for k in TEMPLATE)


def _good_reply(msg, pid, shift, with_payload):
    """A reply every strategy must accept (FedCCL: with its signals payload)."""
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v + shift) for k, v in TEMPLATE.items()}),
            "metrics": MetricRecord({"num-examples": 10 + pid, "loss": 1.0}),
            "info": ConfigRecord({"partition-id": pid}),
        }
    )
    if with_payload:
        sig = np.zeros((2, 32), np.float32)
        sig[:, 1] = 1
        content["payload"] = ArrayRecord(
            {"signals": Array(sig), "signal_labels": Array(np.array([0, 1], np.int64))}
        )
    return Message(content, reply_to=msg)


@pytest.mark.parametrize(("cls", "method", "overrides"), STRATEGIES)
def test_every_valid_reply_is_accepted_once(cls, method, overrides):
    """The deterministic complement of the property test above (whose random replies are
    rarely valid): valid replies are all accepted, a second one for the same partition and
    a NaN one are rejected, with every strategy."""
    s = make_strategy(cls, method=method, overrides=overrides)
    msgs = train_messages(s)
    payload = s.exchange is not None
    bad = _good_reply(msgs[2], 2, 0.5, payload)
    bad.content["arrays"] = ArrayRecord(
        {"w": Array(np.full((2, 2), np.nan, np.float32)), "b": Array(TEMPLATE["b"])}
    )
    replies = [
        _good_reply(msgs[1], 1, 0.25, payload),
        _good_reply(msgs[0], 0, -0.5, payload),
        _good_reply(msgs[1], 1, 0.75, payload),  # duplicate partition
        bad,
    ]
    new, _ = s.aggregate_train(1, replies)
    assert new is not None
    assert s.record["num_results"] == 2 and set(s.record["clients"]) == {"0", "1"}
    reasons = [f["reason"] for f in s.record["failures"] if f["kind"] == "rejected"]
    assert len(reasons) == 2
    assert any("duplicate" in r for r in reasons) and any("NaN" in r for r in reasons)


@st.composite
def an_eval_reply(draw, msg, sent_to):
    """Meant valid half the time (as :func:`a_reply`); ``valid`` says what it is."""
    if draw(st.booleans()):
        pid = sent_to
        n = draw(st.sampled_from([10, 3, NUM_TEST]))
        acc = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
        loss = draw(st.sampled_from([0.0, 0.7, 1.5]))
    else:
        pid = draw(pids)
        n = draw(st.sampled_from([10, NUM_TEST, 0, -5, NUM_TEST + 1, 10**12, 2.5]))
        acc = draw(st.sampled_from([0.0, 0.5, 1.0, 0.5, 57, -1.0, np.nan, np.inf, [0.5]]))
        loss = draw(st.sampled_from([0.0, 1.5, 1.5, -1.0, np.nan, np.inf]))
    reply = eval_reply(msg, pid, accuracy=acc, loss=loss, n=n)
    valid = (
        type(pid) is int
        and pid == sent_to
        and type(n) is int
        and 0 < n <= NUM_TEST
        and not isinstance(acc, list)
        and 0 <= acc <= 1
        and 0 <= loss < np.inf
    )
    empty = type(pid) is int and pid == sent_to and type(n) is int and n == 0
    return reply, valid, empty, pid, acc, loss, n


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_federated_evaluation_takes_exactly_the_valid_replies(data):
    """Random evaluation replies: the federated metrics are the sample-weighted means over
    exactly the valid ones (the first per partition); every other reply is recorded as
    rejected, except an honest empty test split (0 examples), which is left out."""
    s = make_strategy(FedAvgStrategy, overrides="evaluation.federated=true")
    msgs = eval_messages(s)
    drawn = [
        data.draw(an_eval_reply(msgs[i % 3], i % 3)) for i in range(data.draw(st.integers(1, 5)))
    ]
    out = s.aggregate_evaluate(1, [d[0] for d in drawn])
    taken, rejected, seen = [], 0, set()
    for _, valid, empty, pid, acc, loss, n in drawn:
        if valid and pid not in seen:
            seen.add(pid)
            taken.append((acc, loss, n))
        elif not empty:
            rejected += 1
    failures = s.record["federated_failures"]
    assert sum(f["kind"] == "rejected" for f in failures) == rejected
    if not taken:
        assert out is None and "federated_accuracy" not in s.record
        return
    ns = [t[2] for t in taken]
    assert s.record["federated_accuracy"] == pytest.approx(
        np.average([t[0] for t in taken], weights=ns)
    )
    assert s.record["federated_loss"] == pytest.approx(
        np.average([t[1] for t in taken], weights=ns)
    )
    assert sorted(s.record["federated_clients"]) == sorted(str(p) for p in seen)
