"""Time every update attack on one cohort: ``python bench/bench_attacks.py``.

Defaults mimic a CIFAR-size CNN round (S = 50 clients, d = 1M parameters, 20% Byzantine).
Min-Max/Min-Sum cost one [S, S] Gram matrix plus O(S) per search step, so they should stay
within a small multiple of the trivial attacks.
"""

from __future__ import annotations

import argparse
import time

import torch

from fedshield import attacks
from fedshield.attacks import ATTACKS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--dim", type=int, default=1_000_000)
    ap.add_argument("--byzantine", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    gen = torch.Generator(device=args.device).manual_seed(0)
    updates = torch.randn(args.clients, args.dim, device=args.device, generator=gen) * 1e-2
    mask = torch.zeros(args.clients, dtype=torch.bool, device=args.device)
    mask[: max(1, int(args.byzantine * args.clients))] = True
    print(f"S={args.clients} d={args.dim} f={int(mask.sum())} device={args.device}")
    for name in attacks.names():
        if ATTACKS.get(name).kind != "update":
            continue
        attack = attacks.build(name)
        attack(updates, mask, generator=gen)  # warm-up
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.repeats):
            attack(updates, mask, generator=gen)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / args.repeats * 1e3
        extra = getattr(attack, "last_gamma", None)
        print(f"{name:>10}: {ms:8.1f} ms" + (f"  gamma={extra:.4f}" if extra is not None else ""))


if __name__ == "__main__":
    main()
