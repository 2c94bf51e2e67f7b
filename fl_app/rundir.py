"""The run directory ``<output_dir>/<experiment>/<method>/seed<seed>/``: the one place that
says who may write it and what a run may do to what it holds.

- ``run.lock``: held (``flock``) while a run writes the directory, so a second run of the same
  experiment, method and seed fails at once instead of interleaving its rounds
  (:func:`lock_run_dir`);
- what a run does to the directory is decided in one place: :func:`survey` reads what it
  holds (a checkpoint, a completed or unfinished run, its settings, a live run), and
  :func:`decide`, from that and the user's flags (``resume``, ``fresh``), says start, replace,
  resume, or refuse and why (:class:`Decision`). The launcher asks before Flower starts
  (:attr:`Stage.LAUNCH`), the ServerApp before it asks any node (:attr:`Stage.EARLY`) and
  again once its recorder holds the lock (:attr:`Stage.HELD`); both act on the answer
  (:func:`guard_run_dir`);
- a resumed run must train what the checkpoint's run trained: :func:`check_resume_config`
  refuses a config that differs in anything but :data:`RESUME_MAY_CHANGE`; a completed run is
  replaced only by a run of the same settings, outside :data:`RERUN_MAY_CHANGE`
  (:meth:`RunDirState.other_settings`), or with ``fresh``;
- :class:`RunRecorder`: one run's hold on the directory, which writes its results files as it
  goes (their formats: :mod:`fl_app.results`); the checkpoint's files are read here
  (:class:`CheckpointFiles`), written by the ServerApp (:class:`fl_app.server_app.Checkpoint`);
- after a launch stopped: :func:`record_interrupted`, :func:`resume_advice`.
"""

from __future__ import annotations

import dataclasses
import enum
import fcntl
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from core.params import Config, ConfigError
from fl_app import registry
from fl_app.config import dump, run_dir
from fl_app.results import (
    ROUND_LOG,
    jsonable,
    last_logged_round,
    plot_run,
    read_rounds,
    read_summary,
    saved_run_config,
    split_config_changes,
    write_summary,
)

log = logging.getLogger("fl_app")

#: Config keys a resume may change: they do not change what is trained (``num_rounds`` only
#: extends or shortens the run, down to the checkpoint's round; ``output_dir`` names the run
#: directory itself, which may be spelt differently, e.g. relative or absolute).
RESUME_MAY_CHANGE = frozenset(
    {
        "num_rounds",
        "output_dir",
        "client.device",
        "client.num_threads",
        "server.round_timeout",
        "server.wait_for_nodes",
    }
)
#: How a run ran, not what it trained: a rerun that differs from a completed run only in
#: these replaces it like a repeat (see :meth:`RunDirState.other_settings`); where the data is
#: read from (the same dataset, e.g. downloaded once, then read without data.download) included.
RERUN_MAY_CHANGE = frozenset(
    {
        "output_dir",
        "data.root",
        "data.download",
        "client.device",
        "client.num_threads",
        "client.cuda_graph",
        "server.round_timeout",
        "server.wait_for_nodes",
        "server.checkpoint_every",
        "evaluation.plot",
    }
)
#: How to start a run over, in each entry point's spelling.
FRESH = "fresh=true (make run: FRESH=1; deploy/run.sh: --fresh)"

# ------------------------------------------------------------------------------- the lock


class RunDirBusyError(RuntimeError):
    """Another live run holds the results directory."""


def lock_run_dir(path: Path) -> IO[str]:
    """Take the exclusive lock ``path/run.lock`` for this process's run and return the open
    file that holds it; the lock goes with the file (closed in :meth:`RunRecorder.finish`)
    or with the process, so a crashed run leaves no stale lock. Raises
    :class:`RunDirBusyError` naming the holder when another run has it."""
    fh = (path / "run.lock").open("a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise RunDirBusyError(
            f"{path} is being written by another run ({holder}): wait for it or stop it "
            "(flwr stop / Ctrl-C), or give this run another seed or output_dir"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.ctime()}\n")
    fh.flush()
    return fh


def run_dir_busy(path: Path) -> bool:
    """Whether a live run holds ``path/run.lock`` (:func:`lock_run_dir`), asked without
    taking or writing the lock: a shared lock cannot be had while the run's exclusive one is
    held."""
    try:
        with (path / "run.lock").open() as fh:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def run_dir_holder(path: Path) -> int | None:
    """The pid of the process on this host that holds (or last held) ``path/run.lock``, from
    the line :func:`lock_run_dir` writes; None when there is none or it is another host's."""
    try:
        line = (path / "run.lock").read_text()
    except OSError:
        return None
    m = re.match(r"pid (\d+) on (\S+),", line)
    return int(m.group(1)) if m and m.group(2) == socket.gethostname() else None


def release_run_dir(lock: IO[str]) -> None:
    """Give back a lock taken by :func:`lock_run_dir` (its holder line is cleared)."""
    lock.truncate(0)
    lock.close()


def probe_run_dir(directory: Path) -> None:
    """Create ``directory`` and take and give back its lock, so that a launch fails now, not
    after Flower's start-up, where another run writes it: :class:`RunDirBusyError` naming
    that run; OSError when the directory (or its lock file) cannot be created."""
    directory.mkdir(parents=True, exist_ok=True)
    release_run_dir(lock_run_dir(directory))


def wait_for_run_dir(directory: Path, timeout: float) -> bool:
    """Wait until no process holds the run directory's lock, i.e. this run's ServerApp has
    finished or gone (``flwr stop`` reaches a run within seconds; it may complete a round or
    two first). Other runs on the same SuperLink are not waited for. True if the lock is
    free within ``timeout`` seconds (at once when the ServerApp never took it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            release_run_dir(lock_run_dir(directory))
            return True
        except RunDirBusyError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


# ----------------------------------------------------------------- what the directory holds


class CheckpointFiles:
    """The files of a run's checkpoint and what the run directory's decisions read of them:
    its round and saved config (:meth:`header`), without its arrays. ``checkpoint.npz`` holds
    every array and the round (``round``), ``checkpoint.json`` the rest and the run's config
    (``config``; checkpoints written by older versions have none, nor the round in the
    arrays). Both are written to temporary names first and then renamed, arrays first
    (:meth:`fl_app.server_app.Checkpoint.save`); a save that stopped between the two renames
    (round N's arrays, round N−1's JSON) is completed from the temporary JSON when the
    checkpoint is next loaded."""

    def __init__(self, directory: Path) -> None:
        self.npz, self.json = directory / "checkpoint.npz", directory / "checkpoint.json"
        self.pending_npz, self.pending_json = (
            directory / "checkpoint.tmp.npz",
            self.json.with_suffix(".tmp"),
        )

    def _read_json(self, complete: bool) -> dict[str, Any] | None:
        """The checkpoint's JSON, the pending one when a save stopped between its renames
        (then renamed into place if ``complete``: only by the run that holds the directory,
        since a writer may be between its renames right now); None when there is no
        checkpoint. Raises ConfigError when the two files belong to different rounds and no
        save can be completed."""
        if not self.npz.is_file():
            return None
        arrays_round = self._arrays_round()
        if self.pending_json.is_file() and arrays_round is not None:
            try:
                pending = json.loads(self.pending_json.read_text())
            except ValueError:
                pending = {}  # written partly: the arrays were not renamed after it
            if isinstance(pending, dict) and pending.get("round") == arrays_round:
                if not complete:
                    return pending
                log.warning("completing the round-%d checkpoint a stop interrupted", arrays_round)
                self.pending_json.replace(self.json)
        if not self.json.is_file():
            return None
        raw: dict[str, Any] = json.loads(self.json.read_text())
        if arrays_round is not None and arrays_round != raw["round"]:
            raise ConfigError(
                f"{self.npz} holds round {arrays_round} but {self.json} round {raw['round']}:"
                " the checkpoint is inconsistent; start the run again without resume"
            )
        return raw

    def _arrays_round(self) -> int | None:
        """The round stored with the arrays (None in checkpoints of older versions)."""
        with np.load(self.npz, allow_pickle=False) as z:
            return int(z["round"]) if "round" in z.files else None

    def header(self) -> tuple[int, Config | None] | None:
        """The checkpoint's round and saved config (None when it has none), without
        loading its arrays; None when there is no checkpoint. Changes no file. A checkpoint
        that cannot be read (empty or cut-off files, JSON of another shape) is a ConfigError
        saying so, whatever the reader raised."""
        try:
            raw = self._read_json(complete=False)
            return None if raw is None else (int(raw["round"]), raw.get("config"))
        except ConfigError:
            raise
        except Exception as err:  # EOFError, BadZipFile, KeyError, TypeError, OSError, ...
            raise ConfigError(
                f"the checkpoint in {self.npz.parent} cannot be read ({type(err).__name__}: {err})"
            ) from err

    def remove(self) -> None:
        """Delete the checkpoint (a new run replaces the one that wrote it)."""
        for path in (self.npz, self.json, self.pending_npz, self.pending_json):
            path.unlink(missing_ok=True)


def _unreadable(directory: Path, err: ConfigError) -> ConfigError:
    """The launcher's one-line error for a checkpoint that :meth:`CheckpointFiles.header`
    cannot read, naming its cause (the reader's own error, if any)."""
    return ConfigError(f"{directory}: the checkpoint cannot be read ({err.__cause__ or err})")


def checkpoint_round(directory: Path) -> int | None:
    """The round of the checkpoint in ``directory`` (None: there is none), read without its
    arrays; a ConfigError saying why when it cannot be read (files of other rounds, an
    unreadable archive)."""
    try:
        head = CheckpointFiles(directory).header()
    except ConfigError as err:  # its cause: the reader's own error, if any
        raise _unreadable(directory, err) from (err.__cause__ or err)
    return None if head is None else head[0]


def completed_rounds(path: Path) -> int | None:
    """The rounds of the run in ``path`` when its ``summary.json`` says it completed; None
    when it does not (no summary, an unreadable one, another status)."""
    try:
        summary = read_summary(path)
        if summary is None or summary.get("status") != "completed":
            return None
        return int(summary["rounds_completed"])
    except (ValueError, KeyError, TypeError):
        return None


def existing_run(path: Path) -> str | None:
    """A description (status, rounds completed) of the results already in ``path``, or None
    when it holds none."""
    rounds = last_logged_round(path)
    status = None
    try:
        summary = read_summary(path)
    except ValueError:
        summary, status = None, "unreadable summary.json"
    if summary is not None:
        status = summary.get("status")
        if rounds < 0:
            try:
                rounds = int(summary.get("rounds_completed", -1))
            except (ValueError, TypeError):
                status = "unreadable summary.json"
    if rounds < 0 and status is None:
        return None
    status = status or "unknown: running, stopped or killed (no summary.json)"
    return f"status {status}, {max(rounds, 0)} round(s) completed"


def check_resume_config(
    saved: Mapping[str, Any],
    cfg: Config,
    checkpoint_round: int | None,
    where: Path,
    fixed: frozenset[str] = frozenset(),
) -> tuple[str | None, list[str]]:
    """Why the run in ``where`` (saved config ``saved``, checkpoint of round
    ``checkpoint_round``) must not be resumed with ``cfg``, or None: every key that differs
    outside :data:`RESUME_MAY_CHANGE` minus ``fixed`` (keys the run's strategy trains
    differently with, e.g. PMFL's ψ schedule runs over ``num_rounds``), listed, or
    ``num_rounds`` below the checkpoint's round. Also the keys only one config has (the code
    added or removed them since the checkpoint), ``"key: old -> new"``: a warning, not a
    refusal. Pure."""
    may_change = RESUME_MAY_CHANGE - fixed
    changed, added_or_removed = split_config_changes(saved, cfg, may_change)
    hard = [f"  {change}" for change in changed]
    if checkpoint_round is not None and cfg["num_rounds"] < checkpoint_round:
        hard.append(
            f"  num_rounds: {cfg['num_rounds']} is below the checkpoint's round "
            f"{checkpoint_round} (give num_rounds >= {checkpoint_round})"
        )
    if not hard:
        return None, added_or_removed
    at = f" (checkpoint of round {checkpoint_round})" if checkpoint_round else ""
    return (
        f"cannot resume the run in {where}{at}: its config differs from this run's in\n"
        + "\n".join(hard)
        + f"\nA resume may change only {', '.join(sorted(may_change))}. "
        "Resume with the run's original settings (drop the changed SET overrides), or "
        "start a new run in another OUTPUT_DIR, or start this one over with FRESH=1 (run "
        "config fresh=true), which replaces its results. Nothing in the run directory was "
        "changed."
    ), added_or_removed


def _added_or_removed(where: Path, keys: list[str]) -> str:
    """The warning about config keys only one of a resume's configs has."""
    return (
        f"resuming {where}: config keys added or removed since its checkpoint (taken as not "
        f"changing what was trained): {'; '.join(keys)}"
    )


# --------------------------------------------------------------------------- the decision


class Stage(enum.Enum):
    """Who asks what a run may do to its directory, and when."""

    #: the launcher, before Flower starts: a resume needs a checkpoint to continue and rounds
    #: left to run (a mistyped seed must not start a run from round 1)
    LAUNCH = "launch"
    #: the ServerApp (and deploy's pre-check) before any node is asked: it logs nothing, as
    #: the recorder asks again
    EARLY = "early"
    #: the ServerApp's recorder, holding the directory's lock: the live run is this one
    HELD = "held"


class Action(enum.Enum):
    """What a run does to its directory (:func:`decide`)."""

    START = "start"  #: from round 1, in a directory without results
    REPLACE = "replace"  #: from round 1, replacing an earlier run's results
    RESUME = "resume"  #: on from the checkpoint's round
    REFUSE = "refuse"  #: not at all: the message says why and what to do instead
    BUSY = "busy"  #: not at all: another live run writes the directory


#: A record for the caller to log: (logging level, message).
Note = tuple[int, str]


@dataclasses.dataclass(frozen=True)
class RunDirState:
    """What a run directory holds, as far as :func:`decide` reads it (:func:`survey`)."""

    path: Path
    checkpoint: int | None = None  # the checkpoint's round; None: none, or unreadable
    checkpoint_config: Config | None = None  # the config saved with it (older ones have none)
    checkpoint_error: ConfigError | None = None  # why the checkpoint cannot be read
    config_yaml: Config | None = None  # the directory's config.yaml
    completed: int | None = None  # rounds of a run whose summary.json says it completed
    earlier: str | None = None  # the results there, described (existing_run); None: none
    busy: bool = False  # a live run holds the lock (asked only about an unfinished run)
    fixed: frozenset[str] = frozenset()  # keys the run's strategy fixes on resume
    resumable: tuple[str, ...] = ()  # <method>/<seed> of the experiment's runs with a checkpoint

    @property
    def unfinished(self) -> str | None:
        """What the directory holds when it is an unfinished run (interrupted, failed,
        killed) with a checkpoint to continue from, which a run without resume would delete:
        its status, rounds and checkpoint round. None when there is nothing to lose that
        way: no checkpoint, one that cannot be read (and so cannot be resumed), or a run
        that completed through its checkpoint's round (a resume that raised ``num_rounds``
        and was killed hard leaves the earlier "completed" summary beside a later
        checkpoint: that run is unfinished)."""
        if self.checkpoint is None:
            return None
        if self.completed is not None and self.completed >= self.checkpoint:
            return None
        return (
            f"{self.path} holds an unfinished run ({self.earlier or 'no round logged'}, "
            f"checkpoint at round {self.checkpoint})"
        )

    def other_settings(self, cfg: Config) -> list[str]:
        """The settings (``"key: old -> new"``, :func:`fl_app.results.config_changes`) in
        which ``cfg`` differs from the completed run here (its ``config.yaml``), outside
        :data:`RERUN_MAY_CHANGE`: what a run of ``cfg`` would replace by results of another
        experiment. Empty when the directory holds no completed run or no readable config,
        or one of the same settings (a repeat); keys only one config has (the code added or
        removed them since) do not count."""
        if self.completed is None or self.config_yaml is None:
            return []
        return split_config_changes(self.config_yaml, cfg, RERUN_MAY_CHANGE)[0]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a run does to its directory (:func:`decide`): the callers act on it."""

    action: Action
    message: str = ""  # REFUSE and BUSY: why, and what to do instead
    notes: tuple[Note, ...] = ()  # to log before acting (a resume's warnings)
    earlier: str | None = None  # REPLACE: the results it replaces, described
    replaced: tuple[str, ...] = ()  # REPLACE: the settings in which that run differs
    cause: BaseException | None = None  # REFUSE: the error behind it (an unreadable checkpoint)


def survey(cfg: Config, directory: Path, stage: Stage) -> RunDirState:
    """Read what :func:`decide` needs of ``directory`` for a run of ``cfg`` asked at
    ``stage``. Changes nothing: a checkpoint save to complete is left to the run that holds
    the directory. Whether a live run holds the lock is asked only about an unfinished run,
    and not by the run that holds it (``HELD``: it would see itself); the experiment's runs
    with a checkpoint are listed only for the launcher, which names them when there is none
    to resume."""
    try:
        head = CheckpointFiles(directory).header()
        error = None
    except ConfigError as err:
        head, error = None, err
    state = RunDirState(
        path=directory,
        checkpoint=None if head is None else head[0],
        checkpoint_config=None if head is None else head[1],
        checkpoint_error=error,
        config_yaml=saved_run_config(directory),
        completed=completed_rounds(directory),
        earlier=existing_run(directory),
    )
    compared = head is not None and (head[1] is not None or state.config_yaml is not None)
    listed = stage is Stage.LAUNCH and head is None and error is None  # none to resume
    return dataclasses.replace(
        state,
        busy=stage is not Stage.HELD and state.unfinished is not None and run_dir_busy(directory),
        fixed=_fixed_on_resume(cfg) if compared else frozenset(),
        resumable=_resumable(directory) if listed else (),
    )


def _fixed_on_resume(cfg: Config) -> frozenset[str]:
    """The keys of :data:`RESUME_MAY_CHANGE` that the run's strategy trains differently with
    (:meth:`strategies.base.StrategyBase.fixed_on_resume`)."""
    fixed: frozenset[str] = registry.resolve("server", cfg["server"]["name"]).fixed_on_resume(cfg)
    return fixed


def _resumable(directory: Path) -> tuple[str, ...]:
    """``<method>/<seed>`` of the runs of ``directory``'s experiment that have a checkpoint."""
    experiment = directory.parent.parent
    return tuple(
        sorted(
            f"{p.parent.parent.name}/{p.parent.name}"
            for p in experiment.glob("*/*/checkpoint.json")
        )
    )


def conflicting_flags(resume: bool, fresh: bool, stage: Stage) -> str | None:
    """Why ``resume`` and ``fresh`` cannot be given together, in the asker's spelling; None
    unless both are."""
    if not (resume and fresh):
        return None
    if stage is Stage.LAUNCH:
        return "--resume and --fresh (RESUME=1 FRESH=1): choose one"
    return "run config resume=true and fresh=true: choose one"


def decide(state: RunDirState, cfg: Config, *, resume: bool, fresh: bool, stage: Stage) -> Decision:
    """What a run of ``cfg`` with the user's flags does to the directory ``state`` describes,
    asked at ``stage``; pure. Both flags: refused. ``resume``: resumed, unless its
    checkpoint's run trained other settings (:func:`check_resume_config`) or the checkpoint
    cannot be read; without a checkpoint the ServerApp starts from round 1, while the
    launcher refuses (as it does a run that completed all its ``num_rounds``). ``fresh``:
    started, replacing whatever is there. Neither: refused where that would delete an
    unfinished run with a checkpoint (busy when that run is live), or replace a completed run
    of other settings; a repeat of a completed run, or a directory without a checkpoint,
    is started afresh (replaced)."""
    if conflict := conflicting_flags(resume, fresh, stage):
        return Decision(Action.REFUSE, conflict)
    if resume:
        return _resume(state, cfg, stage)
    if not fresh:
        if (run := state.unfinished) is not None:
            return _keep_unfinished(state, cfg, run, stage)
        if changes := state.other_settings(cfg):
            return Decision(Action.REFUSE, _other_settings_refusal(state, cfg, changes))
    return _start(state, cfg)


def _start(state: RunDirState, cfg: Config) -> Decision:
    """A run from round 1: START in an empty directory, else REPLACE what is there."""
    if state.earlier is None:
        return Decision(Action.START)
    return Decision(
        Action.REPLACE, earlier=state.earlier, replaced=tuple(state.other_settings(cfg))
    )


def _resume(state: RunDirState, cfg: Config, stage: Stage) -> Decision:
    """The decision on a resume (see :func:`decide`); its warnings are notes, except early in
    the ServerApp (the recorder's check repeats them)."""
    if stage is Stage.LAUNCH and (problem := _nothing_to_resume(state, cfg)):
        return Decision(Action.REFUSE, problem)
    refusal, notes = _resume_check(state, cfg)
    if stage is Stage.EARLY:
        notes = ()
    if refusal is not None:
        cause = None if state.checkpoint_error is None else state.checkpoint_error.__cause__
        return Decision(Action.REFUSE, refusal, notes, cause=cause)
    if state.checkpoint is None:  # the ServerApp only: the launcher refused it above
        return dataclasses.replace(_start(state, cfg), notes=notes)
    return Decision(Action.RESUME, notes=notes)


def _nothing_to_resume(state: RunDirState, cfg: Config) -> str | None:
    """Why the launcher refuses a resume before Flower's start-up, beyond the ServerApp's own
    check: the checkpoint cannot be read, there is none (a mistyped method, seed or output
    dir: the runs of the experiment that have one are listed), or its run completed all of
    this run's rounds. None if there is a checkpoint to continue from."""
    if state.checkpoint_error is not None:
        return str(_unreadable(state.path, state.checkpoint_error))
    if state.checkpoint is None:
        experiment = state.path.parent.parent
        found = (
            f"runs of {experiment} with one: {', '.join(state.resumable[:20])}"
            if state.resumable
            else f"no run of {experiment} has one"
        )
        return (
            f"nothing to resume: {state.path} holds no checkpoint ({found}); check METHOD, "
            "SEED and OUTPUT_DIR, or leave out RESUME=1 (--resume) to start this run from "
            "round 1"
        )
    done = state.completed
    if done is not None and done >= cfg["num_rounds"]:
        return (
            f"nothing to resume: {state.path} holds a run that completed all its {done} rounds "
            f"(this run's num_rounds is {cfg['num_rounds']}); raise num_rounds above {done} "
            '(SET="num_rounds=N") to continue it'
        )
    return None


def _resume_check(state: RunDirState, cfg: Config) -> tuple[str | None, tuple[Note, ...]]:
    """Why a resume of the run in the directory with ``cfg`` is refused (None: it is not),
    and what to log about it. Its checkpoint's saved config is compared with ``cfg``
    (:func:`check_resume_config`; the run's strategy may fix more keys); a checkpoint without
    one is compared with the directory's ``config.yaml``; without either, a warning. No
    checkpoint: nothing to refuse, the run starts from round 1; one that cannot be read:
    refused, saying so."""
    if state.checkpoint_error is not None:
        return str(state.checkpoint_error), ()
    if state.checkpoint is None:
        return None, ()
    saved = state.checkpoint_config
    notes: list[Note] = []
    if saved is None:
        where = f"the checkpoint in {state.path} has no saved config"
        if state.config_yaml is None:
            return None, (
                (
                    logging.WARNING,
                    f"{where} and there is no config.yaml: cannot check that this run's "
                    "config matches the one it resumes",
                ),
            )
        saved = state.config_yaml
        notes.append((logging.INFO, f"{where}: comparing with config.yaml"))
    refusal, keys = check_resume_config(saved, cfg, state.checkpoint, state.path, state.fixed)
    if keys:
        notes.append((logging.WARNING, _added_or_removed(state.path, keys)))
    return refusal, tuple(notes)


def _keep_unfinished(state: RunDirState, cfg: Config, run: str, stage: Stage) -> Decision:
    """The refusal of a run without ``resume`` or ``fresh`` where it would delete the
    unfinished ``run``: the same command again after a stop, from the shell's history, used
    to replace the run it meant to continue. It says how to continue it (when this run's
    config may resume it) or start over; busy while that run is live (the same command
    submitted twice; not said to the run that holds the lock itself)."""
    if stage is not Stage.HELD and state.busy:
        return Decision(
            Action.BUSY,
            f"{state.path} is being written by another run: wait for it or stop it (flwr stop "
            "/ Ctrl-C), or give this run another seed or output_dir",
        )
    if (refused := _resume_check(state, cfg)[0]) is not None:  # its own advice: settings,
        return Decision(  # FRESH=1, another directory
            Action.REFUSE,
            f"{run}, which a run without resume=true or fresh=true does not replace; and it "
            f"cannot be resumed with this run's settings: {refused}",
        )
    return Decision(
        Action.REFUSE,
        f"{run}: run config resume=true (make run: RESUME=1; deploy/run.sh: --resume) "
        f"continues it; {FRESH} starts it over and replaces it",
    )


def _other_settings_refusal(state: RunDirState, cfg: Config, changes: list[str]) -> str:
    """Why a run without ``fresh`` must not replace the completed run of other settings
    (``changes``) in the directory: the same method and seed with a changed ``SET`` would
    replace its results by another experiment's. Names the differences and the ways out
    (another output_dir or seed, fresh=true, and resume=true where only num_rounds grew)."""
    extend = ""  # the resume's own check decides: PMFL fixes num_rounds, a resume changes fewer
    if cfg["num_rounds"] > (state.completed or 0) and _resume_check(state, cfg)[0] is None:
        extend = f"; resume=true (make run: RESUME=1) continues it to round {cfg['num_rounds']}"
    return (
        f"{state.path} holds a completed run with other settings ("
        + "; ".join(changes)
        + "), which a run without fresh=true does not replace: give this run its own "
        "output_dir (make run: OUTPUT_DIR=...; deploy/run.sh: --output-dir) or seed; "
        f"{FRESH} replaces it{extend}"
    )


def guard_run_dir(
    cfg: Config, directory: Path, *, resume: bool, fresh: bool, stage: Stage
) -> Decision:
    """Act on :func:`decide` for ``directory`` (:func:`survey` at ``stage``): log its notes,
    raise ConfigError (refused) or :class:`RunDirBusyError` (a live run writes it) with its
    message, or return it. Asked by the launcher before Flower starts, and by the ServerApp
    before any node is (``EARLY``) and once its recorder holds the lock (``HELD``)."""
    decision = decide(survey(cfg, directory, stage), cfg, resume=resume, fresh=fresh, stage=stage)
    for level, note in decision.notes:
        log.log(level, note)
    if decision.action is Action.BUSY:
        raise RunDirBusyError(decision.message)
    if decision.action is Action.REFUSE:
        raise ConfigError(decision.message) from decision.cause
    return decision


# ------------------------------------------------------------------------- the recorder


class RunStoppedError(RuntimeError):
    """The run's recorder was finished from outside (:meth:`RunRecorder.finish` from Flower's
    exit handler, after ``flwr stop`` or a signal) while the run went on: it must not log
    or checkpoint another round."""


class RunRecorder:
    """Writes the results files of one run as it goes (holding the directory's lock).

    ``check(dir)`` runs once the lock is held and before any file is written: a resume
    that it refuses (by raising) leaves the directory as it was. A run without ``resume``
    replaces the results already in the directory, with a warning (the ServerApp's ``check``,
    :func:`guard_run_dir` at :attr:`Stage.HELD`, refuses first where that would delete an
    unfinished run it could resume, or a completed run of other settings)."""

    def __init__(
        self,
        cfg: Config,
        resume: bool = False,
        check: Callable[[Path], object] | None = None,
    ) -> None:
        self.cfg = cfg
        self.dir = run_dir(cfg)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock: IO[str] | None = lock_run_dir(self.dir)
        try:
            if check is not None:
                check(self.dir)
        except BaseException:
            release_run_dir(self._lock)
            self._lock = None
            raise
        if not resume and (old := existing_run(self.dir)) is not None:
            log.warning(
                "%s holds the results of an earlier run (%s); this run replaces them", self.dir, old
            )
            (self.dir / "summary.json").unlink(missing_ok=True)
            for plot in self.dir.glob("*.png"):  # drawn from the replaced run's rounds
                plot.unlink()
        (self.dir / "config.yaml").write_text(dump(cfg))
        self.rounds_path = self.dir / ROUND_LOG
        self.records: list[dict[str, Any]] = []
        if resume and self.rounds_path.is_file():
            self.records = read_rounds(self.rounds_path)
        else:
            self.rounds_path.write_text("")
        self.t0 = time.time()
        self.wall_before = 0.0
        # finish() may come from another thread (Flower's exit handler, while the ServerApp's
        # thread runs a round) or from a signal handler in this one: re-entrant
        self._mutex = threading.RLock()
        self._summary: dict[str, Any] | None = None  # set by the first finish()

    def truncate_after(self, last_round: int) -> None:
        """Forget records after ``last_round`` (on resume from a checkpoint)."""
        self.records = [r for r in self.records if r["round"] <= last_round]
        self.rounds_path.write_text("".join(json.dumps(r) + "\n" for r in self.records))

    def write_round(self, record: dict[str, Any]) -> None:
        """Append one round's record to ``rounds.jsonl``; RunStoppedError once the run was
        finished (from outside), so that round is neither logged nor checkpointed."""
        with self._mutex:
            if self._summary is not None:
                raise RunStoppedError(f"the run in {self.dir} was stopped from outside")
            rec = jsonable(record)
            rec["wall_seconds"] = self.wall_before + time.time() - self.t0
            with self.rounds_path.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
            self.records.append(rec)  # after the line: a summary never counts an unlogged round

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` was called."""
        return self._summary is not None

    def finish(
        self, status: str = "completed", reason: str | None = None, *, plots: bool = True
    ) -> dict[str, Any]:
        """Write ``summary.json`` (with ``reason``, why the run stopped, when given) and, with
        ``plots`` and ``evaluation.plot``, the plots; then release the directory. Only the
        first call writes; a later one returns its summary (the ServerApp's own finish after
        Flower's exit handler finished the run as ``interrupted``), or ``{}`` while the first
        is still writing it (a signal handler in the same thread). A first call stopped
        before ``summary.json`` was written (a signal in the same thread, whose own finish
        returned at once) writes it still, then lets the stop go on."""
        with self._mutex:
            if self._summary is not None:
                return self._summary
            self._summary = {}  # claimed: a re-entrant call (a signal) returns at once
            try:
                self._finish(status, reason, plots)
            except BaseException:
                if not self._summary:  # stopped before summary.json: the rounds are all logged
                    self._write_summary(status, reason)
                raise
            finally:
                if self._lock is not None:
                    release_run_dir(self._lock)
                    self._lock = None
            return self._summary

    def _write_summary(self, status: str, reason: str | None) -> None:
        """Write ``summary.json`` with the wall time so far (resumed runs: all sessions')."""
        wall = self.wall_before + time.time() - self.t0
        self._summary = write_summary(self.dir, self.records, self.cfg, status, wall, reason)

    def _finish(self, status: str, reason: str | None, plots: bool) -> None:
        """The summary, then (with ``plots`` and ``evaluation.plot``) the run's plots."""
        self._write_summary(status, reason)
        if plots and self.cfg["evaluation"]["plot"]:
            plot_run(self.records, self.dir, title=self._title())

    def _title(self) -> str:
        """The plots' title: method, experiment and seed."""
        c = self.cfg
        return f"{c['method']} · {c['experiment']} · seed {c['seed']}"


# ---------------------------------------------------------------- after a launch stopped


def recorder_started(directory: Path, since: float) -> bool:
    """Whether a run started at ``since`` (a time.time()) got as far as its recorder in
    ``directory`` (its ``config.yaml`` is that new); before that, the directory holds what
    an earlier run left, untouched."""
    config = directory / "config.yaml"
    return config.is_file() and config.stat().st_mtime >= since


def record_interrupted(cfg: Config, since: float) -> bool:
    """Give a run started at ``since`` (a time.time()) and stopped from outside (Ctrl-C in
    the launcher, ``flwr stop``) its ``summary.json``, status ``interrupted``, from the rounds
    it recorded. Nothing is written unless this run's recorder had started (``config.yaml``
    newer than ``since``: an earlier run's results stay as they were) and it left no summary
    itself; the directory's lock is taken first, so never beside a live ServerApp
    (:func:`write_summary`). True if it wrote the summary."""
    directory = run_dir(cfg)
    summary = directory / "summary.json"
    if not recorder_started(directory, since):
        return False
    if summary.is_file() and summary.stat().st_mtime >= since:
        return False
    try:
        lock = lock_run_dir(directory)
    except RunDirBusyError:
        return False
    try:
        records = read_rounds(directory / ROUND_LOG)
        wall = records[-1].get("wall_seconds", 0.0) if records else 0.0
        write_summary(directory, records, cfg, "interrupted", wall)
    finally:
        release_run_dir(lock)
    return True


def resume_advice(directory: Path, since: float | None = None) -> str:
    """What to do after a run in ``directory`` stopped early: resume from its checkpoint, or,
    when it wrote none yet, start it again. A run started at ``since`` that stopped before
    its recorder did (Flower's start-up, node discovery) left the directory as an earlier
    run had it, whose checkpoint is not this run's: then, start it again."""
    if since is not None and not recorder_started(directory, since):
        return (
            f"it stopped before training: {directory} is as it was; the same command starts "
            "it again"
        )
    try:
        last = checkpoint_round(directory)
    except ConfigError as err:
        return f"its checkpoint cannot be read ({err.__cause__})"
    if last is None:
        return "it wrote no checkpoint yet: the same command (without --resume) starts it again"
    logged = last_logged_round(directory)  # the streamed log may lag behind the run
    return (
        "the same command with --resume (make run ... RESUME=1) continues from its last "
        f"checkpoint (round {last}; rounds.jsonl logs {max(logged, 0)} round(s))"
    )
