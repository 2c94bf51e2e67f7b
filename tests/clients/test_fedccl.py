import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.models import get_weights, set_weights
from strategies.fedccl import PayloadError, global_signals
from tests.clients.signal_terms import signal_contrast_global, signal_contrast_local


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


def _broken(cfg: dict, change: str) -> dict:
    """``cfg`` with one of its arrays broken as ``change`` says."""
    cfg = dict(cfg)
    if change == "extra class":  # 12 global rows and mask entries for 10 classes
        cfg["global_signals"] = np.concatenate([cfg["global_signals"], cfg["global_signals"][:2]])
        cfg["global_mask"] = np.ones(12, bool)
    elif change == "wrong dimension":
        cfg["local_signals"] = cfg["local_signals"][:, :-1]
    elif change == "short labels":
        cfg["local_labels"] = cfg["local_labels"][:-1]
    elif change == "label out of range":
        cfg["local_labels"] = cfg["local_labels"] + 5
    elif change == "NaN":
        cfg["global_signals"] = cfg["global_signals"].copy()
        cfg["global_signals"][0, 0] = np.nan
    elif change == "unpaired":
        del cfg["global_mask"]
    return cfg


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("extra class", r"global signals \(12, 32\) and mask \(12,\) are not one per class"),
        ("wrong dimension", r"signals has shape \(12, 31\), expected \(M, 32\)"),
        ("short labels", r"signal_labels has shape \(11,\), expected \(12,\)"),
        ("label out of range", "signal label 10 outside 0..9"),
        ("NaN", "global signals hold NaN or Inf"),
        ("unpaired", "global_signals came without global_mask"),
    ],
)
def test_signals_from_the_server_are_checked_before_training(
    make_client, global_weights, change, message
):
    """What a server of another version or model would send fails the round with the
    problem named, before a step is taken (an extra class would otherwise train silently)."""
    c = make_client("fedccl")
    with pytest.raises(PayloadError, match=f"FedCCL signals from the server: {message}"):
        c.fit(global_weights(c), _broken(_signals(32), change))


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
