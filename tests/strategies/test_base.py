from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common import MessageType

import strategies.base
from fl_app.diagnostics import cosine_to_global, update_deviation
from strategies.base import (
    POLL_FIRST_S,
    POLL_MAX_S,
    AllClientsFailedError,
    FedAdamStrategy,
    FedAvgMStrategy,
    FedAvgStrategy,
    NodeInfo,
    NodeRegistry,
    cast_like,
    delta_gram,
    error_message,
    send_and_receive,
    update_diagnostics,
    weighted_mean,
)

from .helpers import (
    NUM_TEST,
    NUM_TRAIN,
    TEMPLATE,
    FakeGrid,
    arrays_of,
    eval_messages,
    eval_reply,
    make_strategy,
    reply,
    train_messages,
)


def _arrays(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 2), v, np.float32), "b": np.full(3, v, np.float32)}


class _RoundConfigStrategy(FedAvgStrategy):
    """FedAvg with a method hook that adds a round-dependent scalar to every client's config."""

    def round_config(self, server_round: int) -> dict:
        return {"lam": 0.25 * server_round}


class _RecordingGrid(FakeGrid):
    """In-process grid that keeps every message it is asked to send and answers none."""

    def __init__(self, node_ids: list[int]) -> None:
        super().__init__(node_ids)
        self.sent: list[Message] = []

    def send_and_receive(self, messages, timeout=None):
        self.sent.extend(messages)
        return []


def test_configure_train_sends_every_selected_node_its_config():
    """Each participant's config is the run-level config passed in, the server round and the
    method's round_config() entries (the hook wins over the run config on a name clash)."""
    s = make_strategy(_RoundConfigStrategy)
    rec = ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()})
    run_cfg = ConfigRecord({"state-token": "abc", "state-checkpoint": 2, "lam": -1.0})
    msgs = list(s.configure_train(4, rec, run_cfg, FakeGrid([100, 101, 102])))
    assert sorted(m.metadata.dst_node_id for m in msgs) == [100, 101, 102]
    expected = {
        "state-token": "abc",
        "state-checkpoint": 2,
        "server-round": 4,
        "lam": 1.0,
    }
    for m in msgs:
        assert dict(m.content["config"]) == expected
        assert m.metadata.message_type == MessageType.TRAIN


def test_run_sends_the_current_train_config_every_round():
    """run() builds each round's train messages from ``train_config`` as it is at that round
    (the ServerApp sets the state token and lineage and updates the lineage after a
    checkpoint, from on_round_end), plus the server round and round_config()."""
    s = make_strategy(_RoundConfigStrategy)
    s.train_config = {"state-token": "abc", "state-resumed": "3", "state-checkpoint": 3}
    grid = _RecordingGrid([100, 101, 102])

    def on_round_end(rnd, arrays, record):
        s.train_config.update({"state-checkpoint": 10 + rnd})

    rec = ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()})
    s.run(grid, rec, num_rounds=5, start_round=4, on_round_end=on_round_end)
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert len(train) == 6
    by_round = {}
    for m in train:
        cfg = dict(m.content["config"])
        by_round.setdefault(cfg["server-round"], []).append((m.metadata.dst_node_id, cfg))
    common = {"state-token": "abc", "state-resumed": "3"}
    for rnd, checkpoint in ((4, 3), (5, 14)):
        assert sorted(n for n, _ in by_round[rnd]) == [100, 101, 102]
        for _, cfg in by_round[rnd]:
            assert cfg == {
                **common,
                "state-checkpoint": checkpoint,
                "server-round": rnd,
                "lam": 0.25 * rnd,
            }


def test_the_mean_of_huge_finite_metrics_stays_finite():
    """A client's finite but huge metric (1e308) does not overflow the round's mean."""
    assert weighted_mean([1e308, 1e308], [3, 1]) == 1e308
    assert weighted_mean([1.0, 3.0], [0, 0]) == 0.0


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


def test_bad_identity_and_counts_are_rejected():
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [
        reply(msgs[0], 0, _arrays(1.0)),
        reply(msgs[1], 7, _arrays(3.0)),
        reply(msgs[0], 0, _arrays(5.0)),
        reply(msgs[2], 2, _arrays(5.0), n=0),
        Message(Error(code=1, reason="boom"), reply_to=msgs[1]),
    ]
    new, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays_of(new)["w"], 1.0)
    reasons = " | ".join(f["reason"] for f in s.record["failures"])
    assert "partition id 7" in reasons and "duplicate" in reasons
    assert "num-examples must be a positive integer" in reasons and "boom" in reasons


def _stamp_ids(msgs):
    """What the Grid does when it sends messages: stamp their ids in place."""
    for i, m in enumerate(msgs):
        m.metadata.__dict__["_message_id"] = f"m{i}"
    return msgs


@pytest.mark.parametrize("stamped", [False, True])
@pytest.mark.parametrize(
    ("claimed", "reason"),
    [
        (1, "partition id 1 in a reply to the message sent to partition 0"),
        (1.9, "partition id must be an integer, got 1.9"),
        (0.0, "partition id must be an integer, got 0.0"),
        (True, "partition id must be an integer, got True"),
        ("0", "partition id must be an integer, got '0'"),
    ],
)
def test_partition_id_must_be_the_one_the_message_was_sent_to(stamped, claimed, reason):
    """Node 0 answering as partition 1 (or as 1.9, truncated to 1 by int()) must not take
    partition 1's place: the reply is rejected for partition 0, which is not 'missing'."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    if stamped:
        _stamp_ids(msgs)
    replies = [reply(msgs[0], claimed, _arrays(9.0)), reply(msgs[2], 2, _arrays(1.0))]
    new, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays_of(new)["w"], 1.0)
    assert set(s.record["clients"]) == {"2"}
    by_kind = {f["kind"]: f for f in s.record["failures"]}
    assert sorted(by_kind) == ["missing", "rejected"]
    assert by_kind["rejected"]["pid"] == 0 and reason in by_kind["rejected"]["reason"]
    assert by_kind["missing"]["pid"] == 1


def test_num_examples_above_the_partition_size_is_rejected():
    """num-examples is the partition's training-set size (BaseClient.fit returns
    len(train), whatever client.epochs or client.steps): a client claiming more than its
    node reported at the start-up query would take the aggregation weight of others."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [
        reply(msgs[0], 0, _arrays(1.0), n=NUM_TRAIN),  # exactly the partition: accepted
        reply(msgs[1], 1, _arrays(7.0), n=10**12),
        reply(msgs[2], 2, _arrays(3.0), n=NUM_TRAIN + 1),
    ]
    new, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays_of(new)["w"], 1.0)
    assert s.record["num_results"] == 1
    reasons = {f["pid"]: f["reason"] for f in s.record["failures"]}
    assert reasons == {
        1: f"num-examples 1000000000000 exceeds the {NUM_TRAIN} training samples "
        "partition 1 reported",
        2: f"num-examples {NUM_TRAIN + 1} exceeds the {NUM_TRAIN} training samples "
        "partition 2 reported",
    }


def test_a_partition_the_registry_does_not_know_has_no_count_bound():
    """No reported training-set size means no bound (None), as in federated evaluation:
    not a bound of 0 that would reject any count with "exceeds the 0 training samples"."""
    s = make_strategy(FedAvgStrategy)
    msgs = _stamp_ids(train_messages(s))
    del s.nodes.by_pid[1]  # partition 1's reply still answers the message sent to it
    replies = [
        reply(msgs[0], 0, _arrays(1.0), n=10),
        reply(msgs[1], 1, _arrays(4.0), n=NUM_TRAIN + 20),
    ]
    new, _ = s.aggregate_train(1, replies)
    assert s.record["num_results"] == 2
    assert [f["kind"] for f in s.record["failures"]] == ["missing"]  # partition 2
    np.testing.assert_allclose(arrays_of(new)["w"], (10 + 4 * (NUM_TRAIN + 20)) / 130, rtol=1e-6)


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [
        ({"train_loss": float("nan")}, "metric 'train_loss' = nan is not a finite number"),
        (
            {"train_loss": 2.0, "fit_seconds": float("inf")},
            "'fit_seconds' = inf is not a finite number",
        ),
        ({"train_loss": 2.0, "per_class": [0.5, 0.25]}, "metric 'per_class' is a list"),
        ({"train_loss": 2.0, "steps": 10**400}, "metric 'steps' = 1000"),  # beyond float
    ],
)
def test_a_non_finite_or_list_metric_rejects_the_reply(metrics, reason):
    """An honest client never sends a non-finite metric (BaseClient raises on a non-finite
    loss) nor a list (arrays travel as the payload): such a reply is rejected with its
    reason, not aggregated with the metric silently left out of the round's mean."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [
        reply(msgs[0], 0, _arrays(1.0), n=10, train_loss=1.0, fit_seconds=2.0),
        reply(msgs[1], 1, _arrays(3.0), n=30, train_loss=3.0, fit_seconds=4.0),
        reply(msgs[2], 2, _arrays(9.0), n=60, **metrics),
    ]
    new, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays_of(new)["w"], 2.5)
    assert s.record["train"] == {"train_loss": pytest.approx(2.5), "fit_seconds": 3.5}
    [failure] = s.record["failures"]
    assert failure["kind"] == "rejected" and failure["pid"] == 2
    assert reason in failure["reason"]


def _federated(**kw):
    s = make_strategy(FedAvgStrategy, overrides="evaluation.federated=true", **kw)
    return s, eval_messages(s)


def test_federated_evaluation_averages_valid_replies_by_test_examples():
    s, msgs = _federated()
    assert [m.metadata.dst_node_id for m in msgs] == [100, 101, 102]
    out = s.aggregate_evaluate(
        1,
        [
            eval_reply(msgs[2], 2, accuracy=0.9, loss=0.5, n=30),
            eval_reply(msgs[0], 0, accuracy=0.5, loss=1.5, n=10),
            eval_reply(msgs[1], 1, accuracy=1.0, loss=0.0, n=NUM_TEST),
        ],
    )
    assert out is not None
    assert s.record["federated_accuracy"] == pytest.approx((27 + 5 + 40) / 80)
    assert s.record["federated_loss"] == pytest.approx((15 + 15) / 80)
    assert s.record["federated_clients"] == {"0": 0.5, "1": 1.0, "2": 0.9}
    assert s.record["federated_failures"] == []


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"pid": 0}, "duplicate result for partition 0"),
        ({"pid": 9}, "partition id 9 outside 0..2"),
        ({"pid": 1}, "partition id 1 in a reply to the message sent to partition 0"),
        ({"pid": 1.9}, "partition id must be an integer, got 1.9"),
        ({"n": 10**9}, f"num-examples 1000000000 exceeds the {NUM_TEST} test samples"),
        ({"n": -3}, "num-examples must be a positive integer, got -3"),
        ({"n": 2.5}, "num-examples must be a positive integer, got 2.5"),
        ({"accuracy": 57}, "accuracy 57 outside [0, 1]"),
        ({"accuracy": -1.0}, "accuracy -1.0 outside [0, 1]"),
        ({"accuracy": float("nan")}, "accuracy nan outside [0, 1]"),
        ({"loss": -1.0}, "loss -1.0 must be finite and >= 0"),
        ({"loss": float("inf")}, "loss inf must be finite and >= 0"),
        ({"loss": [1.0]}, "loss must be a number, got [1.0]"),
        ({"loss": 10**400}, "must be finite and >= 0"),
    ],
)
def test_federated_evaluation_rejects_bad_replies_with_reason(bad, reason):
    """The training-side identity and count checks, plus metrics in range: a duplicate or
    misattributed partition, an out-of-range id, an inflated count or an impossible
    accuracy/loss is recorded as rejected and left out of the federated metrics."""
    s, msgs = _federated()
    args = {"pid": 0, "accuracy": 0.2, "loss": 3.0, "n": 10, **bad}
    replies = [
        eval_reply(msgs[0], 0, accuracy=0.5, loss=1.0, n=10),
        eval_reply(msgs[0], args.pop("pid"), **args),
        eval_reply(msgs[1], 1, accuracy=0.9, loss=2.0, n=30),
    ]
    s.aggregate_evaluate(1, replies)
    assert s.record["federated_accuracy"] == pytest.approx((5 + 27) / 40)
    assert s.record["federated_loss"] == pytest.approx((10 + 60) / 40)
    assert s.record["federated_clients"] == {"0": 0.5, "1": 0.9}
    kinds = [(f["kind"], f["pid"]) for f in s.record["federated_failures"]]
    assert kinds == [("rejected", 0), ("missing", 2)]
    assert reason in s.record["federated_failures"][0]["reason"]


def test_federated_evaluation_records_errors_and_skips_empty_test_splits():
    """A client error is recorded (not silently skipped); a client whose local test split
    is empty honestly reports 0 examples (and NaN metrics) and is left out, not rejected.
    Without a reported test-set size (a node that did not send num-test) the count is only
    required to be a positive integer."""
    s, msgs = _federated(num_test=None)
    s.aggregate_evaluate(
        1,
        [
            Message(Error(code=2, reason="ValueError: bad"), reply_to=msgs[0]),
            eval_reply(msgs[1], 1, accuracy=float("nan"), loss=float("nan"), n=0),
            eval_reply(msgs[2], 2, accuracy=0.25, loss=1.0, n=10**6),
        ],
    )
    assert s.record["federated_accuracy"] == 0.25
    assert [(f["kind"], f["pid"]) for f in s.record["federated_failures"]] == [("error", 0)]


def test_federated_evaluation_without_valid_replies_records_nothing_but_failures():
    s, msgs = _federated()
    assert s.aggregate_evaluate(1, [eval_reply(msgs[0], 0, accuracy=2.0)]) is None
    assert "federated_accuracy" not in s.record
    kinds = [f["kind"] for f in s.record["federated_failures"]]
    assert kinds == ["rejected", "missing", "missing"]


def test_node_query_learns_split_sizes_and_label_counts():
    """The start-up query: num-train bounds training counts; num-test (when the node reports
    it) bounds federated-evaluation counts."""

    class QueryGrid(FakeGrid):
        def send_and_receive(self, messages, timeout=None):
            out = []
            for m in messages:
                pid = m.metadata.dst_node_id - 100
                stats = {"num-train": 50 + pid, "label-counts": [50 + pid, 0]}
                if pid == 0:
                    stats["num-test"] = 7
                content = RecordDict(
                    {
                        "info": ConfigRecord({"partition-id": pid, "num-partitions": 2}),
                        "stats": MetricRecord(stats),
                    }
                )
                out.append(Message(content, reply_to=m))
            return out

    nodes = NodeRegistry(2)
    assert nodes.refresh(QueryGrid([100, 101]), timeout=1.0, strict=True) == 2
    assert [(i.num_examples, i.num_test) for i in nodes.by_pid.values()] == [(50, 7), (51, None)]
    np.testing.assert_array_equal(nodes.label_matrix(2), [[50, 0], [51, 0]])


def test_a_malformed_query_reply_is_skipped_later_and_fatal_at_start_up():
    """A node whose query reply lacks its statistics (not this project's ClientApp) is not
    registered: skipped with a warning and asked again at the next refresh, or, at start-up
    (``strict``), an error naming the node and what is missing."""

    class QueryGrid(FakeGrid):
        def send_and_receive(self, messages, timeout=None):
            out = []
            for m in messages:
                pid = m.metadata.dst_node_id - 100
                records = {"info": ConfigRecord({"partition-id": pid, "num-partitions": 2})}
                if pid == 0:
                    records["stats"] = MetricRecord({"num-train": 5, "label-counts": [5, 0]})
                out.append(Message(RecordDict(records), reply_to=m))
            return out

    nodes = NodeRegistry(2)
    assert nodes.refresh(QueryGrid([100, 101]), timeout=1.0) == 1
    assert nodes.known_pids() == [0] and nodes.asked == {100}
    with pytest.raises(RuntimeError, match=r"node 101: malformed query reply \(KeyError"):
        NodeRegistry(2).refresh(QueryGrid([100, 101]), timeout=1.0, strict=True)


class IdentityGrid(FakeGrid):
    """Nodes that answer the start-up query with the identity given per node id:
    ``(partition-id, num-partitions, num-train)``."""

    def __init__(self, identities: dict[int, tuple[int, int, int]]) -> None:
        super().__init__(list(identities))
        self.identities = identities

    def send_and_receive(self, messages, timeout=None):
        out = []
        for m in messages:
            pid, num, n = self.identities[m.metadata.dst_node_id]
            content = RecordDict(
                {
                    "info": ConfigRecord({"partition-id": pid, "num-partitions": num}),
                    "stats": MetricRecord({"num-train": n, "label-counts": [n, 0]}),
                }
            )
            out.append(Message(content, reply_to=m))
        return out


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        ((2, 3, 5), "node 102 reports num-partitions=3, but the run has 2 partitions"),
        ((2, 2, 5), "node 102 reports partition-id=2, outside 0..1"),
        ((-1, 2, 5), "node 102 reports partition-id=-1, outside 0..1"),
        ((1, 2, 9), "node 102 reports partition 1 with 9 training samples.*but it had 5"),
    ],
)
def test_a_node_that_does_not_fit_the_federation_is_not_used(identity, message, caplog):
    """A SuperNode started with another --node-config (a wrong partition id or count, or
    another dataset's partition) is refused at start-up; later it is skipped with one
    warning, the nodes already known keep their partitions, and once it is restarted with
    the right config (with an authentication key: the same node id) it is taken."""
    grid = IdentityGrid({100: (0, 2, 5), 101: (1, 2, 5), 102: identity})
    with pytest.raises(ValueError, match=message):
        NodeRegistry(2).refresh(grid, timeout=1.0, strict=True)

    nodes = NodeRegistry(2)
    assert nodes.refresh(IdentityGrid({100: (0, 2, 5), 101: (1, 2, 5)}), timeout=1.0) == 2
    assert nodes.refresh(grid, timeout=1.0) == 0
    assert message.split(".*")[0] in caplog.text and "it is not used" in caplog.text
    assert {p: i.node_id for p, i in nodes.by_pid.items()} == {0: 100, 1: 101}
    caplog.clear()
    assert nodes.refresh(grid, timeout=1.0) == 0 and "not used" not in caplog.text  # once
    # restarted with the right --node-config (same key) in place of partition 1's node
    grid.identities[102] = (1, 2, 5)
    grid.node_ids = [100, 102]
    assert nodes.refresh(grid, timeout=1.0) == 1
    assert nodes.node_of(1) == 102 and not nodes.refused


def test_a_second_node_for_a_served_partition_is_refused_while_the_first_answers(caplog):
    """Two SuperNodes started with the same partition-id: at start-up an error that says so
    (not a wait for the partition nobody serves); later the newcomer is not used while the
    node that serves the partition answers for it, and takes over once it does not."""
    grid = IdentityGrid({100: (0, 2, 5), 101: (0, 2, 5)})
    with pytest.raises(ValueError, match="which node 100 serves and still answers for: two"):
        NodeRegistry(2).refresh(grid, timeout=1.0, strict=True)
    nodes = NodeRegistry(2)
    assert nodes.refresh(IdentityGrid({100: (0, 2, 5)}), timeout=1.0) == 1
    assert nodes.refresh(grid, timeout=1.0) == 0 and nodes.node_of(0) == 100
    assert "node 101 reports partition-id=0, which node 100 serves" in caplog.text
    grid.node_ids = [101]  # node 100 went away
    assert nodes.refresh(grid, timeout=1.0) == 1 and nodes.node_of(0) == 101


def test_a_restarted_node_takes_over_while_its_old_id_is_still_listed():
    """A SuperNode without a key restarts with a new node id; Flower lists the old id as
    online for about a minute. The old node does not answer, so the new one takes the
    partition at once, at start-up too (no false "two SuperNodes" error)."""

    class Restarted(IdentityGrid):
        def send_and_receive(self, messages, timeout=None):
            alive = [m for m in messages if m.metadata.dst_node_id != 100]  # 100 is dead
            return super().send_and_receive(alive, timeout)

    nodes = NodeRegistry(2)
    nodes.refresh(IdentityGrid({100: (0, 2, 5), 101: (1, 2, 5)}), timeout=1.0)
    grid = Restarted({100: (0, 2, 5), 101: (1, 2, 5), 102: (0, 2, 5)})
    assert nodes.refresh(grid, timeout=1.0) == 1 and nodes.node_of(0) == 102
    fresh = NodeRegistry(2)  # strict (start-up) refresh: the same
    fresh.add(NodeInfo(0, 100, 5, [5, 0]))
    assert fresh.refresh(grid, timeout=1.0, strict=True) == 2 and fresh.node_of(0) == 102


class StatsGrid(FakeGrid):
    """One node (100, partition 0 of 2) answering with the given statistics."""

    def __init__(self, stats: dict) -> None:
        super().__init__([100])
        self.stats = stats

    def send_and_receive(self, messages, timeout=None):
        info = ConfigRecord({"partition-id": 0, "num-partitions": 2})
        content = RecordDict({"info": info, "stats": MetricRecord(self.stats)})
        return [Message(content, reply_to=m) for m in messages]


@pytest.mark.parametrize(
    ("stats", "message"),
    [
        ({"num-train": float("inf"), "label-counts": [5, 0]}, "num-train = inf is not a whole"),
        ({"num-train": 5.5, "label-counts": [5, 0]}, "num-train = 5.5 is not a whole"),
        ({"num-train": -5, "label-counts": [5, 0]}, "num-train = -5 is negative"),
        ({"num-train": 5, "label-counts": [5.0, float("nan")]}, "entry = nan is not a whole"),
        ({"num-train": 5, "label-counts": [5, 0], "num-test": float("inf")}, "num-test = inf"),
        ({"num-train": 5, "label-counts": 5}, "label-counts is int, not a list"),
        ({"num-train": 5, "label-counts": [5, 0, 0]}, "reports 3 label counts, but the run has 2"),
        ({"num-train": 5, "label-counts": [3, 1]}, "label counts summing to 4, not its 5"),
    ],
)
def test_a_query_reply_with_impossible_statistics_is_not_used(stats, message, caplog):
    """Statistics a ClientApp of this project cannot send (non-whole, negative or infinite
    counts; label counts of another class count or another total) never register the node:
    an error at start-up, a warning later (the run goes on)."""
    with pytest.raises((ValueError, RuntimeError), match=message):
        NodeRegistry(2, num_classes=2).refresh(StatsGrid(stats), timeout=1.0, strict=True)
    nodes = NodeRegistry(2, num_classes=2)
    assert nodes.refresh(StatsGrid(stats), timeout=1.0) == 0 and not nodes.by_pid
    assert message in caplog.text


def test_a_node_that_does_not_answer_its_query_is_logged_and_asked_less_often(caplog):
    """Each query to a silent node holds the round up by the timeout: it is named in the
    log and asked again after 1, 2, 4, ... refreshes (at most 32), at once when it answers."""

    class SilentGrid(FakeGrid):
        answers = False
        queries = 0

        def send_and_receive(self, messages, timeout=None):
            self.queries += len(messages)
            if not self.answers:
                return []
            return StatsGrid({"num-train": 5, "label-counts": [5, 0]}).send_and_receive(messages)

    nodes, grid = NodeRegistry(2), SilentGrid([100])
    asked_at = []
    for refresh in range(12):
        before = grid.queries
        nodes.refresh(grid, 1.0)
        if grid.queries > before:
            asked_at.append(refresh)
    assert asked_at == [0, 2, 5, 10]  # then skips 1, 2 and 4 refreshes
    assert "node(s) [100] did not answer the identity query within 1s" in caplog.text
    grid.answers = True
    for _ in range(9):  # its next query: after 8 skipped refreshes
        nodes.refresh(grid, 1.0)
    assert nodes.node_of(0) == 100 and not nodes.silent
    gone = NodeRegistry(2)
    gone.refresh(SilentGrid([101]), 1.0)
    assert 101 in gone.silent
    gone.refresh(SilentGrid([]), 1.0)  # the node left: its entry goes with it
    assert not gone.silent


def test_a_restarted_node_with_the_same_data_takes_its_partition_back():
    nodes = NodeRegistry(2)
    nodes.refresh(IdentityGrid({100: (0, 2, 5), 101: (1, 2, 5)}), timeout=1.0)
    assert nodes.refresh(IdentityGrid({100: (0, 2, 5), 102: (1, 2, 5)}), timeout=1.0) == 1
    assert nodes.node_of(1) == 102


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


def test_a_round_where_every_client_raised_stops_the_run():
    """A client that raises (a bug, bad data) raises every round: finishing "completed"
    with a global model that never moved would hide it."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    raised = [
        Message(Error(code=2, reason=f"ValueError: bad {i}"), reply_to=m)
        for i, m in enumerate(msgs)
    ]
    with pytest.raises(
        AllClientsFailedError,
        match=r"round 3: all 3 participants failed.*bad 0.*resume=true \(make: RESUME=1; "
        r"deploy/run.sh --resume\) continues from the last checkpoint",
    ):
        s.aggregate_train(3, raised)


RAY_REASON = (  # the shape of Flower's reason for a ClientApp that raised in a Ray actor
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()\n"
    '  File "/work/main/clients/base.py", line 285, in train_local\n'
    "FloatingPointError: client 0: non-finite loss in round 1; lower client.lr\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "flwr.clientapp.client_app.ClientAppException:\n"
    "Exception ClientAppException occurred. Message: client 0: non-finite loss in round 1; "
    "lower client.lr'>"
)


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        (RAY_REASON, "client 0: non-finite loss in round 1; lower client.lr"),
        ("<class 'fl_app.data.DataError'>:<'no file\nthere'>", "DataError: no file there"),
        ("<class 'ValueError'>:<'bad'>", "ValueError: bad"),
        ("Traceback ...\n  File x\nKeyError: 'k'\n\n", "KeyError: 'k'"),
        ("", ""),
        ("x" * 900, "x" * 499 + "…"),
    ],
)
def test_error_message_keeps_the_clients_own_error_on_one_line(reason, message):
    """In simulation a client's error reaches the server as Ray's whole traceback; the
    failure record and AllClientsFailedError keep the client's message only."""
    assert error_message(reason) == message


def test_a_round_where_every_client_raised_in_ray_names_the_clients_error():
    s = make_strategy(FedAvgStrategy)
    raised = [Message(Error(code=2, reason=RAY_REASON), reply_to=m) for m in train_messages(s)]
    with pytest.raises(AllClientsFailedError) as err:
        s.aggregate_train(1, raised)
    assert "(error from partition 0: code 2: client 0: non-finite loss in round 1; lower " in (
        str(err.value)
    )
    assert "ray" not in str(err.value) and "\n" not in str(err.value)


def test_rejected_updates_and_lost_nodes_do_not_stop_the_run():
    """The server's defences (rejected updates) and churn (a node that went away, Flower
    code 5) leave the model as it was and the run goes on."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    nan = {k: np.full_like(v, np.nan) for k, v in TEMPLATE.items()}
    rejected = [reply(m, pid, nan) for pid, m in enumerate(msgs)]
    assert s.aggregate_train(1, rejected) == (None, None)
    assert [f["kind"] for f in s.record["failures"]] == ["rejected"] * 3
    msgs = train_messages(s)
    gone = [Message(Error(code=2, reason="ValueError: x"), reply_to=msgs[0])]
    gone += [Message(Error(code=5, reason="Node Unavailable"), reply_to=m) for m in msgs[1:]]
    assert s.aggregate_train(2, gone) == (None, None)


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
    """Edge case: two opposite deltas have a zero mean, so each has cosine 0 to it by
    convention (Dev = K); non-degenerate cases are checked against the references below."""
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


def _random_round(rng, global_arrays, ns, scale=1.0):
    """Client arrays ``W + Δ_k`` (float32) for one round, one per weight in ``ns``."""
    return [
        {
            k: (g + scale * rng.normal(size=g.shape) + 0.3 * (i + 1)).astype(np.float32)
            for k, g in global_arrays.items()
        }
        for i in range(len(ns))
    ]


def _flat(arrays: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k in TEMPLATE])


def test_round_diagnostics_match_the_reference_functions():
    """The production diagnostics (Gram-matrix path in aggregate_train) on non-degenerate
    deltas from a non-zero global model, with unequal weights: Dev^t (PMFL Def. 1, plain
    mean of the deltas, weights do not enter), cos(global update, Δ_k) and ‖W_new − W‖,
    where the global update is the sample-weighted mean minus W, not the plain mean."""
    rng = np.random.default_rng(3)
    w0 = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in TEMPLATE.items()}
    ns = [5, 40, 12]
    clients = _random_round(rng, w0, ns)
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s, arrays=w0)
    new, _ = s.aggregate_train(1, [reply(msgs[p], p, clients[p], n=ns[p]) for p in range(3)])
    deltas = np.stack([_flat(c) - _flat(w0) for c in clients])
    g = _flat(arrays_of(new)) - _flat(w0)
    weighted = np.average(deltas, axis=0, weights=ns)
    np.testing.assert_allclose(g, weighted, rtol=1e-5, atol=1e-6)
    assert not np.allclose(weighted, deltas.mean(axis=0))  # weights matter here
    dev = update_deviation(deltas)
    assert 0.05 < dev < 2.9  # neither degenerate end
    assert s.record["update_deviation"] == pytest.approx(dev, rel=1e-5)
    assert s.record["global_update_norm"] == pytest.approx(np.linalg.norm(g), rel=1e-5)
    cos = cosine_to_global(g, deltas)
    assert s.record["cos_global_client"] == {
        str(p): pytest.approx(cos[p], rel=1e-5, abs=1e-6) for p in range(3)
    }


def test_update_diagnostics_direct_on_uneven_deltas():
    """update_diagnostics itself, with deltas of very different norms and directions (one
    opposite to the first), against the reference functions."""
    rng = np.random.default_rng(11)
    w0 = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in TEMPLATE.items()}
    base = rng.normal(size=7)
    flats = [base * 3 + rng.normal(size=7) * 0.5, base * 0.2 + rng.normal(size=7), -base]
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s, arrays=w0)
    replies = []
    for p, f in enumerate(flats):
        arr = {"w": w0["w"] + f[:4].reshape(2, 2), "b": w0["b"] + f[4:]}
        replies.append(reply(msgs[p], p, {k: v.astype(np.float32) for k, v in arr.items()}))
    results, _ = s.collect(replies)
    g0 = [w0["w"], w0["b"]]
    deltas = np.stack(
        [
            np.concatenate([(a - g).ravel() for a, g in zip(r.arrays, g0, strict=True)])
            for r in results
        ]
    )
    gram = delta_gram(g0, results)
    np.testing.assert_allclose(gram, deltas.astype(np.float64) @ deltas.T, rtol=1e-5)
    new = [g0[0] + 0.1, g0[1] - 0.4]
    u = np.concatenate([(n - g).ravel() for n, g in zip(new, g0, strict=True)]).astype(np.float64)
    diag = update_diagnostics(g0, new, results, gram)
    assert diag["update_deviation"] == pytest.approx(update_deviation(deltas), rel=1e-5)
    assert diag["global_update_norm"] == pytest.approx(np.linalg.norm(u), rel=1e-5)
    cos = cosine_to_global(u, deltas)
    assert diag["cos_global_client"] == {
        str(p): pytest.approx(cos[p], rel=1e-5, abs=1e-6) for p in range(3)
    }


def _two_rounds(s, rng, w0, ns):
    """Two aggregate rounds as run() drives them; returns the client arrays and new globals."""
    out = []
    w = w0
    for rnd in (1, 2):
        clients = _random_round(rng, w, ns, scale=0.5)
        msgs = train_messages(s, server_round=rnd, arrays=w)
        new, _ = s.aggregate_train(rnd, [reply(msgs[p], p, clients[p], n=ns[p]) for p in range(3)])
        w = arrays_of(new)
        out.append((clients, w))
    return out


def _avg(clients, ns):
    return {k: np.average([np.asarray(c[k], np.float64) for c in clients], 0, ns) for k in TEMPLATE}


def test_fedavgm_two_rounds_match_server_momentum_by_hand():
    """FedAvgM (Flower's convention, as torch.optim.SGD): Δ_t = weighted mean − x_t,
    v_1 = Δ_1, v_t = β·v_{t−1} + Δ_t, x_{t+1} = x_t + η·v_t, with β = server_momentum and
    η = server_lr taken from the config."""
    lr, beta = 0.7, 0.6
    s = make_strategy(
        FedAvgMStrategy,
        overrides=f"server.name=fedavgm server.server_lr={lr} server.server_momentum={beta}",
    )
    rng = np.random.default_rng(5)
    w0 = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in TEMPLATE.items()}
    ns = [10, 25, 4]
    (c1, w1), (c2, w2) = _two_rounds(s, rng, w0, ns)
    for k in TEMPLATE:
        d1 = _avg(c1, ns)[k] - w0[k]
        np.testing.assert_allclose(w1[k], w0[k] + lr * d1, rtol=1e-5, atol=1e-6)
        v2 = beta * d1 + (_avg(c2, ns)[k] - w1[k])
        np.testing.assert_allclose(w2[k], w1[k] + lr * v2, rtol=1e-5, atol=1e-6)
        # Flower keeps the buffer in pseudo-gradient sign (x_t − mean), i.e. −v_t
        np.testing.assert_allclose(
            s.state_dict()["momentum_vector"][list(TEMPLATE).index(k)], -v2, rtol=1e-5, atol=1e-6
        )


def test_fedadam_two_rounds_match_adam_by_hand():
    """FedAdam (Reddi et al. 2021, Alg. 2, as Flower implements it): Δ_t = weighted mean −
    x_t, m_t = β1·m + (1−β1)·Δ_t, v_t = β2·v + (1−β2)·Δ_t², x_{t+1} = x_t + η_t·m_t /
    (√v_t + τ). Flower adds an Adam-style bias correction that Reddi et al. do not have,
    η_t = η·√(1−β2^(t+1)) / (1−β1^(t+1)) with t the server round."""
    eta, b1, b2, tau = 0.05, 0.8, 0.95, 0.02
    s = make_strategy(
        FedAdamStrategy,
        overrides=(
            f"server.name=fedadam server.server_lr={eta} server.beta_1={b1} "
            f"server.beta_2={b2} server.tau={tau}"
        ),
    )
    rng = np.random.default_rng(8)
    w0 = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in TEMPLATE.items()}
    ns = [10, 25, 4]
    (c1, w1), (c2, w2) = _two_rounds(s, rng, w0, ns)
    for k in TEMPLATE:
        m = v = 0.0
        x = w0[k].astype(np.float64)
        for t, (clients, got) in enumerate(((c1, w1), (c2, w2)), start=1):
            d = _avg(clients, ns)[k] - x
            m = b1 * m + (1 - b1) * d
            v = b2 * v + (1 - b2) * d**2
            eta_t = eta * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
            x = x + eta_t * m / (np.sqrt(v) + tau)
            np.testing.assert_allclose(got[k], x, rtol=1e-5, atol=1e-6)
            assert got[k].dtype == np.float32  # computed in float64, sent as the model holds it
            x = np.asarray(got[k], np.float64)  # the next round starts from what was sent
        np.testing.assert_allclose(s.state_dict()["m_t"][k], m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s.state_dict()["v_t"][k], v, rtol=1e-5, atol=1e-8)


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


class _FakeClock:
    """Stands in for the ``time`` module of strategies.base: ``sleep`` advances ``now``
    instantly and is recorded, so send_and_receive's polling runs in fake time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class _DelayedGrid:
    """Push/pull grid whose reply to message i is ready ``delays[i]`` s (on ``clock``)
    after the push."""

    def __init__(self, delays: list[float], clock: _FakeClock) -> None:
        self.delays, self.clock, self.pulls = delays, clock, 0
        self.ready_at: dict[str, float] = {}

    def push_messages(self, messages):
        for i, _ in enumerate(messages):
            self.ready_at[f"m{i}"] = self.clock.now + self.delays[i]
        return list(self.ready_at)

    def pull_messages(self, ids):
        self.pulls += 1
        out = [i for i in ids if self.ready_at[i] <= self.clock.now]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in out]


@pytest.fixture
def clock(monkeypatch) -> _FakeClock:
    fake = _FakeClock()
    monkeypatch.setattr(strategies.base, "time", fake)
    return fake


def test_send_and_receive_returns_as_soon_as_the_last_reply_is_ready(clock):
    """Returned at the first pull after the last reply is ready (at most one poll wait
    late), not at the timeout; the waits double from POLL_FIRST_S up to POLL_MAX_S, so the
    pulls are few (no busy loop) and a reply is never waited for longer than POLL_MAX_S."""
    grid = _DelayedGrid([0.0, 0.03, 0.5], clock)
    got = send_and_receive(grid, ["a", "b", "c"], timeout=30.0)
    assert sorted(m.metadata.reply_to_message_id for m in got) == ["m0", "m1", "m2"]
    assert 0.5 <= clock.now <= 0.5 + clock.sleeps[-1]
    assert clock.sleeps[-1] <= POLL_MAX_S
    assert clock.sleeps == [min(POLL_FIRST_S * 2**i, POLL_MAX_S) for i in range(grid.pulls - 1)]
    assert clock.sleeps[-1] == POLL_MAX_S  # grew to the cap: the last reply took 0.5 s
    assert grid.pulls == len(clock.sleeps) + 1 <= 6 + 0.5 / POLL_MAX_S + 1


def test_send_and_receive_returns_without_waiting_when_all_replies_are_in(clock):
    grid = _DelayedGrid([0.0, 0.0], clock)
    assert len(send_and_receive(grid, ["a", "b"], timeout=30.0)) == 2
    assert (grid.pulls, clock.sleeps, clock.now) == (1, [], 0.0)


def test_send_and_receive_gives_up_at_the_timeout_with_what_arrived(clock):
    """A reply not ready by the timeout is not waited for: the last wait is cut to the time
    left, so it returns at the timeout (not up to a poll wait later) with what arrived."""
    grid = _DelayedGrid([0.0, 60.0], clock)
    got = send_and_receive(grid, ["a", "b"], timeout=0.2)
    assert [m.metadata.reply_to_message_id for m in got] == ["m0"]
    assert clock.now == pytest.approx(0.2, abs=1e-12)
    assert clock.sleeps[-1] < POLL_MAX_S and max(clock.sleeps) == POLL_MAX_S


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


def test_cast_like_rounds_integers_and_keeps_matching_arrays():
    """Aggregates go back to the model's dtype (StrategyBase.to_record, PMFL's update):
    float64 → float32, integer buffers rounded (2.9999999 → 3, not truncated to 2), and an
    array already in the dtype is returned as is, without a copy."""
    got = cast_like(np.array([0.1, 2.5], np.float64), np.zeros(2, np.float32))
    assert got.dtype == np.float32 and np.allclose(got, [0.1, 2.5])
    ints = cast_like(np.array([2.9999999, -1.2]), np.zeros(2, np.int64))
    assert ints.dtype == np.int64 and ints.tolist() == [3, -1]
    same = np.ones(3, np.float32)
    assert cast_like(same, np.zeros(3, np.float32)) is same


@pytest.mark.parametrize(
    ("cls", "method"),
    [(FedAvgStrategy, "fedavg"), (FedAvgMStrategy, "fedavg_m"), (FedAdamStrategy, "fedavg_adam")],
)
def test_uniform_weighting_takes_the_plain_mean(cls, method):
    """``server.weighting: uniform`` (FedRCL's server, skynbe/FedRCL servers/base.py) weighs
    every result 1 whatever its sample count, with each Flower aggregation; ``samples`` (the
    default) weighs by num-examples. The clients' metrics stay sample-weighted. FedAvgM's
    first step (no momentum yet) and FedAdam's are functions of the same mean."""
    means = {}
    for weighting in ("samples", "uniform"):
        s = make_strategy(cls, method, overrides=f"server.weighting={weighting}")
        assert s.cfg["server"]["weighting"] == weighting
        msgs = train_messages(s)
        new, _ = s.aggregate_train(
            1,
            [
                reply(msgs[0], 0, _arrays(1.0), n=10, train_loss=1.0),
                reply(msgs[1], 1, _arrays(4.0), n=30, train_loss=3.0),
                reply(msgs[2], 2, _arrays(-2.0), n=60, train_loss=0.0),
            ],
        )
        means[weighting] = arrays_of(new)["w"]
        assert s.record["train"]["train_loss"] == pytest.approx((10 + 90) / 100)
        assert s.record["clients"]["1"]["num_examples"] == 30
    if cls is FedAvgStrategy:
        np.testing.assert_allclose(
            means["samples"], (10 * 1.0 + 30 * 4.0 - 60 * 2.0) / 100, rtol=1e-6
        )
        np.testing.assert_allclose(means["uniform"], (1.0 + 4.0 - 2.0) / 3, rtol=1e-6)
    elif cls is FedAvgMStrategy:  # first round: W + η·Δ̄ with η = 1
        np.testing.assert_allclose(means["samples"], 0.1, rtol=1e-6)
        np.testing.assert_allclose(means["uniform"], 1.0, rtol=1e-6)
    else:  # FedAdam moves each weight by ≈ η·sign(Δ̄) in its first step: both means are > 0
        assert (means["samples"] > 0).all() and (means["uniform"] > 0).all()
        assert not np.allclose(means["samples"], means["uniform"])


def test_weighting_is_a_checked_choice():
    from fl_app.config import ConfigError, load_config

    assert load_config("tiny", "fedavg")["server"]["weighting"] == "samples"
    with pytest.raises(ConfigError, match=r"'server.weighting' = 'equal'.*samples \| uniform"):
        load_config("tiny", "fedavg", "server.weighting=equal")
