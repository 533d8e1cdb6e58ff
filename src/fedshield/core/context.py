"""Values passed between the round loop, client algorithms and server algorithms.

They are the seams shared by the simulator and the Flower app: a client algorithm turns a
:class:`Payload` into a :class:`ClientUpdate`; a server algorithm turns a list of updates
into the next global state. Randomness comes from (seed, round, client) only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import Tensor


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part (seed, round, client, purpose)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def seed_global_rng(seed: int, device: torch.device) -> None:
    """Seed the global RNGs that layers such as dropout draw from.

    ``torch.manual_seed`` also walks every CUDA device, which costs ~0.2 ms per call on a
    CUDA build even without a GPU; per client and round that adds up, so seed only the CPU
    generator and, on GPU runs, the current device's."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def make_generator(*parts: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(derive_seed(*parts))


@dataclass(frozen=True)
class RoundContext:
    """Frozen per-round facts handed to every hook."""

    round: int
    cohort: tuple[int, ...]
    byzantine: tuple[int, ...]
    seed: int
    num_clients: int
    device: torch.device


@dataclass
class Payload:
    """What the server broadcasts: the start point of local training plus method extras
    (reference direction, control variate, look-ahead model, ...)."""

    params: Tensor
    buffers: Tensor
    extras: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """What a client uploads: pseudo-gradient g = θ_local − θ_start (DRAG paper, Sec. II-A), its
    sample count, its final buffers (BatchNorm statistics), optional per-parameter coverage mask
    (depth-limited subnets) and method extras (gradient prototypes, control-variate deltas)."""

    client_id: int
    delta: Tensor
    num_examples: int
    buffers: Tensor
    mask: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
