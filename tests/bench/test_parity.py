"""bench/parity.py's pure parts: the last-5 accuracy, gap and spread, the parity.json row
and its merging, their command lines derived from our config, and the partition file that
both sides read (written once, read back with identical indices by our clients' code and
by the runner of their code). Their code itself is not run here."""

import json

import numpy as np
import parity
import parity_theirs
import pytest
import torch
import torch.nn.functional as F

from core.data import load_client_data, partitions_of
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


def test_fedrcl_model_contract_gives_our_levels_and_logits():
    """Their client reads ``layer<l>`` for l < ``num_layers`` and ``logit``: our levels (each
    stage's pre-ReLU output, pooled) and logits, unchanged."""
    import torch

    cfg = _cfg(parity.METHODS["fedrcl_hard"])
    model = parity_theirs.TheirContract(cfg)
    x = torch.randn(4, 1, 28, 28)
    out = model(x)
    ours = model.net(x)
    assert model.num_layers == len(ours.levels) == 5
    for i, level in enumerate(ours.levels):
        assert torch.equal(out[f"layer{i}"], level) and level.dim() == 2
    assert torch.equal(out["logit"], ours.logits)
    with pytest.raises(SystemExit, match="feature_relu"):
        model(x, no_relu=False)


def test_forget_modules_drops_a_package_and_its_submodules(monkeypatch):
    import sys
    import types

    for name in ("theirpkg", "theirpkg.sub", "theirpkgx"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    parity_theirs.forget_modules(("theirpkg",))
    assert "theirpkg" not in sys.modules and "theirpkg.sub" not in sys.modules
    assert "theirpkgx" in sys.modules


def test_partition_file_is_written_once_and_read_back_identically_by_both_sides(tmp_path):
    path = tmp_path / "part.npz"
    over = f"data.dataset=digits data.test_fraction=0 data.partition_file={path} seed=3"
    cfg = load_config("regime_moon", "moon", over)
    written = partitions_of(cfg["data"], cfg["num_clients"], cfg["seed"])  # writes it
    assert path.is_file()
    mtime = path.stat().st_mtime_ns
    again = partitions_of(cfg["data"], cfg["num_clients"], cfg["seed"])  # reads it
    assert path.stat().st_mtime_ns == mtime
    theirs = parity_theirs.OurData(cfg).local  # what their code is given
    for a, b, c in zip(written, again, theirs, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    for pid, idx in enumerate(theirs):  # our clients train on the same samples
        ours = load_client_data(cfg, pid).train
        assert len(ours) == len(idx)
        assert np.array_equal(ours.y.numpy(), parity_theirs.OurData(cfg).train_raw.y[idx])
    assert sorted(np.concatenate(theirs).tolist()) == list(range(sum(map(len, theirs))))


def test_their_participation_probabilities_are_our_servers(tmp_path):
    path = tmp_path / "part.npz"
    over = (
        f"data.dataset=digits data.test_fraction=0 data.partition_file={path} num_clients=20 "
        "data.alpha=0.5 seed=2"
    )
    cfg = load_config("p3", "fedau", over)
    partitions_of(cfg["data"], cfg["num_clients"], cfg["seed"])
    p = parity_theirs.our_probabilities(parity_theirs.OurData(cfg), cfg)
    assert p.shape == (20,) and p.mean() == pytest.approx(0.1) and p.min() >= 0.02


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


def test_their_fedrane_data_files_hold_our_clients_local_splits(tmp_path):
    """The PFLlib files their loader reads (``{"data": {"x", "y"}}`` per client and split,
    ``global_test``) hold exactly what our client k trains and tests on."""
    path = tmp_path / "part.npz"
    over = f"data.dataset=digits data.partition_file={path} num_clients=4 seed=1"
    cfg = load_config("regime_fedrane", "fedrane_authors", over)
    partitions_of(cfg["data"], cfg["num_clients"], cfg["seed"])
    root = tmp_path / "dataset" / "fmnist"
    parity_theirs.write_pfllib_data(parity_theirs.OurData(cfg), root)

    def read(file):  # as their utils/data_utils.py read_data does
        with open(file, "rb") as fh:
            return np.load(fh, allow_pickle=True)["data"].tolist()

    for k in range(4):
        ours = load_client_data(cfg, k)
        for split, mine in (("train", ours.train), ("test", ours.test)):
            theirs = read(root / split / f"{k}.npz")
            assert np.array_equal(theirs["x"], mine.x.numpy())
            assert np.array_equal(theirs["y"], mine.y.numpy())
        assert len(ours.test) > 0  # the regime's 75/25 local split
    from core.data import load_test_set

    test = read(root / "global_test")
    assert np.array_equal(test["y"], load_test_set(cfg).y.numpy())


def test_accuracy_watch_passes_their_output_on_and_keeps_the_global_accuracies():
    import io

    out = io.StringIO()
    watch = parity_theirs.AccuracyWatch(out)
    text = "Round number: 0\nGlobal test2 acc: 0.0700\nAveraged Test Accuracy: 0.04\nGlob"
    watch.write(text)
    watch.write("al test2 acc: 0.1060\n")  # a line printed in two writes
    assert out.getvalue() == text + "al test2 acc: 0.1060\n"
    assert watch.values == [0.07, 0.106]  # "Averaged Test Accuracy" is not the global one


def test_stand_ins_import_subclass_and_fail_only_when_used(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "meta_path", [parity_theirs.StandIns(("nopkg",)), *sys.meta_path])
    for name in [n for n in sys.modules if n.startswith("nopkg")]:
        monkeypatch.delitem(sys.modules, name)
    from nopkg.optim import RiemannianSGD  # type: ignore[import-not-found]

    class Theirs(RiemannianSGD):  # their fedoptimizer.py subclasses one at import
        pass

    with pytest.raises(RuntimeError, match=r"nopkg\.optim\.RiemannianSGD"):
        RiemannianSGD(lr=1)
    with pytest.raises(RuntimeError, match="stand-in"):
        Theirs()
    import nopkg  # type: ignore[import-not-found]

    assert nopkg.PoincareBall.manifold.__qualname__ == "nopkg.PoincareBall.manifold"
    with pytest.raises(AttributeError):
        nopkg.__wrapped__  # noqa: B018  (dunders are not stood in for)
    for name in [n for n in sys.modules if n.startswith("nopkg")]:
        del sys.modules[name]


def test_mixup_on_logits_scores_their_mixed_features_through_their_classifier():
    from types import SimpleNamespace

    torch.manual_seed(0)
    predictor = torch.nn.Linear(64, 10, bias=False)
    client = SimpleNamespace(model=SimpleNamespace(predictor=predictor), num_classes=10)
    ce = parity_theirs.MixupOnLogits(client)
    y = torch.randint(0, 10, (8,))
    z_mix = torch.randn(8, 64)  # clientFedRANE.py:154 passes the mixed features
    assert torch.allclose(ce(z_mix, y), F.cross_entropy(predictor(z_mix), y))
    logits, nce = torch.randn(8, 10), torch.randn(16, 15)  # class logits; InfoNCE's, 2B - 1
    assert torch.allclose(ce(logits, y), F.cross_entropy(logits, y))
    assert torch.allclose(
        ce(nce, torch.zeros(16, dtype=torch.long)),
        F.cross_entropy(nce, torch.zeros(16, dtype=torch.long)),
    )
    client.model.predictor = torch.nn.Linear(64, 10, bias=False)  # their server sets weights
    assert torch.allclose(ce(z_mix, y), F.cross_entropy(client.model.predictor(z_mix), y))
    for width in (10, 63):  # a class logit or an InfoNCE width could not be told apart
        odd = SimpleNamespace(
            model=SimpleNamespace(predictor=torch.nn.Linear(width, 10)), num_classes=10
        )
        with pytest.raises(SystemExit, match="ambiguous"):
            parity_theirs.MixupOnLogits(odd)


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


def test_fresh_optimizer_clears_their_momentum_before_each_round_only():
    class Client:  # a PFLlib client: its optimizer built once, kept across rounds
        def __init__(self):
            self.w = torch.nn.Parameter(torch.ones(2))
            self.optimizer = torch.optim.SGD([self.w], lr=0.1, momentum=0.9)
            self.buffers_seen = []

        def train(self):
            self.buffers_seen.append(len(self.optimizer.state))
            for _ in range(3):
                self.optimizer.zero_grad()
                self.w.sum().backward()
                self.optimizer.step()

    kept = Client()
    kept.train(), kept.train()
    assert kept.buffers_seen == [0, 1]  # as released: round 2 starts with round 1's momentum
    parity_theirs.fresh_optimizer_each_round(Client)
    fresh = Client()
    fresh.train(), fresh.train()
    assert fresh.buffers_seen == [0, 0]
    assert fresh.optimizer.param_groups[0]["lr"] == 0.1


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


def test_our_gne_in_their_server_steps_with_our_weights_and_records_both(tmp_path):
    """--our-gne-in-theirs: their nash still runs (its warm start evolves as released), the
    step is their updates weighted by our gram_weights on the same updates and live clients'
    sample counts, and each round's two weight vectors are recorded."""
    from types import SimpleNamespace

    from strategies.gne import gram_weights

    calls = []

    class Server:  # their FedRANE server: nash(grads dim x K_live, ids without a gradient)
        def nash(self, grads, no_grad_id_list):
            calls.append(no_grad_id_list)
            self.prvs_alpha = np.array([2.0, 1.0, 1.0], dtype=np.float32)
            return grads.sum(1)

    parity_theirs.our_gne_in_their_server(Server, tmp_path / "gne.jsonl")
    server = Server()
    server.selected_clients = [
        SimpleNamespace(id=i, train_samples=n) for i, n in enumerate([100, 50, 300, 200])
    ]
    grads = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    step = server.nash(grads, [1])  # client 1 has no gradient: columns are clients 0, 2, 3
    g = grads.double()
    ours, status = gram_weights((g.t() @ g).numpy(), np.array([100.0, 300.0, 200.0]))
    assert calls == [[1]] and status == "nash"
    assert torch.allclose(step, grads @ torch.as_tensor(ours, dtype=grads.dtype))
    record = json.loads((tmp_path / "gne.jsonl").read_text())
    assert record["theirs"] == [0.5, 0.25, 0.25] and np.allclose(record["ours"], ours)
    assert np.allclose(record["gram"], (g.t() @ g).numpy())
    assert not np.allclose(ours, [0.5, 0.25, 0.25])  # the step is not theirs


def test_our_gne_in_theirs_is_a_their_side_variant_with_its_own_row():
    args = _fedrane_args(*LEARNING, "--fresh-optimizer", "--our-gne-in-theirs", "--our-drop-last")
    assert parity.their_variants(args) == ["fresh_optimizer", "our_gne"]
    assert parity.diagnostic_label(args) == (
        "fedrane_authors+mixup_on_logits+reg_graph_aug0.5+their_fresh_optimizer"
        "+their_server_our_gne+our_drop_last"
    )
