"""Several runs trained as one batched computation: the vectorised trainer with a run axis.

A bench cell's runs differ in the defense, the attack, the share and the server's
hyper-parameters but share the data, the model and the client's local rule. Where they
do, their rounds advance in lockstep: each run plans its round (cohort, Byzantine set,
broadcast θ_r), then every client that trains in any run — R runs × S clients — takes its
local steps in one ``vmap(grad(loss))`` call per step (:class:`~fedshield.sim.
vectorized.trainer.VectorizedTrainer`'s own :meth:`grads` and SGD update), each row from
its own run's θ_r, and each run then attacks and aggregates its own rows. Profiling a
digits cell (bench/bench_cell.py) puts ~90 % of a run's time in the batched training, and
most of a small model's step in the fixed cost of one ``vmap`` call, so R runs per call
cost little more than one.

What makes it the per-run computation: a row's mini-batches come from its
(seed, round, client) generator, its dropout from its (seed, round, client) stream, its
data is its run's (poisoned for that run's attackers), and the SGD update is
``torch.optim.SGD``'s, as in the per-run trainer; rows whose batches differ in size step
in separate groups. Only float summation order differs (a row's first step starts from
its own θ_r instead of one shared start), within the batched trainer's tolerance
(docs/vectorized.md; tests/test_bench.py compares θ after the rounds).

It applies to runs of a client algorithm whose per-step pieces are the plain ones (local
SGD: no constants, no gradient adjustment, no extras, no client state), without model
buffers or sample-level DP; anything else trains run by run (:func:`lockstep_ok`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedshield.algorithms.client.base import ClientAlgorithm, batch_indices
from fedshield.core.context import ClientUpdate, derive_seed, make_generator
from fedshield.core.seeds import BATCH, TORCH
from fedshield.sim.faults import training_plan
from fedshield.sim.vectorized.rng import CohortStreams, GroupDraws
from fedshield.sim.vectorized.trainer import Layout, Rows, VectorizedTrainer, _Feed

if TYPE_CHECKING:
    from fedshield.sim.engine import Simulator
    from fedshield.sim.state import RoundPlan

#: The per-step pieces a lockstep run may not override (they would need per-run inputs).
_PLAIN = ("round_payload", "constants", "examples", "adjust", "finish_clients", "init_state")


def lockstep_ok(sims: Sequence[Simulator], trainer: VectorizedTrainer | None) -> bool:
    """Whether ``sims`` can train as one computation with ``trainer`` (the first run's)."""
    if trainer is None or not sims:
        return False
    first = sims[0]
    layout = Layout.of(first.model)
    spec = first.comp.client.spec
    for sim in sims:
        algo = sim.comp.client
        if any(getattr(type(algo), p) is not getattr(ClientAlgorithm, p) for p in _PLAIN):
            return False
        if algo.dp_sgd is not None or sim.state.buffers.numel() or layout.buffers:
            return False
        if algo.spec != spec or Layout.of(sim.model) != layout or sim.device != first.device:
            return False
    return True


def train_runs(
    trainer: VectorizedTrainer, sims: Sequence[Simulator], plans: Sequence[RoundPlan]
) -> list[list[ClientUpdate]]:
    """Every run's uploads of this round (before update attacks), in cohort order, with
    the trained clients of all runs stepped together in chunks of ``trainer.chunk`` rows.
    Under ``[faults]`` only the clients that answer train and upload, a late one its
    partial steps (:func:`~fedshield.sim.faults.training_plan`, as ``train_cohort``)."""
    plans = [training_plan(p) for p in plans]
    out: list[list[ClientUpdate | None]] = []
    rows: list[tuple[int, int, int]] = []  # (run, cohort position, client)
    for r, (sim, plan) in enumerate(zip(sims, plans)):
        cohort = plan.ctx.cohort
        ups: list[ClientUpdate | None] = [None] * len(cohort)
        for i, k in enumerate(cohort):
            if plan.trains(k):
                rows.append((r, i, k))
            else:  # the attack overwrites this row: a zero row, as the per-run trainer
                ups[i] = sim.untrained_upload(k, torch.zeros_like(sim.state.params))
        out.append(ups)
    size = {
        row: len(sims[row[0]].client_data(row[2], row[2] in plans[row[0]].ctx.byzantine))
        for row in rows
    }
    rows.sort(key=lambda row: (size[row], row))  # equal sizes step together
    trainer.model.train()
    for begin in range(0, len(rows), trainer.chunk):
        chunk = rows[begin : begin + trainer.chunk]
        for (r, i, _), u in zip(chunk, _train_chunk(trainer, sims, plans, chunk)):
            out[r][i] = u
    assert all(u is not None for ups in out for u in ups)
    return out  # type: ignore[return-value]


def _train_chunk(
    trainer: VectorizedTrainer,
    sims: Sequence[Simulator],
    plans: Sequence[RoundPlan],
    chunk: Sequence[tuple[int, int, int]],
) -> list[ClientUpdate]:
    """The per-run trainer's ``train_chunk`` with one start point θ_r per row."""
    spec = trainer.algo.spec
    dev = trainer.device
    rnd = plans[0].ctx.round
    data = [sims[r].client_data(k, k in plans[r].ctx.byzantine) for r, _, k in chunk]
    seeds = [sims[r].cfg.seed for r, _, _ in chunk]
    steps = [plans[r].local_steps(k, spec.num_steps(len(x))) for x, (r, _, k) in zip(data, chunk)]
    batches = [
        batch_indices(len(x), spec.batch_size, s, make_generator(seed, rnd, k, BATCH))
        for x, s, seed, (_, _, k) in zip(data, steps, seeds, chunk)
    ]
    streams = CohortStreams(
        [derive_seed(seed, rnd, k, TORCH) for seed, (_, _, k) in zip(seeds, chunk)], dev
    )
    start = torch.stack([plans[r].payload.params for r, _, _ in chunk])  # [C, d]
    current = start.clone()
    params = trainer.layout.split_params(current)  # [C, ...] views, stepped in place
    feed = _Feed(data, dev)
    momentum: list[Tensor | None] = [None] * len(params)
    total = torch.zeros(len(chunk), device=dev)
    payload = plans[0].payload  # the plain pieces read x, y only (lockstep_ok)
    for t in range(max(steps, default=0)):
        groups: dict[int, list[int]] = {}
        picks: dict[int, Tensor] = {}
        for j in range(len(chunk)):
            if t < steps[j]:
                picks[j] = next(batches[j])
                groups.setdefault(picks[j].shape[0], []).append(j)
        for members in groups.values():
            rows = Rows(members, dev)
            p_g = [rows.take(p) for p in params]
            x, y = feed.batch([picks[j] for j in members], torch.tensor(members))
            draws = GroupDraws(streams, members, dev)
            g, loss = trainer.grads(p_g, [], x, y, {}, payload, draws)
            trainer._sgd_step(p_g, g, momentum, rows, t, params)
            total.index_add_(0, rows.index, loss.detach().float())
    delta = current.sub_(start)
    losses = total.tolist()
    return [
        ClientUpdate(
            client_id=k,
            delta=delta[j],
            num_examples=len(data[j]),
            buffers=sims[r].state.buffers,
            metrics={"train/loss": losses[j] / max(steps[j], 1)},
        )
        for j, (r, _, k) in enumerate(chunk)
    ]


__all__ = ["lockstep_ok", "train_runs"]
