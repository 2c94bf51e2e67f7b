import numpy as np

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
