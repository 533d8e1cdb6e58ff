"""Pretrained weights: where a model's checkpoint comes from (file, cache, or the Hub).

:func:`resolve_weights` finds the checkpoint of a Hugging Face repo (timm's ``timm/<model>``
repos) for a model's ``pretrained`` option:

1. ``pretrained_path``: a local state dict (.pth/.pt/.bin or .safetensors), if given;
2. the local Hugging Face cache (``HF_HUB_CACHE``), read without touching the network;
3. with ``pretrained_download`` ``"auto"`` (the default) or ``true``, and the Hub's host
   reachable: downloaded into that cache with ``huggingface_hub.hf_hub_download`` (the
   client timm uses for its own pretrained weights), so the next run finds it in 2.

Each way of failing is its own :class:`DataError`: the file is missing; the weights are not
cached and downloads are off; or there is no network — the last two say how to fill the
cache on a machine with network (:func:`cache_hint`). :func:`read_state_dict` reads a
checkpoint file, unwrapping the usual ``{"model": ...}`` / ``{"state_dict": ...}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedshield.errors import DataError
from fedshield.network import unreachable

#: The files a timm repo on the Hub holds its weights in, in order of preference.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
HUB_URL = "https://huggingface.co"


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """The state dict in ``path`` (torch.load with weights_only, or safetensors)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd: Any = load_file(str(path))
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling / format errors of many kinds
        raise DataError(
            f"{path}: cannot read a state dict ({type(err).__name__}: {err}); expected a "
            f"timm checkpoint saved with torch.save (.pth/.pt/.bin) or .safetensors"
        ) from None
    for key in ("model", "state_dict"):  # common checkpoint wrappers
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise DataError(f"{path}: not a state dict")
    return sd


def load_exactly(module: torch.nn.Module, sd: dict[str, Tensor], file: Path) -> None:
    """Load ``sd`` into ``module`` when it holds exactly the module's keys with its shapes;
    otherwise one :class:`DataError` line naming the first missing, unexpected or
    mis-shaped key (``load_state_dict``'s own error lists every key, dozens of lines)."""
    own = module.state_dict()
    missing = [k for k in own if k not in sd]
    extra = [k for k in sd if k not in own]
    wrong = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    problems = []
    if wrong:
        k = wrong[0]
        problems.append(
            f"{k} has shape {tuple(sd[k].shape)} in the checkpoint, {tuple(own[k].shape)} in "
            f"the model" + (f" (and {len(wrong) - 1} more keys)" if len(wrong) > 1 else "")
        )
    for keys, what in ((missing, "lacks the model's"), (extra, "has keys the model lacks:")):
        if keys:
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            problems.append(f"the checkpoint {what} {keys[0]}{more}")
    if problems:
        raise DataError(f"{file}: does not fit the model: {'; '.join(problems)}")
    module.load_state_dict(sd, strict=True)


def cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - a dependency of timm
        return "~/.cache/huggingface/hub"


def cached_weights(repo: str) -> Path | None:
    """The checkpoint of ``repo`` in the local Hugging Face cache (never the network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of timm
        return None
    for fname in WEIGHT_FILES:
        hit = try_to_load_from_cache(repo, fname)
        if isinstance(hit, str):
            return Path(hit)
    return None


def cache_hint(repo: str) -> str:
    """How to put ``repo``'s weights where an offline run finds them."""
    return (
        f"on a machine with network run `python -c \"from huggingface_hub import "
        f"hf_hub_download; print(hf_hub_download('{repo}', '{WEIGHT_FILES[0]}'))\"` and copy "
        f"its cache folder to {cache_dir()} (or set HF_HUB_CACHE), or set "
        f"model.params.pretrained_path to the downloaded file"
    )


def download_weights(repo: str) -> Path:
    """Download ``repo``'s checkpoint into the Hugging Face cache (the Hub's host is probed
    first, so no network is a clear error and not a client traceback)."""
    why = unreachable(HUB_URL)
    if why is not None:
        raise DataError(
            f"pretrained weights for {repo} are not in the Hugging Face cache and cannot be "
            f"downloaded: no network ({why}); {cache_hint(repo)}"
        )
    from huggingface_hub import hf_hub_download

    errors = []
    for fname in WEIGHT_FILES:
        try:
            return Path(hf_hub_download(repo, fname))
        except Exception as err:
            errors.append(f"{fname}: {type(err).__name__}: {err}")
    raise DataError(f"pretrained weights for {repo}: download failed ({'; '.join(errors)})")


def resolve_weights(path: str | Path | None, repo: str, download: bool | str = "auto") -> Path:
    """The checkpoint file for a model's pretrained option (see the module doc)."""
    if path is not None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise DataError(
                f"model.params.pretrained_path: {file} not found (set pretrained = false "
                f"to start from random init)"
            )
        return file
    cached = cached_weights(repo)
    if cached is not None:
        return cached
    if download is False:
        raise DataError(
            f"pretrained weights for {repo} are not in the Hugging Face cache ({cache_dir()}) "
            f"and model.params.pretrained_download = false; {cache_hint(repo)}; or set "
            f"pretrained_download = \"auto\", or pretrained = false"
        )
    return download_weights(repo)


__all__ = [
    "WEIGHT_FILES",
    "cache_dir",
    "cache_hint",
    "cached_weights",
    "download_weights",
    "load_exactly",
    "read_state_dict",
    "resolve_weights",
]
