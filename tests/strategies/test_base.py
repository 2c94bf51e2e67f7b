import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message
from flwr.common import MessageType

from strategies.base import AllClientsFailedError, RayNodeLostError, weighted_mean
from strategies.fedavg import FedAvgStrategy
from tests.core.reference import cosine_to_global, update_deviation

from .helpers import (
    NUM_TEST,
    NUM_TRAIN,
    RAY_REASON,
    TEMPLATE,
    FakeGrid,
    arrays_of,
    eval_messages,
    eval_reply,
    filled,
    make_strategy,
    random_round,
    reply,
    train_messages,
)


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
        reply(msgs[0], 0, filled(1.0), n=10),
        reply(msgs[1], 1, filled(4.0), n=30),
        reply(msgs[2], 2, filled(-2.0), n=60),
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
        reply(msgs[0], 0, filled(1.0)),
        reply(msgs[1], 1, filled(3.0)),
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
        reply(msgs[0], 0, filled(1.0)),
        reply(msgs[1], 7, filled(3.0)),
        reply(msgs[0], 0, filled(5.0)),
        reply(msgs[2], 2, filled(5.0), n=0),
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
    replies = [reply(msgs[0], claimed, filled(9.0)), reply(msgs[2], 2, filled(1.0))]
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
        reply(msgs[0], 0, filled(1.0), n=NUM_TRAIN),  # exactly the partition: accepted
        reply(msgs[1], 1, filled(7.0), n=10**12),
        reply(msgs[2], 2, filled(3.0), n=NUM_TRAIN + 1),
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
        reply(msgs[0], 0, filled(1.0), n=10),
        reply(msgs[1], 1, filled(4.0), n=NUM_TRAIN + 20),
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
        reply(msgs[0], 0, filled(1.0), n=10, train_loss=1.0, fit_seconds=2.0),
        reply(msgs[1], 1, filled(3.0), n=30, train_loss=3.0, fit_seconds=4.0),
        reply(msgs[2], 2, filled(9.0), n=60, **metrics),
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


def test_unexpected_payload_is_rejected_by_plain_strategies():
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [reply(msgs[0], 0, filled(1.0), payload={"x": np.zeros(2, np.float32)})]
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


def test_a_round_where_every_client_raised_in_ray_names_the_clients_error():
    s = make_strategy(FedAvgStrategy)
    raised = [Message(Error(code=2, reason=RAY_REASON), reply_to=m) for m in train_messages(s)]
    with pytest.raises(AllClientsFailedError) as err:
        s.aggregate_train(1, raised)
    assert "(error from partition 0: code 2: client 0: non-finite loss in round 1; lower " in (
        str(err.value)
    )
    assert "ray" not in str(err.value) and "\n" not in str(err.value)


ACTOR_GONE = (  # Flower's reason when a client's Ray actor died with its node (seen live)
    "<class 'ray.exceptions.ActorUnavailableError'>:<'The actor 6f18 is unavailable: The "
    "actor is temporarily unavailable: RpcError: RPC error: Socket closed rpc_code: 14.'>"
)


def test_a_lost_ray_actor_stops_the_run_with_its_reason():
    """Flower's Ray backend puts a dead actor back into its pool, so it would fail clients
    in every later round (seen on a two-node cluster whose worker was killed): the run
    stops with the reason and the way to resume."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [
        reply(msgs[0], 0, filled(1.0)),
        Message(Error(code=0, reason=ACTOR_GONE), reply_to=msgs[1]),
        reply(msgs[2], 2, filled(1.0)),
    ]
    with pytest.raises(
        RayNodeLostError,
        match=r"round 4: partition 1's Ray actor is gone \(code 0: ActorUnavailableError: The "
        r"actor 6f18 is unavailable.*resume=true \(make: RESUME=1\) continues",
    ):
        s.aggregate_train(4, replies)


def test_the_round_log_says_where_each_client_ran():
    """A training reply's host and Ray node (``fl_app.client_app.where``) reach the round
    log's ``clients`` entry; other info entries and non-strings are left out."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    replies = [reply(m, i, filled(1.0)) for i, m in enumerate(msgs)]
    replies[0].content["info"] = ConfigRecord(
        {"partition-id": 0, "host": "gpu-1", "ray-node": "ab12", "ray-node-ip": "10.0.0.2",
         "numerics": "torch 2.14.1, cpu AVX2"}
    )  # fmt: skip
    replies[1].content["info"] = ConfigRecord({"partition-id": 1, "host": 7, "other": "x"})
    s.aggregate_train(1, replies)
    clients = s.record["clients"]
    assert {k: clients["0"][k] for k in ("host", "ray_node", "ray_node_ip", "numerics")} == {
        "host": "gpu-1", "ray_node": "ab12", "ray_node_ip": "10.0.0.2",
        "numerics": "torch 2.14.1, cpu AVX2",
    }  # fmt: skip
    assert set(clients["1"]) == set(clients["2"]) == {"num_examples"}


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
            reply(msgs[0], 0, filled(1.0), n=10, train_loss=1.0),
            reply(msgs[1], 1, filled(1.0), n=30, train_loss=3.0),
        ],
    )
    assert s.record["train"]["train_loss"] == pytest.approx(2.5)
    assert set(s.record["clients"]) == {"0", "1"}


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
    clients = random_round(rng, w0, ns)
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


def test_error_from_superlink_is_attributed_to_the_dead_node_not_double_counted():
    """A dead node's error reply comes from the SuperLink (node id 1) and names the message
    it answers: it must count once, as that partition's failure, not also as 'missing'."""
    s = make_strategy(FedAvgStrategy)
    msgs = train_messages(s)
    for i, m in enumerate(msgs):  # what the Grid does when it sends them
        m.metadata.__dict__["_message_id"] = f"m{i}"
    err = Message(Error(code=5, reason="Node Unavailable"), reply_to=msgs[1])
    err.metadata.__dict__["_src_node_id"] = 1
    s.aggregate_train(1, [reply(msgs[0], 0, filled(1.0)), err, reply(msgs[2], 2, filled(1.0))])
    assert [(f["kind"], f["pid"]) for f in s.record["failures"]] == [("error", 1)]


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


def test_weighting_is_a_checked_choice():
    from core.params import ConfigError
    from fl_app.config import load_config

    assert load_config("tiny", "fedavg")["server"]["weighting"] == "samples"
    with pytest.raises(ConfigError, match=r"'server.weighting' = 'equal'.*samples \| uniform"):
        load_config("tiny", "fedavg", "server.weighting=equal")
