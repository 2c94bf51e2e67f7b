"""bench/parity_theirs.py, the runner of the authors' code on our data: what it gives their
code (our partitions as their data files, our participation probabilities, our model under
their contract) and the diagnostics it applies to their code (stand-ins for missing
packages, mixup scored on logits, their optimizer cleared each round, our GNE weights in
their server). Their code itself is not run here."""

import json

import numpy as np
import parity
import parity_theirs
import pytest
import torch
import torch.nn.functional as F

from core.data import load_client_data, partitions_of
from fl_app.config import load_config


def _cfg(spec: parity.Spec, extra: str = ""):
    return load_config(spec.experiment, spec.method, f"{spec.overrides} num_rounds=30 {extra}")


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
