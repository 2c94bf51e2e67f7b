import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord
from flwr.common import MessageType

from clients.fedrane import FedRANEClient
from clients.losses import lra_discrimination_loss
from core.models import get_weights, orthogonal_rows, set_weights
from core.params import ConfigError
from fl_app.config import load_config
from strategies.gne import aggregation_weights


def test_lra_parameters_are_model_parameters_and_train(make_client, global_weights):
    c = make_client("fedrane")
    names = list(c.model.state_dict())
    assert any(n.startswith("lra.") for n in names)
    w0 = global_weights(c)
    new, _, m = c.fit(w0, {"server-round": 1})
    assert np.isfinite(m["train_loss"])
    lra_idx = [i for i, n in enumerate(names) if n.startswith("lra.")]
    assert any(not np.array_equal(new[i], w0[i]) for i in lra_idx)


def test_output_interface(make_client):
    c = make_client("fedrane")
    out = c.model(c.data.train.x[:8])
    assert torch.allclose(out.h.norm(dim=1), torch.ones(8), atol=1e-5)
    assert out.logits.shape == (8, 10)


def test_projection_head_is_refused(make_client):
    with pytest.raises(ValueError, match="projection_dim=0"):
        make_client("fedrane", overrides="model.projection_dim=16")


def _loss_parts(c, weights, x, y):
    """The client's loss on (x, y) with the given weights, and its parts rebuilt from the
    library: logits = logit_scale·Z̃·Wᵀ + b from the classifier's own parameters, CE on them,
    and L_CD(Z, Z̃) (clients.losses.lra_discrimination_loss)."""
    set_weights(c.model, weights)
    with torch.no_grad():
        out = c.model(x)
        loss = c.loss(x, y, out)
        clf = c.model.base.head.classifier
        logits = c.hp.logit_scale * out.z @ clf.weight.T + clf.bias
        ce = F.cross_entropy(logits, y)
        cd = lra_discrimination_loss(out.h, out.z, c.hp.tau_cd)
    return out, loss, ce, cd, logits


def test_loss_is_scaled_ce_plus_lam_cd_times_discrimination(make_client):
    """``CE(logit_scale·Z̃ → classifier) + λ_CD·L_CD(Z, Z̃)`` on a fixed batch for the
    configured logit_scale and lam_cd; changing either changes the loss, lam_cd = 0 leaves CE."""
    base = make_client("fedrane")
    torch.manual_seed(1)
    torch.nn.init.normal_(base.model.lra.W.weight, std=0.3)  # Z̃ ≠ Z (W starts at zero)
    weights = get_weights(base.model)
    x, y = base.data.train.x[:24], base.data.train.y[:24]
    got = {}
    for scale, lam in ((3.0, 0.7), (10.0, 0.7), (3.0, 0.2), (3.0, 0.0)):
        c = make_client("fedrane", overrides=f"client.logit_scale={scale} client.lam_cd={lam}")
        assert (c.hp.logit_scale, c.hp.lam_cd, c.model.logit_scale) == (scale, lam, scale)
        out, loss, ce, cd, logits = _loss_parts(c, weights, x, y)
        torch.testing.assert_close(out.logits, logits, rtol=1e-5, atol=1e-5)
        assert float(cd) > 0.1 and float(ce) > 0.1
        torch.testing.assert_close(loss, ce + lam * cd, rtol=1e-6, atol=1e-6)
        got[scale, lam] = (out, float(loss), float(ce), float(cd))
    (o3, l3, ce3, cd3), (o10, l10, ce10, cd10) = got[3.0, 0.7], got[10.0, 0.7]
    assert torch.equal(o3.z, o10.z) and torch.equal(o3.h, o10.h)  # the scale is the classifier's
    assert (o3.z - o3.h).abs().max() > 0.05  # LRA moved the features
    assert cd3 == cd10 and abs(ce3 - ce10) > 1e-3 and abs(l3 - l10) > 1e-3
    l2, l0 = got[3.0, 0.2][1], got[3.0, 0.0][1]
    assert l0 == ce3 and l2 == pytest.approx(ce3 + 0.2 * cd3, rel=1e-6)
    assert l3 - l2 == pytest.approx(0.5 * cd3, rel=1e-5)  # linear in λ_CD


def test_lam_cd_zero_skips_the_discrimination_loss(make_client, monkeypatch):
    """λ_CD = 0 trains on CE alone without computing L_CD (as PMFL and FedCCL skip a term
    whose weight is 0); λ_CD > 0 computes it once per step."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return lra_discrimination_loss(*args, **kwargs)

    monkeypatch.setattr("clients.fedrane.lra_discrimination_loss", counting)
    for lam, expected_calls in ((0.0, 0), (0.2, 1)):
        c = make_client("fedrane", overrides=f"client.lam_cd={lam}")
        x, y = c.data.train.x[:16], c.data.train.y[:16]
        out = c.model(x)
        calls.clear()
        loss = c.loss(x, y, out)
        assert len(calls) == expected_calls
        if lam == 0:
            assert torch.equal(loss, F.cross_entropy(out.logits, y))
        loss.backward()  # the graph is whole either way


# ------------------------------------------------------------------ the authors' recipe
AUTHORS = ("fedrane_authors", "fedrane_authors_wo_gne", "fedrane_authors_wo_lra", "spherefed")


def _classifier(c):
    return c.model.base.head.classifier


def test_fixed_classifier_is_seeded_orthonormal_and_travels_nowhere(make_client):
    """``classifier: fixed_orthogonal``: the first 10 rows of a seeded random orthogonal
    matrix (serverFedRANE.py:25-27), no bias, no parameter, not in the state dict (so not in
    the arrays a client sends or the server averages); the same on every client and on a
    model built under another global RNG state; another run seed gives another matrix."""
    a = make_client("fedrane_authors", pid=0)
    torch.manual_seed(123)
    b = make_client("fedrane_authors", pid=1)
    W = _classifier(a).weight
    assert W.shape == (10, 32) and torch.equal(W, _classifier(b).weight)
    torch.testing.assert_close(W @ W.T, torch.eye(10), atol=1e-6, rtol=0)
    assert torch.equal(W, orthogonal_rows(10, 32, a.cfg["seed"]))
    assert not any("classifier" in n for n in a.model.state_dict())
    assert not any(p is W for p in a.model.parameters())
    assert not hasattr(_classifier(a), "bias")
    other = make_client("fedrane_authors", overrides="seed=1")
    assert not torch.allclose(_classifier(other).weight, W)
    x = a.data.train.x[:5]
    a.model.eval()
    out = a.model(x)
    torch.testing.assert_close(out.logits, out.h @ W.T)  # logit_scale 1, no bias, Z only


def _fedavg(results):
    """Flower's FedAvg: Σ (n_k/Σn)·w_k accumulated in float32 (aggregate_arrayrecords)."""
    total = sum(n for _, n in results)
    out = [w * (results[0][1] / total) for w in results[0][0]]
    for weights, n in results[1:]:
        for acc, w in zip(out, weights, strict=True):
            acc += w * (n / total)
    return out


def _gne(global_w, results):
    """GNE: W + Σ p_k (w_k − W) with the Nash weights of strategies/gne.py."""
    deltas = np.stack(
        [
            np.concatenate([(w - g).ravel() for w, g in zip(ws, global_w, strict=True)])
            for ws, _ in results
        ]
    )
    p, status = aggregation_weights(deltas, np.array([n for _, n in results], dtype=float))
    assert status == "nash"
    return [
        (g + sum(pk * (ws[i] - g) for pk, (ws, _) in zip(p, results, strict=True))).astype(g.dtype)
        for i, g in enumerate(global_w)
    ]


def test_fixed_classifier_stays_fixed_through_training_and_averaging(make_client, global_weights):
    """Two clients train a round (the backbone and LRA move, the classifier does not); their
    FedAvg and their GNE average, loaded into the model the server builds, keep it too and
    classify with it."""
    a, b = make_client("fedrane_authors", pid=0), make_client("fedrane_authors", pid=1)
    W = _classifier(a).weight.clone()
    w0 = global_weights(a)
    new_a, n_a, _ = a.fit(w0, {"server-round": 1})
    new_b, n_b, _ = b.fit(w0, {"server-round": 1})
    assert torch.equal(_classifier(a).weight, W) and torch.equal(_classifier(b).weight, W)
    assert all(len(new) == len(w0) for new in (new_a, new_b))
    assert any(not np.array_equal(x, y) for x, y in zip(new_a, w0, strict=True))
    for averaged in (_fedavg([(new_a, n_a), (new_b, n_b)]), _gne(w0, [(new_a, n_a), (new_b, n_b)])):
        torch.manual_seed(7)  # the server's global RNG state is not the clients'
        server = FedRANEClient.build_model(a.cfg)
        set_weights(server, averaged)
        assert torch.equal(server.base.head.classifier.weight, W)
        server.eval()
        x = a.data.test.x[:6]
        out = server(x)
        torch.testing.assert_close(out.logits, F.normalize(server.base(x).h, dim=1) @ W.T)


def test_evaluation_without_lra_is_the_backbone_and_classifier_path(make_client):
    """``eval_lra: false`` (their test_metrics and global test): in eval mode the logits are
    ``classifier(logit_scale·normalize(h))`` whatever the batch, in the client's test and in
    the ServerApp's central evaluation; in training mode LRA still runs. ``eval_lra: true``
    (the default) evaluates through LRA."""
    from fl_app.server_app import CentralEvaluator

    over = "client.logit_scale=4.0 client.lra_dropout=0.0"
    c = make_client("fedrane_authors", overrides=over)
    torch.manual_seed(0)
    for layer in c.model.lra.gat:  # a GAT that moves the features a lot
        for head in layer:
            torch.nn.init.normal_(head.W.weight, std=1.0)
    clf, x, y = _classifier(c), c.data.test.x, c.data.test.y

    def backbone_logits(model, inputs):
        return clf(4.0 * F.normalize(model.base(inputs).h, dim=1))

    c.model.eval()
    with torch.no_grad():
        want = backbone_logits(c.model, x)
        torch.testing.assert_close(c.model(x).logits, want)
        torch.testing.assert_close(c.model(x[:3]).logits, want[:3])  # no batch dependence
        c.model.train()
        trained = c.model(x).logits
        assert (trained - want).abs().max() > 1e-2  # training mode augments
    loss, acc = c.test(c.data.test)
    assert loss == pytest.approx(F.cross_entropy(want, y).item(), rel=1e-5)
    assert acc == pytest.approx((want.argmax(1) == y).float().mean().item())
    # the ServerApp's G-FL evaluator builds the same model and evaluates it the same way
    evaluator = CentralEvaluator(c.cfg, type(c))
    arrays = ArrayRecord({k: Array(v.numpy()) for k, v in c.model.state_dict().items()})
    got = evaluator(1, arrays)
    with torch.no_grad():
        evaluator.model.eval()
        server_want = backbone_logits(evaluator.model, evaluator.test.x)
    assert got["loss"] == pytest.approx(
        F.cross_entropy(server_want, evaluator.test.y).item(), rel=1e-5
    )
    assert got["accuracy"] == pytest.approx(
        (server_want.argmax(1) == evaluator.test.y).float().mean().item()
    )
    # with LRA at evaluation the eval logits are the augmented ones
    d = make_client("fedrane_authors", overrides=over + " client.eval_lra=true")
    set_weights(d.model, get_weights(c.model))
    d.model.eval()
    with torch.no_grad():
        assert (d.model(x).logits - want).abs().max() > 1e-2


def test_alpha_z_mixes_the_classifier_input_and_one_drops_lra(make_client):
    """``alpha_z``: logits from ``α·Z + (1−α)·Z̃`` (reg_graph_aug); ``alpha_z: 1`` builds no
    LRA and has no L_CD (clientFedRANE.py:136)."""
    torch.manual_seed(1)
    c = make_client("fedrane", overrides="client.alpha_z=0.25")
    torch.nn.init.normal_(c.model.lra.W.weight, std=0.3)
    x = c.data.train.x[:12]
    out = c.model(x)
    clf = _classifier(c)
    torch.testing.assert_close(out.logits, clf(10.0 * (0.25 * out.h + 0.75 * out.z)))
    assert (out.z - out.h).abs().max() > 0.05
    s = make_client("spherefed")
    assert s.model.lra is None and not any(n.startswith("lra.") for n in s.model.state_dict())
    out = s.model(x)
    assert torch.equal(out.h, out.z)
    assert s.discrimination(out) is None


def test_authors_loss_is_ce_cd_and_the_mixup_branch(make_client, monkeypatch):
    """fedrane_authors' loss on a fixed mixup draw: ``CE + λ·L_CD^cos(Z, Z̃)`` of the batch,
    plus ``10·mixup-CE`` on the mixed batch's features (clientFedRANE.py:154) and
    ``λ·L_CD^cos`` of the mixed batch, which gets its own graph (lines 143-150); with
    ``mixup_on: classifier`` the mixup CE scores the mixed batch's logits."""
    lam, perm = 0.3, torch.tensor([3, 0, 5, 1, 2, 4, 7, 6])
    monkeypatch.setattr("clients.fedrane.mixup_draw", lambda b, a: (lam, perm))
    for on in ("features", "classifier"):
        c = make_client("fedrane_authors", overrides=f"client.lra_dropout=0.0 client.mixup_on={on}")
        x, y = c.data.train.x[:8], c.data.train.y[:8]
        out = c.model(x)
        loss = c.loss(x, y, out)
        mixed = c.model(lam * x + (1 - lam) * x[perm])
        scored = mixed.z if on == "features" else mixed.logits  # alpha_z 0: the features are Z̃
        want = (
            F.cross_entropy(out.logits, y)
            + 0.1 * lra_discrimination_loss(out.h, out.z, 0.8, "cosine")
            + 10.0
            * (lam * F.cross_entropy(scored, y) + (1 - lam) * F.cross_entropy(scored, y[perm]))
            + 0.1 * lra_discrimination_loss(mixed.h, mixed.z, 0.8, "cosine")
        )
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        loss.backward()


def test_authors_options_leave_the_cuda_graph_and_bad_combinations_fail_clearly(make_client):
    assert make_client("fedrane").graph_safe()
    for over in ("client.mixup_weight=1.0", "client.lra_dropout=0.1", "client.lra_attention=gat"):
        assert not make_client("fedrane", overrides=over).graph_safe()
    for over, message in (
        ("client.lra_heads=2", "needs client.lra_attention=gat"),
        (
            "client.mixup_weight=1.0 client.mixup_on=features model.feature_dim=8",
            "raise model.feature_dim to at least 10 or set client.mixup_on=classifier",
        ),
        (
            "client.classifier=fixed_orthogonal model.feature_dim=8",
            "raise model.feature_dim to at least 10",
        ),
        ("client.alpha_z=1.5", "'client.alpha_z' = 1.5 is out of range; allowed: 0 <= x <= 1"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config("tiny", "fedrane", over)


@pytest.mark.parametrize("method", AUTHORS)
def test_authors_presets_load_and_train_a_round_in_process(run_in_process, method):
    """Each preset of the authors' recipe loads in FedRANE's regime and trains one round of
    the tiny experiment through the real ServerApp (GNE or FedAvg), evaluated centrally."""
    cfg = load_config("regime_fedrane", method)
    assert cfg["client"]["classifier"] == "fixed_orthogonal" and not cfg["client"]["eval_lra"]
    assert (cfg["client"]["lr"], cfg["client"]["momentum"], cfg["client"]["weight_decay"]) == (
        0.01,
        0.9,
        1e-5,
    )
    res = run_in_process(method, set_="num_rounds=1")
    s = res["summary"]
    assert s["status"] == "completed" and s["rounds_completed"] == 1
    assert np.isfinite(res["records"][-1]["accuracy"]) and res["records"][-1]["num_results"] == 3
    assert ("gne_status" in res["records"][-1]) == method.endswith(("authors", "wo_lra"))
    sent = [m for m in res["grid"].sent if m.metadata.message_type == MessageType.TRAIN]
    keys = list(sent[0].content["arrays"].keys())
    assert keys and not any("classifier" in k for k in keys)  # the fixed classifier stays home
    assert any(k.startswith("lra.") for k in keys) == (cfg["client"]["alpha_z"] < 1)
