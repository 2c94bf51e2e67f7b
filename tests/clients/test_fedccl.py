import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.losses import signal_contrast_global, signal_contrast_local
from fl_app.models import get_weights, set_weights
from fl_app.prototypes import global_signals


def test_returns_signals_per_present_class(make_client, global_weights):
    c = make_client("fedccl")
    _, _, m = c.fit(global_weights(c), {"server-round": 1})
    sig, lab = m["signals"], m["signal_labels"]
    assert sig.dtype == np.float32 and lab.dtype == np.int64 and len(sig) == len(lab)
    assert set(lab.tolist()) == set(c.data.train.y.tolist())
    np.testing.assert_allclose(np.linalg.norm(sig, axis=1), 1.0, rtol=1e-5)


def test_signals_change_training(make_client, global_weights):
    c = make_client("fedccl")
    w0 = global_weights(c)
    _, _, m = c.fit(w0, {"server-round": 1})
    sig_dim = m["signals"].shape[1]
    u, mask = global_signals(m["signals"], m["signal_labels"], 10, "mean")
    cfg = {
        "server-round": 2,
        "local_signals": m["signals"],
        "local_labels": m["signal_labels"],
        "global_signals": u,
        "global_mask": mask,
    }
    a = make_client("fedccl").fit(w0, cfg)[0]
    b = make_client("fedccl").fit(w0, {"server-round": 2})[0]
    assert sig_dim == 32
    assert not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _signals(dim, seed=0):
    """Fixed server signals: 12 local signals of classes 0-5 (classes 6-9 have none) and
    global signals for every class but 3 and 9."""
    rng = np.random.default_rng(seed)
    mask = np.ones(10, bool)
    mask[[3, 9]] = False
    return {
        "server-round": 2,
        "local_signals": rng.normal(size=(12, dim)).astype(np.float32),
        "local_labels": np.arange(12, dtype=np.int64) % 6,
        "global_signals": rng.normal(size=(10, dim)).astype(np.float32),
        "global_mask": mask,
    }


@pytest.mark.parametrize(
    ("lam_local", "lam_global"), [(0.5, 2.0), (2.0, 0.5), (0.0, 1.5), (1.5, 0.0), (0.0, 0.0)]
)
def test_loss_is_ce_plus_weighted_local_and_global_contrast(make_client, lam_local, lam_global):
    """On a fixed batch with given signals: ``CE + λ_L·L_local + λ_G·L_global`` with each term
    from clients.losses; a zero weight switches its term off exactly (the ablations)."""
    ref = make_client("fedccl")
    weights = get_weights(ref.model)
    over = f"client.lam_local={lam_local} client.lam_global={lam_global}"
    c = make_client("fedccl", overrides=over)
    assert (c.hp.lam_local, c.hp.lam_global) == (lam_local, lam_global)
    set_weights(c.model, weights)
    x, y = c.data.train.x[:40], c.data.train.y[:40]
    assert {3, 8, 9} <= set(y.tolist())  # samples without a local and/or a global signal
    cfg = _signals(c.model.feature_dim)
    c.setup_round(cfg)
    with torch.no_grad():
        out = c.model(x)
        loss = c.loss(x, y, out)
        ce = F.cross_entropy(out.logits, y)
        tau = c.hp.tau
        sig, lab = torch.from_numpy(cfg["local_signals"]), torch.from_numpy(cfg["local_labels"])
        local = signal_contrast_local(out.h, y, sig, lab, tau)
        u, mask = torch.from_numpy(cfg["global_signals"]), torch.from_numpy(cfg["global_mask"])
        glob = signal_contrast_global(out.h, y, u, mask, tau)
    assert float(local) > 0.5 and float(glob) > 0.5  # both terms matter at this batch
    torch.testing.assert_close(loss, ce + lam_local * local + lam_global * glob)
    if lam_local == 0 and lam_global == 0:
        assert torch.equal(loss, ce)
    if lam_local == 0:  # L_local switched off: the loss does not see the local signals
        c.setup_round({**cfg, "local_signals": -cfg["local_signals"]})
        with torch.no_grad():
            torch.testing.assert_close(c.loss(x, y, out), loss)
    if lam_global == 0:
        c.setup_round({**cfg, "global_signals": -cfg["global_signals"]})
        with torch.no_grad():
            torch.testing.assert_close(c.loss(x, y, out), loss)
