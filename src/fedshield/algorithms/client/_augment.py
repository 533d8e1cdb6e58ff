"""Training-time augmentation through timm's data utilities (early-exit ViT paper, Sec. IV:
MixUp/CutMix, RandAugment), seeded from the client's generator so a run stays a pure
function of (config, seed) (docs/usage.md).

timm's ``Mixup`` and ``RandAugment`` draw from the global ``random`` / ``numpy.random``
streams; :func:`seeded_global_rng` seeds both from the client's generator for the local
update and restores them afterwards, so nothing else in the process is disturbed.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor


@contextlib.contextmanager
def seeded_global_rng(generator: torch.Generator) -> Iterator[None]:
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def make_randaugment(config: str | None) -> Callable[[Tensor], Tensor] | None:
    """Batch wrapper around ``timm.data.auto_augment.rand_augment_transform``.

    timm's RandAugment works on PIL images, and several of its ops pass an RGB fill colour
    that PIL rejects for mode "L", so grey images go L → RGB → augment → L (the three
    channels stay equal, as every op is channel-symmetric on a grey image). Inputs and
    outputs are float batches in [0, 1]; the per-sample PIL round trip costs ~0.1 ms
    per 28×28 image on one core.
    """
    if not config:
        return None
    from PIL import Image
    from timm.data.auto_augment import rand_augment_transform

    tf = rand_augment_transform(config, {"img_mean": (128, 128, 128)})

    def apply(x: Tensor) -> Tensor:
        device = x.device
        imgs = (x.detach().cpu().clamp(0, 1) * 255).round().to(torch.uint8)
        out = []
        for img in imgs:
            arr = img.permute(1, 2, 0).numpy()
            grey = arr.shape[2] == 1
            pil = Image.fromarray(arr[:, :, 0] if grey else arr, "L" if grey else "RGB")
            res = tf(pil.convert("RGB") if grey else pil)
            res_arr = np.asarray(res.convert("L") if grey else res)
            t = torch.from_numpy(res_arr.copy())
            out.append(t[None] if grey else t.permute(2, 0, 1))
        return torch.stack(out).to(device=device, dtype=x.dtype) / 255.0

    return apply


def make_mixup(
    mixup: float,
    cutmix: float,
    prob: float,
    switch_prob: float,
    label_smoothing: float,
    num_classes: int,
) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None:
    """timm ``Mixup`` (batch mode) returning soft targets, or None when both α are 0.

    timm needs an even batch; an odd (last, partial) batch is left unmixed with
    label-smoothed one-hot targets (our choice) rather than dropping a sample.
    """
    if mixup <= 0 and cutmix <= 0:
        return None
    from timm.data import Mixup

    mix = Mixup(
        mixup_alpha=mixup,
        cutmix_alpha=cutmix,
        prob=prob,
        switch_prob=switch_prob,
        label_smoothing=label_smoothing,
        num_classes=num_classes,
    )

    def apply(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if x.shape[0] % 2 == 0:
            return mix(x, y)
        return x, smooth_one_hot(y, num_classes, label_smoothing)

    return apply


def smooth_one_hot(y: Tensor, num_classes: int, smoothing: float) -> Tensor:
    off = smoothing / num_classes
    out = torch.full((y.shape[0], num_classes), off, device=y.device)
    return out.scatter_(1, y[:, None], 1.0 - smoothing + off)


__all__ = ["make_mixup", "make_randaugment", "seeded_global_rng", "smooth_one_hot"]
