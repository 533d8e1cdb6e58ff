"""Memory layout (``run.memory_format``): NCHW vs the layout the rule picks, side by side.

One thread, CPU. Per model family, the median step time over interleaved repeats (process
CPU time: the other jobs of a shared machine disturb it far less than the wall clock) of

* ``train``: forward + backward + SGD step on a batch of 32;
* ``pgd``: one PGD step's input gradient (forward + backward to x);
* ``eval``: a no-grad forward,

in NCHW, with the model converted (``model``: what ``run.memory_format`` does; the first
convolution writes channels_last) and with the inputs converted too (``both``: for
one-channel inputs the same tensor, their NCHW strides already read as channels_last). Then
max-pool's variants on cnn_small's [32, 16, 28, 28] activation, the demo's per-step
training time against a plain NCHW PyTorch loop of the same model, and the end-to-end
CPU time of short runs of the FedCART CPU preset and a DRAG CPU preset, contiguous vs
auto (one process: ``run.memory_format`` switches).

    PYTHONPATH=src python bench/bench_layout.py [--quick] [--out docs/results/bench_layout.txt]
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedshield import config
from fedshield.models import build_model, model_tags
from fedshield.models.fast_pool import MaxPool2x2, fast_path
from fedshield.models.gray_conv import GrayConv2d
from fedshield.models.layout import choose_layout
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

CL = torch.channels_last
#: (label, model name, params, input shape, repeats)
FAMILIES: list[tuple[str, str, dict[str, Any], tuple[int, int, int], int]] = [
    ("cnn_small 28x28", "cnn_small", {}, (1, 28, 28), 15),
    ("cnn_small 8x8", "cnn_small", {}, (1, 8, 8), 25),
    ("dual_head(cnn_small)", "dual_head", {"backbone": "cnn_small"}, (1, 28, 28), 15),
    ("cnn_emnist", "cnn_emnist", {}, (1, 28, 28), 9),
    ("cnn_cifar10", "cnn_cifar10", {}, (3, 32, 32), 7),
    ("cnn_cifar100", "cnn_cifar100", {}, (3, 32, 32), 7),
    ("resnet18 32x32", "resnet18", {}, (3, 32, 32), 5),
    ("mlp (control)", "mlp", {}, (1, 28, 28), 25),
]


def papers_order(model: nn.Module) -> nn.Module:
    """``model`` with its (conv, max-pool, ReLU) stages put back in the papers' order,
    conv → ReLU → max-pool, its grayscale convolutions plain ``nn.Conv2d`` (oneDNN's input
    gradient) and its max-pools ``nn.MaxPool2d`` (PyTorch's kernel), in place: the same
    function (tests/test_models.py, tests/test_gray_conv.py, tests/test_fast_pool.py), the
    way the CNNs were written before, and how a plain PyTorch loop would write them."""
    for mod in model.modules():
        if isinstance(mod, GrayConv2d):
            mod.__class__ = nn.Conv2d
        if isinstance(mod, MaxPool2x2):
            mod.__class__ = nn.MaxPool2d
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 2):
            a, b, c = seq[i], seq[i + 1], seq[i + 2]
            if isinstance(a, nn.Conv2d) and isinstance(b, nn.MaxPool2d) and isinstance(c, nn.ReLU):
                seq[i + 1], seq[i + 2] = c, b
    return model


class _FreePool(torch.autograd.Function):
    """A 2×2 max-pool's output shape at almost no cost: every other pixel, copied
    channels_last; the backward hands back one zero tensor allocated once per shape."""

    zeros: dict[tuple[int, ...], Tensor] = {}

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.shape = tuple(x.shape)
        return x[:, :, ::2, ::2].contiguous(memory_format=CL)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        if ctx.shape not in _FreePool.zeros:
            _FreePool.zeros[ctx.shape] = torch.zeros(ctx.shape).contiguous(memory_format=CL)
        return _FreePool.zeros[ctx.shape]


class FreePool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = _FreePool.apply(x)
        return out


def free_pools(model: nn.Module) -> nn.Module:
    """``model`` with every 2×2 max-pool replaced by :class:`FreePool`, in place: not the same
    function, a lower bound on the time of any max-pool kernel (the rest of the step as is)."""
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        for i, mod in enumerate(seq):
            if isinstance(mod, nn.MaxPool2d) and mod.kernel_size in (2, (2, 2)):
                seq[i] = FreePool()
    return model


def medians(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median CPU milliseconds of each function, calls interleaved (two warm-ups)."""
    for f in fns.values():
        f()
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.process_time()
            f()
            times[k].append(time.process_time() - t)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def step_fns(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Callable[[], Any]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the same weights every call

    def train() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def pgd() -> None:
        xa = x.detach().clone().requires_grad_(True)
        torch.autograd.grad(F.cross_entropy(model(xa), y), xa)

    def evaluate() -> None:
        with torch.no_grad():
            model(x)

    return {"train": train, "pgd": pgd, "eval": evaluate}


def families(quick: bool) -> list[str]:
    cpu = torch.device("cpu")
    lines = [
        "## per step, batch 32: median CPU ms; before = NCHW in the papers' conv → ReLU → pool "
        "order | NCHW | model converted (the rule's way) | model + inputs converted; "
        "gain = before / the layout the rule picks (NCHW or model)",
        f"{'family':22s} {'layout':14s} "
        + "  ".join(f"{k:>6s}: before  NCHW  model   both  gain" for k in ("train", "pgd", "eval")),
    ]
    for label, name, params, shape, repeats in FAMILIES:
        layout, _ = choose_layout("auto", model_tags(name, params), shape, cpu)
        torch.manual_seed(0)
        base = build_model(name, shape, 10, **params)
        base.train(True)
        x, y = torch.rand(32, *shape), torch.randint(0, 10, (32,))
        fns: dict[str, Callable[[], Any]] = {}
        for mode in ("before", "nchw", "model", "both"):
            m = copy.deepcopy(base)
            if mode == "before":
                papers_order(m)
            elif mode != "nchw":
                m.to(memory_format=CL)
            xm = x.contiguous(memory_format=CL) if mode == "both" else x
            for k, f in step_fns(m, xm, y).items():
                fns[f"{mode}/{k}"] = f
        r = medians(fns, max(2, repeats // 3) if quick else repeats)
        cells = []
        for k in ("train", "pgd", "eval"):
            z, a, b, c = (r[f"{m}/{k}"] for m in ("before", "nchw", "model", "both"))
            chosen = b if layout == "channels_last" else a  # what the rule runs
            cells.append(f"{z:6.2f} {a:6.2f} {b:6.2f} {c:6.2f} {z / chosen:5.2f}x")
        lines.append(f"{label:22s} {layout:14s}    " + "   ".join(cells))
        print(lines[-1], flush=True)
    return lines


def pool_variants() -> list[str]:
    """Exact max-pool equivalents (values and gradients bit-identical: tests/test_layout.py,
    tests/test_fast_pool.py)."""
    x = torch.relu(torch.randn(32, 16, 28, 28))
    xc = x.contiguous(memory_format=CL)
    fast = MaxPool2x2()

    def dim_max(t: Tensor) -> Tensor:  # the 2×2 window as two max-over-a-dim reductions
        n, c, h, w = t.shape
        v = t[..., : h // 2 * 2, : w // 2 * 2].unflatten(-1, (w // 2, 2)).amax(-1)
        return v.unflatten(-2, (h // 2, 2)).amax(-2)

    fns = {
        "F.max_pool2d, NCHW input": lambda: F.max_pool2d(x, 2),
        "F.max_pool2d, channels_last input": lambda: F.max_pool2d(xc, 2),
        "convert to channels_last + pool": lambda: F.max_pool2d(x.contiguous(memory_format=CL), 2),
        "two amax over window dims, NCHW": lambda: dim_max(x),  # forward only: amax splits
        # the gradient of tied inputs, max_pool2d routes it to one
    }
    if fast_path(xc):  # else the kernel did not build here (the log says why)
        fns["fast_pool kernel, channels_last"] = lambda: fast(xc)
    assert torch.equal(F.max_pool2d(x, 2), dim_max(x))
    r = medians(fns, 40)
    for k, v in r.items():
        print(f"{k:36s} {v:7.3f} ms", flush=True)
    out = ["## max-pool 2x2 on [32, 16, 28, 28] (cnn_small's first pool), forward, median CPU ms"]
    base = r["F.max_pool2d, NCHW input"]
    out += [f"{k:36s} {v:7.3f} ms  ({base / v:4.1f}x)" for k, v in r.items()]
    return out


def plain_loop(model: nn.Module, data: Any, steps: int, batch: int, lr: float) -> None:
    """A hand-written NCHW PyTorch loop: ``steps`` SGD steps on random batches."""
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        x, y = data.batch(torch.randint(len(data), (batch,), generator=g))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()


def demo_steps(quick: bool) -> list[str]:
    """The demo preset's client training (10 clients × 10 steps, sequential on CPU: its
    28×28 cnn_small is above the FLOP count where batching pays) per local step, against a
    plain NCHW loop doing the same number of steps on the same model and data, written
    the usual way (conv → ReLU → pool; the baseline) and pooling first; then the run's own
    model (channels_last) in the same plain loop, and that model with its max-pools at no
    cost (:func:`free_pools`): a lower bound on the step any max-pool kernel could give."""
    out = ["## demo preset: one round's local training per step (10 clients x 10 steps), "
           "median CPU ms over interleaved repeats"]  # fmt: skip
    sims = {}
    for fmt in ("contiguous", "auto"):
        overrides = [f"run.memory_format={fmt}", "run.progress=false"]
        cfg = config.load(preset="demo", overrides=overrides)
        sims[fmt] = Simulator(build(cfg))
    sim = sims["auto"]
    steps = sim.cfg.client.local_steps * sim.cfg.server.clients_per_round
    plain = papers_order(copy.deepcopy(sims["contiguous"].model))
    pooled = copy.deepcopy(sims["contiguous"].model)
    runs = copy.deepcopy(sim.model)
    free = free_pools(copy.deepcopy(sim.model))
    data = sim.exp.clients[0]
    rnd = iter(range(1, 10_000))
    fns = {
        "plain NCHW loop": lambda: plain_loop(plain, data, steps, 32, 0.05),
        "plain loop, pool first": lambda: plain_loop(pooled, data, steps, 32, 0.05),
        "plain loop, run's model": lambda: plain_loop(runs, data, steps, 32, 0.05),
        "  and max-pool at no cost": lambda: plain_loop(free, data, steps, 32, 0.05),
        "fedshield contiguous": lambda: sims["contiguous"].train_cohort(
            sims["contiguous"].begin_round(next(rnd))
        ),
        "fedshield auto": lambda: sim.train_cohort(sim.begin_round(next(rnd))),
    }
    r = medians(fns, 3 if quick else 7)
    base = r["plain NCHW loop"]
    for k, v in r.items():
        out.append(f"{k:24s} {v / steps:7.3f} ms/step   ratio to plain loop {v / base:5.2f}")
    return out


#: the T = 150 page job's CalFAT variant (docs/results/fedcart.md)
CALFAT = ['client.algorithm="calfat"', 'server.algorithm="fedavg"']
#: (preset, overrides): FedCART's CPU preset on the schedule of its T = 150 page job
#: (natural accuracy every 5 rounds, robust every 10, AutoAttack at the last) for 30 rounds,
#: FedCART and CalFAT, and the DRAG page's CPU preset
E2E_RUNS = [
    ("fedcart-fmnistlt-cpu", ["rounds=30", "eval.every=5", "eval.metrics_every=10"]),
    (
        "fedcart-fmnistlt-cpu",
        ["rounds=30", "eval.every=5", "eval.metrics_every=10", *CALFAT],
    ),
    ("drag-mnist5k-dir0.1-cpu", ["rounds=10"]),
]


def end_to_end(quick: bool) -> list[str]:
    """Whole runs in this process (data loaded once per run): ``before`` (NCHW, the CNNs in
    the papers' conv → ReLU → pool order: the code before the layout rule) and ``auto``
    (this commit's defaults), interleaved; CPU seconds and wall seconds of
    ``Simulator.run``."""
    out = ["## end to end: Simulator.run (build excluded), min over repeats; CPU s / wall s; "
           "before = NCHW + conv → ReLU → pool"]  # fmt: skip
    for preset, overrides in E2E_RUNS[-1:] if quick else E2E_RUNS:
        times: dict[str, list[tuple[float, float]]] = {"before": [], "auto": []}
        if preset == E2E_RUNS[0][0] and overrides == E2E_RUNS[0][1]:
            times["free pool"] = []  # the bound: the same run, every max-pool at no cost
        for _ in range(1 if quick else 2):
            for mode in times:
                fmt = "contiguous" if mode == "before" else "auto"
                cfg = config.load(
                    preset=preset,
                    overrides=[*overrides, f"run.memory_format={fmt}", "run.progress=false"],
                )
                exp = build(cfg)
                if mode == "before":
                    papers_order(exp.model)
                if mode == "free pool":
                    free_pools(exp.model)
                sim = Simulator(exp)
                c, w = time.process_time(), time.perf_counter()
                sim.run()
                times[mode].append((time.process_time() - c, time.perf_counter() - w))
        cpu = {k: min(t[0] for t in v) for k, v in times.items()}
        wall = {k: min(t[1] for t in v) for k, v in times.items()}
        out.append(
            f"{preset + ' ' + ' '.join(overrides):72s}\n{'':72s} before {cpu['before']:6.1f} / "
            f"{wall['before']:6.1f}   auto {cpu['auto']:6.1f} / {wall['auto']:6.1f}   "
            f"auto/before CPU {cpu['auto'] / cpu['before']:.2f}"
        )
        if "free pool" in cpu:
            free = cpu["free pool"]
            out[-1] += (
                f"\n{'':72s} max-pool at no cost (a bound; another model) {free:6.1f}"
                f" / {wall['free pool']:6.1f}   free/before CPU {free / cpu['before']:.2f}"
            )
        print(out[-1], flush=True)
    return out


def header() -> list[str]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return [
        f"# bench_layout  device=cpu  threads={torch.get_num_threads()}  torch {torch.__version__}"
        f"  commit {commit}",
        "# PYTHONPATH=src python bench/bench_layout.py; shared 2-core VM, other jobs running",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument("--skip-runs", action="store_true", help="no end-to-end runs")
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    ap.add_argument(
        "--runs-only", type=int, default=None, metavar="N",
        help="only the first N end-to-end runs (e.g. 1: FedCART's, on a quiet machine)",
    )  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("fedshield").setLevel(logging.WARNING)
    lines = header()
    print("\n".join(lines), flush=True)
    if args.runs_only is not None:
        del E2E_RUNS[args.runs_only :]
    else:
        for part in (families, lambda q: pool_variants(), demo_steps):
            lines += ["", *part(args.quick)]
    if not args.skip_runs:
        lines += ["", *end_to_end(args.quick and args.runs_only is None)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
