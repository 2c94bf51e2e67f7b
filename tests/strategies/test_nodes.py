"""strategies/nodes.py: the node registry (identity queries, refused and silent nodes) and
the reply poller."""

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

import strategies.nodes
from strategies.nodes import POLL_FIRST_S, POLL_MAX_S, NodeInfo, NodeRegistry, send_and_receive

from .helpers import FakeGrid


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


class _FakeClock:
    """Stands in for the ``time`` module of strategies.nodes: ``sleep`` advances ``now``
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
    monkeypatch.setattr(strategies.nodes, "time", fake)
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
