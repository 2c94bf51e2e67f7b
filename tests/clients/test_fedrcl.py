import numpy as np
import pytest


def test_fedrcl_and_fedscl_train(make_client, global_weights):
    w0 = global_weights(make_client("fedrcl"))
    a, _, m = make_client("fedrcl").fit(w0, {"server-round": 1})
    b, _, _ = make_client("fedscl").fit(w0, {"server-round": 1})
    assert np.isfinite(m["train_loss"])
    assert not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_last_level_only_and_hard_mining_run(make_client, global_weights):
    c = make_client("fedrcl", overrides="client.levels=last client.mining=hard")
    _, _, m = c.fit(global_weights(c), {"server-round": 1})
    assert np.isfinite(m["train_loss"])


def test_bad_levels_option_is_reported(make_client, global_weights):
    c = make_client("fedrcl", overrides="client.levels=middle")
    with pytest.raises(ValueError, match="allowed: all, last"):
        c.fit(global_weights(c), {"server-round": 1})
