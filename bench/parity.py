"""Parity with the authors' code: their public code and ours on the same Fashion-MNIST
partition, model and hyperparameters, compared round by round (docs/parity.md).

    nice -n 10 .venv/bin/python bench/parity.py --method moon --theirs /path/to/MOON \\
        --rounds 30 --seeds 0 1

For each seed: writes the partition file with our data code (``core.data.partitions_of``;
both sides read these indices), runs their code on it (``bench/parity_theirs.py``, their
files untouched, a few functions replaced in memory) and ours through the launcher, as
``make run`` does, with ``data.partition_file`` pointing at it. Methods:

- ``moon``: QinbinLi/MOON ``--alg moon`` vs our ``moon``, regime_moon (MOON's CIFAR-10
  recipe: 10 parties, Dirichlet 0.5, 10 local epochs, batch 64, SGD 0.01/0.9/1e-5, μ 5,
  τ 0.5, simple-cnn-mnist with a 256-d head, every party every round);
- ``fedavg_head``: the same code and settings with ``--alg fedavg`` vs our ``fedavg_head``;
- ``fedau``: IBM/fedau ``-weighting adaptive`` vs our ``fedau``, P3 (250 nodes, Dirichlet
  0.1, Bernoulli participation with PMFL's probabilities, 5 local steps of batch 64, lr 0.1,
  cutoff 50) on our P3 model; every round evaluated.
- ``fedrcl_hard``: skynbe/FedRCL ``client=fedrcl`` (their hard-mined CLLoss) vs our
  ``fedrcl_hard``, regime_fedrcl (100 clients, Dirichlet 0.3, 5 a round, 5 local epochs,
  batch 50, SGD 0.1 with decay 0.998, wd 1e-3, clipping 10, unweighted server mean, the
  levels the regime contrasts) on our regime CNN; every round evaluated. Their code needs
  packages ours does not (``--their-deps``, docs/parity.md).
- ``fedavg_fedrcl``: the same code and settings with ``client=base`` (FedAvg: cross-entropy
  alone) vs our ``fedavg`` in regime_fedrcl, R-FedRCL's matched FedAvg.
- ``fedrane_authors``: XeniaLLL/HyperFed_and_FedRANE-master ``system/main.py -algo FedRANE``
  (their ``ClientFedRANE.train_raw`` and GNE server, which do not run as released:
  parity_theirs.py says what is put in place) vs our ``fedrane_authors`` in its literal
  form (``client.mixup_on=features``, as their line 154), regime_fedrane (20 clients, all
  each round, Dirichlet 0.1, 75/25 local split, 5 local epochs, batch 128, SGD 0.01/0.9/1e-5,
  FedAvgCNN with a 64-d feature); every round evaluated. Their code needs ``cvxpy`` and
  ``ecos`` (``--their-deps``).

Their command line is derived from our config, so both sides get the same settings by
construction; a setting their code fixes (MOON's momentum 0.9, FedAU's plain SGD) is checked
against ours. Every side of every seed is kept under ``--out`` (``<method>/seed<k>/``:
``theirs.json``/``ours.json`` with the per-round accuracies, their working directory and
log, our run directory) and reused when asked again with the same settings, so an
interrupted command picks up where it stopped (an interrupted run of ours resumes from its
checkpoint; one of theirs starts again).

Results: ``bench/results/parity.json`` (``--results``), a list with one row per method
(a new run of a method replaces its row), ``parity.md`` (the README's table of those rows),
``parity_gains.md`` (a method's gain over FedAvg in their code and in ours, from the rows of
the pairs in ``GAIN_PAIRS``: MOON's and FedRCL's rows beside FedAvg run by the same codes)
and ``parity_<method>.png`` (accuracy per round, theirs and ours, every seed). A row:
``method``, ``seeds``, ``rounds``, ``theirs`` and
``ours`` (the last-5 accuracy of each seed: the mean test accuracy of the last five rounds,
in percent), ``gap`` = |mean over seeds of theirs − mean over seeds of ours| and ``spread``
= the larger of the two sides' seed-to-seed ranges (max − min over seeds) of the last-5
accuracy, ``tolerance`` = max(spread, 1 point) and ``within`` = gap <= tolerance (the
target). The same per round (round r's accuracy in place of the last-5): ``rounds_within``,
the number of rounds whose gap is within that round's tolerance, and ``early_gap`` /
``early_spread``, the mean gap and spread over rounds 1–5. ``curves`` holds every seed's
accuracy per round (percent) on both sides, ``settings`` our overrides and their command
line, ``commit`` their code's commit.

Short validation runs: ``--train-subset``, ``--test-subset`` and ``--epochs`` (local
epochs; not FedAU) shrink the data and work on both sides alike; ``--results`` elsewhere
keeps such a run out of ``bench/results``. ``--same-init`` (MOON's code; a diagnostic,
not a parity run) starts their nets from our initial weights, which removes the one
difference that is pure chance; its row is ``<method>+same_init`` (our side is reused).
``--mixup-on-logits`` (FedRANE's code; a diagnostic, not a parity run) scores the mixup
cross-entropy on the logits on both sides: ours with ``client.mixup_on=classifier``, theirs
with their cross-entropy putting the mixed features through their classifier first
(parity_theirs.py), as their own ``train_mixup`` scores it; its row is
``fedrane_authors+mixup_on_logits`` and both its sides run in a folder of their own.
``--reg-graph-aug A`` (FedRANE's code; a diagnostic, not a parity run) runs both sides with
the classifier seeing ``A·Z + (1−A)·GAT(Z)``: their own ``-reg_graph_aug A`` (a setting of
their ``main.py``, default 0; no change to their code) and our ``client.alpha_z=A``; its row
gains ``+reg_graph_aug<A>`` and runs in a folder of its own too. ``--fresh-optimizer``
(FedRANE's code; a diagnostic) clears their clients' optimizer state (SGD's momentum) before
every round, as our clients start each round; their client keeps it across rounds. Our side
is reused; the row gains ``+their_fresh_optimizer``. The other way round, ``--our-drop-last``
and ``--our-kept-optimizer`` (FedRANE's code; diagnostics) change our side only, to do as
theirs does: our clients drop each pass's last partial batch (``client.drop_last``, their
loader's ``drop_last=True``) and keep their optimizer state from round to round
(``client.keep_optimizer_state``, their client objects kept for the run). Their side is
reused; our runs are kept apart (``ours_drop_last*``, ``ours_kept_optimizer*``) and the row
gains ``+our_drop_last`` / ``+our_kept_optimizer``. ``--our-gne-in-theirs`` (FedRANE's code; a
diagnostic) makes their server step with our GNE weights, computed on its own clients'
updates, and records both weight vectors each round (``gne_weights.jsonl`` in their run's
folder); our side is reused and the row gains ``+their_server_our_gne``.

Run it with ``nice -n 10`` next to other work: every child (their code, our launcher, its
SuperLink and Ray) inherits the priority.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from parity_theirs import OurData, our_probabilities
from runs import ROOT, launch

from clients.fedrcl import level_indices
from core.data import partitions_of
from core.models import build_model
from core.params import Config
from fl_app.config import load_config, parse_overrides
from fl_app.launch import ENV as LAUNCH_ENV
from fl_app.results import ROUND_LOG, read_rounds, read_summary, run_completed

LAST = 5  # the last-5 accuracy
EARLY = 5  # rounds 1..EARLY: the first rounds' gap and spread
MIN_TOLERANCE = 1.0  # points: the target is gap <= max(spread, this)

# Our launcher's local SuperLink on ports of its own (PARITY_FLWR_PORT and the port two above
# it; default 39731) and Ray's files in a folder of its own, so that a parity run neither
# meets nor stops the SuperLink of the runs of other checkouts (on the launcher's ports).
PARITY_PORT = int(os.environ.get("PARITY_FLWR_PORT", "39731"))
PARITY_ENV = {
    "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(PARITY_PORT),
    "FLWR_LOCAL_CONTROL_API_PORT": str(PARITY_PORT + 2),
}


@dataclasses.dataclass(frozen=True)
class Spec:
    """One method's parity setting: which of their programs, which of our runs."""

    family: str  # their code: a key of THEIR_CODE (bench/parity_theirs.py runs it)
    experiment: str  # our experiment preset: the method's own regime
    method: str  # our method preset
    overrides: str  # on top of the preset, on our side (their side gets the same values)
    alg: str = ""  # MOON's --alg


METHODS = {
    "moon": Spec("moon", "regime_moon", "moon", "data.test_fraction=0", alg="moon"),
    "fedavg_head": Spec("moon", "regime_moon", "fedavg_head", "data.test_fraction=0", "fedavg"),
    "fedau": Spec(
        "fedau",
        "p3",
        "fedau",
        "data.test_fraction=0 evaluation.every=1 server.checkpoint_every=1 "
        "server.interval_timing=before",
    ),
    "fedrcl_hard": Spec(
        "fedrcl",
        "regime_fedrcl",
        "fedrcl_hard",
        "data.test_fraction=0 evaluation.every=1 evaluation.effective_rank=false",
    ),
    # R-FedRCL's matched FedAvg in FedRCL's code (client=base): their FedRCL against their
    # FedAvg on the same data, beside ours
    "fedavg_fedrcl": Spec(
        "fedrcl",
        "regime_fedrcl",
        "fedavg",
        "data.test_fraction=0 evaluation.every=1 evaluation.effective_rank=false",
    ),
    # their train_raw scores the mixup CE on the features (clientFedRANE.py:154): the preset's
    # literal form, so that both sides train the same loss
    "fedrane_authors": Spec(
        "fedrane", "regime_fedrane", "fedrane_authors", "client.mixup_on=features"
    ),
}


# ------------------------------------------------------------------- their command lines
def _require(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"parity: {what}")


def moon_args(cfg: Config, alg: str) -> list[str]:
    """QinbinLi/MOON's main.py arguments for our config ``cfg`` (their working directory:
    ``logs/``, ``models/``). Raises SystemExit for a setting their code cannot take."""
    c, m, d, s = cfg["client"], cfg["model"], cfg["data"], cfg["server"]
    simple_cnn_mnist = dict(name="cnn", channels=[6, 16], kernel_size=5, hidden=[120])
    _require(
        all(m[k] == v for k, v in simple_cnn_mnist.items()) and m["feature_dim"] == 84,
        "MOON's simple-cnn-mnist is model.channels=[6,16] kernel_size=5 hidden=[120] "
        f"feature_dim=84; the config has {m}",
    )
    _require(m["projection_dim"] > 0, "MOON's ModelFedCon has a projection head: projection_dim")
    _require(c["momentum"] == 0.9, "MOON's SGD has momentum 0.9 (fixed in main.py)")
    _require(c["steps"] is None, "MOON trains whole local epochs: client.steps must be null")
    _require(c["lr_decay"] == 1.0 and not c["grad_clip"], "MOON has no lr decay nor clipping")
    _require(s["participation"] == "all", "MOON's --sample_fraction 1: server.participation=all")
    _require(s["name"] == "fedavg", "MOON's server is FedAvg (sample-weighted mean)")
    _require(d["test_fraction"] == 0, "MOON's parties train on all their data: test_fraction=0")
    _require(cfg["data"]["dataset"] == "fmnist", "the parity runs use Fashion-MNIST")
    args = ["--dataset", "fmnist", "--model", "simple-cnn-mnist", "--alg", alg]
    args += [
        "--partition",
        "noniid",
        "--beta",
        str(d["alpha"]),
        "--n_parties",
        str(cfg["num_clients"]),
    ]
    args += ["--epochs", str(c["epochs"]), "--batch-size", str(c["batch_size"])]
    args += ["--lr", str(c["lr"]), "--reg", str(c["weight_decay"]), "--optimizer", "sgd"]
    args += ["--out_dim", str(m["projection_dim"]), "--use_project_head", "1"]
    if alg == "moon":
        args += ["--mu", str(c["mu"]), "--temperature", str(c["tau"])]
        args += ["--model_buffer_size", str(c["buffer_size"]), "--pool_option", "FIFO"]
    args += ["--comm_round", str(cfg["num_rounds"]), "--init_seed", str(cfg["seed"])]
    args += ["--sample_fraction", "1.0", "--device", "cpu", "--datadir", "./data/"]
    args += ["--logdir", "./logs/", "--modeldir", "./models/", "--log_file_name", "parity"]
    return args


def fedau_args(cfg: Config) -> list[str]:
    """IBM/fedau's main.py arguments for our config ``cfg`` (one round = ``client.steps``
    iterations; evaluated every round). Raises SystemExit for a setting their code cannot
    take."""
    c, d, s = cfg["client"], cfg["data"], cfg["server"]
    _require(s["name"] == "fedau", "FedAU's parity compares our fedau server")
    _require(s["history"] == 1 and s["adaptive_weights"], "FedAU: history 1, adaptive weights")
    _require(
        s["interval_timing"] == "before",
        "FedAU's code weighs an update by the intervals recorded before it (main.py:156-171): "
        "server.interval_timing=before",
    )
    _require(c["steps"] is not None, "FedAU's clients take client.steps local iterations")
    _require(c["momentum"] == 0 and c["weight_decay"] == 0, "FedAU's SGD: no momentum nor wd")
    _require(c["lr_decay"] == 1.0 and not c["grad_clip"], "FedAU: no lr decay (in R rounds)")
    _require(c["name"] == "fedavg", "FedAU's clients train on cross-entropy only")
    _require(d["test_fraction"] == 0, "FedAU's nodes train on all their data: test_fraction=0")
    _require(cfg["data"]["dataset"] == "fmnist", "the parity runs use Fashion-MNIST")
    pattern = {
        "bernoulli": "bernoulli",
        "markov": f"markov-{s['markov_p01']}",
        "cyclic": f"cyclic-{s['cyclic_period']}",
    }.get(s["participation"])
    _require(pattern is not None, "FedAU's participation: bernoulli, markov or cyclic")
    steps, rounds = c["steps"], cfg["num_rounds"]
    args = ["-data", "fashion", "-weighting", "adaptive", "-k-adaptive", str(s["cutoff"])]
    args += ["-participation", str(pattern), "-lr", str(c["lr"]), "-lr-global", str(s["server_lr"])]
    args += ["-minibatch", str(c["batch_size"]), "-iters-per-round", str(steps)]
    args += ["-iters-total", str(steps * rounds), "-iters-per-eval", str(steps)]
    args += ["-total-workers", str(cfg["num_clients"]), "-seeds", str(cfg["seed"])]
    args += ["-data-dirichlet-alpha", str(d["alpha"])]
    args += ["-participation-dirichlet-alpha", str(s["participation_beta"])]
    args += ["-participation-prob-mean", str(s["participation_mean"])]
    args += ["-participation-prob-min", str(s["participation_floor"])]
    args += ["-gpu", "0", "-save-checkpoint", "0", "-save-final-model", "0", "-out", "results"]
    return args


def fedrcl_levels(cfg: Config) -> list[int]:
    """The level indices our client contrasts (``client.levels``) for our model."""
    return level_indices(cfg["client"]["levels"], len(build_model(cfg).level_names))


def fedrcl_args(cfg: Config) -> list[str]:
    """skynbe/FedRCL's Hydra overrides (``federated_train.py``) for our config ``cfg``: our
    ``fedrcl`` client (hard-mined) is their ``client=fedrcl``, our ``fedavg`` their
    ``client=base`` (cross-entropy alone, with the same optimiser, clipping and server).
    Raises SystemExit for a setting their code cannot take or fixes otherwise."""
    c, d, s = cfg["client"], cfg["data"], cfg["server"]
    _require(c["name"] in ("fedrcl", "fedavg"), "their clients are FedRCL's and FedAvg's")
    loss = ["client=base"]
    if c["name"] == "fedrcl":
        _require(c["mining"] == "hard", "their CLLoss is client.mining=hard")
        _require(c["rcl_weight"] == 1.0, "their L_RCL enters with weight 1: client.rcl_weight=1")
        _require(
            c["beta"] == 1.0 and c["lam"] == 0.7,
            "their penalty pair has weight 1 and threshold 0.7 (configs/client/fedrcl.yaml): "
            "client.beta=1 client.lam=0.7",
        )
        levels = ",".join(str(i) for i in fedrcl_levels(cfg))
        loss = ["client=fedrcl", f"client.rcl_loss.temp={c['tau']}"]
        loss += [f"client.rcl_loss.branch_level=[{levels}]"]
    _require(c["steps"] is None, "FedRCL trains whole local epochs: client.steps must be null")
    _require(c["grad_clip"] == 10.0, "their client clips the gradient norm at 10: grad_clip=10")
    _require(s["name"] == "fedavg" and s["weighting"] == "uniform", "their server: sum / C")
    _require(s["participation"] == "uniform", "their trainer draws M clients uniformly")
    n, fraction = cfg["num_clients"], s["fraction"]
    _require(
        max(int(fraction * n), 1) == max(s["min_clients"], round(fraction * n)),
        f"their M = int(rate·N) = {max(int(fraction * n), 1)} must be our sample size",
    )
    _require(d["test_fraction"] == 0, "their clients train on all their data: test_fraction=0")
    _require(cfg["evaluation"]["every"] == 1, "their eval.freq 1: evaluation.every=1")
    _require(cfg["data"]["dataset"] == "fmnist", "the parity runs use Fashion-MNIST")
    return [
        *loss,
        "dataset=cifar10",  # 10 classes; the data itself is ours (parity_theirs.py)
        f"seed={cfg['seed']}",
        f"trainer.num_clients={n}",
        f"trainer.participation_rate={fraction}",
        f"trainer.global_rounds={cfg['num_rounds']}",
        f"trainer.local_epochs={c['epochs']}",
        f"trainer.local_lr={c['lr']}",
        f"trainer.local_lr_decay={c['lr_decay']}",
        f"batch_size={c['batch_size']}",
        f"optimizer.momentum={c['momentum']}",
        f"optimizer.wd={c['weight_decay']}",
        f"split.alpha={d['alpha']}",
        "eval.freq=1",
        "use_amp=False",
        "multiprocessing=False",
        "wandb=False",
        "pin_memory=False",
        "hydra.run.dir=.",
        "hydra.output_subdir=null",
        "hydra.job.chdir=False",
    ]


def fedrane_args(cfg: Config) -> list[str]:
    """XeniaLLL/HyperFed_and_FedRANE-master's ``system/main.py`` arguments for our config
    ``cfg`` (``-algo FedRANE``: their ``ClientFedRANE.train_raw`` with the GNE server, their
    defaults elsewhere). Raises SystemExit for a setting their code cannot take or fixes
    otherwise (file:line of their code in the messages)."""
    c, m, d, s = cfg["client"], cfg["model"], cfg["data"], cfg["server"]
    fedavg_cnn = dict(name="cnn", channels=[32, 64], kernel_size=5, hidden=[512, 256])
    _require(
        all(m[k] == v for k, v in fedavg_cnn.items()) and m["feature_dim"] == 64,
        "their '-m cnn' on Fashion-MNIST is FedAvgCNN (trainmodel/models.py:101-153): "
        f"model.channels=[32,64] kernel_size=5 hidden=[512,256] feature_dim=64; the config has {m}",
    )
    _require(m["projection_dim"] == 0, "their model has no projection head: projection_dim=0")
    _require(c["name"] == "fedrane" and s["name"] == "gne", "their FedRANE: fedrane client, gne")
    _require(
        c["classifier"] == "fixed_orthogonal" and c["logit_scale"] == 1.0,
        "their classifier is fixed orthogonal rows, unscaled (serverFedRANE.py:25-30)",
    )
    _require(
        c["lra_attention"] == "gat" and c["lra_heads"] == 2 and c["lra_dropout"] == 0.2,
        "their GAT has 2 averaged heads and dropout 0.2 (main.py:202; graph_models.py:585-601)",
    )
    _require(c["lam_r"] == 0.1, "their graph generator's ridge is 0.1 (graph_generator.py:6)")
    _require(c["nuclear_iters"] == 0, "their graph has no nuclear-norm step: nuclear_iters=0")
    _require(c["cd_similarity"] == "cosine", "their InfoNCE compares cosines: cd_similarity")
    # mixup_on: features is their line 154 as released; classifier is the diagnostic
    # --mixup-on-logits, for which parity_theirs.py (reading our config) scores their CE on
    # the classifier's output
    _require(
        c["mixup_weight"] == 10 and c["mixup_alpha"] == 0.5,
        "train_raw scores 10 x mixup CE, Beta(0.5, 0.5) (clientFedRANE.py:29, 154): "
        "client.mixup_weight=10 mixup_alpha=0.5",
    )
    _require(not c["eval_lra"], "their evaluation skips the graph: client.eval_lra=false")
    _require(
        c["momentum"] == 0.9 and c["weight_decay"] == 1e-5,
        "their client's SGD has momentum 0.9 and weight decay 1e-5 (clientFedRANE.py:22-23)",
    )
    _require(c["steps"] is None, "their clients train whole local epochs: client.steps=null")
    _require(c["lr_decay"] == 1.0 and not c["grad_clip"], "their client: no lr decay, no clip")
    _require(s["participation"] == "all", "their -jr 1.0 (every client each round)")
    _require(d["dataset"] == "fmnist", "the parity runs use Fashion-MNIST")
    _require(cfg["evaluation"]["every"] == 1, "their -eg 1: evaluation.every=1")
    args = ["-data", "fmnist", "-nb", str(d["num_classes"]), "-m", "cnn", "-algo", "FedRANE"]
    args += ["-dev", "cpu", "-nc", str(cfg["num_clients"]), "-jr", "1.0", "-eg", "1"]
    args += ["-gr", str(cfg["num_rounds"]), "-ls", str(c["epochs"])]
    args += ["-lbs", str(c["batch_size"]), "-lr", str(c["lr"])]
    args += ["-gnn_type", "gat", "-graph_n_hops", str(c["lra_steps"])]
    args += ["-reg_graph_aug", str(c["alpha_z"]), "-nce_reg", str(c["lam_cd"])]
    args += ["-info_nce_temperature", str(c["tau_cd"])]
    return args


def their_args(spec: Spec, cfg: Config) -> list[str]:
    makers = {
        "moon": lambda: moon_args(cfg, spec.alg),
        "fedau": lambda: fedau_args(cfg),
        "fedrcl": lambda: fedrcl_args(cfg),
        "fedrane": lambda: fedrane_args(cfg),
    }
    return makers[spec.family]()


# -------------------------------------------------------------------------- figures
def last5(acc: list[float]) -> float:
    """The mean of the last :data:`LAST` values of ``acc`` (fractions), in percent."""
    if not acc:
        raise ValueError("no accuracy recorded")
    tail = acc[-LAST:]
    return 100.0 * sum(tail) / len(tail)


def seed_range(values: list[float]) -> float:
    """max − min (0 for one value)."""
    return max(values) - min(values) if values else 0.0


def gap_and_spread(theirs: list[float], ours: list[float]) -> tuple[float, float]:
    """``gap`` = |mean(theirs) − mean(ours)|, ``spread`` = the larger of the two sides'
    ranges over seeds (max − min); both in the values' unit."""
    if not theirs or not ours:
        raise ValueError("both sides need at least one seed")
    gap = abs(sum(theirs) / len(theirs) - sum(ours) / len(ours))
    return gap, max(seed_range(theirs), seed_range(ours))


def parity_row(
    method: str,
    seeds: list[int],
    theirs: dict[int, list[float]],
    ours: dict[int, list[float]],
    *,
    commit: str = "",
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The parity.json row of ``method`` from every seed's accuracy per round (fractions,
    rounds 1..R, the same R on both sides): see the module docstring."""
    rounds = {len(theirs[s]) for s in seeds} | {len(ours[s]) for s in seeds}
    if len(rounds) != 1 or 0 in rounds:
        raise ValueError(f"every seed of both sides needs the same number of rounds: {rounds}")
    [n_rounds] = rounds
    t5, o5 = [last5(theirs[s]) for s in seeds], [last5(ours[s]) for s in seeds]
    gap, spread = gap_and_spread(t5, o5)
    per_round = [
        gap_and_spread([100 * theirs[s][r] for s in seeds], [100 * ours[s][r] for s in seeds])
        for r in range(n_rounds)
    ]
    early = per_round[:EARLY]
    return {
        "method": method,
        "seeds": list(seeds),
        "rounds": n_rounds,
        "theirs": [round(v, 2) for v in t5],
        "ours": [round(v, 2) for v in o5],
        "gap": round(gap, 2),
        "spread": round(spread, 2),
        "tolerance": round(max(spread, MIN_TOLERANCE), 2),
        "within": bool(gap <= max(spread, MIN_TOLERANCE)),
        "rounds_within": sum(g <= max(s, MIN_TOLERANCE) for g, s in per_round),
        "early_gap": round(sum(g for g, _ in early) / len(early), 2),
        "early_spread": round(sum(s for _, s in early) / len(early), 2),
        "curves": {
            side: {str(s): [round(100 * a, 2) for a in acc[s]] for s in seeds}
            for side, acc in (("theirs", theirs), ("ours", ours))
        },
        "commit": commit,
        "settings": settings or {},
    }


def merge_rows(rows: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    """``rows`` with ``row`` in place of the row of the same method (appended if none), in
    the order of :data:`METHODS` (others after them)."""
    kept = [r for r in rows if r.get("method") != row["method"]] + [row]
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(kept, key=lambda r: order.get(r.get("method", ""), len(order)))


#: their code, as the README table names it, per parity family
THEIR_CODE = {
    "moon": "QinbinLi/MOON",
    "fedau": "IBM/fedau",
    "fedrcl": "skynbe/FedRCL",
    "fedrane": "XeniaLLL/HyperFed_and_FedRANE-master",
}


def parity_table(rows: list[dict[str, Any]]) -> str:
    """``parity.md``: one line per row of parity.json (method, their code and commit, the
    last-5 accuracies of each side per seed, gap, spread, rounds within, rounds, seeds)."""
    lines = [
        "| method | their code | theirs, last-5 % per seed | ours, last-5 % per seed | gap "
        "| spread (tolerance) | within | rounds within | rounds | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = r["method"].split("+")[0]
        family = METHODS[base].family if base in METHODS else ""
        code = f"{THEIR_CODE.get(family, '?')} `{str(r.get('commit', ''))[:7]}`"
        seeds = ", ".join(str(s) for s in r["seeds"])
        lines.append(
            f"| {r['method']} | {code} | {' / '.join(f'{v:.2f}' for v in r['theirs'])} "
            f"| {' / '.join(f'{v:.2f}' for v in r['ours'])} | {r['gap']:.2f} "
            f"| {r['spread']:.2f} ({r['tolerance']:.2f}) | {'yes' if r['within'] else 'no'} "
            f"| {r['rounds_within']}/{r['rounds']} | {r['rounds']} | {seeds} |"
        )
    return "\n".join(lines) + "\n"


#: a method's row and the row of FedAvg run by the same codes on the same model, partitions
#: and settings: their difference is the method's gain over FedAvg in each code
GAIN_PAIRS = {"moon": "fedavg_head", "fedrcl_hard": "fedavg_fedrcl"}


def partition_files(row: dict[str, Any]) -> list[str]:
    """The partition file each seed of ``row`` ran on (read from our side's overrides with
    the launcher's own parser), in the order of its seeds."""
    per_seed = row["settings"]["per_seed"]
    files = [
        parse_overrides(per_seed[str(s)]["ours"]).get("data", {}).get("partition_file")
        for s in row["seeds"]
    ]
    if not all(files):
        raise ValueError(f"row {row['method']}: a seed's settings name no partition file")
    return [str(f) for f in files]


def _pairing(row: dict[str, Any]) -> tuple[list[int], int, list[str]]:
    """What two rows must share for their difference to be paired: seeds, rounds, partitions."""
    return row["seeds"], row["rounds"], partition_files(row)


def gain_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each pair of :data:`GAIN_PAIRS` whose two rows are in ``rows``: the method's
    last-5 gain over its FedAvg per seed (percentage points), in their code (``theirs``) and
    in ours (``ours``), with ``method``, ``baseline``, ``seeds``, ``rounds``. The two rows
    must have run the same seeds, rounds and partition files (a paired difference); a pair
    that did not raises ValueError."""
    by_method = {r["method"]: r for r in rows}
    gains = []
    for method, baseline in GAIN_PAIRS.items():
        if method not in by_method or baseline not in by_method:
            continue
        m, b = by_method[method], by_method[baseline]
        if _pairing(m) != _pairing(b):
            raise ValueError(
                f"rows {method} and {baseline} ran different seeds, rounds or partitions: "
                "rerun one of them on the other's (bench/parity.py --seeds/--rounds)"
            )
        gains.append(
            {
                "method": method,
                "baseline": baseline,
                "seeds": m["seeds"],
                "rounds": m["rounds"],
                **{
                    side: [round(x - y, 2) for x, y in zip(m[side], b[side], strict=True)]
                    for side in ("theirs", "ours")
                },
            }
        )
    return gains


def gains_table(rows: list[dict[str, Any]]) -> str:
    """``parity_gains.md``: one line per pair of :func:`gain_rows` (method, matched FedAvg,
    their code, the gain per seed and its mean on each side, rounds, seeds)."""
    lines = [
        "| method | matched FedAvg | their code | gain in their code, per seed (mean) "
        "| gain in ours, per seed (mean) | rounds | seeds |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(values: list[float]) -> str:
        mean = sum(values) / len(values)
        return f"{' / '.join(f'{v:+.2f}' for v in values)} ({mean:+.2f})"

    for g in gain_rows(rows):
        family = METHODS[g["method"]].family
        lines.append(
            f"| {g['method']} | {g['baseline']} | {THEIR_CODE[family]} | {cell(g['theirs'])} "
            f"| {cell(g['ours'])} | {g['rounds']} | {', '.join(str(s) for s in g['seeds'])} |"
        )
    return "\n".join(lines) + "\n"


def write_results(rows: list[dict[str, Any]], results: Path) -> None:
    """``rows`` as ``parity.json`` in ``results``, with the tables ``parity.md`` and
    ``parity_gains.md`` made from them."""
    results.mkdir(parents=True, exist_ok=True)
    (results / "parity.json").write_text(json.dumps(rows, indent=1) + "\n")
    (results / "parity.md").write_text(parity_table(rows))
    (results / "parity_gains.md").write_text(gains_table(rows))


def title_lines(name: str, width: int = 70) -> str:
    """A row's name broken before a ``+`` into lines of at most ``width`` characters
    (a part longer than that keeps a line of its own)."""
    lines = [""]
    for i, part in enumerate(name.split("+")):
        piece = part if i == 0 else "+" + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append(piece)
        else:
            lines[-1] += piece
    return "\n".join(lines)


def plot(row: dict[str, Any], path: Path) -> None:
    """Accuracy per round, theirs (solid) and ours (dashed), one colour per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, s in enumerate(row["seeds"]):
        for side, style in (("theirs", "-"), ("ours", "--")):
            acc = row["curves"][side][str(s)]
            ax.plot(range(1, len(acc) + 1), acc, style, color=f"C{i}", label=f"{side}, seed {s}")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("global test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(  # the row's name on lines of its own: a diagnostic's is long
        f"{title_lines(row['method'])}\ntheirs vs ours, last-{LAST} gap {row['gap']:.2f} "
        f"(spread {row['spread']:.2f}), {row['rounds']} rounds",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ runs
def commit_of(theirs: Path) -> str:
    """Their checkout's commit (``+dirty`` when its files were changed)."""

    def git(*a: str) -> str:
        done = subprocess.run(["git", "-C", str(theirs), *a], capture_output=True, text=True)
        return done.stdout.strip()

    head = git("rev-parse", "HEAD")
    if not head:
        raise SystemExit(f"{theirs} is not a git checkout of their code")
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def overrides_of(spec: Spec, args: argparse.Namespace, partition: Path) -> str:
    """Our ``--set`` for one run of ``spec``."""
    parts = [spec.overrides, f"num_rounds={args.rounds}", f"data.partition_file={partition}"]
    if args.train_subset:
        parts.append(f"data.train_subset={args.train_subset}")
    if args.test_subset:
        parts.append(f"data.test_subset={args.test_subset}")
    if args.epochs:
        parts.append(f"client.epochs={args.epochs}")
    if args.mixup_on_logits:  # the diagnostic: both sides score the mixup CE on the logits
        parts.append("client.mixup_on=classifier")
    if args.reg_graph_aug is not None:  # the diagnostic: their -reg_graph_aug (fedrane_args)
        parts.append(f"client.alpha_z={args.reg_graph_aug}")
    return " ".join(parts)


#: The diagnostics of their side only (our side's runs reused): each flag's variant (the
#: name of their run's files, and parity_theirs.py's option) and the row's suffix
THEIR_ONLY = {
    "same_init": ("same_init", "+same_init"),
    "fresh_optimizer": ("fresh_optimizer", "+their_fresh_optimizer"),
    "our_gne_in_theirs": ("our_gne", "+their_server_our_gne"),
}
#: The diagnostics of our side only (their side's runs reused): each flag's variant (the
#: name of our run's files; the row's suffix is ``+our_<variant>``) and its override (added
#: to ours after the shared ones, so their side's cache key does not change)
OUR_ONLY = {
    "our_drop_last": ("drop_last", "client.drop_last=true"),
    "our_kept_optimizer": ("kept_optimizer", "client.keep_optimizer_state=true"),
}


def their_variants(args: argparse.Namespace) -> list[str]:
    """The variants of their-side-only diagnostics in effect (:data:`THEIR_ONLY`)."""
    return [variant for flag, (variant, _) in THEIR_ONLY.items() if getattr(args, flag)]


def our_variants(args: argparse.Namespace) -> list[str]:
    """The variants of our-side-only diagnostics in effect (:data:`OUR_ONLY`), in its order."""
    return [variant for flag, (variant, _) in OUR_ONLY.items() if getattr(args, flag)]


def our_overrides(args: argparse.Namespace, shared: str) -> str:
    """Our side's ``--set``: the row's shared overrides (:func:`overrides_of`), then the
    override of each our-side-only diagnostic."""
    extra = [ov for flag, (_, ov) in OUR_ONLY.items() if getattr(args, flag)]
    return " ".join([shared, *extra])


#: The code each diagnostic applies to (a family of :data:`METHODS`)
DIAGNOSTIC_CODE = {
    "same_init": "moon",
    "mixup_on_logits": "fedrane",
    "reg_graph_aug": "fedrane",
    "fresh_optimizer": "fedrane",
    "our_drop_last": "fedrane",
    "our_kept_optimizer": "fedrane",
    "our_gne_in_theirs": "fedrane",
}
CODE_NAME = {"moon": "MOON", "fedrane": "FedRANE"}


def misapplied_diagnostic(args: argparse.Namespace, family: str) -> str | None:
    """Why a diagnostic in effect (set, not None) does not apply to ``family``'s code, or
    None when every one does."""
    for flag, code in DIAGNOSTIC_CODE.items():
        value = getattr(args, flag)  # a flag (False: off) or a number (None: off; 0 is on)
        if value is not None and value is not False and family != code:
            methods = " or ".join(m for m, spec in METHODS.items() if spec.family == code)
            option = "--" + flag.replace("_", "-")
            return f"{option} applies to {CODE_NAME[code]}'s code: --method {methods}"
    return None


def our_label(args: argparse.Namespace) -> str:
    """The folder of our side's runs: the method, then each diagnostic that changes our
    settings (``+mixup_on_logits``, ``+reg_graph_aug<A>``); the method alone without one."""
    label = args.method + "+mixup_on_logits" * args.mixup_on_logits
    if args.reg_graph_aug is not None:
        label += f"+reg_graph_aug{args.reg_graph_aug:g}"
    return label


def diagnostic_label(args: argparse.Namespace) -> str:
    """The row's name: :func:`our_label`, then the suffix of each diagnostic of their side
    only (:data:`THEIR_ONLY`), whose rows reuse our side's runs, then ``+our_<variant>`` for
    each of our side only (:data:`OUR_ONLY`), which reuse theirs."""
    their_only = "".join(suffix for flag, (_, suffix) in THEIR_ONLY.items() if getattr(args, flag))
    return our_label(args) + their_only + "".join(f"+our_{v}" for v in our_variants(args))


def cached(path: Path, key: dict[str, Any]) -> list[float] | None:
    """The accuracies saved in ``path`` by a run of the same ``key``, or None."""
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved["accuracy"] if saved.get("key") == key else None


def save(
    path: Path, key: dict[str, Any], acc: list[float], wall: float, cpu: float | None = None
) -> None:
    """Keep one side's accuracy per round with the ``key`` (settings) that produced it, its
    wall time and, where known, its CPU time."""
    record = {"key": key, "accuracy": acc, "wall_seconds": wall, "cpu_seconds": cpu}
    path.write_text(json.dumps(record) + "\n")


def subprocess_env() -> dict[str, str]:
    """The environment of every child: the launcher's Flower settings (``fl_app.launch.ENV``:
    no dependency installation at run time, no telemetry; the SuperLink started by
    :func:`start_superlink` passes them on to the runs), this checkout first on the path (a
    venv shared by several checkouts may install another one), the launcher on its own
    ports (:data:`PARITY_ENV`) with its Flower home in this checkout, Ray in its own
    folder."""
    env = {**LAUNCH_ENV, **os.environ, **PARITY_ENV}  # no runtime installs, no telemetry
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("FLWR_HOME", str(ROOT / ".flwr"))
    env.setdefault("RAY_TMPDIR", f"/tmp/ray-parity-{os.getuid()}")
    return env


# Flower's and Ray's start-up waits are short for a niced process on a busy machine (Ray
# waits 30 s for its raylet): a launch that stops before its first round is tried again
START_TRIES = 3
SUPERLINK_START_S = 300.0  # Flower waits 15 s for a local SuperLink to start, then kills it


def start_superlink(env: dict[str, str]) -> None:
    """Start the launcher's local SuperLink before the launcher does, unless it serves
    already: Flower's own start-up (``flwr.cli.local_superlink``, the command ``flwr run``
    runs) with a longer wait. Flower gives it 15 s, which a niced process on a busy machine
    can miss (``Failed to start local SuperLink within 15s``); once it serves, ``flwr run``
    uses it. Started from this checkout, so the launcher keeps it as its own."""
    code = (
        "import flwr.cli.local_superlink as l\n"
        f"l.LOCAL_SUPERLINK_STARTUP_TIMEOUT = {SUPERLINK_START_S}\n"
        "l._is_local_superlink_started() or l._start_local_superlink()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)


def run_theirs(
    spec: Spec,
    cfg: Config,
    theirs: Path,
    sdir: Path,
    overrides: str,
    variants: Sequence[str] = (),
    their_deps: Path | None = None,
) -> list[float]:
    """Their accuracy per round for one seed: cached, else run ``parity_theirs.py``, with the
    option of each their-side diagnostic in ``variants`` (:func:`their_variants`: ``same_init``,
    MOON's nets from our initial weights; ``fresh_optimizer``, FedRANE's clients clearing
    their optimizer state every round; ``our_gne``, FedRANE's server stepping with our GNE
    weights). Each variant's files are kept apart (``theirs_same_init*``,
    ``theirs_fresh_optimizer*``, ``theirs_*our_gne*``)."""
    argv = their_args(spec, cfg)
    key: dict[str, Any] = {"argv": argv, "overrides": overrides, "commit": commit_of(theirs)}
    name = "_".join(["theirs", *variants])
    key.update(dict.fromkeys(variants, True))
    if (acc := cached(sdir / f"{name}.json", key)) is not None:
        print(f"  {name}: reusing {sdir / f'{name}.json'}")
        return acc
    work = sdir / name
    if work.exists():  # an interrupted run of theirs starts again
        subprocess.run(["rm", "-rf", str(work)], check=True)
    cmd = [sys.executable, str(ROOT / "bench" / "parity_theirs.py"), "--family", spec.family]
    cmd += ["--theirs", str(theirs), "--experiment", spec.experiment, "--method", spec.method]
    cmd += ["--seed", str(cfg["seed"]), "--set", overrides, "--workdir", str(work)]
    cmd += ["--out-json", str(sdir / f"{name}_acc.json")]
    cmd += [f"--{v.replace('_', '-')}" for v in variants]
    cmd += ["--their-deps", str(their_deps)] if their_deps is not None else []
    cmd += ["--", *argv]
    log_path = sdir / f"{name}.log"
    print(f"  {name}: {shlex.join(argv)}  (log: {log_path})", flush=True)
    start = time.time()
    with log_path.open("w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=subprocess_env())
    if done.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise SystemExit(f"their {spec.method} run failed (seed {cfg['seed']}):\n{tail}")
    done_json = json.loads((sdir / f"{name}_acc.json").read_text())
    acc = done_json["accuracy"]
    if len(acc) != cfg["num_rounds"]:
        raise SystemExit(f"their run logged {len(acc)} rounds of {cfg['num_rounds']}")
    save(sdir / f"{name}.json", key, acc, time.time() - start, done_json.get("cpu_seconds"))
    return acc


def accuracy_per_round(records: list[dict[str, Any]]) -> list[float]:
    """The global test accuracy of rounds 1, 2, ... from our round records (the initial
    model's evaluation, round 0, left out)."""
    return [
        r["accuracy"]
        for r in sorted(records, key=lambda r: r["round"])
        if r["round"] >= 1 and r.get("accuracy") is not None
    ]


def run_ours(
    spec: Spec, cfg: Config, sdir: Path, overrides: str, variants: Sequence[str] = ()
) -> list[float]:
    """Our accuracy per round (rounds 1..R) for one seed: cached, else launched (resumed
    from its checkpoint when an earlier launch stopped). The runs of our-side-only
    diagnostics (``variants``, :func:`our_variants`) are kept apart (``ours_drop_last*``)."""
    key = {"experiment": spec.experiment, "method": spec.method, "overrides": overrides}
    name = "_".join(["ours", *variants])
    if (acc := cached(sdir / f"{name}.json", key)) is not None:
        print(f"  {name}: reusing {sdir / f'{name}.json'}")
        return acc
    out = sdir / name
    run = out / spec.experiment / spec.method / f"seed{cfg['seed']}"
    start = time.time()
    for attempt in range(1, START_TRIES + 1):
        summary = read_summary(run / "summary.json")
        resume = (run / "checkpoint.npz").is_file() and not (summary and run_completed(summary))
        option = "--resume" if resume else "--fresh"
        print(f"  ours: {spec.experiment}/{spec.method} {option} --set {overrides!r}", flush=True)
        start_superlink(subprocess_env())
        try:
            run, records = launch(
                out,
                spec.experiment,
                spec.method,
                overrides,
                option,
                seed=cfg["seed"],
                env=subprocess_env(),
            )
            break
        except SystemExit:
            trained = accuracy_per_round(read_rounds(run / ROUND_LOG))
            if trained or attempt == START_TRIES:
                raise
            print(f"  ours: it stopped before its first round (start-up); try {attempt + 1}")
    acc = accuracy_per_round(records)
    if len(acc) != cfg["num_rounds"]:
        raise SystemExit(f"our run {run} logged {len(acc)} evaluated rounds of {cfg['num_rounds']}")
    if spec.family == "fedau":  # their nodes were given these probabilities: the same?
        drawn = json.loads((run / "participation.json").read_text())["p"]
        given = our_probabilities(OurData(cfg), cfg)
        if not np.allclose(drawn, given, rtol=0, atol=1e-12):
            raise SystemExit(f"{run}: our server drew other participation probabilities")
    save(sdir / f"{name}.json", key, acc, time.time() - start)
    return acc


def parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--method", choices=list(METHODS), required=True)
    p.add_argument("--theirs", type=Path, required=True, help="their checkout (git)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", type=Path, default=ROOT / "results" / "parity", help="runs folder")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--train-subset", type=int, default=None, help="short runs: data.train_subset")
    p.add_argument("--test-subset", type=int, default=None, help="short runs: data.test_subset")
    p.add_argument("--epochs", type=int, default=None, help="short runs: client.epochs (not FedAU)")
    p.add_argument(
        "--same-init",
        action="store_true",
        help="diagnostic (MOON's code): their nets start from our initial weights; "
        "row <method>+same_init",
    )
    p.add_argument(
        "--mixup-on-logits",
        action="store_true",
        help="diagnostic (FedRANE's code): both sides score the mixup cross-entropy on the "
        "logits, theirs through a changed loss; row fedrane_authors+mixup_on_logits",
    )
    p.add_argument(
        "--reg-graph-aug",
        type=float,
        default=None,
        metavar="A",
        help="diagnostic (FedRANE's code): their -reg_graph_aug A, our client.alpha_z=A (the "
        "classifier sees A*Z + (1-A)*GAT(Z)); row fedrane_authors[+mixup_on_logits]"
        "+reg_graph_aug<A>",
    )
    p.add_argument(
        "--fresh-optimizer",
        action="store_true",
        help="diagnostic (FedRANE's code): their clients clear their optimizer state (momentum) "
        "before every round, as ours do; our side is reused; row <label>+their_fresh_optimizer",
    )
    p.add_argument(
        "--our-drop-last",
        action="store_true",
        help="diagnostic (FedRANE's code): our clients drop each pass's last partial batch, as "
        "their loader does (client.drop_last); their side is reused; row <label>+our_drop_last",
    )
    p.add_argument(
        "--our-kept-optimizer",
        action="store_true",
        help="diagnostic (FedRANE's code): our clients keep their optimizer state from round to "
        "round, as theirs do (client.keep_optimizer_state); their side is reused; row "
        "<label>+our_kept_optimizer",
    )
    p.add_argument(
        "--our-gne-in-theirs",
        action="store_true",
        help="diagnostic (FedRANE's code): their server steps with our GNE weights on its own "
        "clients' updates (both recorded per round); our side is reused; row "
        "<label>+their_server_our_gne",
    )
    p.add_argument(
        "--their-deps",
        type=Path,
        default=None,
        help="a folder of the packages their code needs beyond ours (pip install --target; "
        "FedRCL's: docs/parity.md)",
    )
    return p


def main() -> str | None:
    args = parser().parse_args()
    spec = METHODS[args.method]
    if args.epochs and spec.family == "fedau":
        return "--epochs does not apply to FedAU, whose clients take client.steps"
    if (refusal := misapplied_diagnostic(args, spec.family)) is not None:
        return refusal
    if args.reg_graph_aug is not None and not 0 <= args.reg_graph_aug <= 1:
        return f"--reg-graph-aug {args.reg_graph_aug}: their weight of Z lies in [0, 1]"
    if args.fresh_optimizer and args.our_kept_optimizer:
        return (
            "--fresh-optimizer clears their optimizer state each round and --our-kept-optimizer"
            " keeps ours: the two sides would differ in the one thing each tests; use one"
        )
    label = diagnostic_label(args)
    theirs, out = args.theirs.resolve(), args.out.resolve()
    commit = commit_of(theirs)
    acc_theirs, acc_ours, settings = {}, {}, {}
    for seed in args.seeds:
        name = f"{spec.experiment}_seed{seed}" + (
            f"_n{args.train_subset}" if args.train_subset else ""
        )
        partition = out / "partitions" / f"{name}.npz"
        overrides = overrides_of(spec, args, partition)
        cfg = load_config(spec.experiment, spec.method, f"{overrides} seed={seed}")
        sizes = [len(q) for q in partitions_of(cfg["data"], cfg["num_clients"], seed)]
        if spec.family == "moon" and min(sizes) < cfg["client"]["batch_size"]:
            return (
                f"a party of {min(sizes)} samples has no full batch of "
                f"{cfg['client']['batch_size']}: MOON's loader drops it (drop_last) and its "
                "epoch loss divides by zero; raise --train-subset"
            )
        # a diagnostic that changes our settings too keeps both sides in a folder of its own
        sdir = out / our_label(args) / f"seed{seed}"
        sdir.mkdir(parents=True, exist_ok=True)
        print(
            f"{args.method} seed {seed}: partition {partition} (sizes {min(sizes)}..{max(sizes)})"
        )
        acc_theirs[seed] = run_theirs(
            spec, cfg, theirs, sdir, overrides, their_variants(args), args.their_deps
        )
        ours = our_overrides(args, overrides)
        acc_ours[seed] = run_ours(spec, cfg, sdir, ours, our_variants(args))
        settings[str(seed)] = {"ours": ours, "theirs": shlex.join(their_args(spec, cfg))}
    row = parity_row(
        label,
        args.seeds,
        acc_theirs,
        acc_ours,
        commit=commit,
        settings={
            "experiment": spec.experiment,
            "method": spec.method,
            "same_init": args.same_init,
            "mixup_on_logits": args.mixup_on_logits,
            "reg_graph_aug": args.reg_graph_aug,
            "their_fresh_optimizer": args.fresh_optimizer,
            "our_drop_last": args.our_drop_last,
            "our_kept_optimizer": args.our_kept_optimizer,
            "their_server_our_gne": args.our_gne_in_theirs,
            "per_seed": settings,
        },
    )
    table = args.results / "parity.json"
    rows = merge_rows(json.loads(table.read_text()) if table.is_file() else [], row)
    write_results(rows, args.results)
    plot(row, args.results / f"parity_{label.replace('+', '_')}.png")
    print(
        f"{label}: theirs {row['theirs']} ours {row['ours']} (last-{LAST}, per seed); "
        f"gap {row['gap']:.2f}, spread {row['spread']:.2f}: "
        f"{'within' if row['within'] else 'OUTSIDE'} the tolerance {row['tolerance']:.2f}; "
        f"{row['rounds_within']}/{row['rounds']} rounds within; rounds 1-{EARLY}: gap "
        f"{row['early_gap']:.2f}, spread {row['early_spread']:.2f}"
    )
    return None


if __name__ == "__main__":
    sys.exit(main())
