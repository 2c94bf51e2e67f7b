import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.losses import lra_discrimination_loss
from fl_app.models import get_weights, set_weights


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
