"""S1 — framework overhead: the same local training run (a) as a plain PyTorch loop in one
process and (b) through `flwr run` (Ray simulation), per round at steady state.

Same clients, model, seed and local work (``client.steps`` mini-batches per client), the same
FedAvg aggregation and central evaluation every round (the ServerApp's own evaluator), from
the same config overrides. (a) trains the clients one after the other with one thread; (b)
runs them in Flower's simulation with ``--actors`` Ray actors of one CPU each (default 1: the
same compute as (a), so the ratio is Flower's own cost; with 2 the clients of a round train
in parallel on the two cores). Reported: median seconds per round over rounds 2..R for both
((a) runs before and after (b), so slow drifts of a shared machine hit both),
``steady_state_ratio = plain / flwr`` (≥ 0.9 is the target on the CPU: Flower costs at most
~10% per round), and the start-up time of (b) (until round 1 starts).
Because training speed alone varies by 10–20% between processes on a shared machine, the
round is also split into phases (``phases``), and Flower's own cost per round (ClientApp
glue + transport + the server's extra work over the plain loop's) is reported with
``overhead_ratio = 1 − cost / flwr round``, which training-speed noise does not move.

    .venv/bin/python bench/s1_overhead.py [--clients 4] [--rounds 6] [--steps 40] [--actors 1]
        [--device cpu|cuda] [--gpus-per-client 1] [--model cnn|resnet18_gn]
        [--data real|synthetic] [--batch-size B] [--set "..."] [--name s1_overhead]
Writes bench/results/<name>.json and .md (default name ``s1_overhead``, with ``_cuda`` and
``_resnet18_gn`` appended for those; e.g. ``--clients 10 --steps 94 --set
client.batch_size=64 --name s1_overhead_p1`` for rounds of P1's size: 10 clients, batch 64,
one epoch of Fashion-MNIST in all).

``--model resnet18_gn``: both runs train ResNet-18 with GroupNorm (FedRCL's backbone) on
CIFAR-shaped 3×32×32 inputs, by default synthetic (``--data synthetic``): random CIFAR-10
files in CIFAR-10's own format in a temporary folder (:mod:`core.synthetic`), read by the
project's loader (``data.dataset=cifar10 data.root=<folder>``); ``--data real --set
data.root=<cifar folder>`` reads the real CIFAR-10. ``--data synthetic`` with the P1 CNN
writes Fashion-MNIST-shaped files the same way. Timing does not depend on the pixels.

``--device cuda``: (a) trains its clients on the GPU (one after the other, CUDA synchronised
before each timer is read) and (b) gives each simulated client ``--gpus-per-client`` GPUs
(default 1: one client on the GPU at a time, as in (a)). Both runs then use
``client.device=auto``, under which a client trains on the GPU it sees (in (b), the share Ray
gives it) and the ServerApp evaluates on the GPU too (under ``client.device=cuda`` it would
evaluate on one CPU thread: ``fl_app.server_app.CentralEvaluator``); on the CPU both use
``client.device=cpu``. Without a CUDA GPU it stops at once, saying so.

**S1 on a GPU** (``--gpu-suite``) measures, on synthetic data, rounds of P1's size (10
clients × 94 steps of batch 64, 6 rounds) for the P1 CNN and for ResNet-18-GN, each as above
on the GPU, and for the P1 CNN also the same rounds in the flwr simulation with the clients
on the CPU (``--cpu-actors`` Ray actors, default one per core up to one per client, as the
launcher's default runs them), and writes ``bench/results/s1_gpu.json`` and ``.md`` (after
each model, so a run cut short keeps what it finished): per model the plain and flwr seconds
per round, ``steady_state_ratio``, start-up and phases; the GPU's name and the torch, CUDA
and flwr versions. Targets: ratio ≥ 0.8 for ResNet-18-GN; for the P1 CNN, a GPU round
faster than the CPU round. ``--add`` keeps the other models of an existing result of the
same GPU, versions and settings, so the models can be measured by separate commands.
Estimated on one H200 with 16 cores: about 2 minutes for the P1 CNN (two flwr start-ups of
~25 s each) and 3–4 for ResNet-18-GN (12 plain and 6 flwr rounds of ~8 s):

    .venv/bin/python bench/s1_overhead.py --gpu-suite                              # ~6 min
    .venv/bin/python bench/s1_overhead.py --gpu-suite --models cnn                 # ~2 min
    .venv/bin/python bench/s1_overhead.py --gpu-suite --models resnet18_gn --add   # ~4 min
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.9  # BENCHMARKS.md S1: steady_state_ratio = plain / flwr >= 0.9 (on the CPU)
GPU_TARGET = 0.8  # S1 on a GPU: ResNet-18-GN rounds of P1's size, plain / flwr >= 0.8
MODELS = {"cnn": "P1 CNN", "resnet18_gn": "ResNet-18 (GroupNorm)"}
DATASETS = {"cnn": "fmnist", "resnet18_gn": "cifar10"}  # what each model trains on
P1_ROUND = {"clients": 10, "steps": 94, "batch_size": 64}  # P1's round: one epoch of FMNIST
SMALL_ROUND = {"clients": 4, "steps": 40, "batch_size": None}  # None: the smoke preset's 32
sys.path.insert(0, str(ROOT))

from flwr.app import Array, ArrayRecord  # noqa: E402
from runs import launch, write_table  # noqa: E402

from core.data import load_client_data  # noqa: E402
from core.models import get_weights  # noqa: E402
from core.synthetic import FULL_SIZES, write_synthetic  # noqa: E402
from core.training import pick_device  # noqa: E402
from fl_app import registry  # noqa: E402
from fl_app.config import load_config  # noqa: E402
from fl_app.server_app import CentralEvaluator  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Setup:
    """One S1 measurement: ``clients`` clients of ``steps`` local steps a round for
    ``rounds`` rounds (config ``smoke``, method ``fedavg``); the flwr run with ``actors`` Ray
    CPUs (one per client) and ``gpus_per_client`` GPUs per client; the clients on ``device``
    (``cpu`` or ``cuda``); ``model`` (a key of :data:`MODELS`) on its dataset
    (:data:`DATASETS`), read from ``data_root`` when set (a folder of synthetic files) or else
    from the real dataset's folder; ``batch_size`` (None: the smoke preset's); ``extra``:
    further config overrides (``--set``), applied last."""

    clients: int
    rounds: int
    steps: int
    actors: int = 1
    device: str = "cpu"
    gpus_per_client: float = 0.0
    model: str = "cnn"
    data_root: str | None = None
    batch_size: int | None = None
    extra: str = ""


def overrides(s: Setup) -> str:
    """The config overrides (of ``smoke``/``fedavg``) that both the plain loop and the flwr
    run of ``s`` train with: one string, so they compare like with like. ``client.device`` is
    ``cpu`` on the CPU and ``auto`` on the GPU (see the module's docstring)."""
    parts = [
        f"num_clients={s.clients} num_rounds={s.rounds} client.steps={s.steps} "
        "client.personalized_eval=false data.train_subset=20000 evaluation.plot=false",
        f"client.device={'auto' if s.device == 'cuda' else 'cpu'}",
    ]
    if s.model != "cnn":
        parts.append(f"model.name={s.model} data.dataset={DATASETS[s.model]}")
    if s.data_root is not None:
        parts.append(f"data.root={s.data_root} data.download=false")
    if s.batch_size is not None:
        parts.append(f"client.batch_size={s.batch_size}")
    return " ".join([*parts, s.extra] if s.extra else parts)


@contextlib.contextmanager
def synthetic_data(s: Setup) -> Iterator[Setup]:
    """``s`` with ``data_root`` a temporary folder of synthetic files of the dataset its
    config names (:mod:`core.synthetic`: the real format, random images), as many training
    and test images as the run reads (``data.train_subset``, ``data.test_subset``; without
    them, the real dataset's sizes); the folder is removed on exit."""
    with tempfile.TemporaryDirectory(prefix="s1-data-") as tmp:
        s = dataclasses.replace(s, data_root=tmp)
        data = load_config("smoke", "fedavg", overrides(s))["data"]
        full_train, full_test = FULL_SIZES[data["dataset"]]
        n_train = min(data["train_subset"] or full_train, full_train)
        n_test = min(data["test_subset"] or full_test, full_test)
        write_synthetic(data["dataset"], Path(tmp), n_train, n_test)
        yield s


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a timer reads it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(ov: str, device: str) -> tuple[list[float], list[float]]:
    """The plain loop of config ``smoke``/``fedavg`` with the overrides ``ov``: seconds per
    round, and per round the clients' summed ``fit_seconds``. Its clients train one after the
    other in this process (one thread) on ``client.device``
    (:func:`core.training.pick_device`), which must come out as ``device`` (``cpu`` or
    ``cuda``; SystemExit otherwise); their weights are averaged by sample count (FedAvg); the
    global model is evaluated by the ServerApp's own evaluator (its device, batch size and
    test set). Timers are read after the device's queued work."""
    torch.set_num_threads(1)
    cfg = load_config("smoke", "fedavg", ov)
    cls = registry.resolve("client", "fedavg")
    dev = pick_device(str(cfg["client"]["device"]))
    if dev.type != device:
        raise SystemExit(
            f"the plain loop's clients would train on {dev}, not on {device} "
            f"(client.device={cfg['client']['device']!r})"
        )
    torch.manual_seed(cfg["seed"])
    model = cls.build_model(cfg)
    keys, weights = list(model.state_dict()), get_weights(model)
    evaluator = CentralEvaluator(cfg, cls)
    data = [load_client_data(cfg, p) for p in range(cfg["num_clients"])]
    per_round, fit = [], []
    for rnd in range(1, cfg["num_rounds"] + 1):
        sync(dev)
        t0 = time.perf_counter()
        res = [
            cls(cfg, data[p], p, dev).fit(weights, {"server-round": rnd}) for p in range(len(data))
        ]
        n = np.array([r[1] for r in res], dtype=np.float64)
        weights = [
            (
                sum(r[0][i].astype(np.float64) * k for r, k in zip(res, n, strict=True)) / n.sum()
            ).astype(np.float32)
            for i in range(len(weights))
        ]
        evaluator(rnd, ArrayRecord({k: Array(w) for k, w in zip(keys, weights, strict=True)}))
        sync(dev)
        sync(evaluator.device)
        per_round.append(time.perf_counter() - t0)
        fit.append(sum(r[2]["fit_seconds"] for r in res))
    return per_round, fit


def flwr_loop(
    ov: str, actors: int, gpus_per_client: float = 0.0
) -> tuple[list[dict[str, float]], float, float]:
    """The flwr run of config ``smoke``/``fedavg`` with the overrides ``ov``, launched as a
    user launches it (:func:`runs.launch`, results in a temporary folder) with ``actors``
    Ray CPUs, one per client, and ``gpus_per_client`` GPUs per client (0: the launcher's
    default, none). Per round (from 1): its phases (see ``phases``); the run's wall time;
    its start-up (wall time before round 1)."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        options = ["--num-cpus", str(actors), "--cpus-per-client", "1"]
        if gpus_per_client:
            options += ["--gpus-per-client", f"{gpus_per_client:g}"]
        _, rounds = launch(Path(out), "smoke", "fedavg", ov, *options)
        wall = time.perf_counter() - t0
    per_round = [phases(r) for r in rounds if r["round"] > 0]
    return per_round, wall, wall - sum(r["round"] for r in per_round)


def phases(record: dict) -> dict[str, float]:
    """Where a simulated round's time goes: ``fit`` (the clients' local optimisation, summed),
    ``client_glue`` (the ClientApp around it: decoding, building the client, weights in and
    out), ``transport`` (Flower: LinkState, Ray, the polling loops; the exchange minus the
    ClientApp time, which with one actor runs one client after the other), ``server`` (our
    aggregation, diagnostics and central evaluation)."""
    clients = record.get("clients", {}).values()
    fit = sum(c["fit_seconds"] for c in clients)
    app = sum(c["app_seconds"] for c in clients)
    return {
        "round": record["round_seconds"],
        "fit": fit,
        "client_glue": app - fit,
        "transport": record["exchange_seconds"] - app,
        "server": record["round_seconds"] - record["exchange_seconds"],
    }


def median_phases(flwr: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over rounds 2..R of a flwr run's per-round phases (round 1
    holds the actors' and CUDA's start)."""
    return {k: statistics.median(r[k] for r in flwr[1:]) for k in flwr[0]}


def ratio_target(device: str, model: str) -> float | None:
    """The target of ``steady_state_ratio``: 0.9 on the CPU, 0.8 for ResNet-18-GN on the
    GPU; None for the P1 CNN on the GPU, whose target is a GPU round faster than the CPU's."""
    if device == "cpu":
        return TARGET
    return GPU_TARGET if model == "resnet18_gn" else None


def measure(s: Setup) -> dict[str, Any]:
    """One S1 measurement of ``s`` (its data in place): the plain loop, the flwr run, the
    plain loop again (slow drifts of a shared machine hit both), all with
    :func:`overrides`; the figures that :func:`markdown` renders (medians over rounds 2..R).
    Prints a warning when the flwr run's clients trained more than twice as long as the
    plain loop's (on the GPU: they may not have had it)."""
    ov = overrides(s)
    before, fit_before = plain_loop(ov, s.device)
    flwr, wall, startup = flwr_loop(ov, s.actors, s.gpus_per_client)
    after, fit_after = plain_loop(ov, s.device)
    plain, plain_fit = before[1:] + after[1:], fit_before[1:] + fit_after[1:]
    a = statistics.median(plain)
    med = median_phases(flwr)
    b = med["round"]
    # Flower's own cost per round, from the phases of the same run: what the flwr round
    # spends besides the clients' training and the plain loop's aggregation + evaluation
    plain_server = a - statistics.median(plain_fit)
    overhead = med["client_glue"] + med["transport"] + med["server"] - plain_server
    target = ratio_target(s.device, s.model)
    fit_ratio = med["fit"] / statistics.median(plain_fit)
    if fit_ratio > 2:
        print(
            f"warning: the flwr run's clients trained {fit_ratio:.1f}× as long as the plain "
            f"loop's (on {s.device}): did they train on the same device?",
            file=sys.stderr,
        )
    return {
        "clients": s.clients,
        "overrides": ov,
        "rounds": s.rounds,
        "steps": s.steps,
        "actors": s.actors,
        "plain_seconds_per_round": a,
        "flwr_seconds_per_round": b,
        "steady_state_ratio": a / b,
        "overhead_seconds_per_round": overhead,
        "overhead_ratio": 1 - overhead / b,
        "flwr_startup_seconds": startup,
        "flwr_wall_seconds": wall,
        "plain_fit_seconds_per_round": statistics.median(plain_fit),
        "flwr_phases_median": med,
        "plain_rounds_before": before,
        "plain_rounds_after": after,
        "flwr_rounds": flwr,
        "device": s.device,
        "device_name": torch.cuda.get_device_name() if s.device == "cuda" else "cpu",
        "gpus_per_client": s.gpus_per_client,
        "model": s.model,
        "data": "real" if s.data_root is None else "synthetic",
        "target": target,
        "meets_target": None if target is None else a / b >= target,
        "flwr_fit_over_plain_fit": fit_ratio,
    }


def cpu_round(s: Setup) -> dict[str, Any]:
    """The flwr run of ``s`` (its clients on the CPU) alone: the CPU side of "a GPU round
    faster than a CPU round". Its overrides, Ray CPUs, median seconds per round (rounds
    2..R), start-up, wall time, median phases and every round's phases."""
    ov = overrides(s)
    flwr, wall, startup = flwr_loop(ov, s.actors)
    med = median_phases(flwr)
    return {
        "overrides": ov,
        "actors": s.actors,
        "flwr_seconds_per_round": med["round"],
        "flwr_startup_seconds": startup,
        "flwr_wall_seconds": wall,
        "flwr_phases_median": med,
        "flwr_rounds": flwr,
    }


def suite_header(args: argparse.Namespace) -> dict[str, Any]:
    """The top of ``--gpu-suite``'s figures: the GPU's name, the torch, CUDA and flwr
    versions and the settings every model of the suite shares (``models`` empty)."""
    return {
        "device_name": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flwr": importlib.metadata.version("flwr"),
        "clients": args.clients,
        "rounds": args.rounds,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "actors": args.actors,
        "gpus_per_client": args.gpus_per_client,
        "cpu_actors": args.cpu_actors,
        "data": "synthetic",
        "extra_overrides": args.set,
        "models": {},
    }


def earlier_models(path: Path, header: dict[str, Any]) -> dict[str, Any] | str:
    """``--add``: the models of the suite's figures at ``path`` (none when there is no
    file), to be kept beside the ones measured now; or why they cannot be: measured on
    another GPU, with other versions or settings (the fields of ``header`` differ)."""
    if not path.is_file():
        return {}
    old = json.loads(path.read_text())
    differ = [k for k in header if k != "models" and old.get(k) != header[k]]
    if differ:
        return (
            f"--add: {path} was measured with other {', '.join(differ)} "
            f"({', '.join(f'{k}={old.get(k)!r}' for k in differ)}); measure every model "
            "again without --add, or give another --name"
        )
    return dict(old.get("models", {}))


def gpu_suite(
    args: argparse.Namespace, name: str, header: dict[str, Any], earlier: dict[str, Any]
) -> dict[str, Any]:
    """S1 on the GPU (``--gpu-suite``): for each model of ``args.models``, on synthetic data
    (:func:`synthetic_data`), :func:`measure` with the clients on CUDA; for the P1 CNN also
    :func:`cpu_round` of the same rounds with ``args.cpu_actors`` Ray CPUs, and whether the
    GPU round was the faster. The figures: ``header`` (:func:`suite_header`) with, under
    ``models``, the ``earlier`` models (``--add``) and the ones measured now, in
    :data:`MODELS`' order; ``bench/results/<name>.json`` and ``.md`` are rewritten after each
    model, so a run cut short keeps the models it finished. Returns the figures."""
    out = {**header, "models": dict(earlier)}
    for model in args.models:
        base = setup_of(args, "cuda", model)
        with synthetic_data(base) as s:
            row = measure(s)
            if model == "cnn":
                on_cpu = dataclasses.replace(
                    s, device="cpu", gpus_per_client=0.0, actors=args.cpu_actors
                )
                cpu = cpu_round(on_cpu)
                row["cpu"] = cpu
                row["gpu_speedup_over_cpu"] = (
                    cpu["flwr_seconds_per_round"] / row["flwr_seconds_per_round"]
                )
                row["gpu_faster_than_cpu"] = row["gpu_speedup_over_cpu"] > 1
        done = {**out["models"], model: row}
        out["models"] = {m: done[m] for m in MODELS if m in done}
        write_table(ROOT / "bench" / "results", name, out, markdown(out))
    return out


def setup_of(args: argparse.Namespace, device: str, model: str) -> Setup:
    """The :class:`Setup` of the command line ``args`` (sizes filled in by :func:`main`)
    for ``model`` with its clients on ``device``; no data folder yet."""
    return Setup(
        clients=args.clients,
        rounds=args.rounds,
        steps=args.steps,
        actors=args.actors,
        device=device,
        gpus_per_client=args.gpus_per_client,
        model=model,
        batch_size=args.batch_size,
        extra=args.set,
    )


def cuda_problem() -> str | None:
    """Why the clients cannot train on CUDA here (no GPU that torch can use), or None."""
    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (
        f"S1 on cuda needs an NVIDIA GPU, but torch sees no CUDA GPU here (torch "
        f"{torch.__version__}, {build}): run it on a machine with a GPU, or use --device cpu"
    )


def default_name(args: argparse.Namespace) -> str:
    """``s1_gpu`` for the suite; else ``s1_overhead``, with ``_cuda`` on the GPU and the
    model's name for any model but the P1 CNN."""
    if args.gpu_suite:
        return "s1_gpu"
    name = "s1_overhead" + ("_cuda" if args.device == "cuda" else "")
    return name + ("" if args.model == "cnn" else f"_{args.model}")


def parser() -> argparse.ArgumentParser:
    """The command line (see the module's docstring); sizes left None are filled by
    :func:`main`: P1's round in the suite, a small round otherwise."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=None, help="clients (suite 10, else 4)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=None, help="local steps (suite 94, else 40)")
    p.add_argument("--batch-size", type=int, default=None, help="suite 64, else smoke's 32")
    p.add_argument("--actors", type=int, default=1, help="Ray actors (CPUs) for the flwr run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--gpus-per-client",
        type=float,
        default=None,
        help="GPUs per client in the flwr run (default: 1 with cuda, 0 on the CPU)",
    )
    p.add_argument("--model", choices=sorted(MODELS), default="cnn")
    p.add_argument(
        "--data",
        choices=["real", "synthetic"],
        default=None,
        help="real: the dataset's own files (data.root from --set); synthetic: random files "
        "in its format (default: real for the P1 CNN, synthetic for resnet18_gn)",
    )
    p.add_argument("--set", default="", help="extra config overrides for both runs")
    p.add_argument("--name", default=None, help="results file name (no extension)")
    p.add_argument(
        "--gpu-suite",
        action="store_true",
        help="S1 on the GPU: --models at P1's round size on synthetic data, the P1 CNN's CPU "
        "round too; writes s1_gpu.json/.md",
    )
    p.add_argument("--models", default="cnn,resnet18_gn", help="the suite's models, in order")
    p.add_argument(
        "--add",
        action="store_true",
        help="keep the other models of an existing <name>.json of the same GPU, versions and "
        "settings (measure the suite's models in separate commands)",
    )
    p.add_argument(
        "--cpu-actors",
        type=int,
        default=None,
        help="Ray CPUs of the suite's CPU round (default: min(clients, CPU cores))",
    )
    return p


def main(argv: list[str] | None = None) -> str | None:
    """Parse ``argv`` (default ``sys.argv``), measure, write the results and print the table.
    Returns None, or why nothing was measured: ``--device cuda`` (or ``--gpu-suite``)
    without a CUDA GPU stops here, before any run starts. Options that contradict each
    other end the script with argparse's usage (exit 2)."""
    p = parser()
    args = p.parse_args(argv)
    cuda = args.device == "cuda" or args.gpu_suite
    if args.rounds < 2:
        p.error("--rounds must be at least 2: the medians are over rounds 2 to the last")
    if args.gpus_per_client is None:
        args.gpus_per_client = 1.0 if cuda else 0.0
    if not cuda and args.gpus_per_client:
        p.error("--gpus-per-client gives the flwr run's clients GPUs: use it with --device cuda")
    if cuda and args.gpus_per_client <= 0:
        p.error("--device cuda: the flwr run's clients need a GPU share (--gpus-per-client > 0)")
    if args.gpu_suite and args.data == "real":
        p.error("--gpu-suite runs on synthetic data only")
    if args.add and not args.gpu_suite:
        p.error("--add keeps the other models of a --gpu-suite result: use it with --gpu-suite")
    size = P1_ROUND if args.gpu_suite else SMALL_ROUND
    for key, default in size.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if unknown := [m for m in args.models if m not in MODELS]:
        p.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if cuda and (problem := cuda_problem()):
        return problem
    name = args.name or default_name(args)
    res = ROOT / "bench" / "results"
    if args.gpu_suite:
        args.cpu_actors = args.cpu_actors or min(args.clients, os.cpu_count() or 1)
        header = suite_header(args)
        earlier = earlier_models(res / f"{name}.json", header) if args.add else {}
        if isinstance(earlier, str):
            return earlier
        print(markdown(gpu_suite(args, name, header, earlier)))
        return None
    s = setup_of(args, args.device, args.model)
    synthetic = (args.data or ("real" if args.model == "cnn" else "synthetic")) == "synthetic"
    with synthetic_data(s) if synthetic else contextlib.nullcontext(s) as ready:
        out = measure(ready)
    print(write_table(res, name, out, markdown(out)))
    return None


def _ratio_cell(ratio: float, target: float | None) -> str:
    """``0.908 ✓`` against a target, ``0.908`` without one."""
    return f"{ratio:.3f}" + ("" if target is None else f" {'✓' if ratio >= target else '✗'}")


def markdown(out: dict[str, Any]) -> str:
    """The S1 tables from the figures in the JSON file: those of ``--gpu-suite``
    (:func:`gpu_markdown`) or of one measurement (:func:`measurement_markdown`)."""
    return gpu_markdown(out) if "models" in out else measurement_markdown(out)


def measurement_markdown(out: dict[str, Any]) -> str:
    """The S1 tables of one measurement (ratio with ✓/✗ against its target, Flower's cost;
    seconds per round by phase), from the figures :func:`measure` returns. Figures from
    before ``--device`` (no ``device``) are CPU runs of the P1 CNN, target 0.9, and have no
    heading line."""
    a, b = out["plain_seconds_per_round"], out["flwr_seconds_per_round"]
    plain_fit, med = out["plain_fit_seconds_per_round"], out["flwr_phases_median"]
    overhead = out["overhead_seconds_per_round"]
    target = out.get("target", TARGET)
    head = ""
    if "device" in out:
        head = (
            f"{MODELS[out['model']]} on {out['device_name']}, {out['clients']} clients × "
            f"{out['steps']} steps a round, {out['rounds']} rounds, {out['data']} data; flwr "
            f"run: {out['actors']} Ray actor(s)"
            + (f", {out['gpus_per_client']:g} GPU per client" if out["gpus_per_client"] else "")
            + ".\n\n"
        )
    ratio_head = "ratio plain/flwr" + ("" if target is None else f" (target ≥ {target:g})")
    return head + (
        f"| plain loop s/round | flwr simulation s/round | {ratio_head} "
        "| Flower's cost s/round | 1 − cost/round | flwr start-up s |\n"
        "|---|---|---|---|---|---|\n"
        f"| {a:.2f} | {b:.2f} | {_ratio_cell(a / b, target)} "
        f"| {overhead:.3f} | {1 - overhead / b:.3f} | {out['flwr_startup_seconds']:.1f} |\n\n"
        "Median seconds per round by phase (fit = the clients' local optimisation, summed):\n\n"
        "| run | fit | client glue | Flower transport | server | round |\n"
        "|---|---|---|---|---|---|\n"
        f"| plain loop | {plain_fit:.3f} | – | – | {a - plain_fit:.3f} | {a:.3f} |\n"
        f"{_phase_row('flwr simulation', med)}\n"
    )


def _phase_row(label: str, med: dict[str, float]) -> str:
    return (
        f"| {label} | {med['fit']:.3f} | {med['client_glue']:.3f} | {med['transport']:.3f} "
        f"| {med['server']:.3f} | {med['round']:.3f} |"
    )


def gpu_markdown(out: dict[str, Any]) -> str:
    """The S1-on-a-GPU tables from the figures :func:`gpu_suite` writes: per model the plain
    and flwr seconds per round, their ratio (✓/✗ against 0.8 for ResNet-18-GN, none for the
    P1 CNN), Flower's cost and the start-up; the P1 CNN's GPU round against its CPU round
    (✓/✗: the GPU's faster); every run's seconds per round by phase."""
    models = out["models"]
    lines = [
        f"S1 on one {out['device_name']} (torch {out['torch']}, CUDA {out['cuda']}, flwr "
        f"{out['flwr']}): {out['clients']} clients × {out['steps']} local steps of batch "
        f"{out['batch_size']} a round, {out['rounds']} rounds of FedAvg, {out['data']} data "
        "(Fashion-MNIST-shaped for the P1 CNN, CIFAR-10-shaped for ResNet-18). The plain loop "
        "trains the clients one after the other on the GPU in one process; the flwr "
        f"simulation gives each client {out['gpus_per_client']:g} GPU ({out['actors']} Ray "
        "actor(s)). Medians over rounds 2 to the last.",
        "",
        "| model | plain loop s/round | flwr simulation s/round | ratio plain/flwr | target "
        "| Flower's cost s/round | 1 − cost/round | flwr start-up s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, r in models.items():
        a, b, target = r["plain_seconds_per_round"], r["flwr_seconds_per_round"], r["target"]
        goal = "GPU round faster than CPU" if target is None else f"≥ {target:g}"
        lines.append(
            f"| {MODELS[model]} | {a:.3f} | {b:.3f} | {_ratio_cell(a / b, target)} | {goal} "
            f"| {r['overhead_seconds_per_round']:.3f} | {r['overhead_ratio']:.3f} "
            f"| {r['flwr_startup_seconds']:.1f} |"
        )
    for model, r in models.items():
        if "cpu" not in r:
            continue
        cpu, speedup = r["cpu"], r["gpu_speedup_over_cpu"]
        lines += [
            "",
            f"{MODELS[model]}: the GPU round against the same round in the flwr simulation "
            f"with the clients on the CPU ({cpu['actors']} Ray actor(s) of one CPU each). "
            "Target: the GPU round faster.",
            "",
            "| GPU s/round | CPU s/round | GPU speed-up | GPU round faster |",
            "|---|---|---|---|",
            f"| {r['flwr_seconds_per_round']:.3f} | {cpu['flwr_seconds_per_round']:.3f} "
            f"| {speedup:.2f}× | {'✓' if r['gpu_faster_than_cpu'] else '✗'} |",
        ]
    lines += [
        "",
        "Median seconds per round by phase (fit = the clients' local optimisation, summed):",
        "",
        "| model | run | fit | client glue | Flower transport | server | round |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, r in models.items():
        a, fit = r["plain_seconds_per_round"], r["plain_fit_seconds_per_round"]
        lines.append(
            f"| {MODELS[model]} | plain loop (GPU) | {fit:.3f} | – | – | {a - fit:.3f} | {a:.3f} |"
        )
        lines.append(
            _phase_row(f"{MODELS[model]} | flwr simulation (GPU)", r["flwr_phases_median"])
        )
        if "cpu" in r:
            lines.append(
                _phase_row(
                    f"{MODELS[model]} | flwr simulation (CPU)", r["cpu"]["flwr_phases_median"]
                )
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
