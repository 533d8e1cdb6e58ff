"""Early-exit inference throughput: routed (real early exit) vs full depth (early-exit ViT paper).

Loads a trained multi-exit run (``--run DIR`` with ``config.toml`` + ``checkpoint.pt``,
e.g. from ``fedshield run --preset eevit-mnist5k-dir0.5-cpu``) or, without one, trains the
preset's model centrally for ``--train-steps`` steps so that the exits are confident
enough to route. Then, on the test set in batches of ``--batch``:

* full depth: ``model(x)`` (all L blocks, deepest exit only);
* routed: ``model.forward_routed(x, policy)`` — accepted samples leave the batch, so
  deeper blocks run on fewer rows (the stem and the exit heads/policies still cost).

Repeats alternate full/routed (ABBA) so machine-load drift hits both; throughput comes
from the best repeat of the process CPU clock (least disturbed on a shared machine) and of
the wall clock. Printed next to each policy: the measured depth saving 1 − ē/L and the
ideal speed-up 1/(1 − saving) the depth proxy would predict; the gap is the per-exit
overhead (exit heads, signals, gathers) the proxy ignores.

    PYTHONPATH=src python bench/bench_routing.py [--run DIR] [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from fedshield import config
from fedshield.algorithms.client.multi_exit import multi_exit_loss
from fedshield.core.flat import set_buffers, set_params
from fedshield.sim.builder import build
from fedshield.sim.checkpoint import load_checkpoint

POLICIES = ("fixed", "global_resource", "robust")


def load_model(run: Path | None, preset: str, train_steps: int) -> tuple[nn.Module, Tensor, Tensor]:
    """(model in eval mode, test images, test labels)."""
    if run is not None:
        exp = build(config.load(run / "config.toml"))
        state = load_checkpoint(run / "checkpoint.pt")["state"]
        set_params(exp.model, state["params"].to(exp.device))
        set_buffers(exp.model, state["buffers"].to(exp.device))
    else:
        exp = build(config.load(preset=preset))
        train_centrally(exp.model, exp.train.x, exp.train.y, train_steps)
    x, y = exp.bundle.test.batch(None, exp.device)
    return exp.model.eval(), x, y


def train_centrally(model: nn.Module, x: Tensor, y: Tensor, steps: int) -> None:
    if x.dtype == torch.uint8:
        x = x.float() / 255
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (64,), generator=g)
        loss, _ = multi_exit_loss(model.forward_exits(x[idx]), y[idx])  # type: ignore[operator]
        opt.zero_grad()
        loss.backward()
        opt.step()


def over_batches(fn: Callable[[Tensor], object], x: Tensor, batch: int) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            for start in range(0, x.shape[0], batch):
                fn(x[start : start + batch])

    return run


def timed(fn: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=None, help="a finished multi-exit run dir")
    ap.add_argument("--preset", default="eevit-mnist5k-dir0.5-cpu")
    ap.add_argument("--train-steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, x, y = load_model(args.run, args.preset, args.train_steps)
    n, num_exits = x.shape[0], model.num_exits  # type: ignore[attr-defined]
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{args.threads} thread(s); {n} test images, batch {args.batch}, L = {num_exits}"
    )
    with torch.no_grad():
        full_acc = float((model(x).argmax(-1) == y).float().mean())
    print(f"full depth accuracy {full_acc:.4f}")
    print(
        "policy            acc     depth_saving  ideal_x  cpu img/s (full→routed)  ratio  "
        "wall ratio"
    )
    full = over_batches(model, x, args.batch)
    for policy in POLICIES:
        routed = over_batches(lambda xb, p=policy: model.forward_routed(xb, p), x, args.batch)
        with torch.no_grad():
            exit_idx, pred = model.forward_routed(x, policy)  # type: ignore[operator]
        saving = 1 - float((exit_idx + 1).double().mean()) / num_exits
        acc = float((pred == y).float().mean())
        times: dict[str, list[tuple[float, float]]] = {"full": [], "routed": []}
        timed(full), timed(routed)  # warm-up
        for r in range(args.repeats):  # ABBA
            order = (("full", full), ("routed", routed))
            for name, fn in order if r % 2 == 0 else order[::-1]:
                times[name].append(timed(fn))
        cpu_full = n / min(c for _, c in times["full"])
        cpu_routed = n / min(c for _, c in times["routed"])
        wall_ratio = min(w for w, _ in times["full"]) / min(w for w, _ in times["routed"])
        print(
            f"{policy:<16} {acc:.4f}  {saving:>11.3f}  {1 / (1 - saving):>7.2f}  "
            f"{cpu_full:>9.0f} → {cpu_routed:<9.0f}       {cpu_routed / cpu_full:>5.2f}  "
            f"{wall_ratio:>9.2f}"
        )


if __name__ == "__main__":
    main()
