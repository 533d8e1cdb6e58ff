"""``[faults]`` in the simulator (docs/faults.md): the run's fault plan and the two hooks of
the round loop — the cohort is sampled from the available clients, and only the sampled
clients that answer train (late ones for the steps they finished) and upload.

A client's full local steps and its step cost come from what the server knows: its
partition size and, for depth/width tiers, the share of parameters its expected coverage
mask holds (:meth:`~fedshield.algorithms.client.base.ClientAlgorithm.expected_mask`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from fedshield.algorithms.client.base import ClientAlgorithm
from fedshield.config import ExperimentConfig
from fedshield.core.context import ClientUpdate
from fedshield.errors import ConfigError
from fedshield.faults.base import FaultEnv
from fedshield.faults.plan import FaultPlan, build_models, build_plan
from fedshield.registry import tags_of
from fedshield.sim.arrivals import Arrival
from fedshield.sim.state import Experiment, RoundPlan


def check_faults(cfg: ExperimentConfig) -> None:
    """``[faults]`` checked before any data is loaded: model names, parameters, trace files
    (against ``data.num_clients``)."""
    if cfg.faults is None:
        return
    plan = build_plan(cfg.faults, FaultEnv(cfg.seed, cfg.data.num_clients))
    online = [m.name for m in plan.models if m.stage == "availability"] if plan else []
    if online and cfg.privacy is not None and cfg.privacy.central is not None:
        # Amplification by subsampling needs every client sampled with q = S/M; a client
        # online in few rounds is sampled with up to S/(clients online) when it is.
        raise ConfigError(
            f"faults.models: {', '.join(online)} changes who can be sampled, but "
            f"[privacy.central]'s accountant assumes each client is sampled with q = S/M; "
            f"remove the availability model or the central DP section"
        )


def arrival_of(cfg: ExperimentConfig) -> Arrival | None:
    """What ``[faults]`` does to a round, for the build-time statement
    (:mod:`fedshield.sim.arrivals`): the product of the availability models' rates (a) and
    of the response models' (r), every client taking ``client.local_steps`` (1 when set in
    epochs) at full cost; None without fault models."""
    if cfg.faults is None or not cfg.faults.models:
        return None
    steps = cfg.client.local_steps or 1
    env = FaultEnv(cfg.seed, cfg.data.num_clients, full_steps=lambda k: steps)
    plan = build_plan(cfg.faults, env)
    assert plan is not None  # models are listed
    rates = {"availability": 1.0, "response": 1.0}
    unknown = []
    for m in plan.models:
        r = m.rate(env)
        if r is None:
            unknown.append(m.name)
        else:
            rates[m.stage] *= min(max(float(r), 0.0), 1.0)
    return Arrival(
        rates["availability"],
        rates["response"],
        cfg.faults.invite or "online",
        cfg.faults.attackers_fail,
        tuple(unknown),
    )


def response_models(cfg: ExperimentConfig) -> list[str]:
    """The configured models that act after selection (dropout, deadline)."""
    if cfg.faults is None:
        return []
    models = build_models(cfg.faults.models, cfg.faults.params)
    return [m.name for m in models if m.stage == "response"]


def fault_env(exp: Experiment) -> FaultEnv:
    client, model = exp.components.client, exp.model
    spec = client.spec
    d = sum(p.numel() for p in model.parameters())
    masked = "mask" in tags_of(client).get("uploads", ())

    def full_steps(k: int) -> int:
        return spec.num_steps(len(exp.clients[k]))

    def cost(k: int) -> float:
        if not masked:
            return 1.0
        counts = exp.clients[k].class_counts(exp.bundle.num_classes)
        mask = client.expected_mask(k, model, counts)
        return 1.0 if mask is None else float(mask.sum()) / max(d, 1)

    return FaultEnv(exp.cfg.seed, exp.cfg.data.num_clients, full_steps, cost)


def build_faults(exp: Experiment) -> FaultPlan | None:
    """The run's fault plan (None without ``[faults]`` models)."""
    if exp.cfg.faults is None:
        return None
    return build_plan(exp.cfg.faults, fault_env(exp), exp.byzantine)


def training_plan(plan: RoundPlan) -> RoundPlan:
    """``plan`` for the clients that answer: the dropped and late-dropped ones never train.
    Attackers skip training only while an honest row remains for an omniscient attack."""
    if plan.faults is None:
        return plan
    answering = plan.faults.answering()
    byz = set(plan.ctx.byzantine)
    skip = plan.skip_training and any(k not in byz for k in answering)
    return replace(plan, ctx=replace(plan.ctx, cohort=answering), skip_training=skip)


@contextlib.contextmanager
def capped_steps(client: ClientAlgorithm, steps: int | None) -> Iterator[None]:
    """``client`` trains ``steps`` local steps inside the block (None: its own number), the
    first ``steps`` batches of its usual stream (partial work of a late client)."""
    if steps is None:
        yield
        return
    spec = client.spec
    client.spec = replace(spec, steps=steps, epochs=None)
    try:
        yield
    finally:
        client.spec = spec


def share_kept(kept: Sequence[ClientUpdate], byzantine: Sequence[int]) -> float:
    """The Byzantine share of the rows the rule saw (0 when none was kept)."""
    if not kept:
        return 0.0
    byz = set(byzantine)
    return sum(u.client_id in byz for u in kept) / len(kept)


def round_metrics(plan: RoundPlan, kept: Sequence[ClientUpdate], attacked: bool) -> dict[str, Any]:
    """``faults/*`` of the round and ``byz/share_kept`` (with an attack or faults)."""
    out: dict[str, Any] = {}
    if plan.faults is not None:
        out.update(plan.faults.metrics())
    if attacked or plan.faults is not None:
        out["byz/share_kept"] = share_kept(kept, plan.ctx.byzantine)
    return out


def fault_summary(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The run's faults for summary.json and report.md: mean clients online and sampled
    per round, total dropped / late / partial uploads, the largest Byzantine share of the
    kept rows in any round."""
    if not records:
        return {}
    out = {
        "mean_available": sum(r.get("faults/available", 0.0) for r in records) / len(records),
        "mean_sampled": sum(r.get("faults/sampled", 0.0) for r in records) / len(records),
    }
    for key in ("dropped", "late", "partial", "offline"):
        if key != "offline" or any("faults/offline" in r for r in records):
            out[key] = float(sum(r.get(f"faults/{key}", 0.0) for r in records))
    shares = [r["byz/share_kept"] for r in records if "byz/share_kept" in r]
    if shares:
        out["max_byz_share_kept"] = max(shares)
    return out


__all__ = [
    "arrival_of",
    "build_faults",
    "capped_steps",
    "check_faults",
    "fault_env",
    "fault_summary",
    "response_models",
    "round_metrics",
    "share_kept",
    "training_plan",
]
