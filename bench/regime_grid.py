"""Run a declared grid of experiments one after another, resumably (issue 46's regime runs,
P1's matched baselines, the parity runs' "ours" side).

    .venv/bin/python bench/regime_grid.py --out /abs/grid --grid regimes_a [--dry-run]

Each entry is ``experiment method seed`` (from :data:`GRIDS`, in the order declared there:
the method against its matched FedAvg first, then the other seeds, then ablations and the
other baselines). A run whose ``summary.json`` says it completed is skipped; a run with a
checkpoint continues (``--resume``); any other is started (``--fresh`` replaces a run that
failed before its first checkpoint). A failed run is reported and the grid goes on. Runs go
to ``<out>/<experiment>/<method>/seed<k>/`` as ``make run OUTPUT_DIR=<out>`` would put
them, and the launcher's output to ``<out>/logs/``. Long grids run from their own worktree
at a fixed commit, so that a change in the checkout cannot change a running grid: the commit
is written to ``<out>/logs/commits.txt`` beside each run's name.

    .venv/bin/python bench/regime_grid.py --out /abs/grid --queue issue46 [--dry-run]

A queue (:data:`QUEUES`) is what is left of the declared grids in the declared order, each
run pinned to the commit of its protocol's grid runs. The grid runs each from a
worktree at its commit, created under ``--worktrees`` (``<out>/worktrees``) when missing,
and skips a run already committed under ``bench/results`` (the table's copy), so that a
fresh machine picks the queue up where the committed results stop with one command.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import regimes

from core.params import ConfigError
from fl_app.results import read_summary, run_completed
from fl_app.rundir import checkpoint_round

ROOT = Path(__file__).resolve().parent.parent

Entry = tuple[str, str, int]  # experiment, method, seed
Pinned = tuple[str, str, int, str | None]  # experiment, method, seed, commit to run it at


def _pairs(experiment: str, methods: list[str], seeds: list[int]) -> list[Entry]:
    """Seed by seed, each seed's methods in the order given (method, then its baseline)."""
    return [(experiment, m, s) for s in seeds for m in methods]


#: Declared before any result of the entries was seen (docs/BENCHMARKS.md, "Regimes").
GRIDS: dict[str, list[Entry]] = {
    # MOON's regime: the verdict pair, seed 0 first; P1's matched FedAvg (MOON's/PMFL's
    # model on P1); then seeds 1-2 of the pair
    "regimes_a": [
        *_pairs("regime_moon", ["moon", "fedavg_head"], [0]),
        *_pairs("p1", ["fedavg_head"], [0, 1, 2]),
        *_pairs("regime_moon", ["moon", "fedavg_head"], [1, 2]),
    ],
    # PMFL's readings questioned in review (history of aggregated globals only; the literal
    # threshold mu = 1; both) on P3, PMFL's hyperparameters; its matched FedAvg (fedavg_head)
    # and PMFL as published are committed (bench/results/p3_streams/bernoulli)
    "regimes_pmfl_p3": [
        *_pairs("p3", ["pmfl_hist", "pmfl_literal"], [0, 1, 2]),
        *_pairs("p3", ["pmfl_hist_literal"], [0, 1, 2]),
    ],
    # PMFL's fuller regime (regime_pmfl: 1000 rounds, FedAU's CNN, batch 16): the verdict
    # pair seed by seed, then FedAU, the baseline of PMFL's table (order set 2026-11-30)
    "regimes_pmfl_full": [
        *_pairs("regime_pmfl", ["pmfl", "fedavg_head"], [0, 1, 2]),
        *_pairs("regime_pmfl", ["fedau_head"], [0, 1, 2]),
    ],
    # FedRCL's regime: the paper's form (levels chosen by bench/level_probe.py) against
    # FedAvg (same model, optimiser and uniform server mean), then the authors' hard-mined
    # form, FedSCL and MOON
    "regimes_fedrcl": [
        *_pairs("regime_fedrcl", ["fedrcl", "fedavg"], [0, 1, 2]),
        *_pairs("regime_fedrcl", ["fedrcl_hard", "fedscl", "moon", "fedavg_head"], [0, 1, 2]),
    ],
    # FedRANE's regime: the paper's method (our reading) against FedAvg on its ConvNet, then
    # the authors' client (their recipe), SphereFed alone and the paper's ablations
    "regimes_fedrane": [
        *_pairs("regime_fedrane", ["fedrane", "fedavg"], [0, 1, 2]),
        *_pairs("regime_fedrane", ["spherefed", "fedrane_authors"], [0, 1, 2]),
        *_pairs("regime_fedrane", ["fedrane_wo_lra", "fedrane_wo_gne"], [0, 1, 2]),
    ],
    # MOON's mu grid {0.1, 1, 5} and FedProx on the same model
    "regimes_moon_ablations": _pairs(
        "regime_moon", ["moon_mu1", "moon_mu01", "fedprox_head"], [0, 1, 2]
    ),
    # The other baselines of FedRANE's and FedRCL's tables (declared 2026-11-30): FedProx and
    # MOON on FedRANE's model and optimiser (regime_fedrane's per_method: the authors'
    # FedProx mu, MOON on h without a head), FedProx (mu 0.001) on FedRCL's; all matched by
    # the protocol's fedavg
    "regimes_baselines": [
        *_pairs("regime_fedrane", ["fedprox", "moon"], [0, 1, 2]),
        *_pairs("regime_fedrcl", ["fedprox"], [0, 1, 2]),
    ],
}


def _at(commit: str | None, entries: list[Entry]) -> list[Pinned]:
    return [(e, m, s, commit) for e, m, s in entries]


def _of(experiment: str, entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e[0] == experiment]


#: The commit of the protocols' grid runs, and the one that declares the other baselines of
#: FedRANE's and FedRCL's tables (their ``per_method`` presets exist from there on).
GRID_COMMIT = "2a472017cb71e6dfcf11023a078144ab4a708490"
BASELINES_COMMIT = "bb862d911647cd585d210715d0002475550bd0cd"

#: Issue 46's declared grids, each run at the commit of its protocol's grid runs (the other
#: baselines at the commit that declares them). What is left of them comes in the order
#: docs/BENCHMARKS.md sets for it ("Order of what is left", 2026-11-30; the moves declared
#: since concern runs that are committed already, and committed runs are skipped).
QUEUES: dict[str, list[Pinned]] = {
    "issue46": [
        *_at(GRID_COMMIT, GRIDS["regimes_fedrane"]),
        *_at(BASELINES_COMMIT, _of("regime_fedrane", GRIDS["regimes_baselines"])),
        *_at(GRID_COMMIT, GRIDS["regimes_pmfl_full"]),
        *_at(GRID_COMMIT, GRIDS["regimes_moon_ablations"]),
        *_at(GRID_COMMIT, GRIDS["regimes_fedrcl"]),
        *_at(BASELINES_COMMIT, _of("regime_fedrcl", GRIDS["regimes_baselines"])),
    ],
}


def committed(experiment: str, method: str, seed: int, results: Path) -> bool:
    """Whether the regime table already has this run: a completed copy under one of its
    protocol's committed run directories (``bench/regimes.py``'s ``runs``). Raises
    ConfigError on a committed summary that cannot be read."""
    for p in regimes.PROTOCOLS:
        if p.experiment != experiment:
            continue
        for d in p.runs:
            run = results / d / method / f"seed{seed}"
            try:
                if _finished(run):
                    return True
            except ValueError as e:
                raise ConfigError(f"{run}/summary.json cannot be read ({e}): mend it") from e
    return False


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def worktree(commit: str, base: Path) -> Path:
    """``base/<commit[:7]>``, a worktree of this repository checked out at ``commit`` (a
    full hash; created when missing). Raises ConfigError if the path holds anything else
    than a clean checkout of exactly that commit (a folder inside another checkout, another
    commit, changed or untracked files), since the launcher would import that code."""
    wt = base / commit[:7]
    if not wt.exists():
        base.mkdir(parents=True, exist_ok=True)
        done = _git(["worktree", "add", "--detach", str(wt), commit], ROOT)
        if done.returncode != 0:
            raise ConfigError(
                f"cannot make a worktree at {commit}: {done.stderr.strip()} (in a shallow "
                "clone, `git fetch --unshallow` first)"
            )
    if not wt.is_dir():
        raise ConfigError(f"{wt} is not a folder: delete it and the grid will make a worktree")
    top = _git(["rev-parse", "--show-toplevel"], wt).stdout.strip()
    head = _git(["rev-parse", "HEAD"], wt).stdout.strip()
    changed = _git(["status", "--porcelain"], wt).stdout.strip()
    if not top or Path(top).resolve() != wt.resolve() or head != commit or changed:
        raise ConfigError(
            f"{wt} is not a clean checkout of {commit} (its checkout {top or 'none'} at "
            f"{head or 'no commit'}{', with changes' if changed else ''}): delete it (`git "
            "worktree remove --force` if it is a worktree) and the grid will make it again"
        )
    return wt


def _finished(run: Path) -> bool:
    """Whether the run directory holds a run that completed all its rounds (a ValueError
    naming the file when its summary cannot be read)."""
    summary = read_summary(run)
    return summary is not None and run_completed(summary)


def state(run: Path) -> str:
    """``completed``, ``resume`` (a checkpoint to continue from) or ``start``."""
    if _finished(run):
        return "completed"
    try:
        return "resume" if checkpoint_round(run) is not None else "start"
    except ConfigError:  # a damaged checkpoint: start over (--fresh replaces it)
        return "start"


def run_to_end(cmd: list[str], log: IO[str], cwd: Path = ROOT) -> int:
    """Run one launcher (from ``cwd``, whose code it imports) to its end; a SIGTERM or Ctrl-C
    of the grid is passed on to it (the launcher then stops its run and keeps the
    checkpoint) before the grid stops too."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)

    def stop(signum: int, _frame: object) -> None:
        proc.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def head_of(checkout: Path = ROOT) -> str:
    """The checkout's commit (with ``+dirty`` when it has uncommitted changes)."""
    head = _git(["rev-parse", "--short", "HEAD"], checkout).stdout.strip()
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], checkout).stdout.strip()
    return head + ("+dirty" if dirty else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output_dir of every run (absolute)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--grid", choices=sorted(GRIDS), action="append")
    which.add_argument("--queue", choices=sorted(QUEUES), help="run each entry at its commit")
    p.add_argument("--worktrees", help="where a queue's worktrees go [<out>/worktrees]")
    p.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    args = p.parse_args()
    out = Path(args.out).resolve()
    logs = out / "logs"
    if args.queue:
        entries: list[Pinned] = QUEUES[args.queue]
    else:
        entries = [(*e, None) for g in args.grid for e in GRIDS[g]]
    trees = Path(args.worktrees).resolve() if args.worktrees else out / "worktrees"
    results = ROOT / "bench" / "results"
    failed = []
    for experiment, method, seed, at in entries:
        run = out / experiment / method / f"seed{seed}"
        try:
            done = at is not None and committed(experiment, method, seed, results)
            what = "committed" if done else state(run)
            tag = f" @{at[:7]}" if at is not None else ""
            print(f"{experiment} {method} seed{seed}{tag}: {what}", flush=True)
            if what in ("completed", "committed") or args.dry_run:
                continue
            cwd = worktree(at, trees) if at is not None else ROOT
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        logs.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "fl_app.launch", "--experiment", experiment]
        cmd += ["--method", method, "--seed", str(seed), "--output-dir", str(out)]
        cmd += ["--resume"] if what == "resume" else ["--fresh"]
        name = f"{experiment}-{method}-seed{seed}"
        with (logs / "commits.txt").open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {name} {what} {head_of(cwd)}\n")
        t0 = time.time()
        with (logs / f"{name}.log").open("a") as log:
            rc = run_to_end(cmd, log, cwd)
        print(f"  exit {rc} after {(time.time() - t0) / 60:.1f} min", flush=True)
        if rc != 0:
            failed.append(name)
            if rc in (130, 143, -signal.SIGTERM):  # stopped from outside: stop the grid too
                break
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
