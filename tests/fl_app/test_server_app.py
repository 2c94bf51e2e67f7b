"""The real ServerApp main over an in-process Grid: every method end to end, fast."""

import json
import logging

import numpy as np
import pytest
from flwr.common import MessageType

from core.params import ConfigError
from core.training import numerics

METHODS = [
    "fedavg",
    "fedprox",
    "moon",
    "fedrcl",
    "fedscl",
    "fedrane",
    "fedrane_wo_lra",
    "fedccl",
    "pmfl",
    "fedau",
]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_and_writes_results(run_in_process, method):
    res = run_in_process(method)
    s = res["summary"]
    assert s["status"] == "completed" and s["rounds_completed"] == 2
    assert s["method"] == method and s["final_accuracy"] > 0.15  # 10 classes: chance is 0.1
    recs = res["records"]
    assert [r["round"] for r in recs] == [0, 1, 2]
    assert recs[-1]["num_results"] == 3 and recs[-1]["failures"] == []
    assert "update_deviation" in recs[-1] and len(recs[-1]["cos_global_client"]) == 3
    for name in ("config.yaml", "rounds.jsonl", "summary.json"):
        assert (res["dir"] / name).is_file()


def test_summary_fields(run_in_process):
    s = run_in_process("fedavg", set_="num_rounds=3")["summary"]
    for key in (
        "method",
        "experiment",
        "seed",
        "rounds_completed",
        "final_accuracy",
        "best_accuracy",
        "ema_accuracy",
        "last5_accuracy",
        "top5_accuracy",
        "wall_seconds",
        "final_personal_accuracy",
    ):
        assert key in s, key
    assert s["best_accuracy"] >= s["final_accuracy"]
    assert s["numerics"] == [numerics("cpu")]  # every client trained on this CPU


@pytest.mark.parametrize("method", ["fedccl", "fedccl_m", "fedccl_gne", "fedccl_au"])
def test_fedccl_prototypes_cross_the_wire_both_ways(run_in_process, method):
    """With each server that carries FedCCL's signals: plain, FedAvgM and GNE aggregation."""
    res = run_in_process(method, set_="num_rounds=3")
    sent = [m for m in res["grid"].sent if m.metadata.message_type == "train"]
    first, later = sent[:3], sent[3:]
    assert all("payload" not in m.content.array_records for m in first)
    assert all("payload" in m.content.array_records for m in later)
    payload = later[0].content["payload"]
    assert set(payload) == {"local_signals", "local_labels", "global_signals", "global_mask"}
    assert res["records"][1]["classes_with_signal"] == 10
    assert ("gne_status" in res["records"][1]) == (method == "fedccl_gne")


def test_federation_size_mismatch_is_a_clear_error(run_in_process):
    with pytest.raises(ConfigError, match=r"num-supernodes=3"):
        from tests.conftest import InProcessGrid, run_config

        grid = InProcessGrid(run_config("fedavg"), num_nodes=2, num_partitions=2)
        run_in_process("fedavg", grid=grid)


def test_a_node_started_with_a_wrong_partition_id_is_a_clear_error(run_in_process, tmp_path):
    """SuperNodes started as partitions 0, 1, 3 of 3: refused at start-up with the
    --node-config to use, before the run directory is touched (it used to pass the count
    check and fail later with an IndexError, after the earlier results were replaced)."""
    from tests.conftest import InProcessGrid, run_config

    grid = InProcessGrid(run_config("fedavg"), num_nodes=3)
    grid.contexts[1002].node_config["partition-id"] = 3
    with pytest.raises(
        ConfigError, match=r"node 1002 reports partition-id=3, outside 0..2.*partition-id=<0..2>"
    ):
        run_in_process("fedavg", grid=grid)
    assert not (tmp_path / "out").exists()


def test_client_failure_does_not_stop_the_run(run_in_process):
    from flwr.app import Error, Message

    def fail_node_1(msg, reply):
        if msg.metadata.message_type == "train" and msg.metadata.dst_node_id == 1001:
            return Message(Error(code=1, reason="injected crash"), reply_to=msg)
        return reply

    res = run_in_process("fedavg", intercept=fail_node_1, failures_ok=True)
    rec = res["records"][1]
    assert rec["num_results"] == 2 and rec["failures"][0]["kind"] == "error"
    assert res["summary"]["failed_results"] == 2 and res["summary"]["status"] == "completed"


def test_a_client_that_always_raises_fails_the_run(run_in_process, tmp_path):
    """E.g. a client bug: the run stops at round 1 with status "failed" and the client's
    error, instead of finishing "completed" with the initial model."""
    from flwr.app import Error, Message

    from strategies.base import AllClientsFailedError

    def fail_all(msg, reply):
        if msg.metadata.message_type == "train":
            return Message(Error(code=2, reason="ValueError: broken client"), reply_to=msg)
        return reply

    with pytest.raises(AllClientsFailedError, match="round 1: all 3 .*broken client"):
        run_in_process("fedavg", intercept=fail_all)
    summary = json.loads((tmp_path / "out/tiny/fedavg/seed0/summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_completed"] == 0
    assert summary["reason"].startswith("AllClientsFailedError: round 1: all 3 participants")
    assert "ValueError: broken client" in summary["reason"]


def test_missing_nodes_message_tells_a_slow_start_from_a_small_federation():
    """Nodes that are connected but have not answered yet (ClientApps starting on a busy
    machine) need a longer wait, not another federation size."""
    from fl_app.config import load_config
    from fl_app.server_app import missing_nodes_message
    from strategies.nodes import NodeInfo, NodeRegistry

    cfg = load_config("tiny", "fedavg")  # 3 clients, wait_for_nodes 60
    nodes = NodeRegistry(3, 10)
    nodes.add(NodeInfo(pid=0, node_id=11))
    slow = missing_nodes_message(cfg, nodes, {11, 12, 13})
    assert "only 1 of 3 nodes answered" in slow and "missing partitions [1, 2]" in slow
    assert "all 3 nodes are connected but 2 did not answer" in slow
    assert 'SET="server.wait_for_nodes=240"' in slow and "num-supernodes" not in slow
    few = missing_nodes_message(cfg, nodes, {11})
    assert "num-supernodes=3" in few and "did not answer" not in few
    both = missing_nodes_message(cfg, nodes, {11, 12})
    assert "2 nodes are connected, 1 of them silent" in both and "num-supernodes=3" in both


def test_a_federation_that_stays_gone_stops_the_run_and_resume_goes_on(run_in_process, tmp_path):
    """Every SuperNode gone after round 1 (an outage): the server waits
    ``server.wait_for_nodes`` for one to come back, then stops with status "failed" at round
    1 instead of running rounds 2.. with no one; once they are back, resume=true runs them."""
    from strategies.nodes import NoNodesError
    from tests.conftest import InProcessGrid, run_config

    class Outage:
        def __init__(self, grid):
            self.grid, self.rounds = grid, 0

        def get_node_ids(self):
            return [] if self.rounds >= 1 else self.grid.get_node_ids()

        def send_and_receive(self, messages, timeout=None):
            replies = self.grid.send_and_receive(messages, timeout)
            self.rounds += any(m.metadata.message_type == "train" for m in messages)
            return replies

    set_ = "num_rounds=3 server.wait_for_nodes=1"
    grid = InProcessGrid(run_config("fedavg", set_=set_), 3)
    with pytest.raises(NoNodesError, match="round 2: no node .* connected for 1s.*resume=true"):
        run_in_process("fedavg", set_, grid=Outage(grid))
    summary = json.loads((tmp_path / "out/tiny/fedavg/seed0/summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_completed"] == 1
    res = run_in_process("fedavg", set_, grid=grid, resume=True)
    assert [r["round"] for r in res["records"]] == [0, 1, 2, 3]
    assert res["summary"]["status"] == "completed"


class AtSecondTrain:
    """A grid that calls ``act()`` as the run sends its second round of train messages
    (round 1 completed), then passes them on (unless ``act`` raised)."""

    def __init__(self, grid, act):
        self.grid, self.act, self.trains = grid, act, 0

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def send_and_receive(self, messages, timeout=None):
        if any(m.metadata.message_type == "train" for m in messages):
            self.trains += 1
            if self.trains == 2:
                self.act()
        return self.grid.send_and_receive(messages, timeout)


def test_a_run_stopped_from_outside_is_interrupted_and_an_error_is_one_log_line(
    run_in_process, tmp_path, caplog
):
    """A stop (SIGINT/SystemExit reaching the ServerApp, e.g. Ctrl-C on deploy/local_demo.sh)
    was recorded as status "failed" with reason "SystemExit: 0"; and a run refused at start
    said why only inside a traceback."""
    from tests.conftest import InProcessGrid, run_config

    def stop():
        raise SystemExit(0)

    grid = InProcessGrid(run_config("fedavg", set_="num_rounds=3"), 3)
    with pytest.raises(SystemExit):
        run_in_process("fedavg", "num_rounds=3", grid=AtSecondTrain(grid, stop))
    summary = json.loads((tmp_path / "out/tiny/fedavg/seed0/summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds_completed"] == 1
    logger = logging.getLogger("flwr")  # whose handlers the ServerApp's log takes over
    logger.addHandler(caplog.handler)
    try:
        with pytest.raises(ConfigError):
            run_in_process("fedavg", "num_rounds=3")  # would delete the interrupted run
    finally:
        logger.removeHandler(caplog.handler)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line.startswith("the run stopped: ConfigError: ") and "\n" not in line
    assert "holds an unfinished run (status interrupted, 1 round(s) completed" in line


def test_flwr_stop_of_a_simulated_run_leaves_an_interrupted_summary(
    run_in_process, tmp_path, monkeypatch
):
    """``flwr stop`` ends a simulation through Flower's exit handlers, run in the process's
    main thread, while the ServerApp's thread is not unwound: the run used to have no
    ``summary.json``. The handler (registered with Flower, run here from another thread as
    Flower's main thread would) writes it (status ``interrupted``), and the ServerApp's
    thread, still running, neither logs nor checkpoints another round."""
    import threading

    from flwr.supercore.exit import exit_handler as flower_exit

    import fl_app.server_app as server_app
    from fl_app.config import load_config
    from fl_app.rundir import RunRecorder, RunStoppedError
    from tests.conftest import InProcessGrid, run_config

    handlers = []

    def register(handler, *, run_before_force_exit=False):
        assert run_before_force_exit  # before Flower's 5 s force-exit timer starts
        handlers.append(handler)

    monkeypatch.setattr(server_app, "add_exit_handler", register)

    def flwr_stop():
        (handler,) = handlers  # what Flower's exit runs, in its main thread
        main = threading.Thread(target=handler)
        main.start()
        main.join()

    grid = InProcessGrid(run_config("fedavg", set_="num_rounds=3"), 3)
    with pytest.raises(RunStoppedError):
        run_in_process("fedavg", "num_rounds=3", grid=AtSecondTrain(grid, flwr_stop))
    out = tmp_path / "out/tiny/fedavg/seed0"
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["reason"]) == ("interrupted", server_app.STOPPED_REASON)
    assert summary["rounds_completed"] == 1
    assert [json.loads(r)["round"] for r in (out / "rounds.jsonl").read_text().splitlines()] == [
        0,
        1,
    ]
    assert json.loads((out / "checkpoint.json").read_text())["round"] == 1
    run_in_process("fedavg", "num_rounds=3", resume=True)  # and it resumes from there
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    # the registration is Flower's own, before its force-exit timer
    monkeypatch.undo()
    count = len(flower_exit.registered_exit_handlers)
    try:
        other = RunRecorder(load_config("tiny", "fedavg", f"output_dir={tmp_path / 'x'}"))
        server_app.finish_on_flower_exit(other)
        added = flower_exit.registered_exit_handlers[count:]
        assert [h.run_before_force_exit for h in added] == [True]
    finally:
        del flower_exit.registered_exit_handlers[count:]
        other.finish(plots=False)


def test_a_run_that_never_aggregated_an_update_fails(run_in_process, tmp_path):
    """Every update rejected in every round (here by a tiny server.max_update_norm):
    the run ends "failed" with why, not "completed" with the initial model."""
    from fl_app.server_app import NoUpdatesError

    with pytest.raises(
        NoUpdatesError, match=r"no round of 2 .*6 result\(s\) rejected \(first: update norm"
    ):
        run_in_process("fedavg", "server.max_update_norm=1e-6", failures_ok=True)
    summary = json.loads((tmp_path / "out/tiny/fedavg/seed0/summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_completed"] == 2


def test_check_trained_names_why_nothing_was_aggregated():
    from fl_app.server_app import NoUpdatesError, check_trained

    check_trained([{"round": 0}])  # no round yet
    check_trained([{"round": 0}, {"round": 1, "num_results": 0}, {"round": 2, "num_results": 1}])
    empty = [{"round": 0}, *({"round": r, "participants": [], "num_results": 0} for r in (1, 2))]
    with pytest.raises(NoUpdatesError, match="2 of 2 round.s. without participants"):
        check_trained(empty)
    failed = [{"round": 1, "participants": [0], "failures": [{"kind": "missing"}]}]
    with pytest.raises(NoUpdatesError, match="1 client.s. failed or did not reply"):
        check_trained(failed)


def test_client_timeout_is_reported_and_run_goes_on(run_in_process):
    def drop_node_2(msg, reply):  # a reply that never arrives (timed out)
        if msg.metadata.message_type == "train" and msg.metadata.dst_node_id == 1002:
            return None
        return reply

    class Dropping:
        def __init__(self, grid):
            self.grid = grid

        def get_node_ids(self):
            return self.grid.get_node_ids()

        def send_and_receive(self, messages, timeout=None):
            return [r for r in self.grid.send_and_receive(messages, timeout) if r is not None]

    from tests.conftest import InProcessGrid, run_config

    grid = InProcessGrid(run_config("fedavg"), 3, intercept=drop_node_2)
    res = run_in_process("fedavg", grid=Dropping(grid), failures_ok=True)
    rec = res["records"][1]
    assert rec["num_results"] == 2
    assert rec["failures"] == [
        {
            "kind": "missing",
            "node_id": 1002,
            "pid": 2,
            "reason": "no reply before server.round_timeout",
        }
    ]
    assert res["summary"]["status"] == "completed"


def _client_metrics(records):
    """Per-round client metrics without wall-clock timings."""
    return [
        {
            pid: {k: v for k, v in m.items() if not k.endswith("_seconds")}
            for pid, m in (r.get("clients") or {}).items()
        }
        for r in records
    ]


@pytest.mark.parametrize(
    ("method", "extra"),
    [("fedavg", ""), ("pmfl", "server.participation=bernoulli server.participation_mean=0.6")],
)
def test_same_seed_same_partitions_participants_and_metrics(run_in_process, method, extra):
    run = run_in_process(method, set_=f"num_rounds=3 {extra}", seed=4)
    a = run["records"]
    b = run_in_process(method, set_=f"num_rounds=3 {extra}", seed=4)["records"]
    assert [r.get("participants") for r in a] == [r.get("participants") for r in b]
    assert [r.get("accuracy") for r in a] == [r.get("accuracy") for r in b]
    assert _client_metrics(a) == _client_metrics(b)
    participants = [r["participants"] for r in a[1:]]
    truth = json.loads((run["dir"] / "participation.json").read_text())
    if method == "fedavg":  # every client every round
        assert participants == [[0, 1, 2]] * 3
        assert truth == {"kind": "all"}
    else:  # Bernoulli with mean 0.6: some round leaves someone out
        assert any(len(p) < 3 for p in participants)
        assert truth["kind"] == "bernoulli" and len(truth["p"]) == 3
        assert sum(truth["p"]) / 3 == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("method", "server"),
    [
        ("fedavg", ""),
        ("moon", ""),
        ("fedavg", "server.name=fedavgm"),  # momentum buffer in the checkpoint
        ("fedavg", "server.name=fedadam server.server_lr=0.05"),  # Adam moments
        ("fedccl", "server.name=fedcclm"),  # signals + momentum
        ("fedccl", "server.name=fedcclau"),  # signals + FedAU counters
        ("fedccl", "server.name=fedccladam server.server_lr=0.05"),  # signals + Adam moments
    ],
)
def test_resume_matches_uninterrupted_run(run_in_process, method, server):
    """Interrupt after round 2, resume to round 3: the curve equals an uninterrupted run."""
    part = run_in_process(method, set_=f"num_rounds=2 {server}", seed=6)
    assert json.loads((part["dir"] / "checkpoint.json").read_text())["round"] == 2
    resumed = run_in_process(method, set_=f"num_rounds=3 {server}", seed=6, resume=True)
    resumed = resumed["records"]
    assert [r["round"] for r in resumed] == [0, 1, 2, 3]
    reference = run_in_process(method, set_=f"num_rounds=3 {server}", seed=6)["records"]
    np.testing.assert_allclose(
        [r["accuracy"] for r in resumed], [r["accuracy"] for r in reference], rtol=0, atol=1e-12
    )


class _Stop(Exception):
    pass


@pytest.mark.parametrize("method", ["moon", "pmfl", "pmfl_hist_literal"])
def test_resume_between_checkpoints_uses_the_checkpoints_client_state(run_in_process, method):
    """Checkpoints every 2 rounds; the run stops after the clients trained in round 4 (their
    state of rounds 3 and 4 is on disk, the checkpoint is round 2's). The resumed run redoes
    rounds 3-4 from round 2's client state and so equals an uninterrupted run (for
    ``pmfl_hist_literal`` with a history of aggregated globals only: W¹ alone at the
    checkpoint)."""
    cfg = "num_rounds=4 server.checkpoint_every=2 client.steps=2"
    if method.startswith("pmfl"):
        cfg += " server.participation=all"

    def stop_in_round_4(msg, reply):
        train = msg.metadata.message_type == MessageType.TRAIN
        # the last of the 3 nodes has trained in round 4
        if (
            train
            and msg.metadata.dst_node_id == 1002
            and msg.content["config"]["server-round"] == 4
        ):
            raise _Stop
        return reply

    with pytest.raises(_Stop):
        run_in_process(method, set_=cfg, seed=6, intercept=stop_in_round_4)
    resumed = run_in_process(method, set_=cfg, seed=6, resume=True)
    assert [r["round"] for r in resumed["records"]] == [0, 1, 2, 3, 4]
    reference = run_in_process(method, set_=cfg, seed=6)["records"]
    np.testing.assert_allclose(
        [r["accuracy"] for r in resumed["records"]],
        [r["accuracy"] for r in reference],
        rtol=0,
        atol=1e-12,
    )


def test_a_fresh_start_removes_the_client_state_of_the_run_it_replaces(run_in_process):
    """MOON keeps model-sized state per client under ``client_state/<token>``: a resume
    keeps its run's folder, a fresh start in the same run directory removes the replaced
    run's (tens of GB for PMFL on ResNet-18 with 100 clients, unreachable once the
    checkpoint is gone)."""

    def tokens(run):
        return sorted(p.name for p in (run["dir"] / "client_state").iterdir())

    first = run_in_process("moon", set_="num_rounds=2")
    (token,) = tokens(first)
    assert any((first["dir"] / "client_state" / token).rglob("*.pt"))
    assert tokens(run_in_process("moon", set_="num_rounds=3", resume=True)) == [token]
    fresh = tokens(run_in_process("moon", set_="num_rounds=2", fresh=True))
    assert len(fresh) == 1 and fresh != [token]


@pytest.mark.parametrize(
    "server", ["fedavgm", "fedadam server.server_lr=0.05", "gne", "fedau", "pmfl"]
)
def test_any_client_combines_with_any_server(run_in_process, server):
    s = run_in_process("fedrcl", set_=f"server.name={server}")["summary"]
    server = server.split()[0]
    assert s["server"] == server and s["client"] == "fedrcl" and s["rounds_completed"] == 2
    assert s["final_accuracy"] > 0.15


def test_node_that_cannot_load_its_data_stops_the_run_at_once(run_in_process):
    bad = "data.train_subset=3 data.partition=dirichlet data.min_partition_size=2"
    with pytest.raises(RuntimeError, match="cannot split 3 training samples into num_clients"):
        run_in_process("fedavg", set_=bad)


@pytest.mark.parametrize("method", ["fedavg_plus", "fedccl_plus"])
def test_robust_evaluation_is_reported_every_evaluation(run_in_process, method):
    """FedCCL Table 8's columns: clean, FGSM and PGD-20 accuracy of the global model."""
    res = run_in_process(
        method, set_="client.adv_steps=1 evaluation.robust_samples=64 evaluation.every=2"
    )
    evaluated = [r for r in res["records"] if "accuracy" in r]
    assert [r["round"] for r in evaluated] == [0, 2]
    for r in evaluated:
        assert 0 <= r["robust_pgd"] <= 1 and 0 <= r["robust_fgsm"] <= 1
    s = res["summary"]
    assert s["final_robust_fgsm"] == evaluated[-1]["robust_fgsm"]
    assert s["final_robust_pgd"] == evaluated[-1]["robust_pgd"]


def _files(run_dir):
    return {
        p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != "run.lock"
    }


def test_a_run_that_fails_at_start_leaves_the_earlier_results_as_they_were(run_in_process):
    """A federation of the wrong size, or nodes that cannot load their data, stop a new run
    before it replaces anything in the directory of an earlier run (same method and seed),
    even one started with fresh=true (which may replace it)."""
    from tests.conftest import InProcessGrid, run_config

    done = run_in_process("fedavg", set_="num_rounds=2", seed=3)
    before = _files(done["dir"])
    assert {"summary.json", "rounds.jsonl", "checkpoint.npz"} <= set(before)
    with pytest.raises(ConfigError, match="num-supernodes=3"):
        grid = InProcessGrid(run_config("fedavg", seed=3), num_nodes=2, num_partitions=2)
        run_in_process("fedavg", seed=3, grid=grid, fresh=True)
    bad = "data.train_subset=3 data.partition=dirichlet data.min_partition_size=2"
    with pytest.raises(RuntimeError, match="cannot split 3 training samples"):
        run_in_process("fedavg", set_=bad, seed=3, fresh=True)
    assert _files(done["dir"]) == before


def test_a_run_without_resume_or_fresh_keeps_an_unfinished_run(run_in_process, tmp_path):
    """The same `flwr run` again after a run stopped (from the shell's history, without
    resume=true) deleted the run's checkpoint and client state. Now it is refused before any
    node is asked, changing nothing, with how to continue or start over; fresh=true starts
    over; both at once are refused; a completed run is replaced without a word."""
    from fl_app.server_app import NoUpdatesError
    from tests.conftest import InProcessGrid, run_config

    set_ = "server.max_update_norm=1e-6"
    with pytest.raises(NoUpdatesError):  # a run that stops failed, with a checkpoint
        run_in_process("fedavg", set_, failures_ok=True)
    run = tmp_path / "out/tiny/fedavg/seed0"
    before = _files(run)
    assert "checkpoint.npz" in before
    grid = InProcessGrid(run_config("fedavg", set_=set_), 3)
    with pytest.raises(
        ConfigError,
        match=r"holds an unfinished run \(status failed, 2 round\(s\) completed, checkpoint at "
        r"round 2\): run config resume=true \(make run: RESUME=1; deploy/run.sh: --resume\) "
        r"continues it; fresh=true",
    ):
        run_in_process("fedavg", set_, grid=grid)
    assert grid.sent == [] and _files(run) == before
    with pytest.raises(ConfigError, match="resume=true and fresh=true: choose one"):
        run_in_process("fedavg", resume=True, fresh=True)
    assert _files(run) == before
    assert run_in_process("fedavg", fresh=True)["summary"]["status"] == "completed"
    assert run_in_process("fedavg")["summary"]["status"] == "completed"  # replaces a completed run


def test_a_completed_run_is_replaced_only_by_its_repeat_or_with_fresh(run_in_process):
    """The same method and seed with another SET used to replace a completed run's results
    by another experiment's, with a note: now a run of other settings is refused (naming
    the differences) unless fresh=true; a repeat, or one that differs only in how it ran
    (threads, device, plots), still replaces it; a larger num_rounds is offered the resume."""
    import yaml

    from fl_app.rundir import Stage, survey

    first = run_in_process("fedavg", set_="num_rounds=2", seed=6)
    first_config = yaml.safe_load((first["dir"] / "config.yaml").read_text())
    rounds = (first["dir"] / "rounds.jsonl").read_text()
    refused = r"holds a completed run with other settings \(client.lr: 0.05 -> 0.2\).*FRESH=1"
    with pytest.raises(ConfigError, match=refused):
        run_in_process("fedavg", set_="num_rounds=2 client.lr=0.2", seed=6)
    assert (first["dir"] / "rounds.jsonl").read_text() == rounds  # untouched
    with pytest.raises(ConfigError, match=r"resume=true \(make run: RESUME=1\) continues it"):
        run_in_process("fedavg", set_="num_rounds=3", seed=6)
    for other in ("num_rounds=3 client.lr=0.2", "num_rounds=3 evaluation.plot=true"):
        with pytest.raises(ConfigError) as err:  # a resume would refuse these: not offered
            run_in_process("fedavg", set_=other, seed=6)
        assert "holds a completed run" in str(err.value) and "resume" not in str(err.value)
    again = run_in_process("fedavg", set_="num_rounds=2 client.num_threads=2", seed=6)
    assert again["summary"]["status"] == "completed"
    other = run_in_process("fedavg", set_="num_rounds=2 client.lr=0.2", seed=6, fresh=True)
    assert other["summary"]["status"] == "completed"
    replaced = survey(first_config, other["dir"], Stage.EARLY).other_settings(first_config)
    assert replaced == ["client.lr: 0.2 -> 0.05"]


def test_resume_with_a_changed_config_is_refused_and_changes_nothing(run_in_process):
    part = run_in_process("fedavg", set_="num_rounds=2", seed=7)
    before = _files(part["dir"])
    assert {"config.yaml", "rounds.jsonl", "summary.json", "checkpoint.json"} <= set(before)
    lr = json.loads(before["checkpoint.json"])["config"]["client"]["lr"]
    with pytest.raises(ConfigError) as err:
        run_in_process("fedavg", set_="num_rounds=3 client.lr=0.5", seed=7, resume=True)
    assert f"client.lr: {lr} -> 0.5" in str(err.value)
    assert "num_rounds" not in str(err.value).split("A resume may change")[0]
    with pytest.raises(ConfigError, match=r"model.channels: \[4, 8\] -> \[8, 16\]"):
        run_in_process("fedavg", set_="num_rounds=3 model.channels=[8,16]", seed=7, resume=True)
    with pytest.raises(ConfigError, match=r'server.participation: "all" -> "uniform"'):
        run_in_process(
            "fedavg", set_="num_rounds=3 server.participation=uniform", seed=7, resume=True
        )
    with pytest.raises(ConfigError, match=r"num_rounds: 1 is below the checkpoint's round 2"):
        run_in_process("fedavg", set_="num_rounds=1", seed=7, resume=True)
    assert _files(part["dir"]) == before


def test_a_refused_resume_asks_no_node(run_in_process):
    """Under plain `flwr run` (no launcher pre-check) a changed config is refused before
    node discovery, which on a large federation waits for every node to load its data."""
    from tests.conftest import InProcessGrid, run_config

    run_in_process("fedavg", set_="num_rounds=2", seed=7)
    grid = InProcessGrid(run_config("fedavg", set_="num_rounds=3 client.lr=0.5"), num_nodes=3)
    with pytest.raises(ConfigError, match="client.lr"):
        run_in_process("fedavg", set_="num_rounds=3 client.lr=0.5", seed=7, resume=True, grid=grid)
    assert grid.sent == []


def test_a_resume_warns_once_about_keys_the_code_added_or_removed(
    run_in_process, caplog, monkeypatch
):
    """The early check (before node discovery) is silent; the one under the lock warns."""
    from fl_app import server_app

    part = run_in_process("fedavg", set_="num_rounds=2", seed=7)
    ckpt = part["dir"] / "checkpoint.json"
    saved = json.loads(ckpt.read_text())
    saved["config"]["client"]["retired_option"] = 1  # a key this code no longer has
    ckpt.write_text(json.dumps(saved))
    logger = logging.getLogger("fl_app")  # the ServerApp's logger does not propagate
    monkeypatch.setattr(server_app, "_setup_logging", lambda: logger.addHandler(caplog.handler))
    try:
        res = run_in_process("fedavg", set_="num_rounds=3", seed=7, resume=True)
    finally:
        logger.removeHandler(caplog.handler)
    assert res["summary"]["status"] == "completed"
    warned = [r for r in caplog.records if "added or removed" in r.getMessage()]
    assert len(warned) == 1 and "client.retired_option" in warned[0].getMessage()


def test_resume_may_change_num_rounds_and_threads(run_in_process):
    run_in_process("fedavg", set_="num_rounds=2", seed=7)
    more = run_in_process("fedavg", set_="num_rounds=3 client.num_threads=2", seed=7, resume=True)
    assert [r["round"] for r in more["records"]] == [0, 1, 2, 3]
    assert more["summary"]["status"] == "completed" and more["summary"]["rounds_completed"] == 3
    saved = json.loads((more["dir"] / "checkpoint.json").read_text())["config"]
    assert saved["num_rounds"] == 3 and saved["client"]["num_threads"] == 2


def test_resume_of_a_checkpoint_without_config_compares_config_yaml(run_in_process):
    part = run_in_process("fedavg", set_="num_rounds=2", seed=7)
    ckpt = part["dir"] / "checkpoint.json"
    raw = json.loads(ckpt.read_text())
    del raw["config"]  # as written before the config was saved with the checkpoint
    ckpt.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"client.lr: 0.05 -> 0.5"):
        run_in_process("fedavg", set_="num_rounds=3 client.lr=0.5", seed=7, resume=True)
    (part["dir"] / "config.yaml").unlink()  # nothing to compare with: a warning
    res = run_in_process("fedavg", set_="num_rounds=3", seed=7, resume=True)
    assert [r["round"] for r in res["records"]] == [0, 1, 2, 3]


def test_federated_evaluation_is_the_sample_weighted_mean_of_the_clients(run_in_process):
    """``evaluation.federated=true``: every round the global model is sent to the clients'
    local test splits; the round records each client's accuracy and the sample-weighted
    means. The replies are captured on their way to the server, and the Dirichlet split
    gives the clients test splits of different sizes, so the weighting matters."""
    from fl_app.client_app import node_data

    seen: dict[int, dict[str, tuple[float, float, int]]] = {}

    def capture(msg, reply):
        if msg.metadata.message_type == MessageType.EVALUATE:
            m, rnd = reply.content["metrics"], int(msg.content["config"]["server-round"])
            pid = str(reply.content["info"]["partition-id"])
            seen.setdefault(rnd, {})[pid] = (m["accuracy"], m["loss"], int(m["num-examples"]))
        return reply

    res = run_in_process(
        "fedavg",
        set_="evaluation.federated=true num_rounds=3 data.partition=dirichlet data.alpha=0.5",
        intercept=capture,
    )
    grid = res["grid"]
    sizes = {
        str(c.node_config["partition-id"]): len(node_data(c).test) for c in grid.contexts.values()
    }
    assert len(set(sizes.values())) > 1
    assert sorted(seen) == [1, 2, 3]
    unweighted_differs = False
    for r in res["records"][1:]:
        got = seen[r["round"]]
        assert sorted(got) == ["0", "1", "2"]
        assert {pid: n for pid, (_, _, n) in got.items()} == sizes
        assert r["federated_clients"] == {pid: acc for pid, (acc, _, _) in got.items()}
        accs = np.array([got[p][0] for p in sorted(got)])
        losses = np.array([got[p][1] for p in sorted(got)])
        ns = np.array([got[p][2] for p in sorted(got)], dtype=float)
        assert r["federated_accuracy"] == pytest.approx(float(accs @ ns / ns.sum()), rel=1e-12)
        assert r["federated_loss"] == pytest.approx(float(losses @ ns / ns.sum()), rel=1e-12)
        unweighted_differs |= abs(r["federated_accuracy"] - accs.mean()) > 1e-6
    assert unweighted_differs
    assert "federated_accuracy" not in res["records"][0]  # round 0: the server's test set only
    assert res["summary"]["final_federated_accuracy"] == res["records"][-1]["federated_accuracy"]


def test_server_limits_blas_threads_to_client_num_threads(run_in_process, monkeypatch):
    """More BLAS threads than free cores spin: the Gram of 100 deltas took 9 s on 2 threads
    beside training clients, 0.5 s on one (README, S3). Libraries loaded during the run
    (scikit-learn's, scipy's) are covered too."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from core import training

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)  # restored after the test
    monkeypatch.setattr(training, "_limited_to", None)  # as in a fresh process
    with threadpool_limits(limits=2):
        run_in_process("fedavg", set_="num_rounds=1 client.num_threads=1")
        found = {p["filepath"]: p["num_threads"] for p in threadpool_info()}
        assert set(found.values()) == {1}, found


def test_pmfl_resume_with_another_num_rounds_is_refused(run_in_process):
    """ψ runs over num_rounds (PMFLStrategy.fixed_on_resume), unlike FedAvg's runs, which a
    resume may extend."""
    run_in_process("pmfl")
    with pytest.raises(ConfigError, match=r"num_rounds: 2 -> 3"):
        run_in_process("pmfl", set_="num_rounds=3", resume=True)


@pytest.mark.parametrize("method", ["pmfl_hist", "pmfl_literal", "pmfl_hist_literal"])
def test_pmfl_reading_presets_run_end_to_end(run_in_process, method):
    """The presets of PMFL's alternative readings over the real ServerApp on tiny data, four
    rounds: each learns, the options reach the run's config, and with ``history_init`` false
    ψ stays 0 until t = 2, the first round with an aggregated global before it (``pmfl``
    mixes W⁰ from t = 1). ψ = 1/2 − t/(2(T−1)), T = 4: 1/2, 1/3, 1/6, 0."""
    res = run_in_process(method, set_="num_rounds=4")
    s = res["summary"]
    assert s["status"] == "completed" and s["rounds_completed"] == 4
    assert s["final_accuracy"] > 0.15  # 10 classes: chance is 0.1
    cfg = (res["dir"] / "config.yaml").read_text()
    assert ("threshold: literal" in cfg) is method.endswith("literal")
    assert ("history_init: false" in cfg) is method.startswith("pmfl_hist")
    psi = [r["psi"] for r in res["records"][1:]]
    hist_only = method.startswith("pmfl_hist")
    assert psi == pytest.approx([0.0, 0.0 if hist_only else 1 / 3, 1 / 6, 0.0])


@pytest.mark.parametrize("method", ["fedrcl", "fedavg"])
def test_regime_fedrcl_trains_a_round_in_process(run_in_process, method):
    """The FedRCL regime's preset (conf/experiments/regime_fedrcl.yaml) as it stands, on a
    federation small enough for a test: 3 digits clients, all taking part, one round of one
    local epoch. Its model (4 GroupNorm stages), FedRCL's levels [3, 4], the clipped SGD and
    the server's uniform mean are the preset's own."""
    from fl_app.config import load_config

    tiny = (
        "num_rounds=1 num_clients=3 data.dataset=digits data.partition=iid"
        " data.min_partition_size=5 server.participation=all server.fraction=1.0"
        " server.min_clients=2 client.epochs=1 evaluation.plot=false"
    )
    cfg = load_config("regime_fedrcl", method, tiny)
    assert cfg["server"]["weighting"] == "uniform" and cfg["client"]["grad_clip"] == 10.0
    assert cfg["model"]["norm"] == "group" and cfg["model"]["channels"] == [32, 32, 64, 64]
    assert cfg["client"].get("levels") == ([3, 4] if method == "fedrcl" else None)
    res = run_in_process(method, experiment="regime_fedrcl", set_=tiny)
    s = res["summary"]
    assert s["status"] == "completed" and s["rounds_completed"] == 1
    assert s["final_accuracy"] > 0.15  # 10 classes: chance is 0.1
    assert res["records"][-1]["num_results"] == 3
    assert "effective_rank" in res["records"][-1]
