"""bench/parity.py's pure parts: the last-5 accuracy, gap and spread, the parity.json row
and its merging, their command lines derived from our config, and the diagnostic flags
(refused where they do not apply; their side reused where only ours changes). What the
runner of their code gives it is in test_parity_theirs.py. Their code itself is not run
here."""

import json
from pathlib import Path

import numpy as np
import parity
import pytest

from fl_app.config import load_config


def test_last5_is_the_mean_of_the_last_five_rounds_in_percent():
    assert parity.last5([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]) == pytest.approx(50.0)
    assert parity.last5([0.2, 0.4]) == pytest.approx(30.0)  # fewer rounds than five
    with pytest.raises(ValueError):
        parity.last5([])


def test_gap_is_the_distance_of_the_means_and_spread_the_larger_seed_range():
    gap, spread = parity.gap_and_spread([80.0, 82.0], [79.0, 79.5])
    assert gap == pytest.approx(81.0 - 79.25)
    assert spread == pytest.approx(2.0)  # theirs range 2.0 > ours 0.5
    assert parity.gap_and_spread([70.0], [70.4]) == pytest.approx((0.4, 0.0))
    with pytest.raises(ValueError):
        parity.gap_and_spread([], [1.0])


def _curve(final: float, rounds: int = 8) -> list[float]:
    return [final * (r + 1) / rounds for r in range(rounds)]


def test_row_holds_last5_per_seed_gap_spread_and_the_per_round_figures():
    theirs = {0: _curve(0.80), 1: _curve(0.82)}
    ours = {0: _curve(0.81), 1: _curve(0.80)}
    row = parity.parity_row("moon", [0, 1], theirs, ours, commit="abc", settings={"k": 1})
    t5 = [100 * np.mean(theirs[s][-5:]) for s in (0, 1)]
    o5 = [100 * np.mean(ours[s][-5:]) for s in (0, 1)]
    assert row["method"] == "moon" and row["seeds"] == [0, 1] and row["rounds"] == 8
    assert row["theirs"] == pytest.approx(t5, abs=0.01)
    assert row["ours"] == pytest.approx(o5, abs=0.01)
    assert row["gap"] == pytest.approx(abs(np.mean(t5) - np.mean(o5)), abs=0.01)
    assert row["spread"] == pytest.approx(max(np.ptp(t5), np.ptp(o5)), abs=0.01)
    assert row["tolerance"] == pytest.approx(max(row["spread"], 1.0))
    assert row["within"] is True
    assert row["rounds_within"] == 8  # the curves differ by under a point each round
    assert row["early_gap"] < 0.5
    assert row["curves"]["theirs"]["1"][-1] == pytest.approx(82.0)
    assert row["commit"] == "abc" and row["settings"] == {"k": 1}
    json.dumps(row)  # parity.json holds it as it is


def test_row_outside_the_tolerance_and_refusing_unequal_round_counts():
    row = parity.parity_row(
        "fedau", [0, 1], {0: [0.5] * 6, 1: [0.5] * 6}, {0: [0.6] * 6, 1: [0.6] * 6}
    )
    assert row["gap"] == pytest.approx(10.0) and row["spread"] == 0.0
    assert row["tolerance"] == 1.0 and row["within"] is False and row["rounds_within"] == 0
    with pytest.raises(ValueError, match="same number of rounds"):
        parity.parity_row("moon", [0], {0: [0.5] * 3}, {0: [0.5] * 4})


def test_merge_replaces_the_methods_row_and_keeps_the_methods_order():
    rows = [{"method": "fedau", "gap": 1}, {"method": "moon", "gap": 2}, {"method": "x"}]
    merged = parity.merge_rows(rows, {"method": "moon", "gap": 3})
    assert [r["method"] for r in merged] == ["moon", "fedau", "x"]
    assert merged[0]["gap"] == 3
    assert [r["method"] for r in parity.merge_rows([], {"method": "fedau"})] == ["fedau"]


def test_parity_table_has_one_line_per_row_with_both_sides_per_seed():
    row = parity.parity_row(
        "fedau",
        [0, 1],
        {0: [0.5] * 5, 1: [0.4] * 5},
        {0: [0.45] * 5, 1: [0.4] * 5},
        commit="6e9cce9b2e",
    )
    table = parity.parity_table([row]).splitlines()
    assert len(table) == 3 and table[0].startswith("| method | their code")
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells[:4] == ["fedau", "IBM/fedau `6e9cce9`", "50.00 / 40.00", "45.00 / 40.00"]
    assert cells[4:] == ["2.50", "10.00 (10.00)", "yes", "5/5", "5", "0, 1"]


def _paired_row(method: str, theirs: float, ours: float, partition: str = "p") -> dict:
    """A two-seed row of ``method`` whose last-5 is ``theirs``/``ours`` (+1 point on seed 1)
    on the partition files ``<partition><seed>.npz``."""
    per_seed = {
        str(s): {"ours": f"num_rounds=5 data.partition_file=/x/{partition}{s}.npz"} for s in (0, 1)
    }
    return parity.parity_row(
        method,
        [0, 1],
        {s: [theirs + s / 100] * 5 for s in (0, 1)},
        {s: [ours + s / 100] * 5 for s in (0, 1)},
        settings={"experiment": "regime_fedrcl", "per_seed": per_seed},
    )


def test_gain_rows_are_the_method_minus_its_fedavg_per_seed_on_each_side():
    rows = [
        _paired_row("fedrcl_hard", 0.85, 0.86),
        _paired_row("moon", 0.80, 0.80),  # its FedAvg row is missing: no gain row
        _paired_row("fedavg_fedrcl", 0.84, 0.87),
    ]
    [gain] = parity.gain_rows(rows)
    assert gain["method"] == "fedrcl_hard" and gain["baseline"] == "fedavg_fedrcl"
    assert gain["seeds"] == [0, 1] and gain["rounds"] == 5
    assert gain["theirs"] == pytest.approx([1.0, 1.0]) and gain["ours"] == pytest.approx(
        [-1.0, -1.0]
    )
    table = parity.gains_table(rows).splitlines()
    assert len(table) == 3 and table[0].startswith("| method | matched FedAvg")
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells == [
        "fedrcl_hard",
        "fedavg_fedrcl",
        "skynbe/FedRCL",
        "+1.00 / +1.00 (+1.00)",
        "-1.00 / -1.00 (-1.00)",
        "5",
        "0, 1",
    ]


def test_gain_rows_refuse_a_pair_that_ran_on_other_partitions():
    rows = [_paired_row("fedrcl_hard", 0.85, 0.86), _paired_row("fedavg_fedrcl", 0.84, 0.87, "q")]
    with pytest.raises(ValueError, match="different seeds, rounds or partitions"):
        parity.gain_rows(rows)


def test_committed_gains_table_renders_from_the_committed_parity_rows():
    results = Path(parity.__file__).parent / "results"
    rows = json.loads((results / "parity.json").read_text())
    assert (results / "parity_gains.md").read_text() == parity.gains_table(rows)
    assert (results / "parity.md").read_text() == parity.parity_table(rows)


def test_write_results_writes_the_rows_and_both_tables(tmp_path):
    rows = [_paired_row("fedrcl_hard", 0.85, 0.86), _paired_row("fedavg_fedrcl", 0.84, 0.87)]
    parity.write_results(rows, tmp_path / "r")
    assert json.loads((tmp_path / "r" / "parity.json").read_text()) == rows
    assert (tmp_path / "r" / "parity.md").read_text() == parity.parity_table(rows)
    assert (tmp_path / "r" / "parity_gains.md").read_text() == parity.gains_table(rows)


def test_plot_writes_a_png(tmp_path):
    row = parity.parity_row(
        "moon", [0, 1], {0: _curve(0.8), 1: _curve(0.8)}, {0: _curve(0.8), 1: _curve(0.79)}
    )
    parity.plot(row, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_title_lines_breaks_a_long_row_name_before_a_plus():
    assert parity.title_lines("moon") == "moon"
    name = "fedrane_authors+mixup_on_logits+reg_graph_aug0.5+their_fresh_optimizer+our_drop_last"
    lines = parity.title_lines(name, width=50).split("\n")
    assert "".join(lines) == name and all(len(x) <= 50 for x in lines)
    assert all(x.startswith("+") for x in lines[1:])


def _cfg(spec: parity.Spec, extra: str = ""):
    return load_config(spec.experiment, spec.method, f"{spec.overrides} num_rounds=30 {extra}")


def test_moon_command_line_follows_our_config():
    spec = parity.METHODS["moon"]
    args = parity.their_args(spec, _cfg(spec, "seed=1"))
    opt = dict(zip(args[::2], args[1::2], strict=True))
    assert opt["--alg"] == "moon" and opt["--model"] == "simple-cnn-mnist"
    assert opt["--n_parties"] == "10" and opt["--beta"] == "0.5" and opt["--epochs"] == "10"
    assert opt["--batch-size"] == "64" and float(opt["--lr"]) == 0.01
    assert (
        float(opt["--reg"]) == 1e-5
        and float(opt["--mu"]) == 5
        and float(opt["--temperature"]) == 0.5
    )
    assert opt["--out_dim"] == "256" and opt["--comm_round"] == "30" and opt["--init_seed"] == "1"
    fedavg = parity.their_args(parity.METHODS["fedavg_head"], _cfg(parity.METHODS["fedavg_head"]))
    assert "--alg fedavg" in " ".join(fedavg) and "--mu" not in fedavg
    with pytest.raises(SystemExit, match="momentum 0.9"):  # fixed in their code
        parity.their_args(spec, _cfg(spec, "client.momentum=0.5"))
    with pytest.raises(SystemExit, match="simple-cnn-mnist"):
        parity.their_args(spec, _cfg(spec, "model.feature_dim=128"))


def test_fedau_command_line_follows_our_config():
    spec = parity.METHODS["fedau"]
    args = parity.their_args(spec, _cfg(spec, "seed=1"))
    opt = dict(zip(args[::2], args[1::2], strict=True))
    assert opt["-weighting"] == "adaptive" and opt["-k-adaptive"] == "50"
    assert opt["-total-workers"] == "250" and opt["-seeds"] == "1"
    assert opt["-minibatch"] == "64" and opt["-iters-per-round"] == "5"
    assert opt["-iters-total"] == "150" and opt["-iters-per-eval"] == "5"  # 30 rounds, each
    assert opt["-participation"] == "bernoulli" and float(opt["-participation-prob-mean"]) == 0.1
    markov = parity.their_args(spec, _cfg(spec, "server.participation=markov"))
    assert "markov-0.05" in markov
    with pytest.raises(SystemExit, match="no momentum"):
        parity.their_args(spec, _cfg(spec, "client.momentum=0.9"))


def test_fedau_parity_uses_their_interval_timing():
    spec = parity.METHODS["fedau"]
    assert _cfg(spec)["server"]["interval_timing"] == "before"
    with pytest.raises(SystemExit, match="interval_timing=before"):
        parity.their_args(spec, _cfg(spec, "server.interval_timing=after"))


def test_fedrcl_command_line_follows_our_config():
    spec = parity.METHODS["fedrcl_hard"]
    args = parity.their_args(spec, _cfg(spec, "seed=2"))
    opt = dict(a.split("=", 1) for a in args)
    assert opt["client"] == "fedrcl" and opt["seed"] == "2"
    assert opt["trainer.num_clients"] == "100" and float(opt["trainer.participation_rate"]) == 0.05
    assert opt["trainer.global_rounds"] == "30" and opt["trainer.local_epochs"] == "5"
    assert float(opt["trainer.local_lr"]) == 0.1 and float(opt["trainer.local_lr_decay"]) == 0.998
    assert opt["batch_size"] == "50" and float(opt["optimizer.wd"]) == 0.001
    assert float(opt["optimizer.momentum"]) == 0 and float(opt["client.rcl_loss.temp"]) == 0.05
    assert opt["client.rcl_loss.branch_level"] == "[3,4]"  # the regime's levels (conv4, fc)
    assert opt["use_amp"] == "False" and opt["multiprocessing"] == "False"
    assert opt["eval.freq"] == "1" and float(opt["split.alpha"]) == 0.3
    every = parity.their_args(spec, _cfg(spec, "client.levels=all"))
    assert "client.rcl_loss.branch_level=[0,1,2,3,4]" in every
    with pytest.raises(SystemExit, match="mining=hard"):  # their CLLoss is the hard-mined form
        parity.their_args(spec, _cfg(spec, "client.mining=paper"))
    with pytest.raises(SystemExit, match="sum / C"):
        parity.their_args(spec, _cfg(spec, "server.weighting=samples"))
    with pytest.raises(SystemExit, match="evaluation.every=1"):
        parity.their_args(spec, _cfg(spec, "evaluation.every=5"))


def test_fedavg_in_fedrcls_code_is_their_base_client_with_the_same_settings():
    """``fedavg_fedrcl``: their ``client=base`` against R-FedRCL's matched FedAvg; every
    setting but the loss is the FedRCL row's, and no L_RCL option reaches their code."""
    fedavg, fedrcl = parity.METHODS["fedavg_fedrcl"], parity.METHODS["fedrcl_hard"]
    ours = _cfg(fedavg, "seed=1")
    assert ours["client"]["name"] == "fedavg" and ours["server"]["weighting"] == "uniform"
    base = parity.their_args(fedavg, ours)
    rcl = parity.their_args(fedrcl, _cfg(fedrcl, "seed=1"))
    assert "client=base" in base and not any(a.startswith("client.") for a in base)
    assert set(rcl) - set(base) == {
        "client=fedrcl",
        "client.rcl_loss.temp=0.05",
        "client.rcl_loss.branch_level=[3,4]",
    }
    assert set(base) - set(rcl) == {"client=base"}
    with pytest.raises(SystemExit, match="FedRCL's and FedAvg's"):
        parity.their_args(fedavg, load_config("regime_fedrcl", "moon", fedavg.overrides))


def test_our_accuracy_per_round_leaves_out_the_initial_model_and_sorts_rounds():
    records = [
        {"round": 2, "accuracy": 0.5},
        {"round": 0, "accuracy": 0.1},
        {"round": 1, "accuracy": 0.3},
        {"round": 3, "loss": 1.0},  # not evaluated
    ]
    assert parity.accuracy_per_round(records) == [0.3, 0.5]


def test_children_never_install_dependencies_and_use_their_own_superlink_port(monkeypatch):
    monkeypatch.delenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", raising=False)
    env = parity.subprocess_env()
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] == str(parity.PARITY_PORT)
    assert env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] != "39191"  # the launcher's default
    assert env["PYTHONPATH"].split(":")[0] == str(parity.ROOT)


def test_fedrane_command_line_follows_our_config():
    spec = parity.METHODS["fedrane_authors"]
    args = parity.their_args(spec, _cfg(spec, "seed=1"))
    opt = dict(zip(args[::2], args[1::2], strict=True))
    assert opt["-algo"] == "FedRANE" and opt["-m"] == "cnn" and opt["-data"] == "fmnist"
    assert opt["-nc"] == "20" and opt["-jr"] == "1.0" and opt["-gr"] == "30" and opt["-eg"] == "1"
    assert opt["-ls"] == "5" and opt["-lbs"] == "128" and float(opt["-lr"]) == 0.01
    assert opt["-gnn_type"] == "gat" and opt["-graph_n_hops"] == "1"
    assert float(opt["-reg_graph_aug"]) == 0 and float(opt["-nce_reg"]) == 0.1
    assert float(opt["-info_nce_temperature"]) == 0.8 and opt["-dev"] == "cpu"
    # the preset's form (mixup on the logits) is the diagnostic --mixup-on-logits: the same
    # command line, their loss changed by parity_theirs.py from our config
    assert parity.their_args(spec, _cfg(spec, "seed=1 client.mixup_on=classifier")) == args
    with pytest.raises(SystemExit, match="mixup_weight=10"):
        parity.their_args(spec, _cfg(spec, "client.mixup_weight=1"))
    with pytest.raises(SystemExit, match="momentum 0.9"):
        parity.their_args(spec, _cfg(spec, "client.momentum=0"))
    with pytest.raises(SystemExit, match="FedAvgCNN"):
        parity.their_args(spec, _cfg(spec, "model.feature_dim=128"))
    with pytest.raises(SystemExit, match="fedrane client, gne"):
        parity.their_args(spec, _cfg(spec, "server.name=fedavg"))


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["--method", "moon", "--mixup-on-logits"], "applies to FedRANE's code"),
        (["--method", "fedrane_authors", "--same-init"], "applies to MOON's code"),
        (["--method", "fedau", "--epochs", "2"], "does not apply to FedAU"),
        (["--method", "moon", "--reg-graph-aug", "0.5"], "applies to FedRANE's code"),
        (["--method", "fedrane_authors", "--reg-graph-aug", "1.5"], "lies in [0, 1]"),
        (["--method", "moon", "--fresh-optimizer"], "applies to FedRANE's code"),
        (["--method", "moon", "--our-drop-last"], "applies to FedRANE's code"),
        (["--method", "fedrcl_hard", "--our-kept-optimizer"], "applies to FedRANE's code"),
        (
            ["--method", "fedrane_authors", "--fresh-optimizer", "--our-kept-optimizer"],
            "use one",
        ),
        (["--method", "moon", "--our-gne-in-theirs"], "applies to FedRANE's code"),
    ],
)
def test_diagnostics_are_refused_for_the_code_they_do_not_apply_to(
    monkeypatch, tmp_path, argv, refusal
):
    monkeypatch.setattr(
        "sys.argv", ["parity.py", "--theirs", str(tmp_path), "--out", str(tmp_path), *argv]
    )
    assert refusal in parity.main()
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


def _fedrane_args(*argv: str):
    """bench/parity.py's arguments for FedRANE's code, 3 rounds, and ``argv``."""
    common = ["--method", "fedrane_authors", "--theirs", "unused", "--rounds", "3"]
    return parity.parser().parse_args([*common, *argv])


#: The diagnostics of the FedRANE rows in which both sides learn
LEARNING = ("--mixup-on-logits", "--reg-graph-aug", "0.5")


def test_mixup_on_logits_sets_the_classifier_form_on_our_side_last(tmp_path):
    spec = parity.METHODS["fedrane_authors"]
    plain = parity.overrides_of(spec, _fedrane_args(), tmp_path)
    diag = parity.overrides_of(spec, _fedrane_args("--mixup-on-logits"), tmp_path)
    assert load_config(spec.experiment, spec.method, plain)["client"]["mixup_on"] == "features"
    assert load_config(spec.experiment, spec.method, diag)["client"]["mixup_on"] == "classifier"


def test_reg_graph_aug_sets_alpha_z_on_our_side_and_their_flag_follows(tmp_path):
    spec = parity.METHODS["fedrane_authors"]
    plain = _fedrane_args("--mixup-on-logits")
    diag = _fedrane_args(*LEARNING)
    cfg_plain, cfg_diag = (
        load_config(spec.experiment, spec.method, parity.overrides_of(spec, a, tmp_path))
        for a in (plain, diag)
    )
    assert cfg_plain["client"]["alpha_z"] == 0 and cfg_diag["client"]["alpha_z"] == 0.5
    assert cfg_diag["client"]["mixup_on"] == "classifier"

    def reg(cfg):
        argv = parity.their_args(spec, cfg)
        return float(argv[argv.index("-reg_graph_aug") + 1])

    assert reg(cfg_plain) == 0 and reg(cfg_diag) == 0.5
    assert parity.diagnostic_label(plain) == "fedrane_authors+mixup_on_logits"
    assert parity.diagnostic_label(diag) == "fedrane_authors+mixup_on_logits+reg_graph_aug0.5"
    fresh = _fedrane_args(*LEARNING, "--fresh-optimizer")
    assert parity.diagnostic_label(fresh) == (
        "fedrane_authors+mixup_on_logits+reg_graph_aug0.5+their_fresh_optimizer"
    )
    # their side only: our overrides are those of the row without it
    assert parity.overrides_of(spec, fresh, tmp_path) == parity.overrides_of(spec, diag, tmp_path)


def test_our_only_diagnostics_change_our_settings_and_reuse_their_side(tmp_path, monkeypatch):
    """--our-drop-last / --our-kept-optimizer: our overrides gain client.drop_last /
    keep_optimizer_state (read back by our config), the shared overrides (their cache key and
    their command line) do not change, our run goes to a file of its own, and the row's name
    says so."""
    spec = parity.METHODS["fedrane_authors"]
    plain = _fedrane_args(*LEARNING)
    both = _fedrane_args(*LEARNING, "--our-drop-last", "--our-kept-optimizer")
    shared = parity.overrides_of(spec, both, tmp_path)
    assert shared == parity.overrides_of(spec, plain, tmp_path)
    assert parity.our_overrides(plain, shared) == shared
    cfg = load_config(spec.experiment, spec.method, parity.our_overrides(both, shared))
    assert cfg["client"]["drop_last"] and cfg["client"]["keep_optimizer_state"]
    assert parity.our_variants(both) == ["drop_last", "kept_optimizer"]
    assert parity.diagnostic_label(both) == (
        "fedrane_authors+mixup_on_logits+reg_graph_aug0.5+our_drop_last+our_kept_optimizer"
    )
    assert parity.our_label(both) == parity.our_label(plain)  # their side's folder: reused
    fresh = _fedrane_args(*LEARNING, "--fresh-optimizer", "--our-drop-last")
    assert parity.diagnostic_label(fresh).endswith("+their_fresh_optimizer+our_drop_last")

    # run_ours reads (and would write) its own file, not the plain row's ours.json
    key = {"experiment": spec.experiment, "method": spec.method, "overrides": "x"}
    parity.save(tmp_path / "ours.json", key, [0.1], 1.0)
    parity.save(tmp_path / "ours_drop_last.json", key, [0.2], 1.0)
    assert parity.run_ours(spec, cfg, tmp_path, "x") == [0.1]
    assert parity.run_ours(spec, cfg, tmp_path, "x", ["drop_last"]) == [0.2]


def test_our_gne_in_theirs_is_a_their_side_variant_with_its_own_row():
    args = _fedrane_args(*LEARNING, "--fresh-optimizer", "--our-gne-in-theirs", "--our-drop-last")
    assert parity.their_variants(args) == ["fresh_optimizer", "our_gne"]
    assert parity.diagnostic_label(args) == (
        "fedrane_authors+mixup_on_logits+reg_graph_aug0.5+their_fresh_optimizer"
        "+their_server_our_gne+our_drop_last"
    )
