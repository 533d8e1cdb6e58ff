"""How many torch threads a run's process uses: one rule for the CLI, sweeps, benches and
the Flower apps (ServerApp, ClientApp), so a cap set for a machine holds on every path."""

from __future__ import annotations

import os

from fedshield.errors import ConfigError

#: Caps ``run.threads`` for every run of this process and its children: a process that runs
#: beside others (a test worker, one of several jobs sharing the cores) sets it so that a
#: preset asking for 2 threads does not oversubscribe the machine.
MAX_THREADS_ENV = "FEDSHIELD_MAX_THREADS"


def thread_cap() -> int | None:
    """``$FEDSHIELD_MAX_THREADS`` as a number (None when unset); one clear error otherwise."""
    cap = os.environ.get(MAX_THREADS_ENV, "").strip()
    if not cap:
        return None
    try:
        return max(1, int(cap))
    except ValueError:
        raise ConfigError(f"{MAX_THREADS_ENV}={cap!r}: expected a whole number >= 1") from None


def set_threads(requested: int | None, default: int | None = 1) -> int:
    """Set torch's intra-op threads to ``requested`` (``run.threads``), else ``default``
    (None: the runtime's own count — Ray gives an actor 1, a SuperNode's ClientApp process
    every core), at most :func:`thread_cap`; returns the count set.

    On a busy 2-core machine two threads measured 6-17x slower per round than one
    (oversubscription: the eevit sample test took 141 s beside another test worker, 32 s
    alone), and one thread keeps runs bit-reproducible across machines with different core
    counts."""
    import torch

    threads = requested or default or torch.get_num_threads()
    cap = thread_cap()
    if cap is not None:
        threads = min(threads, cap)
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return threads


__all__ = ["MAX_THREADS_ENV", "set_threads", "thread_cap"]
