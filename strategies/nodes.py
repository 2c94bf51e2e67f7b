"""Node identity: which Flower node serves which partition of the federation.

Partition ids are what the clients report at start-up (the ClientApp answers a QUERY message
with its ``partition-id``, the number of partitions, its split sizes and label counts); node
ids are Flower's. :class:`NodeRegistry` maps one to the other, asks new nodes for their
identity as they connect (a restarted SuperNode without an authentication key comes back
with a new node id but the same partition id), and refuses nodes that do not fit the
federation. :func:`send_and_receive` is the reply poller every exchange of a round uses.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import MessageType
from flwr.serverapp import Grid

from strategies.replies import error_message

log = logging.getLogger("fl_app")

POLL_FIRST_S, POLL_MAX_S = 0.002, 0.05  # reply polling: first wait, longest wait
#: How long a node already serving a partition gets to answer when another node claims it
PROBE_TIMEOUT_S = 10.0


def send_and_receive(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and pull their replies until all arrived or ``timeout`` seconds passed.

    Same contract as ``Grid.send_and_receive``, but polls every 2 ms growing to 50 ms instead
    of Flower's fixed sleep between pulls (0.1 s in simulation, 3 s in deployment), which
    otherwise adds up to that much idle time to every train and evaluate exchange. A grid
    without push/pull (the tests' in-process grid) is used as is."""
    if not hasattr(grid, "push_messages"):
        return list(grid.send_and_receive(messages, timeout=timeout))
    pending = {mid for mid in grid.push_messages(messages) if mid}
    replies: list[Message] = []
    deadline, wait = time.monotonic() + timeout, POLL_FIRST_S
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0:
            break
        time.sleep(min(wait, remaining))
        wait = min(2 * wait, POLL_MAX_S)
    return replies


class NoNodesError(RuntimeError):
    """No node of the federation connected for ``server.wait_for_nodes`` seconds: the run
    stops at the last completed round instead of running the rest with no one."""

    def __init__(self, server_round: int, waited: float) -> None:
        super().__init__(
            f"round {server_round}: no node of the federation connected for {waited:.0f}s "
            "(server.wait_for_nodes); start the SuperNodes again, then resume=true "
            "(make: RESUME=1; deploy/run.sh --resume) continues from the last checkpoint"
        )


@dataclass
class NodeInfo:
    """A node as its start-up query described it: partition id, node id, its training-set
    size (``num-train``: the most a training reply may claim as num-examples), label counts
    and, when the node reports ``num-test``, its local test-set size (bounds federated
    evaluation counts; ``None``: not reported, unbounded)."""

    pid: int
    node_id: int
    num_examples: int = 0
    label_counts: list[int] = field(default_factory=list)
    num_test: int | None = None


class NodeRegistry:
    """Partition id ↔ node id. Partition ids are what the clients report (a restarted
    SuperNode without a key comes back with a new node id but the same partition id; with
    an authentication key it keeps its node id)."""

    def __init__(self, num_clients: int, num_classes: int | None = None) -> None:
        self.num_clients, self.num_classes = num_clients, num_classes
        self.by_pid: dict[int, NodeInfo] = {}
        self.asked: set[int] = set()  # accepted nodes: not asked again
        self.refused: dict[int, str] = {}  # node id -> why; asked again at every refresh
        # node id -> (refreshes to skip, silent answers so far): a node that does not answer
        # its query is asked again after 1, 2, 4, ... 32 refreshes, not every round
        self.silent: dict[int, tuple[int, int]] = {}

    def add(self, info: NodeInfo) -> None:
        self.by_pid[info.pid] = info

    def node_of(self, pid: int) -> int | None:
        """The node that serves partition ``pid`` (None: no node has reported it)."""
        info = self.by_pid.get(pid)
        return info.node_id if info else None

    def known_pids(self) -> list[int]:
        return sorted(self.by_pid)

    def connected_pids(self, node_ids: Iterable[int]) -> list[int]:
        alive = set(node_ids)
        return sorted(p for p, i in self.by_pid.items() if i.node_id in alive)

    def refresh(self, grid: Grid, timeout: float, strict: bool = False) -> int:
        """Ask nodes not seen before for their identity (QUERY); returns how many were added.

        A SuperNode that restarts with a new node id is found here and mapped to its
        partition again. A node whose identity does not fit this federation (another number
        of partitions, a partition id outside ``0..num_clients-1``, a new node for a known
        partition with other data) is not used: a ValueError at start-up (``strict``), later
        a warning (once per reported identity), and it is asked again at every refresh, so
        that the node restarted with the right ``--node-config`` (with an authentication key
        it keeps its node id) is taken. An error reply or a malformed one leaves the node
        unregistered, to be asked again next time; with ``strict`` either is a
        RuntimeError."""
        node_ids = list(grid.get_node_ids())
        listed = set(node_ids)
        for gone in [n for n in (*self.silent, *self.refused) if n not in listed]:
            self.silent.pop(gone, None)
            self.refused.pop(gone, None)
        new = [n for n in node_ids if n not in self.asked and not self._skip_silent(n)]
        if not new:
            return 0
        added = 0
        replies = send_and_receive(grid, [_identity_query(n) for n in new], timeout)
        self._note_silent(new, {r.metadata.src_node_id for r in replies}, timeout, strict)
        for reply in replies:
            if reply.has_error():
                if strict:  # at start-up: a node that cannot even load its data is fatal
                    raise RuntimeError(f"node query failed: {error_message(reply.error.reason)}")
                log.warning("node query failed: %s", error_message(reply.error.reason))
                continue
            node = reply.metadata.src_node_id
            try:
                info, num = _node_info(reply)
            except ValueError as err:  # not this project's ClientApp answering
                if strict:
                    raise RuntimeError(f"node {node}: {err}") from err
                log.warning("node %s: %s; it is asked again at the next refresh", node, err)
                continue
            known = self.by_pid.get(info.pid)
            # a restarted SuperNode (without a key: a new node id) while its old id is still
            # listed (Flower drops it after ≈60 s), or a second SuperNode?
            served = (
                known is not None
                and known.node_id != node
                and known.node_id in listed
                and self._answers(grid, known.node_id, info.pid, timeout)
            )
            problem = self.identity_problem(info, num, served)
            if problem:
                if strict:
                    raise ValueError(f"node {node} {problem}")
                if self.refused.get(node) != problem:
                    log.warning("node %s %s: it is not used", node, problem)
                self.refused[node] = problem
                continue
            if info.pid in self.by_pid:
                log.info("partition %d now served by node %s", info.pid, node)
            self.add(info)
            self.refused.pop(node, None)
            self.asked.add(node)
            added += 1
        return added

    def wait_connected(
        self, grid: Grid, server_round: int, timeout: float, wait: float
    ) -> list[int]:
        """The partitions whose nodes are connected now (new nodes asked for their identity
        first, each query waiting at most ``timeout`` s). With none, waits up to ``wait``
        seconds (``server.wait_for_nodes``) for one to come back (SuperNodes restarting, a
        network outage) instead of running rounds with no one; then :class:`NoNodesError`."""
        deadline = None
        while True:
            left = timeout if deadline is None else max(deadline - time.monotonic(), 1.0)
            self.refresh(grid, timeout=min(timeout, left))
            connected = self.connected_pids(grid.get_node_ids())
            if connected:
                if deadline is not None:
                    log.info("round %d: %d node(s) connected again", server_round, len(connected))
                return connected
            if deadline is None:
                log.warning(
                    "round %d: no node of the federation is connected; waiting up to "
                    "server.wait_for_nodes=%.0fs for one",
                    server_round,
                    wait,
                )
                deadline = time.monotonic() + wait
            elif time.monotonic() >= deadline:
                raise NoNodesError(server_round, wait)
            time.sleep(min(1.0, wait))

    def _answers(self, grid: Grid, node: int, pid: int, timeout: float) -> bool:
        """Whether ``node`` answers an identity query (within ``min(timeout, 10)`` s) as the
        node of partition ``pid``."""
        for reply in send_and_receive(grid, [_identity_query(node)], min(timeout, PROBE_TIMEOUT_S)):
            if reply.has_error() or reply.metadata.src_node_id != node:
                continue
            try:
                return _node_info(reply)[0].pid == pid
            except ValueError:
                return False
        return False

    def _skip_silent(self, node: int) -> bool:
        """Whether a node that did not answer its last query sits this refresh out."""
        if node not in self.silent:
            return False
        skip, count = self.silent[node]
        self.silent[node] = (skip - 1, count)
        return skip > 0

    def _note_silent(
        self, asked: list[int], answered: set[int], timeout: float, strict: bool
    ) -> None:
        """Log the nodes that did not answer their query within ``timeout`` and back off
        from asking them (each such query holds a round up by ``timeout``)."""
        quiet = [n for n in asked if n not in answered]
        for n in answered:
            self.silent.pop(n, None)
        if not quiet or strict:  # at start-up discover_nodes waits and names the missing
            return
        for n in quiet:
            count = self.silent.get(n, (0, 0))[1] + 1
            self.silent[n] = (min(2 ** (count - 1), 32), count)
        log.warning(
            "node(s) %s did not answer the identity query within %.0fs; asked again after "
            "skipping %s refresh(es) (one a round) (a connected SuperNode whose ClientApp "
            "does not respond: check its log)",
            quiet,
            timeout,
            [self.silent[n][0] for n in quiet],
        )

    def identity_problem(
        self, info: NodeInfo, num_partitions: int, served: bool = False
    ) -> str | None:
        """Why a node that reports ``info`` and ``num-partitions=num_partitions`` cannot
        serve this federation of ``num_clients`` partitions (None: it can). Its label counts
        must be one per class and sum to its training samples. A partition already known
        must come back with the same data (a restarted node does: partitions are seeded);
        other label counts mean another dataset or partition config, whose node would
        corrupt the sample weights and the participation model. Nor may a node take over a
        partition that is ``served`` (its known node, another one, still answers for it): two
        SuperNodes started with the same ``partition-id``."""
        n, pid = self.num_clients, info.pid
        if num_partitions != n:
            return f"reports num-partitions={num_partitions}, but the run has {n} partitions"
        if not 0 <= pid < n:
            return f"reports partition-id={pid}, outside 0..{n - 1}"
        c = self.num_classes
        if c is not None and len(info.label_counts) != c:
            return f"reports {len(info.label_counts)} label counts, but the run has {c} classes"
        if info.label_counts and sum(info.label_counts) != info.num_examples:
            return (
                f"reports label counts summing to {sum(info.label_counts)}, not its "
                f"{info.num_examples} training samples"
            )
        known = self.by_pid.get(pid)
        if known is not None and (known.num_examples, known.label_counts) != (
            info.num_examples,
            info.label_counts,
        ):
            return (
                f"reports partition {pid} with {info.num_examples} training samples and label"
                f" counts {info.label_counts}, but it had {known.num_examples} and"
                f" {known.label_counts} (another dataset or partition config)"
            )
        if served and known is not None:
            return (
                f"reports partition-id={pid}, which node {known.node_id} serves and still "
                "answers for: two SuperNodes started with the same partition-id? Give each its "
                'own --node-config "partition-id=..."'
            )
        return None

    def label_matrix(self, num_classes: int) -> np.ndarray:
        out = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for pid, info in self.by_pid.items():
            if info.label_counts:
                out[pid] = info.label_counts
        return out


def _identity_query(node: int) -> Message:
    """The start-up query that asks ``node`` for its identity (the ClientApp's ``query``)."""
    return Message(
        RecordDict({"config": ConfigRecord({})}), dst_node_id=node, message_type=MessageType.QUERY
    )


def _node_info(reply: Message) -> tuple[NodeInfo, int]:
    """A node's answer to the start-up query (the ClientApp's ``query``): its
    :class:`NodeInfo` and the number of partitions it was told. ValueError names what is
    missing or malformed."""
    try:
        info: dict[str, Any] = dict(reply.content.config_records["info"])
        stats: dict[str, Any] = dict(reply.content.metric_records["stats"])
        counts = stats["label-counts"]
        if not isinstance(counts, list):
            raise TypeError(f"label-counts is {type(counts).__name__}, not a list")
        num_test = stats.get("num-test")
        return NodeInfo(
            _count(info["partition-id"], "partition-id", negative=True),  # range: see refresh
            reply.metadata.src_node_id,
            _count(stats["num-train"], "num-train"),
            [_count(c, "label-counts entry") for c in counts],
            None if num_test is None else _count(num_test, "num-test"),
        ), _count(info["num-partitions"], "num-partitions")
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"malformed query reply ({type(err).__name__}: {err})") from err


def _count(value: Any, name: str, negative: bool = False) -> int:
    """A whole number ≥ 0 (any sign with ``negative``) from a node's reply: an ``int``, or a
    float with an integral value (MetricRecord may carry either); ValueError otherwise
    (bool, inf, NaN, 1.5, −1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} = {value!r} is not a number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name} = {value!r} is not a whole number")
    if value < 0 and not negative:
        raise ValueError(f"{name} = {value!r} is negative")
    return int(value)
