import numpy as np
import pytest
import torch


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
