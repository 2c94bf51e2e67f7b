"""Property-based: random malformed results and payloads thrown at every strategy. No crash,
and nothing accepted that should not be."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies.base import FedAdamStrategy, FedAvgMStrategy, FedAvgStrategy
from strategies.fedau import FedAUStrategy, PMFLStrategy
from strategies.fedccl import FedCCLStrategy
from strategies.gne import GNEStrategy

from .helpers import TEMPLATE, make_strategy, train_messages

STRATEGIES = [
    (FedAvgStrategy, "fedavg", ""),
    (GNEStrategy, "fedrane_wo_lra", ""),
    (FedAUStrategy, "fedau", ""),
    (PMFLStrategy, "pmfl", ""),
    (FedCCLStrategy, "fedccl", ""),
    (FedAvgMStrategy, "fedavg", "server.name=fedavgm"),
    (FedAdamStrategy, "fedavg", "server.name=fedadam"),
]

values = st.sampled_from([0.0, 1.0, -3.5, np.nan, np.inf, -np.inf, 1e30])
MAX_UPDATE_NORM = 1e4  # server.max_update_norm of the tiny preset
dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.float16])


@st.composite
def arrays_entry(draw):
    # "good" weighted up so that valid replies (which must all be accepted) come up often
    mode = draw(st.sampled_from(["good"] * 3 + ["shape", "dtype", "value", "missing", "extra"]))
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


@st.composite
def a_reply(draw, msg):
    arrays = draw(arrays_entry())
    n = draw(st.sampled_from([10, 0, -5, 3]))
    pid = draw(st.sampled_from([0, 1, 2, 5, -1]))
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": n, "loss": draw(st.floats(0, 5))}),
        }
    )
    if draw(st.booleans()):
        content["info"] = ConfigRecord({"partition-id": pid})
    kind = draw(st.sampled_from(["none"] * 3 + ["good"] * 3 + ["shape", "labels", "nan", "junk"]))
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
        and n > 0
        and "info" in content
        and 0 <= pid <= 2
        # the round-1 global is TEMPLATE: the update norm is that of the arrays themselves
        and np.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays.values()))
        <= MAX_UPDATE_NORM
    )
    return Message(content, reply_to=msg), valid, kind, pid


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), which=st.integers(0, len(STRATEGIES) - 1))
def test_malformed_results_never_crash_and_are_never_accepted(data, which):
    cls, method, overrides = STRATEGIES[which]
    s = make_strategy(cls, method=method, overrides=overrides)
    msgs = train_messages(s)
    drawn = [data.draw(a_reply(msgs[i % 3])) for i in range(data.draw(st.integers(1, 4)))]
    replies = [r for r, _, _, _ in drawn]
    assert s.cfg["server"]["max_update_norm"] == MAX_UPDATE_NORM
    new, _ = s.aggregate_train(1, replies)
    needs_payload = cls is FedCCLStrategy
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
    payload = cls is FedCCLStrategy
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
