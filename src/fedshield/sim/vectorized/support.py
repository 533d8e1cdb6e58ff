"""When a round's cohort can train as one batched computation (``run.vectorize``), and why
not: the client algorithm must be defined by its per-step pieces alone (it owns no loop:
:func:`fedshield.algorithms.client.base.batches`), and one batched step of the model must
run under ``vmap`` / ``functional_call`` with every random draw routed through the
per-client streams (a probe of two clients on two samples, ``randomness="error"``).

``auto`` falls back to client-by-client training with one log line saying why; ``true``
makes any obstacle a :class:`~fedshield.errors.ConfigError` when the experiment is built.
On CPU ``auto`` also stays client by client when one client's step is large
(> :data:`CPU_MAX_STEP_FLOPS` forward FLOPs): there the batched kernels run no faster
than per-client ones (bench_vectorized: ``cnn_small`` on 28×28 MNIST, ≈ 71 MFLOP per
32-sample step, batched 0.85–1.0× the sequential simulator), so batching would only cost
memory. The rule reads FLOP counts, not timings, so a run's path is reproducible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedshield.algorithms.client.base import ClientAlgorithm, ClientContext, ClientRound, batches
from fedshield.core.context import Payload, RoundContext
from fedshield.core.flat import get_buffers, get_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.sim.vectorized.heap import keep_freed_memory
from fedshield.sim.vectorized.rng import GroupDraws
from fedshield.sim.vectorized.trainer import VectorizedTrainer

if TYPE_CHECKING:
    from fedshield.config import ExperimentConfig
    from fedshield.sim.state import CohortHost, Experiment, RoundPlan

log = logging.getLogger("fedshield")


def why_sequential(client: ClientAlgorithm, cfg: ExperimentConfig | None = None) -> str | None:
    """None when the algorithm can train batched; else the reason it cannot."""
    name = getattr(client, "registry_name", type(client).__name__)
    if cfg is not None and cfg.privacy is not None and cfg.privacy.local is not None:
        return "privacy.local (DP-SGD: Opacus per-sample gradients) trains client by client"
    if not batches(client):
        return f"client.algorithm={name!r} trains with a loop of its own"
    return None


def probe(trainer: VectorizedTrainer, payload: Payload, data: TensorData) -> str | None:
    """None when one batched step of two clients runs; else why it cannot.

    Draws are disabled and ``vmap`` runs with ``randomness="error"``, so a random op the
    per-client streams do not replay (``F.dropout`` in a forward, DropPath, Dropout2d)
    fails here instead of silently drawing one mask for every client."""
    model, dev = trainer.model, trainer.device
    n = min(2, len(data))
    x, y = data.batch(torch.arange(n), dev)
    if n < 2:
        x, y = x.repeat(2, *[1] * (x.dim() - 1)), y.repeat(2)
    xs, ys = torch.stack([x, x]), torch.stack([y, y])
    algo = trainer.algo
    rounds = [
        ClientRound(
            payload, data, algo.init_state(payload.params.numel()),
            ClientContext(k, 0, torch.Generator(), dev),
        )
        for k in range(2)
    ]  # fmt: skip
    p_rows = payload.params.expand(2, -1).clone()
    _, params, bufs = trainer.stacked_state(payload, p_rows)
    consts = trainer.constants(rounds)
    was_training = model.training
    model.train()
    try:
        trainer.grads(params, bufs, xs, ys, consts, payload, GroupDraws(None, [0, 1], dev))
        trainer.unreached = trainer.find_unreached(
            payload, x, y, {k: v[0] for k, v in consts.items()}
        )
    except ConfigError:
        raise
    except Exception as err:  # any failure of the batched step is a reason to fall back
        return explain(err)
    finally:
        model.train(was_training)
    return None


def explain(err: Exception) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if "randomness" in text:
        return (
            "its forward draws random numbers outside nn.Dropout (F.dropout, DropPath, "
            "Dropout2d, ...), which cannot be replayed per client"
        )
    if "data-dependent control flow" in text:
        return (
            "its forward reads tensor values in Python (.item(), data-dependent control "
            "flow, BatchNorm with momentum=None), which a batched call cannot"
        )
    if "mutate a captured Tensor" in text:
        return (
            "a buffer is updated in place inside an input-gradient transform (BatchNorm in "
            "train mode during the attack: client.params.attack_eval_mode=false)"
        )
    return f"{type(err).__name__}: {text[:200]}"


CPU_FLOATS = 2**22  # a chunk's stacked tensors on CPU: ~16 MiB, near the caches of one core
CPU_CHUNK_RANGE = (16, 256)
CUDA_CHUNK_MAX = 1024
CPU_MAX_STEP_FLOPS = 2**25  # ≈ 34 MFLOP forward per client step (see the module docstring)


@dataclass(frozen=True)
class StepCost:
    """One client step's size, from one sample's forward: its FLOPs (``torch.utils.
    flop_counter``) and the floats its modules output (activations), times the batch."""

    flops: int
    activations: int


def step_cost(
    model: torch.nn.Module, data: TensorData, batch_size: int, dev: torch.device
) -> StepCost:
    """:class:`StepCost` of a step of ``min(batch_size, len(data))`` samples of ``data``."""
    from torch.utils.flop_counter import FlopCounterMode

    x, _ = data.batch(torch.arange(1), dev)
    floats = [0]

    def count(module: torch.nn.Module, args: object, out: object) -> None:
        if isinstance(out, Tensor) and not list(module.children()):
            floats[0] += out.numel()

    hooks = [m.register_forward_hook(count) for m in model.modules()]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    b = min(batch_size, len(data))
    return StepCost(counter.get_total_flops() * b, floats[0] * b)


def chunk_size(
    configured: int | None, device: torch.device, num_params: int, activations: int = 0
) -> int:
    """``run.vectorize_chunk``, or its default from a client's θ (``num_params``) and one
    step's ``activations`` (floats). CPU: ≈ 2²² / max(d, activations) clients (16 to 256),
    so the batched tensors stay near the caches, which on one core matters more than
    fewer calls (bench_vectorized: ``mlp`` on 8×8 inputs is fastest at 256, ``cnn_small``
    and the 28×28 ``mlp`` at 32–64). CUDA: the most clients, up to 1024, whose training
    state (≈ 8 copies of θ — parameters, gradients, momentum, temporaries — and 3 of the
    activations, kept for the backward pass) fits in a quarter of the free memory."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        lo, hi = CPU_CHUNK_RANGE
        return max(lo, min(hi, CPU_FLOATS // max(num_params, activations, 1)))
    free, _ = torch.cuda.mem_get_info(device)
    per_client = 4 * (8 * num_params + 3 * activations)
    return max(1, min(CUDA_CHUNK_MAX, int(free // 4 // max(per_client, 1))))


def _names(cfg_model: str, client: ClientAlgorithm) -> str:
    name = getattr(client, "registry_name", type(client).__name__)
    return f"model.name={cfg_model!r} with client.algorithm={name!r}"


def trainer_for(sim: CohortHost, plan: RoundPlan) -> VectorizedTrainer | None:
    """The simulator's batched trainer, or None (logged once) when it trains one by one."""
    cfg = sim.cfg
    mode = cfg.run.vectorize
    if mode is False:
        return None
    client = sim.comp.client
    reason = why_sequential(client, cfg)
    trainer = None
    if reason is None:
        k = next((k for k in plan.ctx.cohort if plan.trains(k)), plan.ctx.cohort[0])
        data = sim.exp.clients[k]
        cost = step_cost(sim.model, data, client.spec.batch_size, sim.device)
        d = sim.state.params.numel()
        chunk = chunk_size(cfg.run.vectorize_chunk, sim.device, d, cost.activations)
        trainer = VectorizedTrainer(sim.model, client, sim.device, chunk, cfg.run.amp)
        why = probe(trainer, plan.payload, data)
        if why is not None:
            reason, trainer = f"{_names(cfg.model.name, client)} cannot run batched: {why}", None
        elif mode == "auto" and sim.device.type == "cpu" and cost.flops > CPU_MAX_STEP_FLOPS:
            reason, trainer = (
                f"on CPU a client step of model.name={cfg.model.name!r} costs "
                f"≈ {cost.flops / 1e6:.0f} MFLOP, above the {CPU_MAX_STEP_FLOPS / 1e6:.0f} "
                f"MFLOP where batching pays; run.vectorize=true batches anyway",
                None,
            )
    if trainer is not None and sim.device.type == "cpu":
        keep_freed_memory()  # batched steps reuse MiB-sized blocks (see .heap)
    if trainer is None:
        if mode is True:  # the build-time check passed, so this is a surprise
            raise ConfigError(f"run.vectorize=true: {reason}")
        log.info("run.vectorize=auto: training clients one by one (%s)", reason)
    return trainer


def require_vectorizable(exp: Experiment) -> None:
    """``run.vectorize = true``: a ConfigError naming both keys unless batching works."""
    cfg, client = exp.cfg, exp.components.client
    reason = why_sequential(client, cfg)
    if reason is None:
        trainer = VectorizedTrainer(exp.model, client, exp.device, 2, cfg.run.amp)
        server = exp.components.server
        params, buffers = get_params(exp.model), get_buffers(exp.model)
        ctx = RoundContext(1, (0,), (), cfg.seed, cfg.data.num_clients, exp.device)
        payload = server.broadcast(params, buffers, server.init_state(params), ctx)
        why = probe(trainer, payload, exp.clients[0])
        if why is None:
            return
        reason = f"{_names(cfg.model.name, client)} cannot run batched: {why}"
    raise ConfigError(
        f"run.vectorize=true: {reason}; set run.vectorize='auto' to train such cohorts "
        f"client by client"
    )


__all__ = [
    "CPU_MAX_STEP_FLOPS",
    "StepCost",
    "chunk_size",
    "explain",
    "probe",
    "require_vectorizable",
    "step_cost",
    "trainer_for",
    "why_sequential",
]
