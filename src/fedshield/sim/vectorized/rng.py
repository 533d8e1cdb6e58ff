"""Per-client random streams for batched cohorts: each client's replay of the global RNG.

The sequential path seeds the global generator with derive_seed(seed, round, client,
_TORCH) before a client trains, and dropout masks and attack starts are drawn from it in
program order. Here every client of a chunk owns a generator seeded identically; inside a
batched call each draw site draws once per client, from that client's generator, with the
same op and shape as the sequential path — so the values are the same, bit for bit on CPU.

* CPU: dropout is ``empty_like(x).bernoulli_(1 − p).div_(1 − p)`` (ATen's ``_dropout_impl``),
  attack starts ``uniform_`` / ``randn`` with the client's generator.
* CUDA: attack starts as on CPU; dropout runs ATen's fused ``native_dropout`` (the kernel
  the sequential path runs, which takes no generator) on the device's default generator
  temporarily holding the client's state, so the Philox offsets advance identically.

Inside ``vmap`` random ops on unbatched tensors need ``randomness="same"``; the draws are
made per client and stacked, then the batched client index picks each client's row. An
unrouted random op (``F.dropout`` in a forward, DropPath) would silently draw once for
all clients there, so the engine first probes the step with ``randomness="error"`` and
:attr:`GroupDraws.check` set, where no draw is random (see :mod:`.support`).
:mod:`.modules` routes ``nn.Dropout`` to :meth:`GroupDraws.dropout`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


class CohortStreams:
    """One generator per client of a chunk (row order), on ``device``. ``seeds``: the
    clients' seeds, or a function of the row giving them; a client's generator is made at
    its first draw (most models draw nothing: no dropout, no attack start)."""

    def __init__(self, seeds: Sequence[int] | Callable[[int], int], device: torch.device) -> None:
        self.device = device
        self._seed = seeds if callable(seeds) else seeds.__getitem__
        self._gens: dict[int, torch.Generator] = {}

    def gen(self, row: int) -> torch.Generator:
        """Client ``row``'s generator, seeded at its first use."""
        g = self._gens.get(row)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(int(self._seed(row)))
            self._gens[row] = g
        return g

    def uniform_for(
        self, row: int, shape: Sequence[int], dtype: torch.dtype, low: float, high: float
    ) -> Tensor:
        out = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        return out.uniform_(low, high, generator=self.gen(row))

    def normal_for(self, row: int, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        return torch.randn(tuple(shape), dtype=dtype, device=self.device, generator=self.gen(row))

    def dropout_for(self, row: int, shape: Sequence[int], dtype: torch.dtype, p: float) -> Tensor:
        """The multiplier ``mask / (1 − p)`` that dropout applies to an input of ``shape``."""
        if self.device.type == "cuda":
            ones = torch.ones(tuple(shape), dtype=dtype, device=self.device)
            return self._on_default(row, lambda: torch.native_dropout(ones, p, True)[0])
        noise = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        return noise.bernoulli_(1 - p, generator=self.gen(row)).div_(1 - p)

    def draws(self, row: int) -> RowDraws:
        """Client ``row``'s :class:`~fedshield.adversarial.linf.Draws` (outside ``vmap``)."""
        return RowDraws(self, row)

    def _on_default(self, row: int, draw: Callable[[], Tensor]) -> Tensor:
        idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
        default = torch.cuda.default_generators[idx]
        saved = default.get_state()
        default.set_state(self.gen(row).get_state())
        try:
            out = draw()
            self.gen(row).set_state(default.get_state())
        finally:
            default.set_state(saved)
        return out


class RowDraws:
    """One client's draws from its stream, shaped like ``like``."""

    def __init__(self, streams: CohortStreams, row: int) -> None:
        self.streams, self.row = streams, row

    def uniform(self, like: Tensor, low: float, high: float) -> Tensor:
        return self.streams.uniform_for(self.row, like.shape, like.dtype, low, high)

    def normal(self, like: Tensor) -> Tensor:
        return self.streams.normal_for(self.row, like.shape, like.dtype)


class GroupDraws:
    """The :class:`~fedshield.adversarial.linf.Draws` of one batched call over
    the chunk rows ``rows``: each draw stacks one value per client and returns the batched
    client's own row. ``check``: no randomness (the support probe)."""

    def __init__(
        self,
        streams: CohortStreams | None,
        rows: Sequence[int],
        device: torch.device,
        check: bool = False,
    ) -> None:
        self.streams = streams
        self.rows = list(rows)
        self.device = device
        self.check = check or streams is None
        self.cid: Tensor | None = None

    def bind(self, cid: Tensor) -> None:
        """The batched client index (position in ``rows``) of the running ``vmap``."""
        self.cid = cid

    def _pick(self, make: Callable[[int], Tensor]) -> Tensor:
        assert self.cid is not None, "bind() the batched client index first"
        return torch.stack([make(r) for r in self.rows])[self.cid]

    def uniform(self, like: Tensor, low: float, high: float) -> Tensor:
        """``U(low, high)`` shaped like one client's ``like``, from each client's stream."""
        shape, dtype = like.shape, like.dtype
        if self.check:
            return torch.zeros(shape, dtype=dtype, device=self.device)
        s = self.streams
        assert s is not None
        return self._pick(lambda r: s.uniform_for(r, shape, dtype, low, high))

    def normal(self, like: Tensor) -> Tensor:
        """``N(0, 1)`` shaped like one client's ``like``, from each client's stream."""
        shape, dtype = like.shape, like.dtype
        if self.check:
            return torch.zeros(shape, dtype=dtype, device=self.device)
        s = self.streams
        assert s is not None
        return self._pick(lambda r: s.normal_for(r, shape, dtype))

    def dropout(self, x: Tensor, p: float) -> Tensor:
        """``nn.Dropout(p)`` in train mode on one client's ``x``."""
        if p == 0:  # ATen returns the input untouched (and draws nothing)
            return x
        if p == 1:
            return x * torch.zeros((), dtype=x.dtype, device=x.device)
        if self.check:
            return x * torch.ones((), dtype=x.dtype, device=x.device)
        s = self.streams
        assert s is not None
        return x * self._pick(lambda r: s.dropout_for(r, x.shape, x.dtype, p))


__all__ = ["CohortStreams", "GroupDraws", "RowDraws"]
