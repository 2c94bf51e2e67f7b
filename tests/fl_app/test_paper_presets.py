"""The papers' own set-ups (conf/experiments/paper_*.yaml), each trained for one round on
small synthetic files of its real dataset's format (CIFAR-10/100's pickled batches, SVHN's
.mat files, MNIST's and Fashion-MNIST's IDX files: core/synthetic.py), read through the
project's own loaders; the model each run builds is the paper's. Without its dataset a
preset stops at the launcher's one-line data error.

torchvision checks the MD5 of the CIFAR and SVHN files it reads; the synthetic files cannot
match the real ones, and the loader skips that check in the folder core/synthetic.py marks
as synthetic."""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.models import CNN, ResNet18GN
from core.synthetic import N_TRAIN, WRITERS
from fl_app import registry
from fl_app.config import available, load_config

# ---------------------------------------------------------------- the papers' models
# (parameters with 2+ dimensions, in order: the weights of every conv and linear layer)
SIMPLE_CNN = [  # MOON model.py SimpleCNN_header + ModelFedCon's l1, l2, l3 (out_dim 256)
    (6, 3, 5, 5),
    (16, 6, 5, 5),
    (120, 400),
    (84, 120),
    (84, 84),
    (256, 84),
    (10, 256),
]
FEDCCL_CNN = [(6, 1, 5, 5), (16, 6, 5, 5), (128, 256), (10, 128)]  # 4 layers, 128-d h
# FedAU's ModelCNNSvhn / ModelCNNCifar10 but for the fc input (32·6·6 here, no conv padding)
PMFL_SVHN_CNN = [(32, 3, 3, 3), (32, 32, 3, 3), (128, 1152), (128, 128), (256, 128), (10, 256)]
PMFL_CIFAR_CNN = [(32, 3, 3, 3), (32, 32, 3, 3), (256, 1152), (64, 256), (64, 64), (256, 64)]
PMFL_CIFAR_CNN += [(10, 256)]  # PMFL's projection head (64→64→256) and its classifier
FEDAU_CIFAR_CNN = [(32, 3, 3, 3), (32, 32, 3, 3), (256, 1152), (64, 256), (10, 64)]
# The CIFAR ResNet-18 (3x3 stem, no max-pool) has 11,173,962 parameters with 10 classes,
# with BatchNorm or with GroupNorm alike; 100 classes add 90 rows of the 512-d classifier.
RESNET18_CIFAR10 = 11_173_962
RESNET18_CIFAR100 = RESNET18_CIFAR10 + 90 * 513

# preset: (method, clients in the test, extra overrides, the model's check)
PRESETS: dict[str, tuple[str, int, str, Any]] = {
    "paper_moon_cifar10": ("moon", 3, "", SIMPLE_CNN),
    "paper_fedrcl_cifar10": ("fedrcl", 3, "server.min_clients=2", RESNET18_CIFAR10),
    "paper_fedrcl_cifar100": ("fedrcl", 3, "server.min_clients=2", RESNET18_CIFAR100),
    "paper_fedrane_cifar10": ("fedrane", 3, "", RESNET18_CIFAR10),
    "paper_fedccl_fmnist": ("fedccl", 3, "", FEDCCL_CNN),
    "paper_fedccl_mnist": ("fedccl", 3, "", FEDCCL_CNN),
    # 3 nodes at a mean participation of 0.1 would mostly train nobody: all take part
    "paper_pmfl_svhn": ("pmfl", 3, "server.participation=all", PMFL_SVHN_CNN),
    "paper_pmfl_cifar10": ("pmfl", 3, "server.participation=all", PMFL_CIFAR_CNN),
    "paper_fedau_cifar10": ("fedau", 3, "server.participation=all", FEDAU_CIFAR_CNN),
}


def test_every_paper_preset_is_tested_here():
    assert sorted(PRESETS) == [p for p in available("experiments") if p.startswith("paper_")]


def _weight_shapes(model: Any) -> list[tuple[int, ...]]:
    return [tuple(p.shape) for p in model.parameters() if p.dim() >= 2]


def _check_paper_model(cfg: dict[str, Any], expected: Any) -> None:
    model = registry.resolve("client", cfg["client"]["name"]).build_model(cfg)
    if isinstance(expected, int):  # a ResNet-18: its backbone (FedRANE wraps it with LRA)
        base = getattr(model, "base", model)
        assert isinstance(base, ResNet18GN) and base.feature_dim == 512
        assert sum(p.numel() for p in base.parameters()) == expected
    else:
        assert isinstance(model, CNN)
        assert _weight_shapes(model) == expected


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_paper_preset_trains_a_round_of_its_model_on_its_data_format(
    preset, run_in_process, tmp_path
):
    """The preset as it is (dataset, partition, model, method and its hyperparameters),
    made tiny: a few clients, one round of one local step of a small batch, a small test
    set. It reads the synthetic files through the project's loader, trains, and its global
    model reaches a finite accuracy; the model it built is the paper's."""
    method, clients, extra, expected = PRESETS[preset]
    dataset = load_config(preset, method)["data"]["dataset"]
    root = tmp_path / "data"
    WRITERS[dataset](root)
    overrides = (
        f"data.root={root} data.download=false num_rounds=1 num_clients={clients} "
        f"data.train_subset={N_TRAIN // 2} data.test_subset=32 client.steps=1 "
        f"client.batch_size=8 evaluation.every=1 {extra}"
    )
    res = run_in_process(method, set_=overrides, num_nodes=clients, experiment=preset)
    s = res["summary"]
    assert s["status"] == "completed" and s["rounds_completed"] == 1, s
    assert math.isfinite(s["final_accuracy"]) and 0.0 <= s["final_accuracy"] <= 1.0
    assert res["records"][-1]["num_results"] >= 2
    cfg = load_config(preset, method, overrides)
    assert cfg["data"]["dataset"] == dataset
    _check_paper_model(cfg, expected)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_paper_preset_without_its_dataset_stops_with_a_data_error(preset, tmp_path, capsys):
    """data.download=false and no files: the launcher's one line and exit 2, before Flower
    starts and before a run directory is made."""
    from fl_app.launch import main

    method = PRESETS[preset][0]
    dataset = load_config(preset, method)["data"]["dataset"]
    missing = tmp_path / "nodata"
    out = tmp_path / "out"
    args = ["--experiment", preset, "--method", method, "--output-dir", str(out)]
    code = main([*args, "--set", f"data.root={missing} data.download=false"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("data error: "), err
    name = "Fashion-MNIST" if dataset == "fmnist" else dataset
    assert name in err and "Traceback" not in err
    assert not out.exists()


def test_an_empty_dataset_folder_is_a_data_error_naming_the_dataset(tmp_path, capsys):
    """The folder exists but holds no files: the clients' own loader, run by the launcher
    before Flower starts, says what is missing and how to get it."""
    from fl_app.launch import main

    (tmp_path / "svhn").mkdir()
    code = main(
        [
            "--experiment",
            "paper_pmfl_svhn",
            "--method",
            "pmfl",
            "--output-dir",
            str(tmp_path / "out"),
            "--set",
            f"data.root={tmp_path / 'svhn'} data.download=false",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"data error: svhn not found under {tmp_path / 'svhn'}")
    assert "data.download=true" in err and "Traceback" not in err
