import pytest
import torch
import torch.nn.functional as F

from fl_app.models import CNN, ResNet18GN, build_model, get_weights, max_pool2x2, set_weights


def test_cnn_p1_shapes_and_interface():
    m = CNN(channels=(6, 16), feature_dim=128)
    out = m(torch.randn(5, 1, 28, 28))
    assert [lv.shape for lv in out.levels] == [(5, 6), (5, 16), (5, 128)]
    assert out.h.shape == (5, 128) and out.z is out.h and out.logits.shape == (5, 10)
    assert m.fc.in_features == 256  # conv5x5-pool-conv5x5-pool on 28x28 -> 16x4x4


def test_projection_head_feeds_classifier():
    m = CNN(projection_dim=32)
    out = m(torch.randn(3, 1, 28, 28))
    assert out.z.shape == (3, 32) and out.h.shape == (3, 128)
    assert m.head.classifier.in_features == 32


def test_resnet18_gn_levels_and_no_batchnorm():
    m = ResNet18GN(3, 10)
    out = m(torch.randn(2, 3, 32, 32))
    assert [lv.shape[1] for lv in out.levels] == [64, 64, 128, 256, 512]
    assert out.h.shape == (2, 512) and out.logits.shape == (2, 10)
    assert not any(isinstance(x, torch.nn.BatchNorm2d) for x in m.modules())


def test_batch_of_one():
    out = CNN()(torch.randn(1, 1, 28, 28))
    assert out.logits.shape == (1, 10)


def test_weights_round_trip():
    a, b = CNN(), CNN()
    set_weights(b, get_weights(a))
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(a(x).logits, b(x).logits)
    with pytest.raises(ValueError, match="expected"):
        set_weights(b, get_weights(a)[:-1])


def test_build_model_from_config():
    cfg = {
        "model": {
            "name": "cnn",
            "channels": [4, 8],
            "kernel_size": 5,
            "feature_dim": 16,
            "projection_dim": 0,
        },
        "data": {"channels": 1, "image_size": 28, "num_classes": 10},
    }
    assert build_model(cfg)(torch.randn(2, 1, 28, 28)).h.shape == (2, 16)


@pytest.mark.parametrize("shape", [(3, 2, 24, 24), (2, 4, 7, 9), (1, 1, 2, 2)])
def test_max_pool2x2_equals_max_pool2d_with_and_without_autograd(shape):
    x = torch.randn(*shape)
    want = F.max_pool2d(x, 2)
    with torch.no_grad():
        assert torch.equal(max_pool2x2(x), want)  # strided-maxima path
    xg = x.clone().requires_grad_(True)
    got = max_pool2x2(xg)  # autograd path
    assert torch.equal(got.detach(), want) and got.requires_grad
    batched = torch.func.vmap(max_pool2x2)(torch.stack([x, 2 * x]))  # as in FrozenStack
    assert torch.equal(batched[1], F.max_pool2d(2 * x, 2))


def test_cnn_hidden_fc_is_moons_simple_cnn_mnist():
    """hidden (120,) + feature_dim 84 + head 256: QinbinLi/MOON ``ModelFedCon('simple-cnn-mnist')``
    (conv6-conv16-fc120-fc84 = h, l1 84→84, l2 84→256 = z, l3 256→10), parameter for parameter."""
    m = CNN(channels=(6, 16), hidden=(120,), feature_dim=84, projection_dim=256)
    shapes = [tuple(p.shape) for p in m.parameters()]
    assert shapes == [
        (6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 256), (120,), (84, 120), (84,),
        (84, 84), (84,), (256, 84), (256,), (10, 256), (10,),
    ]  # fmt: skip
    out = m(torch.randn(4, 1, 28, 28))
    assert [lv.shape for lv in out.levels] == [(4, 6), (4, 16), (4, 120), (4, 84)]
    assert out.h.shape == (4, 84) and out.z.shape == (4, 256) and bool((out.h >= 0).all())
