"""ServerApp: loads the config, discovers the nodes, builds the method's strategy and runs it.

A round flows as DESIGN.md says: the participation model picks partition ids, the strategy
sends each participant the global arrays, a config record and its payload; the replies are
validated and aggregated; the global model is evaluated on the test set every
``evaluation.every`` rounds; the round's record is appended to ``rounds.jsonl`` and a
checkpoint is written so that ``resume=true`` continues an interrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import time
import uuid
import weakref
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.exit import add_exit_handler

from clients.adversarial import robust_accuracy
from clients.base import BaseClient
from core.data import load_test_set
from core.diagnostics import effective_rank
from core.models import set_weights
from core.params import Config, ConfigError
from core.participation import ParticipationModel, participation_of
from core.state import Lineage, client_state_dir, remove_replaced_client_state, start_session
from core.training import evaluate_model, extract_features, limit_threads, pick_device
from fl_app import registry
from fl_app.config import config_from_run_config, participation_warning, run_dir, run_flag
from fl_app.rundir import (
    CheckpointFiles,
    RunRecorder,
    RunStoppedError,
    Stage,
    conflicting_flags,
    guard_run_dir,
)
from strategies.base import StrategyBase
from strategies.exchange import PayloadExchange
from strategies.nodes import NodeRegistry

log = logging.getLogger("fl_app")
app = ServerApp()

STOPPED_REASON = "stopped from outside (flwr stop, Ctrl-C or a signal to the ServerApp)"


def finish_on_flower_exit(recorder: RunRecorder) -> None:
    """Have Flower's exit write ``recorder``'s summary as ``interrupted`` (with
    :data:`STOPPED_REASON`) before the process ends. ``flwr stop`` reaches the ServerApp's
    process as a SIGINT (its heartbeat thread raises one), and Flower's signal handler runs
    its exit handlers, then ends the process; in a simulation the ServerApp runs in a thread
    that this does not unwind, so :func:`run`'s own ``except`` never saw the stop and the run
    had no ``summary.json``. A run that finished first is left as it is; the handler holds
    the recorder weakly (a process that runs many runs keeps none of them alive)."""
    ref = weakref.ref(recorder)

    def finish() -> None:
        live = ref()
        if live is not None and not live.finished:
            log.warning("%s: writing its summary as interrupted", STOPPED_REASON)
            # no plots: this runs before Flower's force-exit timer starts
            live.finish(status="interrupted", reason=STOPPED_REASON, plots=False)

    # Flower's registration holds a plain lock that its exit takes again: a SIGINT/SIGTERM
    # arriving inside it (this thread runs the ServerApp in deployment) would hang the exit
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        add_exit_handler(finish, run_before_force_exit=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _setup_logging() -> None:
    flwr_logger = logging.getLogger("flwr")
    log.handlers = list(flwr_logger.handlers) or [logging.StreamHandler()]
    log.setLevel(logging.INFO)
    log.propagate = False


def federation_hint(cfg: Config) -> str:
    n = cfg["num_clients"]
    return (
        f"experiment {cfg['experiment']!r} needs {n} clients: run "
        f'`flwr run . --federation-config "num-supernodes={n} client-resources-num-cpus=1"` '
        f"(or `make run`, which passes it), or set num_clients to the federation's size"
    )


def discover_nodes(grid: Grid, cfg: Config) -> NodeRegistry:
    """Ask every connected node for its partition id and label counts (QUERY messages).

    Waits up to ``server.wait_for_nodes`` seconds for ``num_clients`` nodes. Raises
    ConfigError when the federation's size does not match the experiment, or when nodes are
    connected but have not answered by then (their ClientApps still starting: the message
    says to raise ``server.wait_for_nodes``, not to resize the federation)."""
    want = cfg["num_clients"]
    wait = cfg["server"]["wait_for_nodes"]
    deadline = time.monotonic() + wait
    nodes = NodeRegistry(want, cfg["data"]["num_classes"])
    while True:
        try:  # a query waits at most what is left, so a slow start gets asked again
            nodes.refresh(grid, max(1.0, deadline - time.monotonic()), strict=True)
        except ValueError as err:
            raise ConfigError(
                f"{err}: {federation_hint(cfg)}; a deployed SuperNode takes --node-config"
                f' "partition-id=<0..{want - 1}> num-partitions={want}"'
            ) from err
        if len(nodes.by_pid) >= want:
            return nodes
        if time.monotonic() > deadline:
            raise ConfigError(missing_nodes_message(cfg, nodes, set(grid.get_node_ids())))
        time.sleep(1.0)


def missing_nodes_message(cfg: Config, nodes: NodeRegistry, listed: set[int]) -> str:
    """Why discovery gave up: nodes missing from the federation (resize it), or nodes that
    are connected (``listed``) but never answered their identity query (wait longer)."""
    want, wait = cfg["num_clients"], cfg["server"]["wait_for_nodes"]
    missing = sorted(set(range(want)) - set(nodes.by_pid))
    silent = len(listed - {info.node_id for info in nodes.by_pid.values()})
    head = (
        f"only {len(nodes.by_pid)} of {want} nodes answered within "
        f"server.wait_for_nodes={wait}s (missing partitions {missing[:10]})"
    )
    if silent and len(listed) >= want:
        return (
            f"{head}; all {len(listed)} nodes are connected but {silent} did not answer the "
            "identity query in time (their ClientApps are still starting, e.g. on a busy "
            f'machine): raise it, e.g. SET="server.wait_for_nodes={max(120, 4 * wait)}"'
        )
    if silent:
        return (
            f"{head}; {len(listed)} nodes are connected, {silent} of them silent: "
            f"raise server.wait_for_nodes if they are still starting; {federation_hint(cfg)}"
        )
    return f"{head}; {federation_hint(cfg)}"


class CentralEvaluator:
    """Evaluates the global model on the global test set (G-FL)."""

    def __init__(self, cfg: Config, client_cls: Any) -> None:
        self.cfg = cfg
        self.device = pick_device("auto" if cfg["client"]["device"] == "auto" else "cpu")
        self.model = client_cls.build_model(cfg).to(self.device)
        self.test = load_test_set(cfg)
        self.client_cls = client_cls

    def load(self, arrays: ArrayRecord) -> None:
        """Put the global model's ``arrays`` (in the model's parameter order) into the model."""
        set_weights(self.model, [arrays[k].numpy() for k in arrays])

    def __call__(self, server_round: int, arrays: ArrayRecord) -> dict[str, Any]:
        self.load(arrays)
        bs = self.cfg["evaluation"]["batch_size"]
        loss, acc = evaluate_model(self.model, self.test, bs, self.device)
        out: dict[str, Any] = {"accuracy": acc, "loss": loss}
        if self.cfg["evaluation"]["effective_rank"]:
            feats = extract_features(self.model, self.test, bs, self.device)
            out["effective_rank"] = effective_rank(feats.numpy())
        if self.cfg["evaluation"]["robust"]:
            out.update(
                robust_accuracy(
                    self.model,
                    self.test,
                    self.cfg["evaluation"]["robust_eps"],
                    self.cfg["evaluation"]["robust_steps"],
                    self.cfg["evaluation"]["robust_samples"],
                    bs,
                    self.device,
                )
            )
        return out


def _pack(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Replace numpy arrays in a nested state by references into ``arrays`` (for JSON)."""
    if isinstance(value, np.ndarray):
        key = f"s{len(arrays)}"
        arrays[key] = value
        return {"__array__": key}
    if isinstance(value, dict):
        return {str(k): _pack(v, arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_pack(v, arrays) for v in value]
    return value


def _unpack(value: Any, arrays: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__array__"}:
            return np.asarray(arrays[value["__array__"]])
        return {k: _unpack(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpack(v, arrays) for v in value]
    return value


class Checkpoint(CheckpointFiles):
    """Global arrays and strategy state of a run, in the checkpoint's files
    (:class:`fl_app.rundir.CheckpointFiles`, which reads their round and config for the run
    directory's decisions): ``checkpoint.npz`` holds every array (global model ``a<i>``,
    state arrays ``s<j>``, the round ``round``), ``checkpoint.json`` the rest and the run's
    config. Both files are written to temporary names first and then renamed, arrays first;
    a save that stopped between the two renames (round N's arrays, round N−1's JSON) is
    completed from the temporary JSON when the checkpoint is next loaded. Arrays are read
    back with ``allow_pickle=False``."""

    def save(
        self,
        server_round: int,
        arrays: ArrayRecord,
        state: dict[str, Any],
        config: Config | None = None,
    ) -> None:
        """Write round ``server_round``'s checkpoint: the global ``arrays``, the ``state``
        (its numpy arrays go beside the global ones) and the run's ``config``."""
        store = {f"a{i}": arrays[k].numpy() for i, k in enumerate(arrays)}
        packed = _pack(state, store)
        np.savez(self.pending_npz, allow_pickle=False, round=np.int64(server_round), **store)
        head = {"round": server_round, "keys": list(arrays), "config": config}
        self.pending_json.write_text(json.dumps({**head, **packed}))
        self.pending_npz.replace(self.npz)
        self.pending_json.replace(self.json)

    def load(self) -> tuple[int, ArrayRecord, dict[str, Any]] | None:
        """The checkpoint (completing an interrupted save); call it only while holding the
        run directory."""
        raw = self._read_json(complete=True)
        if raw is None:
            return None
        with np.load(self.npz, allow_pickle=False) as z:
            arrays = ArrayRecord({k: Array(z[f"a{i}"]) for i, k in enumerate(raw["keys"])})
            state = _unpack(raw, z)
        return int(raw["round"]), arrays, state


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The run (:func:`run`); a run that stops on an error says why on one ERROR line
    first, ahead of the traceback and Flower's own exit report."""
    _setup_logging()
    try:
        run(grid, context)
    except Exception as err:
        log.error("the run stopped: %s", _one_line(err))
        raise


def _one_line(err: BaseException) -> str:
    """``Type: message`` of an error, its white space (newlines too) collapsed."""
    return " ".join(f"{type(err).__name__}: {err}".split())


def _log_method(cfg: Config, exchange_cls: type[PayloadExchange] | None) -> None:
    """The run's first log line: what trains (client, aggregator, payload) on what."""
    log.info(
        "method %s (client %s, server %s: aggregator %s, payload %s), experiment %s, seed %d",
        cfg["method"],
        cfg["client"]["name"],
        cfg["server"]["name"],
        registry.aggregator_name(cfg["server"]["name"]),
        exchange_cls.name if exchange_cls else "none",
        cfg["experiment"],
        cfg["seed"],
    )


def run(grid: Grid, context: Context) -> None:
    """One run of the experiment in Flower's run config: checks, nodes, rounds, results."""
    cfg = config_from_run_config(context.run_config)
    resume, fresh = run_flag(context.run_config, "resume"), run_flag(context.run_config, "fresh")
    if conflict := conflicting_flags(resume, fresh, Stage.EARLY):
        raise ConfigError(conflict)
    limit_threads(cfg["client"]["num_threads"])  # torch and numpy's BLAS (validated >= 1)
    client_cls = registry.resolve("client", cfg["client"]["name"])
    strategy_cls = registry.resolve("server", cfg["server"]["name"])  # the aggregator
    exchange_cls = registry.exchange_for(cfg)  # the payload exchange the client brings
    _log_method(cfg, exchange_cls)
    if warning := participation_warning(cfg):
        log.warning(warning)
    # a changed config, or a run that would be lost, is refused before any node is asked
    # (and checked again, with warnings, by the recorder once it holds the directory)
    guard_run_dir(cfg, run_dir(cfg), resume=resume, fresh=fresh, stage=Stage.EARLY)
    # Nodes (which load their data to answer) and the test set first: a federation or data
    # problem fails here, before the run directory's earlier results are touched.
    nodes = discover_nodes(grid, cfg)
    log.info("%d nodes connected: partitions %s", len(nodes.by_pid), nodes.known_pids())
    evaluator = CentralEvaluator(cfg, client_cls)  # its model is loaded from the arrays
    # a refused resume or replacement raises before the recorder writes config.yaml or
    # rounds.jsonl
    recorder = RunRecorder(
        cfg,
        resume=resume,
        check=lambda d: guard_run_dir(cfg, d, resume=resume, fresh=fresh, stage=Stage.HELD),
    )
    finish_on_flower_exit(recorder)
    try:
        _train(
            cfg,
            grid,
            resume=resume,
            client_cls=client_cls,
            strategy_cls=strategy_cls,
            exchange_cls=exchange_cls,
            nodes=nodes,
            evaluator=evaluator,
            recorder=recorder,
        )
        check_trained(recorder.records)
    except BaseException as err:  # a stop from outside (SIGINT, SystemExit) is no failure
        stopped = isinstance(err, KeyboardInterrupt | SystemExit | RunStoppedError)
        recorder.finish(
            status="interrupted" if stopped else "failed",
            reason=_one_line(err),
        )
        raise
    summary = recorder.finish()
    log.info(
        "finished: final accuracy %s, best %s, last-5 %s (results in %s)",
        *(_fmt(summary[k]) for k in ("final_accuracy", "best_accuracy", "last5_accuracy")),
        recorder.dir,
    )


class NoUpdatesError(RuntimeError):
    """No round of a run aggregated a single client update: its global model is the initial
    one, so the run must not end "completed"."""


def check_trained(records: list[dict[str, Any]]) -> None:
    """Raise :class:`NoUpdatesError` when no round of ``records`` (``rounds.jsonl``, round
    0 being the initial evaluation) aggregated a client result, naming why: results
    rejected (with the first reason), clients that failed, or rounds without participants."""
    rounds = [r for r in records if r.get("round", 0) >= 1]
    if not rounds or any(r.get("num_results", 0) > 0 for r in rounds):
        return
    failures = [f for r in rounds for f in r.get("failures", [])]
    rejected = [f for f in failures if f.get("kind") == "rejected"]
    empty = sum(1 for r in rounds if not r.get("participants"))
    why = [f"{len(rejected)} result(s) rejected"] if rejected else []
    if rejected:
        first = str(rejected[0].get("reason"))
        hint = "; see server.max_update_norm, client.lr" if "update norm" in first else ""
        why[0] += f" (first: {first}{hint})"
    if len(failures) > len(rejected):
        why.append(f"{len(failures) - len(rejected)} client(s) failed or did not reply")
    if empty:
        why.append(
            f"{empty} of {len(rounds)} round(s) without participants (raise "
            "server.participation_mean or num_clients)"
        )
    raise NoUpdatesError(
        f"no round of {len(rounds)} aggregated a client update, so the global model is the "
        f"initial one: {'; '.join(why) or 'no results'}"
    )


def _fmt(value: Any) -> str:
    """A metric for the log: 4 decimals, or as it is (None, a count)."""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _restore(
    ckpt: Checkpoint,
    strategy: StrategyBase,
    participation: ParticipationModel,
    recorder: RunRecorder,
) -> tuple[int, str, Lineage, ArrayRecord] | None:
    """A resume: the strategy, participation and torch RNG from the checkpoint, the round log
    cut back to it; (first round to run, client-state token, lineage, global arrays), or
    None (a warning; the round log emptied) when there is no checkpoint."""
    loaded = ckpt.load()
    if loaded is None:
        log.warning("resume=true but no checkpoint in %s; starting from round 1", recorder.dir)
        recorder.truncate_after(-1)  # rounds of the run that left no checkpoint
        return None
    last, arrays, state = loaded
    strategy.load_state_dict(state["strategy"])
    participation.load_state_dict(state["participation"])
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    # client state saved after this checkpoint belongs to the discarded rounds
    lineage = Lineage((*state.get("state_resumed", []), last), checkpoint=last)
    recorder.truncate_after(last)
    recorder.wall_before = recorder.records[-1]["wall_seconds"] if recorder.records else 0.0
    log.info("resuming from the checkpoint of round %d", last)
    return last + 1, state["state_token"], lineage, arrays


def _state(
    strategy: StrategyBase, participation: ParticipationModel, token: str, lineage: Lineage
) -> dict[str, Any]:
    """What a checkpoint holds besides the global arrays (:func:`_restore` reads it back)."""
    return {
        "strategy": strategy.state_dict(),
        "participation": participation.state_dict(),
        "torch_rng": torch.get_rng_state().tolist(),
        "state_token": token,
        "state_resumed": list(lineage.resumed),
    }


def _train(
    cfg: Config,
    grid: Grid,
    *,
    resume: bool,
    client_cls: type[BaseClient],
    strategy_cls: type[StrategyBase],
    exchange_cls: type[PayloadExchange] | None,
    nodes: NodeRegistry,
    evaluator: CentralEvaluator,
    recorder: RunRecorder,
) -> None:
    """The run once its directory is held: model, participation, strategy (the aggregator
    ``strategy_cls`` holding an ``exchange_cls`` built for this run, when the client brings
    one), checkpoint (loaded on resume, removed otherwise), then the rounds."""
    ckpt = Checkpoint(recorder.dir)
    if not resume:
        ckpt.remove()  # the replaced run's: a later resume must not mix it with these rounds
    torch.manual_seed(cfg["seed"])
    model = client_cls.build_model(cfg)
    arrays = ArrayRecord(
        {k: Array(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}
    )
    participation = participation_of(cfg, nodes.label_matrix(cfg["data"]["num_classes"]))
    exchange = exchange_cls(cfg, nodes) if exchange_cls is not None else None
    strategy = strategy_cls(cfg, nodes, participation, arrays, evaluator, recorder, exchange)

    start_round, token, lineage = 1, uuid.uuid4().hex[:12], Lineage()
    if resume:
        restored = _restore(ckpt, strategy, participation, recorder)
        if restored is not None:
            start_round, token, lineage, arrays = restored
    (recorder.dir / "participation.json").write_text(json.dumps(participation.description()))
    removed = remove_replaced_client_state(recorder.dir, keep=token)
    if removed:
        log.info("removed the client state of %d replaced run(s) in %s", len(removed), recorder.dir)
    lineage = start_session(client_state_dir(recorder.dir) / token, lineage)
    if start_round == 1:
        recorder.write_round({"round": 0, **evaluator(0, arrays)})

    def on_round_end(rnd: int, arrays: ArrayRecord, record: dict[str, Any]) -> None:
        nonlocal lineage
        recorder.write_round(record)
        if rnd % cfg["server"]["checkpoint_every"] == 0 or rnd == cfg["num_rounds"]:
            ckpt.save(rnd, arrays, _state(strategy, participation, token, lineage), config=cfg)
            # from now on a resume starts here: clients may drop older state versions
            lineage = dataclasses.replace(lineage, checkpoint=rnd)
            strategy.train_config.update(lineage.to_config())

    strategy.train_config = {"state-token": token, **lineage.to_config()}
    strategy.run(grid, arrays, cfg["num_rounds"], start_round, on_round_end)
