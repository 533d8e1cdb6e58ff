"""Data and weights the way users get them: ``data.download = "auto"`` with a
clear, different error without network; pretrained ViT weights fetched from the Hub when
allowed (offline path kept); Hugging Face datasets and Flower Datasets' partitioners.

No test touches the network: the downloaders and ``socket.create_connection`` are
replaced, and the Hugging Face dataset is built by the test and saved to disk."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import torch

from fedshield import config
from fedshield.cli import main
from fedshield.data import load_dataset, partition
from fedshield.errors import ConfigError, DataError
from fedshield.testing.cli import one_line_error


def _no_network(monkeypatch) -> None:
    def refuse(*a, **k):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)


def _network(monkeypatch) -> list[tuple]:
    """The probe succeeds (and records what it probed); nothing else is connected."""
    probed: list[tuple] = []

    class _Conn:
        def close(self) -> None:
            pass

    def connect(addr, timeout=None):
        probed.append(addr)
        return _Conn()

    monkeypatch.setattr(socket, "create_connection", connect)
    return probed


def _write_mnist(raw: Path, n: int = 40) -> None:
    rng = np.random.default_rng(0)
    raw.mkdir(parents=True, exist_ok=True)
    for split, size in (("train", n), ("t10k", n // 2)):
        images = rng.integers(0, 256, (size, 28, 28), dtype=np.uint8)
        labels = (np.arange(size) % 10).astype(np.uint8)
        for kind, arr, magic in (("images-idx3", images, 2051), ("labels-idx1", labels, 2049)):
            with open(raw / f"{split}-{kind}-ubyte", "wb") as f:
                f.write(struct.pack(">I", magic))
                f.write(b"".join(struct.pack(">I", d) for d in arr.shape) + arr.tobytes())


# -- data.download = "auto" ------------------------------------------------------------------
def test_download_auto_is_the_default_and_validates() -> None:
    assert config.DataConfig().download == "auto"
    for value in ("auto", True, False):
        assert config.DataConfig(download=value).download == value
    with pytest.raises(ConfigError, match="data.download"):
        config.validate({"data": {"download": "yes"}})


def test_download_auto_downloads_missing_files_when_the_network_is_there(
    tmp_path, monkeypatch
) -> None:
    import torchvision.datasets as tvd

    probed = _network(monkeypatch)
    calls = []

    def fake_download(self) -> None:
        if self._check_exists():  # as torchvision's own download does
            return
        calls.append(self.root)
        _write_mnist(Path(self.raw_folder))

    monkeypatch.setattr(tvd.MNIST, "download", fake_download)
    bundle = load_dataset("mnist", str(tmp_path), "auto")
    assert len(bundle.train) == 40 and len(calls) == 1
    assert probed and probed[0][0] in tvd.MNIST.mirrors[0]  # torchvision's own host
    load_dataset("mnist", str(tmp_path), "auto")  # now present: read, not downloaded again
    assert len(calls) == 1


def test_no_network_is_its_own_error(tmp_path, monkeypatch) -> None:
    """With downloads on and no network the error advised turning downloads on."""
    _no_network(monkeypatch)
    for mode in ("auto", True):
        with pytest.raises(DataError) as err:
            load_dataset("cifar10", str(tmp_path), mode)
        text = str(err.value)
        assert "cannot be downloaded: no network" in text and "Network is unreachable" in text
        assert "data.download" not in text  # not "switch downloads on"
    with pytest.raises(DataError, match='set data.download = "auto"'):
        load_dataset("cifar10", str(tmp_path), False)  # downloads off: say how to turn them on


def test_no_network_through_the_cli(tmp_path, capsys, small_cfg, monkeypatch) -> None:
    _no_network(monkeypatch)
    small_cfg["data"] |= {"dataset": "fmnist", "root": str(tmp_path / "data")}
    small_cfg["model"] = {"name": "mlp"}
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(small_cfg))
    one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")], "no network")


# -- pretrained weights --------------------------------------------------------------------
def _vit_state_dict() -> dict[str, torch.Tensor]:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(1)
    vit = VisionTransformer(img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=32,
                            depth=6, num_heads=2)  # fmt: skip
    return vit.state_dict()


_TINY = {"patch_size": 4, "embed_dim": 32, "num_heads": 2, "depth": 6, "pretrained": True}


def test_pretrained_weights_are_downloaded_into_the_cache_when_allowed(
    tmp_path, monkeypatch
) -> None:
    import huggingface_hub
    from huggingface_hub import constants
    from safetensors.torch import save_file

    from fedshield.models import build_model

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    probed = _network(monkeypatch)
    sd = _vit_state_dict()
    fetched = []

    def fake_download(repo, filename, **_):
        fetched.append((repo, filename))
        path = tmp_path / "dl" / filename
        path.parent.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    model = build_model("eevit", (3, 16, 16), 10, **_TINY, hf_repo="timm/tiny-test")
    assert fetched == [("timm/tiny-test", "model.safetensors")]
    assert probed[0][0] == "huggingface.co"
    torch.testing.assert_close(model.vit.state_dict()["blocks.5.attn.qkv.weight"],
                               sd["blocks.5.attn.qkv.weight"])  # fmt: skip


def test_pretrained_weights_without_network_or_downloads_say_how_to_fill_the_cache(
    tmp_path, monkeypatch
) -> None:
    from huggingface_hub import constants

    from fedshield.models import build_model

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    _no_network(monkeypatch)
    with pytest.raises(DataError) as err:
        build_model("eevit", (3, 16, 16), 10, **_TINY, hf_repo="timm/tiny-test")
    assert "cannot be downloaded: no network" in str(err.value)
    assert "hf_hub_download('timm/tiny-test', 'model.safetensors')" in str(err.value)
    with pytest.raises(DataError) as err:
        build_model("eevit", (3, 16, 16), 10, **_TINY, hf_repo="timm/tiny-test",
                    pretrained_download=False)  # fmt: skip
    text = str(err.value)
    assert "pretrained_download = false" in text and "no network" not in text
    assert str(tmp_path / "cache") in text and "hf_hub_download" in text


def test_the_pretrained_io_lives_in_its_own_module() -> None:
    import fedshield.models.eevit as eevit
    from fedshield.models import pretrained

    assert eevit.read_state_dict is pretrained.read_state_dict
    assert eevit.resolve_weights is pretrained.resolve_weights


# -- Hugging Face datasets ------------------------------------------------------------------
def _hf_digits(tmp_path: Path, test_split: bool = True, string_labels: bool = False) -> Path:
    """A small image dataset built with `datasets` and saved to disk (sklearn's digits)."""
    datasets = pytest.importorskip("datasets")
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    images = [Image.fromarray((im * 16).clip(0, 255).astype(np.uint8)) for im in d.images[:600]]
    names = [f"digit{i}" for i in range(10)]
    labels = [names[t] for t in d.target[:600]] if string_labels else d.target[:600].tolist()
    label_feature = datasets.Value("string") if string_labels else datasets.ClassLabel(names=names)
    features = datasets.Features({"image": datasets.Image(), "label": label_feature})
    full = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    out = tmp_path / "hf-digits"
    if test_split:
        datasets.DatasetDict(
            {"train": full.select(range(500)), "test": full.select(range(500, 600))}
        ).save_to_disk(str(out))
    else:
        full.save_to_disk(str(out))
    return out


def test_a_saved_hugging_face_dataset_loads_offline(tmp_path, monkeypatch) -> None:
    _no_network(monkeypatch)  # a saved folder needs no network
    path = _hf_digits(tmp_path)
    bundle = load_dataset(f"hf:{path}", str(tmp_path), "auto")
    assert bundle.input_shape == (1, 8, 8) and bundle.num_classes == 10
    assert (len(bundle.train), len(bundle.test)) == (500, 100)
    assert bundle.train.x.dtype == torch.uint8 and bundle.class_names[3] == "digit3"
    from sklearn.datasets import load_digits

    first = (load_digits().images[0] * 16).clip(0, 255).astype(np.uint8)
    assert torch.equal(bundle.train.x[0, 0], torch.from_numpy(first))
    assert int(bundle.train.y[0]) == int(load_digits().target[0])


def test_without_a_test_split_and_with_string_labels(tmp_path) -> None:
    path = _hf_digits(tmp_path, test_split=False, string_labels=True)
    bundle = load_dataset(f"hf:{path}", "", False, {"test_fraction": 0.2})
    assert (len(bundle.train), len(bundle.test)) == (480, 120)  # stratified 80/20
    assert bundle.class_names == tuple(f"digit{i}" for i in range(10))
    with pytest.raises(ConfigError, match="data.params.image_column='pixels': no such column"):
        load_dataset(f"hf:{path}", "", False, {"image_column": "pixels"})


def test_hf_dataset_and_flower_partitioner_through_the_cli(tmp_path, small_cfg) -> None:
    path = _hf_digits(tmp_path)
    small_cfg |= {"rounds": 2}
    small_cfg["data"] = {"dataset": f"hf:{path}", "num_clients": 6, "partition": "flwr_dirichlet",
                         "beta": 0.5, "min_size": 5}  # fmt: skip
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(small_cfg))
    out = tmp_path / "o"
    assert main(["run", str(cfg), "--out", str(out), "-q"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and 0.0 <= summary["final_test_acc"] <= 1.0


def test_hf_needs_a_path_before_any_data(tmp_path, capsys, small_cfg) -> None:
    small_cfg["data"] |= {"dataset": "huggingface"}
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(small_cfg))
    one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")], "data.params.path")


def _hf_int_digits(tmp_path: Path, scale: int = 16) -> Path:
    """sklearn's digits saved as ``{image: int lists, label}`` (no Image feature): the
    arrays load as int64."""
    datasets = pytest.importorskip("datasets")
    from sklearn.datasets import load_digits

    d = load_digits()
    images = (d.images * scale).clip(0, 255 if scale == 16 else None).astype(np.int64)
    full = datasets.Dataset.from_dict(
        {"image": images.tolist(), "label": d.target.tolist()},
        features=datasets.Features(
            {"image": datasets.Sequence(datasets.Sequence(datasets.Value("int64"))),
             "label": datasets.ClassLabel(names=[str(i) for i in range(10)])}
        ),
    )  # fmt: skip
    out = tmp_path / f"hf-int-digits-{scale}"
    full.save_to_disk(str(out))
    return out


def test_integer_pixel_arrays_are_8_bit_images(tmp_path) -> None:
    """Int lists loaded as floats 0-255 (round-1 loss 4,389, accuracy 0.10,
    status ok). They are uint8, read as x/255 like every other set, and train."""
    path = _hf_int_digits(tmp_path)
    bundle = load_dataset(f"hf:{path}", "", False)
    assert bundle.train.x.dtype == torch.uint8
    x, _ = bundle.train.batch(torch.arange(len(bundle.train)))
    assert float(x.min()) >= 0.0 and float(x.max()) == 1.0  # 16·16 = 256 clipped to 255


def test_integer_pixels_beyond_8_bit_are_refused_naming_the_dataset(tmp_path) -> None:
    path = _hf_int_digits(tmp_path, scale=256)  # 0..4096: not 8-bit
    with pytest.raises(DataError, match=rf"dataset 'hf:{path}': the train inputs are int64 "
                       r"\(0..4096\); expected uint8 images"):  # fmt: skip
        load_dataset(f"hf:{path}", "", False)


# -- Flower Datasets' partitioners ----------------------------------------------------------
_LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 60))


@pytest.mark.parametrize("name", ["flwr_iid", "flwr_dirichlet", "flwr_linear", "flwr_square"])
def test_flower_partitioners_split_every_sample_as_a_function_of_the_seed(name) -> None:
    pytest.importorskip("flwr_datasets")
    parts = partition(_LABELS, 8, name, seed=1)
    assert sorted(torch.cat(parts).tolist()) == list(range(len(_LABELS)))
    again = partition(_LABELS, 8, name, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    other = partition(_LABELS, 8, name, seed=2)
    assert any(not torch.equal(a, b) for a, b in zip(parts, other))


def test_flower_dirichlet_is_flowers_and_follows_beta() -> None:
    pytest.importorskip("flwr_datasets")
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    # the wrapper's partition is Flower's on the rows shuffled by the run's partition stream
    rng = np.random.default_rng([3, 0xDA7A])
    perm = rng.permutation(len(_LABELS))
    seed = int(rng.integers(2**31 - 1))
    ref = DirichletPartitioner(8, "label", alpha=0.3, min_partition_size=5, seed=seed)
    ref.dataset = Dataset.from_dict({"label": _LABELS[perm].tolist(), "row": perm.tolist()})
    want = [sorted(ref.load_partition(k)["row"]) for k in range(8)]
    got = partition(_LABELS, 8, "flwr_dirichlet", seed=3, beta=0.3, min_size=5)
    assert [p.tolist() for p in got] == want

    def skew(parts) -> float:
        props = [np.bincount(_LABELS[p.numpy()], minlength=10) / len(p) for p in parts]
        return float(np.mean([np.abs(q - 0.1).sum() for q in props]))

    assert skew(partition(_LABELS, 8, "flwr_dirichlet", 0, beta=0.05)) > skew(
        partition(_LABELS, 8, "flwr_dirichlet", 0, beta=100.0)
    )


def test_gz_idx_helper_matches_torchvision(tmp_path) -> None:
    """The fake download above writes files torchvision reads (guards the download test)."""
    import torchvision.datasets as tvd

    _write_mnist(tmp_path / "MNIST" / "raw", n=20)
    ds = tvd.MNIST(str(tmp_path), train=True, download=False)
    assert len(ds) == 20 and int(ds.targets[3]) == 3
