"""Results of one run: ``<output_dir>/<experiment>/<method>/seed<seed>/``.

- ``config.yaml``: the merged config;
- ``rounds.jsonl``: one JSON object per round with every metric (appended as rounds finish);
- ``summary.json``: final, best, EMA(0.9), last-5 mean and top-5 mean of the global test
  accuracy, P-FL accuracy, dropped results, wall time, status;
- ``curves.png``: accuracy and loss per round;
- ``run.lock``: held (``flock``) while a run writes the directory, so a second run of the same
  experiment, method and seed fails at once instead of interleaving its rounds.

A resumed run must train what the checkpoint's run trained: :func:`check_resume_config`
refuses a config that differs in anything but :data:`RESUME_MAY_CHANGE`.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import yaml

from core.params import Config, ConfigError
from fl_app.config import CONF_DIR, dump, run_dir

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
_ABSENT = object()


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


def ema(values: list[float], decay: float = 0.9) -> float:
    """Exponential moving average ``e_t = decay·e_{t−1} + (1−decay)·v_t``, ``e_1 = v_1``
    (FedRCL reports EMA(0.9) of the test accuracy)."""
    out = values[0]
    for v in values[1:]:
        out = decay * out + (1 - decay) * v
    return out


def summarize(records: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """Summary statistics of a run from its per-round records."""
    accs = [r["accuracy"] for r in records if r.get("accuracy") is not None and r["round"] > 0]
    pers = [
        r["train"]["personal_accuracy"]
        for r in records
        if isinstance(r.get("train"), dict) and "personal_accuracy" in r["train"]
    ]
    out: dict[str, Any] = {
        "method": cfg["method"],
        "experiment": cfg["experiment"],
        "seed": cfg["seed"],
        "client": cfg["client"]["name"],
        "server": cfg["server"]["name"],
        "rounds_completed": max((r["round"] for r in records), default=0),
        "num_rounds": cfg["num_rounds"],
        "final_accuracy": accs[-1] if accs else None,
        "best_accuracy": max(accs) if accs else None,
        "ema_accuracy": ema(accs) if accs else None,
        "last5_accuracy": float(np.mean(accs[-5:])) if accs else None,
        "top5_accuracy": float(np.mean(sorted(accs)[-5:])) if accs else None,
        "final_personal_accuracy": pers[-1] if pers else None,
        "last5_personal_accuracy": float(np.mean(pers[-5:])) if pers else None,
        "dropped_results": sum(
            sum(1 for f in r.get("failures", []) if f.get("kind") == "rejected") for r in records
        ),
        "failed_results": sum(
            sum(1 for f in r.get("failures", []) if f.get("kind") in ("error", "missing"))
            for r in records
        ),
    }
    for key in ("federated_accuracy", "effective_rank", "robust_fgsm", "robust_pgd"):
        vals = [r[key] for r in records if r.get(key) is not None]
        if vals:
            out[f"final_{key}"] = vals[-1]
    return out


def _flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same(a: Any, b: Any) -> bool:
    if a is _ABSENT or b is _ABSENT:
        return a is b
    numbers = (int, float, np.integer, np.floating)
    if all(isinstance(v, numbers) and not isinstance(v, bool) for v in (a, b)):
        return bool(a == b)  # 1 and 1.0 are the same setting
    # a JSON/YAML round trip turns tuples into lists: compare the JSON forms
    return json.dumps(_jsonable(a), sort_keys=True) == json.dumps(_jsonable(b), sort_keys=True)


def differing_keys(configs: Sequence[Mapping[str, Any]], ignore: frozenset[str]) -> list[str]:
    """The dotted keys outside ``ignore`` whose values are not the same (as a resume
    compares them: 1 and 1.0 alike; a key one config lacks differs) in all ``configs``,
    sorted."""
    flats = [_flatten(c) for c in configs]
    keys = sorted({k for f in flats for k in f} - ignore)
    return [
        k
        for k in keys
        if any(not _same(flats[0].get(k, _ABSENT), f.get(k, _ABSENT)) for f in flats[1:])
    ]


def _diff(
    old: Mapping[str, Any], new: Mapping[str, Any], ignore: frozenset[str]
) -> list[tuple[str, Any, Any]]:
    flat_old, flat_new = _flatten(old), _flatten(new)
    keys = list(flat_old) + [k for k in flat_new if k not in flat_old]
    return [
        (k, flat_old.get(k, _ABSENT), flat_new.get(k, _ABSENT))
        for k in keys
        if k not in ignore and not _same(flat_old.get(k, _ABSENT), flat_new.get(k, _ABSENT))
    ]


def _absent(*values: Any) -> bool:
    return any(v is _ABSENT for v in values)


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else json.dumps(_jsonable(value))


def _change(key: str, old: Any, new: Any) -> str:
    return f"{key}: {_show(old)} -> {_show(new)}"


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], ignore: frozenset[str] = frozenset()
) -> list[str]:
    """The dotted keys whose values differ between two nested configs, as
    ``"key: old -> new"`` (values in JSON: ``0.01``, ``"all"``, ``[6, 16]``, ``null``; a key
    only one side has shows ``(absent)``), in ``old``'s key order, then keys only ``new``
    has; keys in ``ignore`` are left out. Pure: neither config is modified."""
    return [_change(*d) for d in _diff(old, new, ignore)]


#: What makes two runs' training comparable (BENCHMARKS.md: every Δ compares runs on the
#: same model, projection head included, and the same client optimiser): every ``model.*``
#: key and these client keys.
OPTIMISER_KEYS = (
    "client.epochs",
    "client.steps",
    "client.batch_size",
    "client.lr",
    "client.lr_decay",
    "client.momentum",
    "client.weight_decay",
    "client.grad_clip",
)


def training_setup(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The model and client-optimiser settings of a config, flattened (``model.name``,
    ``client.lr``, …): two runs whose setups differ trained different models or with
    different optimisers, so a Δ between them is not the method's."""
    flat = _flatten(cfg)
    keys = [k for k in flat if k.startswith("model.")] + list(OPTIMISER_KEYS)
    return {k: flat.get(k, _ABSENT) for k in keys}


def setup_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``"key: a -> b"`` for every model or client-optimiser setting in which configs ``a``
    and ``b`` differ (:func:`training_setup`); empty when a Δ between them is fair. A key
    one config lacks (a run from before the key existed) counts as its ``conf/base.yaml``
    default, which is what that run trained with."""
    sa, sb = training_setup(a), training_setup(b)
    defaults = training_setup(_base_defaults())
    for s in (sa, sb):
        for key, value in defaults.items():
            if s.get(key, _ABSENT) is _ABSENT:
                s[key] = value
    return [
        _change(k, sa.get(k, _ABSENT), sb.get(k, _ABSENT))
        for k in list(sa) + [k for k in sb if k not in sa]
        if not _same(sa.get(k, _ABSENT), sb.get(k, _ABSENT))
    ]


def _base_defaults() -> dict[str, Any]:
    """``conf/base.yaml`` as it is (every key's default)."""
    with (CONF_DIR / "base.yaml").open() as f:
        base: dict[str, Any] = yaml.safe_load(f)
    return base


def plain_fedavg(cfg: Mapping[str, Any]) -> bool:
    """Whether a config is FedAvg itself: plain cross-entropy clients (no adversarial
    training) averaged by the plain FedAvg server, on whatever model it names; the baseline
    a method's Δ is taken against when its :func:`training_setup` is the method's."""
    c, s = cfg.get("client", {}), cfg.get("server", {})
    return c.get("name") == "fedavg" and not c.get("adversarial") and s.get("name") == "fedavg"


def run_setup_config(run: Path, summary: Mapping[str, Any]) -> Config | None:
    """The config the run in ``run`` trained with: its ``config.yaml``, else (runs committed
    with their summary and round log only) what its experiment and method presets give
    today; None when neither can be had (a method without a preset)."""
    cfg = saved_run_config(run)
    if cfg is not None:
        return cfg
    from fl_app.config import load_config  # what the presets give, for older committed runs

    try:
        return load_config(summary.get("experiment"), summary.get("method"))
    except (ConfigError, OSError, ValueError, TypeError):
        return None


def matched_baseline(
    method: str, configs: Mapping[str, Mapping[str, Any] | None], baseline: str
) -> tuple[str | None, list[str]]:
    """The run group a ``method``'s Δ is taken against, and why not ``baseline`` itself:
    ``baseline`` when it trained the same model with the same client optimiser
    (:func:`setup_differences`), else another group of ``baseline``'s kind (the same client
    and server, e.g. ``fedavg_head`` for ``fedavg``) that did, else None. The list holds
    the settings in which ``baseline`` differs (empty when it is the match). ``configs``:
    each group's config (None: unknown, which matches nothing); without a run of
    ``baseline`` its kind is plain FedAvg (:func:`plain_fedavg`)."""
    mine, base = configs.get(method), configs.get(baseline)
    if mine is None:
        return None, ["(the method's config is unknown)"]
    differ = ["(no run of the baseline)"] if base is None else setup_differences(base, mine)
    if not differ:
        return baseline, []

    def kind(c: Mapping[str, Any]) -> tuple[Any, ...]:
        cl, sv = c.get("client", {}), c.get("server", {})
        return cl.get("name"), bool(cl.get("adversarial")), sv.get("name")

    def same_kind(c: Mapping[str, Any]) -> bool:  # without a run of the baseline: FedAvg's
        return kind(c) == kind(base) if base is not None else plain_fedavg(c)

    for other, cfg in sorted(configs.items(), key=lambda kv: (len(kv[0]), kv[0])):
        if other in (method, baseline) or cfg is None or not same_kind(cfg):
            continue
        if not setup_differences(cfg, mine):
            return other, differ
    return None, differ


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
    diffs = _diff(saved, cfg, may_change)
    hard = [f"  {_change(*d)}" for d in diffs if not _absent(*d[1:])]
    soft = [_change(*d) for d in diffs if _absent(*d[1:])]
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


def run_completed(summary: Mapping[str, Any]) -> bool:
    """Whether a run's summary is that of a run that finished all its rounds (the runs the
    results tables and ``fl_app.compare`` count)."""
    return summary.get("status") == "completed" and summary.get(
        "rounds_completed", 0
    ) >= summary.get("num_rounds", 0)


def last_logged_round(path: Path) -> int:
    """The last round in the round log of the run directory ``path`` (plain or gzipped);
    lines that are not round records are skipped; -1 when there is none."""
    try:
        log = read_round_log(path)
    except (OSError, ValueError):
        return -1
    rounds = -1
    for line in log.splitlines():
        try:
            rounds = max(rounds, int(json.loads(line)["round"]))
        except (ValueError, KeyError, TypeError):
            continue
    return rounds


def read_summary(path: Path) -> dict[str, Any] | None:
    """The ``summary.json`` of the run directory ``path``; None when there is none; a
    ValueError naming the file when it cannot be read or is not a JSON object."""
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        return None
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{summary_path}: not a run summary ({err})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path}: not a run summary (not a JSON object)")
    return summary


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


def replaced_settings(path: Path, cfg: Config) -> list[str]:
    """The settings (``"key: old -> new"``, :func:`config_changes`) in which ``cfg`` differs
    from the completed run in ``path`` (its ``config.yaml``), outside
    :data:`RERUN_MAY_CHANGE`: what a run of ``cfg`` there would replace by results of
    another experiment. Empty when ``path`` holds no completed run or no readable config,
    or one of the same settings (a repeat); keys only one config has (the code added or
    removed them since) do not count."""
    if completed_rounds(path) is None:
        return []
    saved = saved_run_config(path)
    if saved is None:
        return []
    return [_change(*d) for d in _diff(saved, cfg, RERUN_MAY_CHANGE) if not _absent(*d[1:])]


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


def saved_run_config(path: Path) -> Config | None:
    """The config saved in ``path/config.yaml`` (None when missing or unreadable)."""
    try:
        data = yaml.safe_load((path / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


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


def read_rounds(path: Path) -> list[dict[str, Any]]:
    """The records of a ``rounds.jsonl`` (none when the file is missing)."""
    return parse_rounds(path.read_text()) if path.is_file() else []


def parse_rounds(log: str | bytes) -> list[dict[str, Any]]:
    """The round records of a round log: one JSON object a line, blank lines skipped."""
    return [json.loads(line) for line in log.splitlines() if line.strip()]


Curve = list[tuple[int, float]]  # (round, value) pairs of one run


def read_round_log(run: Path) -> bytes:
    """A run directory's round log: ``rounds.jsonl``, or the gzipped ``rounds.jsonl.gz`` of
    the copies committed under ``bench/results/``."""
    plain = run / "rounds.jsonl"
    return (
        plain.read_bytes()
        if plain.is_file()
        else gzip.decompress((run / "rounds.jsonl.gz").read_bytes())
    )


def curve(records: list[dict[str, Any]], key: str = "accuracy") -> Curve:
    """``[(round, value), ...]`` of the round records that carry ``key``."""
    return [(r["round"], r[key]) for r in records if r.get(key) is not None]


def mean_curve(curves: list[Curve]) -> tuple[list[int], list[float]]:
    """The rounds that every one of several runs' curves has, and the mean value over the
    runs at each of them (curves evaluated on other rounds are aligned by round number)."""
    common = set.intersection(*(set(r for r, _ in c) for c in curves))
    rounds = sorted(common)
    values = [dict(c) for c in curves]
    return rounds, [sum(v[r] for v in values) / len(values) for r in rounds]


def write_summary(
    directory: Path,
    records: list[dict[str, Any]],
    cfg: Config,
    status: str,
    wall: float,
    reason: str | None = None,
) -> dict[str, Any]:
    """Write ``directory/summary.json`` (:func:`summarize` of ``records`` with ``status``,
    ``wall_seconds`` and, when given, ``reason``: why a run stopped), replaced atomically,
    and return it."""
    summary = summarize(records, cfg)
    summary["status"] = status
    summary["wall_seconds"] = wall
    if reason is not None:
        summary["reason"] = reason
    tmp = directory / "summary.json.tmp"
    tmp.write_text(json.dumps(_jsonable(summary), indent=2) + "\n")
    tmp.replace(directory / "summary.json")
    return summary


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
            rec = _jsonable(record)
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
            plot_curves(self.records, self.dir / "curves.png", title=self._title())
            plot_client_matrix(
                self.records,
                "cos_global_client",
                self.dir / "cos_global.png",
                "cos(global update, client update)  [FedRANE Fig. 3]",
            )
            plot_client_matrix(
                self.records,
                "aggregation_weights",
                self.dir / "aggregation_weights.png",
                "aggregation weight",
            )
            plot_series(
                self.records,
                "update_deviation",
                self.dir / "update_deviation.png",
                "update deviation Dev^t = Σ_k (1 − cos(Δ_k, mean Δ))  [PMFL Def. 1]",
            )

    def _title(self) -> str:
        c = self.cfg
        return f"{c['method']} · {c['experiment']} · seed {c['seed']}"


def plot_curves(records: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Global test accuracy/loss (and P-FL accuracy when present) per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = [r for r in records if r.get("accuracy") is not None]
    tr = [r for r in records if isinstance(r.get("train"), dict) and r["train"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot([r["round"] for r in ev], [r["accuracy"] for r in ev], label="global test (G-FL)")
    pers = [
        (r["round"], r["train"]["personal_accuracy"])
        for r in tr
        if "personal_accuracy" in r["train"]
    ]
    if pers:
        ax1.plot(*zip(*pers, strict=True), label="local models (P-FL)")
    _round_axis(ax1)
    ax1.set_ylabel("accuracy")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot([r["round"] for r in ev], [r.get("loss") for r in ev], label="global test loss")
    ax2.plot(
        [r["round"] for r in tr],
        [r["train"].get("train_loss") for r in tr],
        label="client train loss",
    )
    _round_axis(ax2)
    ax2.set_ylabel("loss")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _round_axis(ax: Any) -> None:
    """Label the x axis "round", with whole-number ticks only (no round 0.5)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_series(records: list[dict[str, Any]], key: str, path: Path, label: str) -> None:
    """Line plot over rounds of a per-round number recorded under ``key`` (rounds without it
    are left out); nothing is written if no round has it."""
    points = [(r["round"], r[key]) for r in records if isinstance(r.get(key), int | float)]
    if not points:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*points, strict=True), marker="." if len(points) <= 50 else None)
    _round_axis(ax)
    ax.set_ylabel(key)
    ax.set_title(label, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_client_matrix(records: list[dict[str, Any]], key: str, path: Path, label: str) -> None:
    """Heatmap (round × client) of a per-client value recorded under ``key`` each round
    (blank where a client did not take part); nothing is written if no round has it."""
    rows = [(r["round"], r[key]) for r in records if isinstance(r.get(key), dict) and r[key]]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = sorted({int(c) for _, v in rows for c in v})
    col = {c: i for i, c in enumerate(clients)}
    mat = np.full((len(rows), len(clients)), np.nan)
    for i, (_, vals) in enumerate(rows):
        for c, v in vals.items():
            mat[i, col[int(c)]] = v if v is not None else np.nan
    fig, ax = plt.subplots(figsize=(min(12, 2 + 0.25 * len(clients)), 4))
    im = ax.imshow(
        mat.T,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        extent=(rows[0][0] - 0.5, rows[-1][0] + 0.5, len(clients) - 0.5, -0.5),
    )
    _round_axis(ax)
    ax.set_ylabel("client (partition id)")
    if len(clients) <= 20:
        ax.set_yticks(range(len(clients)), [str(c) for c in clients])
    fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
