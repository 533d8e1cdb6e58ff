"""Hugging Face datasets as a fedshield dataset: ``data.dataset = "hf:<name or folder>"``.

The part after ``hf:`` is a dataset on the Hugging Face Hub (``hf:ylecun/mnist``), loaded
with ``datasets.load_dataset`` into a cache under ``<data.root>/huggingface``, or a folder
written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, read with
``datasets.load_from_disk`` (offline). Its image column (an ``Image`` feature, or arrays
of shape [H, W] / [H, W, C]) and label column (a ``ClassLabel``, integers or strings) are
found by their features unless ``data.params`` names them, and held in memory like every
other dataset: PIL images and integer pixels in 0..255 as uint8 (read as x/255), float
arrays as they are; :mod:`fedshield.data.check` then refuses anything not uint8 or in
[0, 1] (16-bit integers, floats 0–255), naming the dataset. A dataset without a test
split is split 80/20, stratified, as the bundled ones are.

``data.download`` applies to Hub datasets: ``"auto"`` and ``true`` let ``datasets``
download them (the Hub's host is probed first: no network is its own error), ``false``
reads the cache only. The ``datasets`` package is optional (extra ``hf``).

Flower Datasets' partitioners are registered beside fedshield's, in
:mod:`fedshield.data.flwr_partitioners`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from fedshield.core.params import Params
from fedshield.data.bundle import DataBundle, TensorData
from fedshield.data.datasets import (
    DATASETS,
    DatasetInfo,
    DatasetMissing,
    _download_url,
    _info,
    _stratified_split,
)
from fedshield.errors import ConfigError, DataError

HUB_URL = "https://huggingface.co"


class HFParams(Params):
    path: str | None = Field(
        None,
        min_length=1,
        description="a Hub dataset (ylecun/mnist) or a folder saved with save_to_disk; "
        'data.dataset = "hf:<path>" sets it',
    )
    name: str | None = Field(None, description="the dataset's configuration (subset), if any")
    train_split: str = Field("train", description="split the clients are partitioned from")
    test_split: str | None = Field(
        "test", description="split evaluated on; absent or None: test_fraction of train"
    )
    image_column: str | None = Field(
        None, description="column of the inputs; None: the first Image feature, or image/img"
    )
    label_column: str | None = Field(
        None, description="column of the labels; None: the first ClassLabel, or label/labels"
    )
    test_fraction: float = Field(
        0.2, ge=0.01, le=0.9, description="held-out share when there is no test split"
    )
    image_size: int | None = Field(
        None, ge=1, le=1024, description="resize images to this square; None: as stored"
    )


def require_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data.dataset = 'hf:...' needs the datasets package: pip install 'fedshield[hf]'"
        ) from None
    return datasets


@contextlib.contextmanager
def _offline(datasets: Any, on: bool) -> Iterator[None]:
    """``datasets`` (and the Hub client) in offline mode: read the cache, never the network."""
    if not on:
        yield
        return
    import huggingface_hub.constants as hub

    saved = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved


def _open(datasets: Any, root: str, download: bool, path: str, name: str | None) -> Any:
    local = Path(path).expanduser()
    if local.exists():
        try:
            return datasets.load_from_disk(str(local))
        except (FileNotFoundError, ValueError) as err:
            raise DataError(f"{local}: not a saved Hugging Face dataset ({err})") from None
    missing = _missing_folder(path)
    if missing is not None:  # a path, not a Hub name (also checked before any data)
        raise DataError(f"dataset 'hf:{path}': no folder {missing}")
    cache = Path(root).expanduser() / "huggingface"
    try:
        with _offline(datasets, not download):
            return datasets.load_dataset(path, name, cache_dir=str(cache))
    except Exception as err:
        if download:
            raise DataError(f"dataset 'hf:{path}': loading from the Hub failed ({err})") from None
        raise DatasetMissing(
            f"dataset 'hf:{path}' is not in the cache {cache} ({type(err).__name__}); set "
            f'data.download = "auto" (downloads it; needs network) or give a folder saved '
            f"with save_to_disk"
        ) from None


def _column(features: dict[str, Any], given: str | None, kind: str, names: tuple[str, ...]) -> str:
    if given is not None:
        if given not in features:
            raise ConfigError(
                f"data.params.{kind}_column={given!r}: no such column "
                f"(columns: {', '.join(features)})"
            )
        return given
    feature_type = "Image" if kind == "image" else "ClassLabel"
    for col, feat in features.items():
        if type(feat).__name__ == feature_type:
            return col
    for col in names:
        if col in features:
            return col
    raise ConfigError(
        f"data.params.{kind}_column: no {feature_type} feature or column named "
        f"{' / '.join(names)} (columns: {', '.join(features)}); name it"
    )


def _images(values: list[Any], size: int | None, where: str) -> torch.Tensor:
    """Images or arrays → [N, C, H, W]: uint8 for PIL images ('L' or 'RGB') and integer
    pixels in 0..255, float32 for float arrays (checked to lie in [0, 1] on loading)."""
    arrays = []
    for v in values:
        if hasattr(v, "convert"):  # a PIL image
            img = v.convert("L" if v.mode in ("1", "L", "I", "I;16", "F") else "RGB")
            if size is not None:
                img = img.resize((size, size))
            arrays.append(np.asarray(img))
        else:
            arrays.append(np.asarray(v))
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DataError(
            f"{where}: inputs of different shapes ({sorted(shapes)[:3]}...); set "
            f"data.params.image_size to resize them"
        )
    x = np.stack(arrays)
    if x.ndim == 3:  # [N, H, W]
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)  # [N, H, W, C] → [N, C, H, W]
    elif x.ndim != 4:
        raise DataError(f"{where}: inputs of shape {x.shape[1:]}; expected images [H, W(, C)]")
    if x.dtype.kind in "iu" and x.size and x.min() >= 0 and x.max() <= 255:
        # Integer pixels (int lists saved with save_to_disk load as int64) are 8-bit
        # images: uint8, read as x/255 like every other set (they used to train as
        # floats 0-255). Other integers are left for fedshield.data.check to refuse.
        x = x.astype(np.uint8)
    x = np.ascontiguousarray(x)
    t = torch.from_numpy(x)
    return t if t.dtype == torch.uint8 or not t.is_floating_point() else t.float()


def _load_hf(
    root: str,
    download: bool,
    *,
    path: str | None,
    name: str | None,
    train_split: str,
    test_split: str | None,
    image_column: str | None,
    label_column: str | None,
    test_fraction: float,
    image_size: int | None,
) -> DataBundle:
    if path is None:
        raise DatasetMissing(
            f"dataset 'huggingface': nothing to read under {root}; name the dataset, "
            f"data.dataset = 'hf:<Hub name or folder saved with save_to_disk>'"
        )
    datasets = require_datasets()
    obj = _open(datasets, root, download, path, name)
    splits = dict(obj) if isinstance(obj, datasets.DatasetDict) else {train_split: obj}
    if train_split not in splits:
        raise ConfigError(
            f"data.params.train_split={train_split!r}: 'hf:{path}' has splits "
            f"{', '.join(splits)}"
        )
    train = splits[train_split]
    features = dict(train.features)
    img_col = _column(features, image_column, "image", ("image", "img", "pixel_values"))
    lab_col = _column(features, label_column, "label", ("label", "labels", "fine_label"))
    x = _images(list(train[img_col]), image_size, f"hf:{path} {train_split}.{img_col}")
    y_raw = list(train[lab_col])
    if test_split is not None and test_split in splits:
        test = splits[test_split]
        xt = _images(list(test[img_col]), image_size, f"hf:{path} {test_split}.{img_col}")
        yt_raw = list(test[lab_col])
    else:
        xt, yt_raw = None, []
    feat = features[lab_col]
    if type(feat).__name__ == "ClassLabel":
        names = tuple(feat.names)
        y = np.asarray(y_raw, dtype=np.int64)
        yt = np.asarray(yt_raw, dtype=np.int64)
    else:  # plain integers or strings: classes in sorted order
        names = tuple(str(c) for c in sorted(set(y_raw) | set(yt_raw)))
        index = {c: i for i, c in enumerate(sorted(set(y_raw) | set(yt_raw)))}
        y = np.asarray([index[v] for v in y_raw], dtype=np.int64)
        yt = np.asarray([index[v] for v in yt_raw], dtype=np.int64)
    if xt is None:  # no test split: a fixed stratified hold-out, as the bundled sets
        tr, te = _stratified_split(y, test_fraction, seed=12345)
        idx_tr, idx_te = torch.from_numpy(tr), torch.from_numpy(te)
        xt, yt = x[idx_te], y[te]
        x, y = x[idx_tr], y[tr]
    if xt.shape[1:] != x.shape[1:]:
        raise DataError(f"hf:{path}: train and test inputs differ in shape")
    shape = tuple(int(d) for d in x.shape[1:])
    return DataBundle(
        f"hf:{path}",
        TensorData(x, torch.from_numpy(y)),
        TensorData(xt, torch.from_numpy(yt)),
        len(names),
        shape,  # type: ignore[arg-type]
        names,
    )


def _hub_url(*, path: str | None, **_: Any) -> str | None:
    """Nothing to download for a saved folder; the Hub otherwise."""
    return None if path is None or Path(path).expanduser().exists() else HUB_URL


def _hf_info(p: HFParams) -> DatasetInfo:
    """Shape and classes come from the data (None: checked after loading); a missing
    ``path`` is refused here, before any data."""
    if p.path is None:
        raise ConfigError(
            "data.dataset='huggingface' needs data.params.path, or write "
            "data.dataset = 'hf:<Hub name or folder saved with save_to_disk>'"
        )
    missing = _missing_folder(p.path)
    if missing is not None:
        raise ConfigError(
            f"data.dataset='hf:{p.path}': no folder {missing} (a path, not a Hub name: "
            "give a folder saved with save_to_disk, or a Hub name such as 'owner/name')"
        )
    return DatasetInfo(None, None)


def _missing_folder(path: str) -> Path | None:
    """The folder ``path`` names when it looks like a path and does not exist: it starts
    with ``/``, ``./``, ``../`` or ``~``, or its parent is an existing directory (a Hub
    name ``owner/name`` has no local parent); None otherwise (loaded from the Hub)."""
    local = Path(path).expanduser()
    if local.exists():
        return None
    looks_local = path.startswith(("/", "./", "../", "~", ".\\", "..\\"))
    parent = local.parent
    if looks_local or (parent != Path(".") and parent.is_dir()):
        return local
    return None


huggingface = _download_url(_hub_url)(
    _info(_hf_info)(
        DATASETS.register(
            "huggingface",
            help="A Hugging Face dataset: data.dataset = 'hf:<Hub name or saved folder>'.",
            schema=HFParams,
            tags=["files"],
        )(_load_hf)
    )
)


__all__ = ["HFParams", "HUB_URL", "huggingface", "require_datasets"]
