import pytest

from fl_app.config import load_config
from fl_app.results import config_changes, ema, split_config_changes, summarize
from fl_app.rundir import RESUME_MAY_CHANGE


def _cfg(tmp_path, seed=0):
    return load_config("tiny", "fedavg", f"output_dir={tmp_path} seed={seed}")


def test_ema_and_summary_by_hand(tmp_path):
    assert ema([1.0, 0.0, 1.0]) == pytest.approx(0.9 * (0.9 * 1.0) + 0.1)
    accs = [0.1, 0.5, 0.3, 0.6, 0.2, 0.4, 0.7]
    recs = [{"round": 0, "accuracy": 0.05}]
    recs += [{"round": i + 1, "accuracy": a, "failures": []} for i, a in enumerate(accs)]
    recs[2]["failures"] = [{"kind": "rejected"}, {"kind": "missing"}, {"kind": "error"}]
    s = summarize(recs, _cfg(tmp_path))
    assert s["rounds_completed"] == 7 and s["final_accuracy"] == 0.7
    assert s["best_accuracy"] == 0.7
    assert s["last5_accuracy"] == pytest.approx((0.3 + 0.6 + 0.2 + 0.4 + 0.7) / 5)
    assert s["top5_accuracy"] == pytest.approx((0.7 + 0.6 + 0.5 + 0.4 + 0.3) / 5)
    assert s["dropped_results"] == 1 and s["failed_results"] == 2
    # EMA(0.9) of rounds 1..7 (round 0, the initial model, is left out):
    # 0.1 → 0.14 → 0.156 → 0.2004 → 0.20036 → 0.220324 → 0.2682916
    assert s["ema_accuracy"] == pytest.approx(0.2682916, abs=1e-12)
    assert s["final_personal_accuracy"] is None and s["last5_personal_accuracy"] is None
    for key in ("federated_accuracy", "effective_rank", "robust_fgsm", "robust_pgd"):
        assert f"final_{key}" not in s  # no round recorded it


def test_summary_lists_each_arithmetic_the_clients_trained_on(tmp_path):
    """``numerics``: the distinct ``numerics`` of the round log's clients, sorted; a record
    without clients (round 0) or a client without the key (an older run) adds nothing."""
    a, b = "torch 2.14.1, cpu AVX2", "torch 2.14.1, cpu AVX512"
    recs = [
        {"round": 0, "accuracy": 0.1},
        {"round": 1, "clients": {"0": {"numerics": b}, "1": {"numerics": a}}},
        {"round": 2, "clients": {"0": {"numerics": b}, "1": {"num_examples": 3}}},
        {"round": 3, "clients": {"0": {"numerics": 7}}},
    ]
    assert summarize(recs, _cfg(tmp_path))["numerics"] == [a, b]
    assert summarize(recs[:1], _cfg(tmp_path))["numerics"] == []


def test_summary_personal_and_final_metrics_by_hand(tmp_path):
    """P-FL accuracy from each round's ``train`` record; ``final_<metric>`` is the last
    round that recorded the metric (None and missing values are skipped)."""
    recs = [
        {"round": 0, "accuracy": 0.1, "effective_rank": 3.0},
        {
            "round": 1,
            "accuracy": 0.2,
            "train": {"personal_accuracy": 0.3},
            "federated_accuracy": 0.35,
        },
        {"round": 2, "accuracy": 0.4, "train": {"train_loss": 1.0}, "effective_rank": 5.0},
        {"round": 3, "accuracy": 0.5, "train": {"personal_accuracy": 0.6}, "robust_pgd": 0.05},
        {"round": 4, "accuracy": None, "train": {"personal_accuracy": 0.8}, "robust_fgsm": 0.2},
        {"round": 5, "accuracy": 0.3, "federated_accuracy": None, "robust_fgsm": None},
    ]
    s = summarize(recs, _cfg(tmp_path))
    assert s["rounds_completed"] == 5
    assert s["final_accuracy"] == 0.3 and s["best_accuracy"] == 0.5
    assert s["ema_accuracy"] == pytest.approx(((0.9 * 0.2 + 0.04) * 0.9 + 0.05) * 0.9 + 0.03)
    assert s["final_personal_accuracy"] == 0.8
    assert s["last5_personal_accuracy"] == pytest.approx((0.3 + 0.6 + 0.8) / 3)
    assert s["final_federated_accuracy"] == 0.35
    assert s["final_effective_rank"] == 5.0
    assert s["final_robust_fgsm"] == 0.2 and s["final_robust_pgd"] == 0.05
    pers = [{"round": r, "train": {"personal_accuracy": r / 10}} for r in range(1, 8)]
    s = summarize(pers, _cfg(tmp_path))
    assert s["final_personal_accuracy"] == 0.7
    assert s["last5_personal_accuracy"] == pytest.approx(0.5)  # rounds 3..7
    assert s["final_accuracy"] is None and s["ema_accuracy"] is None


def test_config_changes_lists_dotted_keys_old_to_new():
    old = {
        "num_rounds": 3,
        "client": {"lr": 0.01, "device": "auto"},
        "model": {"channels": [6, 16]},
    }
    new = {"num_rounds": 5, "client": {"lr": 0.5, "device": "cpu"}, "model": {"channels": (8, 16)}}
    assert config_changes(old, old) == []
    assert config_changes(old, {**old, "model": {"channels": (6, 16)}}) == []  # tuple == list
    assert config_changes(old, new) == [
        "num_rounds: 3 -> 5",
        "client.lr: 0.01 -> 0.5",
        'client.device: "auto" -> "cpu"',
        "model.channels: [6, 16] -> [8, 16]",
    ]
    assert config_changes(old, new, ignore=RESUME_MAY_CHANGE) == [
        "client.lr: 0.01 -> 0.5",
        "model.channels: [6, 16] -> [8, 16]",
    ]
    assert config_changes({"a": {"b": None}}, {"a": {}, "c": 1}) == [
        "a.b: null -> (absent)",
        "c: (absent) -> 1",
    ]
    assert old["client"] == {"lr": 0.01, "device": "auto"}  # pure


def test_split_config_changes_tells_changed_values_from_added_or_removed_keys():
    old = {"num_rounds": 3, "client": {"lr": 0.01, "retired": 1}}
    new = {"num_rounds": 5, "client": {"lr": 0.5}, "model": {"name": "cnn"}}
    changed, added_or_removed = split_config_changes(old, new, ignore=frozenset({"num_rounds"}))
    assert changed == ["client.lr: 0.01 -> 0.5"]
    assert added_or_removed == ["client.retired: 1 -> (absent)", 'model.name: (absent) -> "cnn"']
    assert changed + added_or_removed == config_changes(old, new, frozenset({"num_rounds"}))


def test_setup_differences_name_the_model_and_optimiser_keys_only() -> None:
    """A fair Δ needs the same model (head included) and client optimiser; the method's own
    hyperparameters, the seed and the server may differ."""
    from fl_app.results import plain_fedavg, setup_differences

    fedavg, moon = load_config("p1", "fedavg"), load_config("p1", "moon")
    head = load_config("p1", "fedavg_head")
    assert setup_differences(fedavg, moon) == ["model.projection_dim: 0 -> 256"]
    assert setup_differences(head, moon) == []
    assert setup_differences(fedavg, load_config("p1", "fedccl_m", "seed=3")) == []
    mom = load_config("p1", "fedprox", "client.momentum=0.9 client.weight_decay=0.001")
    assert setup_differences(fedavg, mom) == [
        "client.momentum: 0.0 -> 0.9",
        "client.weight_decay: 0.0 -> 0.001",
    ]
    old = {**fedavg, "model": {k: v for k, v in fedavg["model"].items() if k != "hidden"}}
    assert setup_differences(old, fedavg) == []  # runs from before model.hidden existed
    padded = load_config("p1", "fedavg", "model.padding=1")
    old_padded = {**padded, "model": {k: v for k, v in padded["model"].items() if k != "padding"}}
    assert setup_differences(old_padded, padded) == ["model.padding: 0 -> 1"]  # its default
    assert plain_fedavg(fedavg) and plain_fedavg(head)
    assert not plain_fedavg(load_config("p1", "fedavg_m"))  # server momentum
    assert not plain_fedavg(load_config("p1", "fedavg_plus"))  # adversarial training


def test_matched_baseline_prefers_the_baseline_then_its_kind_on_the_same_model() -> None:
    from fl_app.results import matched_baseline

    configs = {m: load_config("p1", m) for m in ("fedavg", "fedavg_head", "moon", "fedprox")}
    assert matched_baseline("fedprox", configs, "fedavg") == ("fedavg", [])
    assert matched_baseline("moon", configs, "fedavg") == (
        "fedavg_head",
        ["model.projection_dim: 0 -> 256"],
    )
    no_fedavg = {m: c for m, c in configs.items() if m != "fedavg"}
    assert matched_baseline("moon", no_fedavg, "fedavg")[0] == "fedavg_head"
    del configs["fedavg_head"]
    assert matched_baseline("moon", configs, "fedavg")[0] is None
    assert matched_baseline("moon", {**configs, "moon": None}, "fedavg")[0] is None
