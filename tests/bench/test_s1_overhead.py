"""S1 (bench/s1_overhead.py): the committed framework-overhead tables are what the script
renders from the measurements in their JSON files (so a table in the README cannot drift
from its measurement); the GPU tables mark each target met or missed; ResNet-18-GN's
synthetic CIFAR-10 is read by the project's loader as the runs read it; the plain loop and
the flwr run get the same overrides (on the CPU and in the GPU suite, whose plumbing runs
here with the measurements faked); ``--device cuda`` without a GPU stops before any run; and
(e2e) the CPU path of ResNet-18-GN runs end to end at a tiny size."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import s1_overhead
import torch

from core.data import load_client_data, load_test_set
from core.datafiles import marked_synthetic
from core.models import ResNet18GN, build_model
from fl_app.config import load_config
from tests.bench.conftest import rendered_and_committed


@pytest.mark.parametrize("name", ["s1_overhead", "s1_overhead_p1"])
def test_committed_table_renders_from_its_json(name):
    rendered, committed = rendered_and_committed(s1_overhead, name)
    assert rendered == committed


# ------------------------------------------------------------------ hand-made figures
PHASES = {"round": 2.0, "fit": 1.5, "client_glue": 0.1, "transport": 0.3, "server": 0.1}


def _row(model: str, plain: float, flwr: float, target: float | None) -> dict:
    """One model's figures as :func:`s1_overhead.measure` returns them (the fields the
    tables read)."""
    return {
        "plain_seconds_per_round": plain,
        "flwr_seconds_per_round": flwr,
        "steady_state_ratio": plain / flwr,
        "overhead_seconds_per_round": 0.25,
        "overhead_ratio": 1 - 0.25 / flwr,
        "flwr_startup_seconds": 31.0,
        "plain_fit_seconds_per_round": plain - 0.1,
        "flwr_phases_median": {**PHASES, "round": flwr},
        "model": model,
        "target": target,
    }


def _gpu_figures(resnet_plain: float, gpu_round: float, cpu_round: float) -> dict:
    """Figures of ``--gpu-suite``: ResNet-18-GN's plain loop ``resnet_plain`` s/round against
    10 s in flwr; the P1 CNN's flwr round ``gpu_round`` on the GPU and ``cpu_round`` on the
    CPU."""
    cnn = _row("cnn", 0.9 * gpu_round, gpu_round, None)
    cpu = {"actors": 10, "flwr_seconds_per_round": cpu_round, "flwr_phases_median": PHASES}
    cnn.update(
        cpu=cpu,
        gpu_speedup_over_cpu=cpu_round / gpu_round,
        gpu_faster_than_cpu=cpu_round > gpu_round,
    )
    return {
        "device_name": "NVIDIA H200",
        "torch": "2.11.0+cu130",
        "cuda": "13.0",
        "flwr": "1.41.0",
        "clients": 10,
        "rounds": 6,
        "steps": 94,
        "batch_size": 64,
        "actors": 1,
        "gpus_per_client": 1.0,
        "cpu_actors": 10,
        "data": "synthetic",
        "models": {"cnn": cnn, "resnet18_gn": _row("resnet18_gn", resnet_plain, 10.0, 0.8)},
    }


def _table_row(table: str, first_cells: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(first_cells))


def test_gpu_table_marks_both_targets_met():
    table = s1_overhead.markdown(_gpu_figures(resnet_plain=8.5, gpu_round=1.0, cpu_round=2.5))
    assert "S1 on one NVIDIA H200 (torch 2.11.0+cu130, CUDA 13.0, flwr 1.41.0)" in table
    resnet = _table_row(table, "| ResNet-18 (GroupNorm) | 8.500 | 10.000 |")
    assert "| 0.850 ✓ | ≥ 0.8 |" in resnet
    cnn = _table_row(table, "| P1 CNN | 0.900 | 1.000 |")
    assert "| 0.900 | GPU round faster than CPU |" in cnn  # no ratio target on the CNN
    assert "| 1.000 | 2.500 | 2.50× | ✓ |" in table
    assert "| P1 CNN | flwr simulation (CPU) | 1.500 |" in table


def test_gpu_table_marks_both_targets_missed():
    table = s1_overhead.markdown(_gpu_figures(resnet_plain=7.0, gpu_round=3.0, cpu_round=2.0))
    assert "| 0.700 ✗ | ≥ 0.8 |" in _table_row(table, "| ResNet-18 (GroupNorm) |")
    assert "| 3.000 | 2.000 | 0.67× | ✗ |" in table
    assert "✓" not in table


def test_gpu_table_of_one_model_has_no_cpu_comparison():
    figures = _gpu_figures(resnet_plain=9.0, gpu_round=1.0, cpu_round=2.0)
    del figures["models"]["cnn"]
    table = s1_overhead.markdown(figures)
    assert "| 0.900 ✓ | ≥ 0.8 |" in table and "GPU speed-up" not in table
    assert "| P1 CNN |" not in table


def test_one_measurement_table_states_its_setting_and_target():
    """A measurement with ``--device`` in its figures gets a heading line and its own
    target: none for the P1 CNN on the GPU, 0.8 for ResNet-18-GN there."""
    row = _row("cnn", 0.9, 1.0, None)
    row.update(
        device="cuda",
        device_name="NVIDIA H200",
        clients=10,
        steps=94,
        rounds=6,
        data="synthetic",
        actors=1,
        gpus_per_client=1.0,
    )
    table = s1_overhead.markdown(row)
    assert table.startswith("P1 CNN on NVIDIA H200, 10 clients × 94 steps a round, 6 rounds, ")
    assert "| ratio plain/flwr |" in table and "| 0.900 |" in table and "✗" not in table
    row.update(model="resnet18_gn", target=0.8)
    assert "(target ≥ 0.8)" in s1_overhead.markdown(row)
    assert "| 0.900 ✓ |" in s1_overhead.markdown(row)


# ------------------------------------------------------------------ data and plumbing
def test_synthetic_cifar10_is_read_by_the_loader_as_the_runs_read_it():
    """The overrides of a ResNet-18-GN measurement point the project's loader at the
    synthetic CIFAR-10 files: 3×32×32 standardised images, as many as the run asks for,
    in a marked folder that is removed afterwards; the model is ResNet-18-GN."""
    setup = s1_overhead.Setup(
        2, 1, 2, model="resnet18_gn", extra="data.train_subset=120 data.test_subset=30"
    )
    with s1_overhead.synthetic_data(setup) as s:
        assert s.data_root is not None and marked_synthetic(s.data_root)
        cfg = load_config("smoke", "fedavg", s1_overhead.overrides(s))
        assert (cfg["data"]["dataset"], cfg["data"]["root"]) == ("cifar10", s.data_root)
        clients = [load_client_data(cfg, p) for p in range(2)]
        test = load_test_set(cfg)
        root = Path(s.data_root)
    assert not root.exists()
    assert all(c.train.x.shape[1:] == (3, 32, 32) for c in clients)
    assert sum(len(c.train) + len(c.test) for c in clients) == 120
    assert test.x.shape == (30, 3, 32, 32) and test.x.dtype == torch.float32
    assert abs(float(test.x.mean())) < 0.5  # standardised with CIFAR-10's statistics
    model = build_model(cfg)
    assert isinstance(model, ResNet18GN)
    assert model(test.x[:2]).logits.shape == (2, 10)


def _num_rounds(ov: str) -> int:
    m = re.search(r"num_rounds=(\d+)", ov)
    assert m, ov
    return int(m.group(1))


@pytest.fixture
def fake_runs(monkeypatch):
    """The plain loop and the flwr run replaced by fakes that record their arguments (and
    whether the data folder of their overrides holds the synthetic files) and return fixed
    timings: plain 1.8 s a round, flwr 2.0 s (fit 1.5), on the GPU and on the CPU alike."""
    calls: list[tuple] = []

    def present(ov: str) -> bool:
        m = re.search(r"data\.root=(\S+)", ov)
        return m is not None and marked_synthetic(m.group(1))

    def plain_loop(ov, device):
        calls.append(("plain", ov, device, present(ov)))
        n = _num_rounds(ov)
        return [1.8] * n, [1.6] * n

    def flwr_loop(ov, actors, gpus_per_client=0.0):
        calls.append(("flwr", ov, (actors, gpus_per_client), present(ov)))
        return [dict(PHASES)] * _num_rounds(ov), 40.0, 28.0

    monkeypatch.setattr(s1_overhead, "plain_loop", plain_loop)
    monkeypatch.setattr(s1_overhead, "flwr_loop", flwr_loop)
    return calls


def test_both_runs_of_a_resnet_measurement_get_the_same_overrides(rebuild, fake_runs):
    err, out = rebuild(s1_overhead, "--model", "resnet18_gn", "--set", "data.train_subset=60")
    assert err is None
    assert [c[0] for c in fake_runs] == ["plain", "flwr", "plain"]
    assert len({c[1] for c in fake_runs}) == 1  # one overrides string for all three
    ov = fake_runs[0][1]
    assert "model.name=resnet18_gn data.dataset=cifar10 data.root=" in ov
    assert "client.device=cpu" in ov and ov.endswith("data.train_subset=60")
    assert all(c[3] for c in fake_runs)  # the synthetic files were there for every run
    assert fake_runs[0][2] == "cpu" and fake_runs[1][2] == (1, 0.0)
    measured = json.loads((out / "s1_overhead_resnet18_gn.json").read_text())
    assert measured["steady_state_ratio"] == pytest.approx(0.9)
    assert (measured["model"], measured["data"], measured["device"]) == (
        "resnet18_gn",
        "synthetic",
        "cpu",
    )
    assert (out / "s1_overhead_resnet18_gn.md").read_text() == s1_overhead.markdown(measured)


def test_gpu_suite_measures_each_model_and_the_cnns_cpu_round(rebuild, fake_runs, monkeypatch):
    """With CUDA faked: for each model the plain loop on cuda and the flwr run with one GPU
    per client, from one overrides string of P1's round size (client.device=auto); for the
    P1 CNN also the flwr run on the CPU with the same overrides but client.device=cpu and one
    Ray actor per client (at most one per core); the JSON holds every key the issue asks
    for."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    small = "data.train_subset=200 data.test_subset=20"
    err, out = rebuild(s1_overhead, "--gpu-suite", "--set", small)
    assert err is None
    kinds = [(c[0], c[2]) for c in fake_runs]
    cpu_actors = min(10, os.cpu_count() or 1)
    assert kinds == [
        ("plain", "cuda"),
        ("flwr", (1, 1.0)),
        ("plain", "cuda"),
        ("flwr", (cpu_actors, 0.0)),
        ("plain", "cuda"),
        ("flwr", (1, 1.0)),
        ("plain", "cuda"),
    ]
    cnn_gpu, cnn_cpu, resnet = fake_runs[0][1], fake_runs[3][1], fake_runs[4][1]
    assert fake_runs[1][1] == fake_runs[2][1] == cnn_gpu and fake_runs[5][1] == resnet
    assert "num_clients=10 num_rounds=6 client.steps=94 " in cnn_gpu
    assert "client.device=auto" in cnn_gpu and "client.batch_size=64" in cnn_gpu
    assert cnn_cpu == cnn_gpu.replace("client.device=auto", "client.device=cpu")
    assert "model.name=resnet18_gn data.dataset=cifar10" in resnet
    assert all(c[3] for c in fake_runs)
    measured = json.loads((out / "s1_gpu.json").read_text())
    assert measured["device_name"] == "Fake GPU" and measured["torch"] == torch.__version__
    assert measured["flwr"] and list(measured["models"]) == ["cnn", "resnet18_gn"]
    for model in ("cnn", "resnet18_gn"):
        row = measured["models"][model]
        assert row["steady_state_ratio"] == pytest.approx(0.9)
        assert row["flwr_startup_seconds"] == pytest.approx(28.0)
        assert set(row["flwr_phases_median"]) == set(PHASES)
    cnn = measured["models"]["cnn"]
    assert cnn["cpu"]["flwr_seconds_per_round"] == pytest.approx(2.0)
    assert cnn["cpu"]["actors"] == cpu_actors and cnn["gpu_faster_than_cpu"] is False
    assert measured["models"]["resnet18_gn"]["meets_target"] is True
    assert (out / "s1_gpu.md").read_text() == s1_overhead.markdown(measured)


def test_gpu_suite_adds_a_model_to_the_same_settings_figures_only(rebuild, fake_runs, monkeypatch):
    """Two commands, one file: ``--add`` keeps the P1 CNN measured first beside ResNet-18-GN
    (in the table's order); figures of other settings are refused, and left as they are."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    small = ("--set", "data.train_subset=200 data.test_subset=20")
    assert rebuild(s1_overhead, "--gpu-suite", "--models", "cnn", *small)[0] is None
    err, out = rebuild(s1_overhead, "--gpu-suite", "--models", "resnet18_gn", "--add", *small)
    assert err is None
    first = json.loads((out / "s1_gpu.json").read_text())
    assert list(first["models"]) == ["cnn", "resnet18_gn"] and "cpu" in first["models"]["cnn"]
    assert len(fake_runs) == 4 + 3  # the CNN's four runs, then ResNet-18-GN's three
    err, _ = rebuild(s1_overhead, "--gpu-suite", "--models", "cnn", "--add", "--rounds", "4")
    assert err is not None and "other rounds, extra_overrides" in err
    assert json.loads((out / "s1_gpu.json").read_text()) == first
    assert len(fake_runs) == 7  # refused before any run
    err, _ = rebuild(s1_overhead, "--gpu-suite", "--models", "resnet18_gn", *small)
    assert list(json.loads((out / "s1_gpu.json").read_text())["models"]) == ["resnet18_gn"]


@pytest.mark.parametrize("argv", [["--device", "cuda"], ["--gpu-suite"]])
def test_cuda_without_a_gpu_stops_before_any_run(argv, rebuild, monkeypatch):
    """No CUDA GPU (as on this project's CI): the script returns the reason, naming the
    missing GPU, without starting a run or writing a result."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def ran(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(s1_overhead, "plain_loop", ran)
    monkeypatch.setattr(s1_overhead, "flwr_loop", ran)
    monkeypatch.setattr(s1_overhead, "synthetic_data", ran)
    err, out = rebuild(s1_overhead, *argv)
    assert err is not None and "needs an NVIDIA GPU" in err and "no CUDA GPU" in err
    assert "--device cpu" in err
    assert not list(out.iterdir())


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpus-per-client", "1"],
        ["--device", "cuda", "--gpus-per-client", "0"],
        ["--gpu-suite", "--data", "real"],
        ["--gpu-suite", "--models", "cnn,vgg"],
        ["--add"],
        ["--rounds", "1"],
    ],
)
def test_contradictory_options_are_refused_with_the_usage(argv, rebuild, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exc:
        rebuild(s1_overhead, *argv)
    assert exc.value.code == 2


# ------------------------------------------------------------------ end to end
@pytest.mark.e2e
def test_resnet18_gn_on_the_cpu_runs_end_to_end(rebuild):
    """ResNet-18-GN on synthetic CIFAR-10, tiny (2 clients, 2 rounds of 2 steps of batch 4):
    the plain loop twice and a real `flwr run` simulation; the JSON has the keys the tables
    read, from rounds that ran."""
    tiny = "data.train_subset=64 data.test_subset=8 client.batch_size=4"
    err, out = rebuild(
        s1_overhead,
        *("--model", "resnet18_gn", "--clients", "2", "--rounds", "2", "--steps", "2"),
        *("--set", tiny),
    )
    assert err is None
    measured = json.loads((out / "s1_overhead_resnet18_gn.json").read_text())
    assert measured["model"] == "resnet18_gn" and measured["data"] == "synthetic"
    assert "data.dataset=cifar10" in measured["overrides"]
    assert len(measured["plain_rounds_before"]) == len(measured["plain_rounds_after"]) == 2
    assert [set(r) for r in measured["flwr_rounds"]] == [set(PHASES)] * 2
    assert measured["flwr_phases_median"]["fit"] > 0 and measured["plain_fit_seconds_per_round"] > 0
    assert measured["steady_state_ratio"] > 0 and measured["flwr_startup_seconds"] > 0
    assert measured["target"] == 0.9 and isinstance(measured["meets_target"], bool)
    assert (out / "s1_overhead_resnet18_gn.md").read_text() == s1_overhead.markdown(measured)
