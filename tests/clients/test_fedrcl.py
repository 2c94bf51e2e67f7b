import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.losses import rcl_loss
from core.params import ConfigError


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


def test_levels_and_mining_options_select_the_loss(make_client):
    """On one fixed batch the client loss is CE + L_RCL over exactly the levels and with the
    mining that the options name: ``levels=last`` uses ``levels[-1:]`` only, ``mining=hard``
    the authors' hard mining; the defaults use every level with the paper form. Each option
    on its own changes the value, so ignoring either one is caught."""
    torch.manual_seed(0)
    default = make_client("fedrcl")
    x, y = default.data.train.x[:32], default.data.train.y[:32]
    assert len(y.unique()) < len(y)  # same-class pairs exist: the RCL terms are not empty
    with torch.no_grad():
        out = default.model(x)
    ce = F.cross_entropy(out.logits, y)
    hp = default.hp
    assert hp.beta > 0 and (hp.levels, hp.mining) == ("all", "paper")
    kw = {"tau": hp.tau, "beta": hp.beta, "lam": hp.lam}
    refs = {
        (levels, mining): ce + hp.rcl_weight * rcl_loss(sel, y, mining=mining, **kw)
        for levels, sel in (("all", out.levels), ("last", out.levels[-1:]))
        for mining in ("paper", "hard")
    }
    assert len(out.levels) > 1
    for (levels, mining), ref in refs.items():
        c = make_client("fedrcl", overrides=f"client.levels={levels} client.mining={mining}")
        torch.testing.assert_close(c.loss(x, y, out), ref)
        others = [v for k, v in refs.items() if k != (levels, mining)]
        assert all(abs(float(v - ref)) > 1e-3 for v in others)


def test_bad_levels_option_is_reported(make_client):
    with pytest.raises(ConfigError, match=r"'client.levels' = 'middle'.*allowed: all \| last"):
        make_client("fedrcl", overrides="client.levels=middle")


def test_levels_by_index_select_those_levels(make_client):
    """``client.levels: [i, ...]`` contrasts exactly the levels it names (the tiny CNN has
    conv1, conv2, fc): the loss equals CE + L_RCL over those, and [0, 1, 2] equals ``all``."""
    torch.manual_seed(0)
    c = make_client("fedrcl", overrides="client.levels=[0,2]")
    assert c.hp.levels == [0, 2] and c.model.level_names == ["conv1", "conv2", "fc"]
    x, y = c.data.train.x[:32], c.data.train.y[:32]
    with torch.no_grad():
        out = c.model(x)
    ce = F.cross_entropy(out.logits, y)
    want = ce + rcl_loss([out.levels[0], out.levels[2]], y)
    torch.testing.assert_close(c.loss(x, y, out), want)
    every = make_client("fedrcl", overrides="client.levels=[0,1,2]")
    torch.testing.assert_close(every.loss(x, y, out), make_client("fedrcl").loss(x, y, out))
    last = make_client("fedrcl", overrides="client.levels=[2]")
    torch.testing.assert_close(
        last.loss(x, y, out), make_client("fedrcl", overrides="client.levels=last").loss(x, y, out)
    )
    _, _, m = c.fit(c.get_parameters({}), {"server-round": 1})
    assert np.isfinite(m["train_loss"])


def test_a_level_index_the_model_lacks_names_the_valid_ones(make_client):
    with pytest.raises(
        ConfigError,
        match=r"'client.levels' = \[1, 3\] names level\(s\) \[3\] that model 'cnn' does not "
        r"have; its levels are 0..2: 0 conv1, 1 conv2, 2 fc",
    ):
        make_client("fedrcl", overrides="client.levels=[1,3]")


@pytest.mark.parametrize("levels", ["[]", "[1,1]", "[-1]", "[1.5]", "[true]", "middle"])
def test_malformed_levels_are_refused(make_client, levels):
    with pytest.raises(ConfigError, match=r"'client.levels' = .*allowed: all \| last \| a list"):
        make_client("fedrcl", overrides=f"client.levels={levels}")


def test_levels_of_another_type_are_refused(make_client):
    with pytest.raises(
        ConfigError,
        match=r"'client.levels' = 3 has type int; expected str like the default 'all' or list$",
    ):
        make_client("fedrcl", overrides="client.levels=3")
