import numpy as np

from clients.fedccl import FedCCLClient, pgd_attack
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


def test_pgd_stays_in_eps_ball_and_hurts_accuracy(make_client, global_weights):
    import torch

    c = make_client("fedccl")
    c.fit(global_weights(c), {"server-round": 1})
    x, y = c.data.test.x[:64], c.data.test.y[:64]
    xa = pgd_attack(c.model, x, y, eps=0.3, alpha=0.1, steps=5)
    assert float((xa - x).abs().max()) <= 0.3 + 1e-6
    with torch.no_grad():
        clean = (c.model(x).logits.argmax(1) == y).float().mean()
        adv = (c.model(xa).logits.argmax(1) == y).float().mean()
    assert adv <= clean


def test_robust_eval_metrics(make_client, global_weights):
    c = make_client("fedccl_plus", overrides="client.adv_steps=1 client.robust_eval_samples=64")
    c.fit(global_weights(c), {"server-round": 1})
    out = FedCCLClient.server_metrics(c.model, c.data.test, c.cfg, c.device)
    assert set(out) == {"robust_fgsm", "robust_pgd"} and all(0 <= v <= 1 for v in out.values())
