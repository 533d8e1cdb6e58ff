import pytest
import torch

from fedshield.errors import ConfigError
from fedshield.models import MODELS, build_model, check_model, model_tags, parse_model_params
from fedshield.registry import tags_of

SHAPES = {"resnet18": (3, 32, 32), "wrn28_4": (3, 32, 32), "cnn_cifar10": (3, 32, 32)}


@pytest.mark.parametrize("name", MODELS.names())
def test_forward_backward_and_feature_split(name):
    shape = SHAPES.get(name, (1, 28, 28))
    model = build_model(name, shape, 7)
    x = torch.rand(2, *shape)
    out = model(x)
    assert out.shape == (2, 7)
    out.sum().backward()
    if hasattr(model, "forward_exits"):  # multi-exit: model(x) is the deepest exit only
        sum(z.sum() for z in model.forward_exits(x)).backward()
    if hasattr(model, "forward_main"):  # FedCART's dual head: h is trained via forward_main only
        model.forward_main(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    z = model.forward_features(x)
    assert z.shape == (2, model.num_features)
    torch.testing.assert_close(model.forward_head(z), out)


def test_small_inputs_supported():
    assert build_model("cnn_small", (1, 8, 8), 10)(torch.rand(3, 1, 8, 8)).shape == (3, 10)


def test_wrn_28_4_size():
    n = sum(p.numel() for p in build_model("wrn28_4", (3, 32, 32), 10).parameters())
    assert 5.8e6 < n < 5.9e6  # WRN-28-4 has about 5.85M parameters on CIFAR-10


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [  # reproducers: each a ConfigError naming the key, not a TypeError
        ("cnn_small", {"hidden": 0}, r"^model.params.hidden: Input should be greater than or"),
        ("mlp", {"hidden": -1}, r"^model.params.hidden: Input should be greater than or"),
        ("cnn_small", {"hiden": 3}, r"^model.params.hiden: unknown key \(did you mean 'hidden'"),
        ("cnn_small", {"hidden": 8.0}, r"^model.params.hidden: Input should be a valid integer"),
        ("cnn_emnist", {"width": 8}, r"^model.params.width: unknown key \(allowed: none\)"),
        ("wrn28_4", {"drop": 1.0}, r"^model.params.drop: Input should be less than 1"),
        ("dual_head", {"hiden": 3}, r"^model.params.hiden: unknown key \(did you mean 'hidden'"),
        ("dual_head", {"backbone": "mlp", "hidden": 0}, r"^model.params.hidden: Input should"),
        ("dual_head", {"backbone": "cnn_smal"}, r"^model.params.backbone: unknown model \(did"),
        ("dual_head", {"backbone": "dual_head"}, r"^model.params.backbone: must be a classifier"),
        ("resnet50", {}, r"^model.name: unknown model 'resnet50' \(did you mean 'resnet18'\?\)"),
    ],
)
def test_bad_model_params_are_config_errors(name, params, match):
    with pytest.raises(ConfigError, match=match):
        parse_model_params(name, params)
    with pytest.raises(ConfigError, match=match):
        build_model(name, (1, 28, 28), 10, **params)


def test_dual_head_takes_the_backbone_params_and_batchnorm():
    m = build_model("dual_head", (1, 8, 8), 4, backbone="mlp", hidden=8)
    assert isinstance(m.backbone.mlp[0], torch.nn.Linear) and m.num_features == 8
    assert tags_of(m) == {"family": frozenset({"dual_head"})}
    assert model_tags("dual_head", {"backbone": "resnet18"}) == {
        "family": frozenset({"dual_head"}),
        "batchnorm": frozenset(),
    }
    assert "batchnorm" in tags_of(build_model("wrn28_4", (3, 8, 8), 4))


def test_check_model_builds_nothing_and_names_a_too_small_input():
    state = torch.random.get_rng_state()
    assert check_model("dual_head", (3, 32, 32), 10, {"backbone": "wrn28_4"}) == {
        "family": frozenset({"dual_head"}),
        "batchnorm": frozenset(),
    }
    assert torch.equal(torch.random.get_rng_state(), state)  # the run's seed is untouched
    with pytest.raises(ConfigError, match=r"^model: input shape \(1, 4, 4\) is too small"):
        check_model("cnn_cifar100", (1, 4, 4), 10)
    with pytest.raises(ConfigError, match=r"^model.params.hidden: Input should be greater"):
        check_model("mlp", (1, 8, 8), 10, {"hidden": 0})


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("cnn_small", (1, 28, 28)),
        ("cnn_small", (1, 8, 8)),
        ("cnn_emnist", (1, 28, 28)),
        ("cnn_cifar10", (3, 32, 32)),
        ("cnn_cifar100", (3, 32, 32)),
    ],
)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_conv_pool_relu_is_the_papers_conv_relu_pool_bit_for_bit(name, shape, layout):
    """The CNNs pool before their ReLU (cheaper); the papers' order, conv → ReLU → pool, built
    from the same weights gives the same logits and gradients exactly: max commutes with
    ReLU and the gradient reaches the same arg-max entries (or none), with no arithmetic."""
    torch.manual_seed(0)
    ours = build_model(name, shape, 10).to(memory_format=layout)
    papers = build_model(name, shape, 10).to(memory_format=layout)
    papers.load_state_dict(ours.state_dict())
    t = list(papers.trunk)
    swapped = []
    for i in range(0, len(t), 3):  # (conv, pool, relu) → (conv, relu, pool)
        assert isinstance(t[i], torch.nn.Conv2d) and isinstance(t[i + 1], torch.nn.MaxPool2d)
        swapped += [t[i], t[i + 2], t[i + 1]]
    papers.trunk = torch.nn.Sequential(*swapped)
    x = torch.randn(16, *shape)
    y = torch.randint(0, 10, (16,))
    outs = []
    for m in (ours, papers):
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        outs.append([loss.detach(), *(p.grad for p in m.parameters())])
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
