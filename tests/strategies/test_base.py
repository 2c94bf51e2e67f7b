import time
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Error, Message

from strategies.base import FedAvgStrategy, delta_gram, send_and_receive, update_diagnostics

from .helpers import TEMPLATE, arrays_of, make_strategy, reply, train_messages


def _arrays(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 2), v, np.float32), "b": np.full(3, v, np.float32)}


def test_configure_train_sends_every_selected_node_its_config():
    s = make_strategy(FedAvgStrategy)
    s.train_config = {"state-token": "abc"}
    msgs = train_messages(s, server_round=4)
    assert sorted(m.metadata.dst_node_id for m in msgs) == [100, 101, 102]
    cfg = msgs[0].content["config"]
    assert cfg["server-round"] == 4


def test_weighted_mean_is_exact():
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [
        reply(msgs[0], 0, _arrays(1.0), n=10),
        reply(msgs[1], 1, _arrays(4.0), n=30),
        reply(msgs[2], 2, _arrays(-2.0), n=60),
    ]
    new, _ = s.aggregate_train(1, replies)
    expected = (10 * 1.0 + 30 * 4.0 + 60 * -2.0) / 100
    np.testing.assert_allclose(arrays_of(new)["w"], expected, rtol=1e-6)
    np.testing.assert_allclose(arrays_of(new)["b"], expected, rtol=1e-6)
    assert s.record["num_results"] == 3 and s.record["failures"] == []


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"w": np.full((2, 2), np.nan, np.float32), "b": np.zeros(3, np.float32)}, "NaN or Inf"),
        ({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}, "has shape (2, 3)"),
        ({"w": np.zeros((2, 2), np.float64), "b": np.zeros(3, np.float32)}, "dtype float64"),
        ({"w": np.zeros((2, 2), np.float32)}, "array names differ"),
        ({"w": np.full((2, 2), 1e9, np.float32), "b": np.zeros(3, np.float32)}, "update norm"),
    ],
)
def test_bad_result_is_dropped_with_reason_and_round_goes_on(bad, reason):
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [
        reply(msgs[0], 0, _arrays(1.0)),
        reply(msgs[1], 1, _arrays(3.0)),
        reply(msgs[2], 2, bad),
    ]
    new, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays_of(new)["w"], 2.0)
    [failure] = s.record["failures"]
    assert failure["kind"] == "rejected" and reason in failure["reason"]
    assert s.dropped_total == 1


def test_bad_identity_and_counts_are_rejected():
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [
        reply(msgs[0], 0, _arrays(1.0)),
        reply(msgs[1], 7, _arrays(3.0)),
        reply(msgs[2], 0, _arrays(5.0)),
        reply(msgs[2], 2, _arrays(5.0), n=0),
        Message(Error(code=1, reason="boom"), reply_to=msgs[1]),
    ]
    new, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays_of(new)["w"], 1.0)
    reasons = " | ".join(f["reason"] for f in s.record["failures"])
    assert "partition id 7" in reasons and "duplicate" in reasons
    assert "num-examples must be a positive integer" in reasons and "boom" in reasons


def test_unexpected_payload_is_rejected_by_plain_strategies():
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [reply(msgs[0], 0, _arrays(1.0), payload={"x": np.zeros(2, np.float32)})]
    new, _ = s.aggregate_train(1, replies)
    assert new is None and "unexpected payload" in s.record["failures"][0]["reason"]


def test_all_bad_keeps_global_model():
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    assert s.aggregate_train(1, [Message(Error(code=1, reason="x"), reply_to=msgs[0])]) == (
        None,
        None,
    )


def test_scalar_metrics_are_sample_weighted():
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    s.aggregate_train(
        1,
        [
            reply(msgs[0], 0, _arrays(1.0), n=10, train_loss=1.0),
            reply(msgs[1], 1, _arrays(1.0), n=30, train_loss=3.0),
        ],
    )
    assert s.record["train"]["train_loss"] == pytest.approx(2.5)
    assert set(s.record["clients"]) == {"0", "1"}


def test_diagnostics_from_gram():
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    results, _ = s.collect([reply(msgs[0], 0, _arrays(1.0)), reply(msgs[1], 1, _arrays(-1.0))])
    gram = delta_gram([TEMPLATE["w"], TEMPLATE["b"]], results)
    np.testing.assert_allclose(gram, [[7.0, -7.0], [-7.0, 7.0]])
    diag = update_diagnostics(
        [TEMPLATE["w"], TEMPLATE["b"]], [v for v in _arrays(0.5).values()], results, gram
    )
    # opposite deltas: the mean is zero, so both have cosine 0 to it
    assert diag["update_deviation"] == pytest.approx(2.0)
    assert diag["cos_global_client"] == {"0": pytest.approx(1.0), "1": pytest.approx(-1.0)}


def test_error_from_superlink_is_attributed_to_the_dead_node_not_double_counted():
    """A dead node's error reply comes from the SuperLink (node id 1) and names the message
    it answers: it must count once, as that partition's failure, not also as 'missing'."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    for i, m in enumerate(msgs):  # what the Grid does when it sends them
        m.metadata.__dict__["_message_id"] = f"m{i}"
    err = Message(Error(code=5, reason="Node Unavailable"), reply_to=msgs[1])
    err.metadata.__dict__["_src_node_id"] = 1
    s.aggregate_train(1, [reply(msgs[0], 0, _arrays(1.0)), err, reply(msgs[2], 2, _arrays(1.0))])
    assert [(f["kind"], f["pid"]) for f in s.record["failures"]] == [("error", 1)]


class _DelayedGrid:
    """Push/pull grid whose reply to message i becomes available ``delays[i]`` s after push."""

    def __init__(self, delays: list[float]) -> None:
        self.delays, self.ready_at, self.pulls = delays, {}, 0

    def push_messages(self, messages):
        now = time.monotonic()
        for i, _ in enumerate(messages):
            self.ready_at[f"m{i}"] = now + self.delays[i]
        return list(self.ready_at)

    def pull_messages(self, ids):
        self.pulls += 1
        now = time.monotonic()
        out = [i for i in ids if self.ready_at[i] <= now]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in out]


def test_send_and_receive_returns_replies_soon_after_they_arrive():
    grid = _DelayedGrid([0.0, 0.03, 0.06])
    t0 = time.monotonic()
    got = send_and_receive(grid, ["a", "b", "c"], timeout=5.0)
    took = time.monotonic() - t0
    assert sorted(m.metadata.reply_to_message_id for m in got) == ["m0", "m1", "m2"]
    assert took < 0.06 + 0.05 + 0.04  # last reply + at most one longest poll wait (+ slack)
    assert grid.pulls < 20  # the wait grows: no busy loop


def test_send_and_receive_gives_up_at_the_timeout_with_what_arrived():
    grid = _DelayedGrid([0.0, 60.0])
    t0 = time.monotonic()
    got = send_and_receive(grid, ["a", "b"], timeout=0.2)
    assert 0.2 <= time.monotonic() - t0 < 1.0
    assert [m.metadata.reply_to_message_id for m in got] == ["m0"]


def test_aggregate_does_not_depend_on_the_order_replies_arrive_in():
    """Replies are aggregated in partition order, so a seeded run gives the same global
    model however the clients' replies are interleaved (float sums are order-sensitive)."""
    rng = np.random.default_rng(0)
    updates = [
        {
            k: (rng.normal(size=v.shape) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
            for k, v in TEMPLATE.items()
        }
        for _ in range(3)
    ]

    def run(order: list[int]) -> dict[str, np.ndarray]:
        s = make_strategy(FedAvgStrategy)
        msgs = train_messages(s)
        replies = [reply(msgs[p], p, updates[p], n=7 + 13 * p) for p in order]
        new, _ = s.aggregate_train(1, replies)
        return arrays_of(new)

    first = run([0, 1, 2])
    for order in ([2, 0, 1], [1, 2, 0], [2, 1, 0]):
        other = run(order)
        for k in TEMPLATE:
            np.testing.assert_array_equal(other[k], first[k])
