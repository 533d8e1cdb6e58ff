import pytest
import torch

from fedshield.errors import ConfigError
from fedshield.models import MODELS, build_model

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
    if hasattr(model, "forward_main"):  # dual head: h is trained via forward_main only (§7)
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


def test_bad_model_param_is_config_error():
    with pytest.raises(ConfigError, match="model.params for model 'cnn_small'"):
        build_model("cnn_small", (1, 28, 28), 10, depth=3)
