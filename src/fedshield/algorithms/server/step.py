"""One server round step (docs/security.md §0), the same on every backend.

    admit → screen → weights → server.update → server.post_step → guard

The simulator's engine (:meth:`fedshield.sim.engine.Simulator.end_round`, which fedshield's
own Flower strategy also calls) and every Flower-native strategy
(:class:`fedshield.flower.adapter.FedshieldRule`) run :func:`server_round_step` on a round's
uploads, so a check added here holds on every path:

1. **Admit**: one upload per client that was asked this round. An upload from a client
   outside ``ctx.cohort`` is dropped (``sys/rejected/unsampled``); a client that answered
   more than once has every one of its uploads dropped (``sys/rejected/duplicate``): it
   cannot choose which copy counts. (The Flower adapters first match each reply to its
   own instruction, :mod:`fedshield.flower.replies`.)
2. **Screen**: :func:`fedshield.core.integrity.screen` (shapes, dtypes, finiteness, masks,
   extras, sample counts; trusted counts replace reported ones where the server knows them).
3. **Weights no client can buy**: under a Byzantine-robust rule every count is capped at
   ``count_cap`` × the lower median count of the kept uploads (``sys/capped_counts``), so
   f clients hold at most f·k/(f·k + Σ honest) of the weight whatever they claim (a
   weighted geometric median has no breakdown point otherwise), and then lower still
   until the round's f largest counts hold less than half of the total
   (:func:`~fedshield.algorithms.server.cohort.cap_for_f`). Kept uploads whose counts
   are all 0 are weighted uniformly (``sys/zero_counts``) instead of aborting the round.
   f is the sampled cohort's (:mod:`fedshield.algorithms.server.cohort`): when fewer rows
   are kept than the rule needs to outvote it, a ``fill`` round defense first lends the
   rule the cached rows of invited clients that sent nothing (:mod:`fedshield.crossround.
   fill`), and with still too few the server completes the round with zero rows, votes
   to keep θ (``sys/padded``, :mod:`fedshield.algorithms.server.padding`), or with
   ``server.short_rounds = "skip"`` does not move θ (``sys/skipped/too_few``).
4. **Step**: the server algorithm's ``update`` then ``post_step`` (behind the round
   defenses of ``server.round_defenses``, :mod:`fedshield.crossround`). A rule that raises on
   this round's rows (a reference that cannot be formed, weights that cannot be
   normalised) keeps θ and the server state (``sys/failed_step``) and the run goes on.
5. **Guard**: a step whose θ, buffers or state is not finite is not applied
   (``sys/nonfinite_step``).

Every outcome is in the returned metrics; θ is never left non-finite.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from fedshield.algorithms.server.base import ServerAlgorithm, ServerRound, State
from fedshield.algorithms.server.cohort import RoundBudget, cap_for_f, round_budget
from fedshield.algorithms.server.padding import can_pad, padded
from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.core.integrity import UploadSpec, screen

log = logging.getLogger("fedshield")

#: Default k of the count cap: a client weighs at most twice the cohort's median count.
COUNT_CAP = 2.0


@dataclass
class StepOutcome:
    """θ^{t+1} (or θ^t when nothing could be applied), the kept uploads and the metrics."""

    params: Tensor
    buffers: Tensor
    state: State
    kept: list[ClientUpdate]
    metrics: dict[str, float] = field(default_factory=dict)
    applied: bool = False


def admit(
    updates: Sequence[ClientUpdate], cohort: Sequence[int]
) -> tuple[list[ClientUpdate], Counter[str]]:
    """The uploads of clients asked this round, at most one per client (module docstring)."""
    asked = set(cohort)
    seen = Counter(u.client_id for u in updates if u.client_id in asked)
    rejected: Counter[str] = Counter()
    out = []
    for u in updates:
        if u.client_id not in asked:
            rejected["unsampled"] += 1
        elif seen[u.client_id] > 1:
            rejected["duplicate"] += 1
        else:
            out.append(u)
    for reason, n in rejected.items():
        log.warning("dropped %d upload(s): %s", n, reason)
    return out, rejected


def cap_counts(
    kept: list[ClientUpdate], cap: float | None, f: int | None = None
) -> tuple[list[ClientUpdate], dict[str, float]]:
    """Counts capped at ``cap`` × the lower median count (None: no cap), then so that the
    ``f`` largest hold less than half of the total; all-zero counts made uniform."""
    counts = sorted(int(u.num_examples) for u in kept)
    if not counts:
        return kept, {}
    if counts[-1] == 0:
        return [replace(u, num_examples=1) for u in kept], {"sys/zero_counts": float(len(kept))}
    if cap is None:
        return kept, {}
    median = counts[(len(counts) - 1) // 2]
    limit = max(1, int(cap * median))
    by_f = cap_for_f([min(n, limit) for n in counts], f or 0)
    if by_f is not None:
        limit = max(1, min(limit, by_f))
    capped = [u for u in kept if u.num_examples > limit]
    if not capped:
        return kept, {}
    out = [replace(u, num_examples=limit) if u.num_examples > limit else u for u in kept]
    return out, {"sys/capped_counts": float(len(capped))}


def _skip_too_few(
    server: ServerAlgorithm,
    budget: RoundBudget,
    kept: int,
    ctx: RoundContext,
    metrics: dict[str, float],
) -> None:
    """θ kept: the f of the sampled cohort may be the majority of the kept rows."""
    need = "no number of rows" if budget.needed is None else f"{budget.needed} rows"
    log.warning(
        "round %d: %d row(s) kept of %d sampled; %r outvotes f=%d of the cohort only on %s; "
        "θ unchanged",
        ctx.round,
        kept,
        len(ctx.cohort),
        server.aggregator,
        budget.f,
        need,
    )
    metrics["sys/skipped"] = 1.0
    metrics["sys/skipped/too_few"] = 1.0


def _pads(
    server: ServerAlgorithm, budget: RoundBudget, kept: list[ClientUpdate], defenses: Any
) -> bool:
    """Whether a short round is completed with zero rows (padding) rather than skipped:
    asked for, possible on these rows, and no defense hands the rule rows of uninvited
    clients (cache), which the zero rows would not bound."""
    uninvited = defenses is not None and defenses.tagged("adds_uninvited")
    return (
        server.short_rounds == "pad" and bool(budget.needed) and can_pad(kept) and not uninvited
    )


def _nonfinite_parts(params: Tensor, buffers: Tensor, state: State) -> list[str]:
    bad = [n for n, t in (("params", params), ("buffers", buffers)) if not _finite(t)]
    bad += [f"state.{k}" for k, v in state.items() if isinstance(v, Tensor) and not _finite(v)]
    return bad


def _finite(t: Tensor) -> bool:
    return not t.is_floating_point() or bool(torch.isfinite(t).all())


def server_round_step(
    server: ServerAlgorithm,
    start: ServerRound,
    spec: UploadSpec,
    *,
    count_cap: float | None = COUNT_CAP,
    uniform_counts: bool = False,
    rejected_before: Mapping[str, int] | None = None,
    trusted_ids: bool = True,
) -> StepOutcome:
    """One round of the server (module docstring) from ``start``: θ^t, its buffers, the
    server state and the round's uploads as received (``start.ctx.cohort``: the clients
    asked this round). ``count_cap``: k of the count cap under a robust rule (None: no cap).
    ``uniform_counts``: every kept upload weighs 1 (self-reported counts unused).
    ``rejected_before``: uploads a transport already dropped, by reason (counted too).
    ``trusted_ids``: an upload's client id is the sender's (the simulator), so clients
    whose uploads the checks reject are known-bad and lower the round's f."""
    ctx = start.ctx
    admitted, rejected = admit(start.updates, ctx.cohort)
    rejected.update(rejected_before or {})
    screened = screen(admitted, spec)
    rejected.update(screened.rejected)
    kept = screened.kept
    metrics: dict[str, float] = {"sys/rejected": float(sum(rejected.values()))}
    metrics |= {f"sys/rejected/{k}": float(v) for k, v in sorted(rejected.items())}
    metrics["sys/kept"] = float(len(kept))
    out = StepOutcome(start.params, start.buffers, start.state, kept, metrics)
    known_bad = len(admitted) - len(kept) if trusted_ids else 0
    budget = round_budget(
        server.aggregator, len(ctx.cohort), getattr(server, "byzantine_f", None), known_bad
    )
    metrics |= budget.metrics()
    defenses = getattr(server, "round_defenses", None)  # fedshield.crossround
    filled: dict[str, Tensor] = {}
    fresh = kept
    if defenses is not None and kept:  # a short round completed from cached rows (fill)
        sent = {u.client_id for u in admitted}
        kept, filled, notes = defenses.complete(start.replace(updates=kept), budget.needed, sent)
        metrics |= notes
        out.state = start.state | filled
    if uniform_counts:
        kept = [replace(u, num_examples=1) for u in kept]
    elif kept:
        kept, notes = cap_counts(kept, count_cap if server.robust else None, budget.f)
        metrics |= notes
    out.kept = kept
    if not kept:
        log.warning("round %d: no valid upload; θ unchanged", ctx.round)
        metrics["sys/skipped"] = 1.0
        return out
    # Also with a cache: in early rounds the cache holds few honest rows (attackers always
    # answer), so the fresh rows, not the cached ones, decide whether f can be outvoted.
    short = budget.too_few(len(kept))
    if short and not _pads(server, budget, kept, defenses):
        _skip_too_few(server, budget, len(kept), ctx, metrics)
        return out
    pad_f = budget.f if short else None  # zero rows complete the round (padding)
    rule = server.aggregator
    server.aggregator = rule.for_round(ctx.round)  # Bucketing's draw: (seed, round) only
    rnd = start.replace(updates=kept)
    try:
        if defenses is not None:  # cached rows, step bound: around update and post_step
            # This round's own uploads are the first len(fresh) rows (fill appends after).
            own = kept[: len(fresh)] if len(kept) > len(fresh) else None
            step = defenses.step(server, rnd, own, filled, pad_f)
        else:
            if pad_f is not None:
                rows, added = padded(kept, budget.needed, start.buffers, budget.f or 0)
                rnd = rnd.replace(updates=rows)
                metrics["sys/padded"] = float(added)
            step = server.post_step(server.update(rnd), rnd)
    except (ValueError, ArithmeticError) as err:
        # A rule that cannot run on this round's rows must not end a long run (docs/security.md §4).
        log.warning("round %d: the server step failed (%s); θ unchanged", ctx.round, err)
        metrics["sys/failed_step"] = 1.0
        return out
    finally:
        server.aggregator = rule
    metrics |= {k: float(v) for k, v in step.metrics.items()}
    bad = _nonfinite_parts(step.params, step.buffers, step.state)
    if bad:
        log.warning("round %d: non-finite %s after the server step; θ unchanged", ctx.round, bad)
        metrics["sys/nonfinite_step"] = 1.0
        return out
    out.params, out.buffers, out.state, out.applied = step.params, step.buffers, step.state, True
    return out


__all__ = ["COUNT_CAP", "StepOutcome", "admit", "cap_counts", "server_round_step"]
