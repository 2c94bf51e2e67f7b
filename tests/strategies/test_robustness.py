"""Property-based: random malformed results and payloads thrown at every strategy. No crash,
and nothing accepted that should not be."""

import numpy as np
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
dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.float16])


@st.composite
def arrays_entry(draw):
    mode = draw(st.sampled_from(["good", "shape", "dtype", "value", "missing", "extra"]))
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
    kind = draw(st.sampled_from(["none", "good", "shape", "labels", "nan", "junk"]))
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
    )
    return Message(content, reply_to=msg), valid, kind


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), which=st.integers(0, len(STRATEGIES) - 1))
def test_malformed_results_never_crash_and_are_never_accepted(data, which):
    cls, method, overrides = STRATEGIES[which]
    s = make_strategy(cls, method=method, overrides=overrides)
    msgs = train_messages(s)
    drawn = [data.draw(a_reply(msgs[i % 3])) for i in range(data.draw(st.integers(1, 4)))]
    replies = [r for r, _, _ in drawn]
    new, _ = s.aggregate_train(1, replies)
    needs_payload = cls is FedCCLStrategy
    accepted_ok = [
        ok and ((kind == "good") if needs_payload else kind == "none") for _, ok, kind in drawn
    ]
    assert s.record["num_results"] <= sum(accepted_ok)
    if new is not None:
        for k in TEMPLATE:
            arr = new[k].numpy()
            assert arr.shape == TEMPLATE[k].shape and np.isfinite(arr).all()
    if s.record["num_results"] == 0:  # nothing accepted: the model stays (FedAU/PMFL count
        # the round and return it unchanged: no historical global yet in round 1)
        assert new is None or all(np.array_equal(new[k].numpy(), TEMPLATE[k]) for k in TEMPLATE)
