"""The run directory ``<output_dir>/<experiment>/<method>/seed<seed>/``: who may write it, and
what a run may do to what it holds.

- ``run.lock``: held (``flock``) while a run writes the directory, so a second run of the same
  experiment, method and seed fails at once instead of interleaving its rounds
  (:func:`lock_run_dir`);
- :class:`RunRecorder`: one run's hold on the directory, which writes its results files as it
  goes (their formats: :mod:`fl_app.results`);
- a resumed run must train what the checkpoint's run trained: :func:`check_resume_config`
  refuses a config that differs in anything but :data:`RESUME_MAY_CHANGE`; a completed run is
  replaced only by a run of the same settings, outside :data:`RERUN_MAY_CHANGE`
  (:func:`replaced_settings`).
"""

from __future__ import annotations

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

from fl_app.config import Config, ConfigError, dump, run_dir
from fl_app.results import (
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


# how a run ran, not what it trained: a rerun that differs from a completed run only in
# these replaces it like a repeat (see :func:`replaced_settings`); where the data is read
# from (the same dataset, e.g. downloaded once, then read without data.download) included
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


def replaced_settings(path: Path, cfg: Config) -> list[str]:
    """The settings (``"key: old -> new"``, :func:`fl_app.results.config_changes`) in which
    ``cfg`` differs from the completed run in ``path`` (its ``config.yaml``), outside
    :data:`RERUN_MAY_CHANGE`: what a run of ``cfg`` there would replace by results of
    another experiment. Empty when ``path`` holds no completed run or no readable config,
    or one of the same settings (a repeat); keys only one config has (the code added or
    removed them since) do not count."""
    if completed_rounds(path) is None:
        return []
    saved = saved_run_config(path)
    if saved is None:
        return []
    return split_config_changes(saved, cfg, RERUN_MAY_CHANGE)[0]


def check_resume_config(
    saved: Mapping[str, Any],
    cfg: Config,
    checkpoint_round: int | None,
    where: Path,
    fixed: frozenset[str] = frozenset(),
    *,
    warn: bool = True,
) -> None:
    """Refuse to resume the run in ``where`` (saved config ``saved``, checkpoint of round
    ``checkpoint_round``) with ``cfg``: raise :class:`ConfigError` listing every key that
    differs outside :data:`RESUME_MAY_CHANGE` minus ``fixed`` (keys the run's strategy
    trains differently with, e.g. PMFL's ψ schedule runs over ``num_rounds``), or when
    ``num_rounds`` is below the checkpoint's round. A key only one config has (the code
    added or removed it since the checkpoint) is logged as a warning (unless ``warn`` is
    false), not refused."""
    may_change = RESUME_MAY_CHANGE - fixed
    changed, soft = split_config_changes(saved, cfg, may_change)
    hard = [f"  {change}" for change in changed]
    if checkpoint_round is not None and cfg["num_rounds"] < checkpoint_round:
        hard.append(
            f"  num_rounds: {cfg['num_rounds']} is below the checkpoint's round "
            f"{checkpoint_round} (give num_rounds >= {checkpoint_round})"
        )
    if soft and warn:
        log.warning(
            "resuming %s: config keys added or removed since its checkpoint (taken as "
            "not changing what was trained): %s",
            where,
            "; ".join(soft),
        )
    if hard:
        at = f" (checkpoint of round {checkpoint_round})" if checkpoint_round else ""
        raise ConfigError(
            f"cannot resume the run in {where}{at}: its config differs from this run's in\n"
            + "\n".join(hard)
            + f"\nA resume may change only {', '.join(sorted(may_change))}. "
            "Resume with the run's original settings (drop the changed SET overrides), or "
            "start a new run in another OUTPUT_DIR, or start this one over with FRESH=1 (run "
            "config fresh=true), which replaces its results. Nothing in the run directory was "
            "changed."
        )


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
        records = read_rounds(directory / "rounds.jsonl")
        wall = records[-1].get("wall_seconds", 0.0) if records else 0.0
        write_summary(directory, records, cfg, "interrupted", wall)
    finally:
        release_run_dir(lock)
    return True


class RunStoppedError(RuntimeError):
    """The run's recorder was finished from outside (:meth:`RunRecorder.finish` from Flower's
    exit handler, after ``flwr stop`` or a signal) while the run went on: it must not log
    or checkpoint another round."""


class RunRecorder:
    """Writes the results files of one run as it goes (holding the directory's lock).

    ``check(dir)`` runs once the lock is held and before any file is written: a resume
    that it refuses (by raising) leaves the directory as it was. A run without ``resume``
    replaces the results already in the directory, with a warning (the ServerApp's ``check``
    refuses first where that would delete an unfinished run it could resume, or a completed
    run of other settings: :func:`fl_app.server_app.refuse_replacing`)."""

    def __init__(
        self,
        cfg: Config,
        resume: bool = False,
        check: Callable[[Path], None] | None = None,
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
        self.rounds_path = self.dir / "rounds.jsonl"
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
        wall = self.wall_before + time.time() - self.t0
        self._summary = write_summary(self.dir, self.records, self.cfg, status, wall, reason)

    def _finish(self, status: str, reason: str | None, plots: bool) -> None:
        self._write_summary(status, reason)
        if plots and self.cfg["evaluation"]["plot"]:
            plot_run(self.records, self.dir, title=self._title())

    def _title(self) -> str:
        c = self.cfg
        return f"{c['method']} · {c['experiment']} · seed {c['seed']}"
