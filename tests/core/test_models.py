import pytest
import torch
import torch.nn.functional as F

from core.models import CNN, ResNet18GN, build_model, get_weights, max_pool2x2, set_weights


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


def test_cnn_defaults_keep_the_p1_state_dict():
    """The padding/norm options change nothing for configs that do not set them: the same
    state_dict names and shapes as before they existed (checkpoints and runs stay valid)."""
    m = CNN(channels=(6, 16), feature_dim=128)
    assert [(k, tuple(v.shape)) for k, v in m.state_dict().items()] == [
        ("convs.0.weight", (6, 1, 5, 5)), ("convs.0.bias", (6,)),
        ("convs.1.weight", (16, 6, 5, 5)), ("convs.1.bias", (16,)),
        ("fc.weight", (128, 256)), ("fc.bias", (128,)),
        ("head.classifier.weight", (10, 128)), ("head.classifier.bias", (10,)),
    ]  # fmt: skip
    assert m.norms is None and m.level_names == ["conv1", "conv2", "fc"]


def test_cnn4_padded_stages_with_groupnorm():
    """The regime_fedrcl model: four conv3x3 stages with padding 1 on 28x28 (28-14-7-3-1),
    GroupNorm(2) after each conv (convs without bias), a level per stage and the fc level."""
    m = CNN(channels=(32, 64, 128, 256), kernel_size=3, padding=1, norm="group")
    out = m(torch.randn(3, 1, 28, 28))
    assert [lv.shape for lv in out.levels] == [(3, 32), (3, 64), (3, 128), (3, 256), (3, 128)]
    assert m.level_names == ["conv1", "conv2", "conv3", "conv4", "fc"]
    assert m.fc.in_features == 256  # the last stage's map is 1x1
    assert m.norms is not None and [g.num_groups for g in m.norms] == [2, 2, 2, 2]
    assert all(c.bias is None for c in m.convs)
    plain = CNN(channels=(32, 64, 128, 256), kernel_size=3, padding=1)
    assert plain.norms is None and all(c.bias is not None for c in plain.convs)
    assert len(plain(torch.randn(2, 1, 28, 28)).levels) == 5


def test_cnn_level_is_the_normalised_pre_relu_map_pooled():
    m = CNN(channels=(4,), kernel_size=3, padding=1, norm="group", feature_dim=8)
    x = torch.randn(2, 1, 28, 28)
    assert m.norms is not None
    want = m.norms[0](m.convs[0](x)).mean(dim=(2, 3))
    torch.testing.assert_close(m(x).levels[0], want)


def test_cnn_option_errors():
    with pytest.raises(ValueError, match="cannot split into 2 groups"):
        CNN(channels=(6, 15), norm="group")
    with pytest.raises(ValueError, match="unknown norm 'batch'"):
        CNN(norm="batch")
    with pytest.raises(ValueError, match="no feature map after stage 3.*model.padding 0"):
        CNN(channels=(8, 8, 8), kernel_size=5)


def test_resnet_level_names():
    assert ResNet18GN(3, 10).level_names == ["stem", "layer1", "layer2", "layer3", "layer4"]


def test_build_model_reads_padding_and_norm():
    from fl_app.config import load_config

    cfg = load_config(
        "p4",
        "fedavg",
        "model.channels=[32,64,128,256] model.kernel_size=3 model.padding=1 model.norm=group",
    )
    m = build_model(cfg)
    assert isinstance(m, CNN) and m.norms is not None and len(m.convs) == 4
    assert build_model(load_config("p4", "fedavg")).norms is None
