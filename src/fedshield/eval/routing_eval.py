"""Early-exit routing evaluators (early-exit ViT paper, Sec. III-D–G, §IV).

``routing`` — clean routing of the global multi-exit model:

* global test set: full depth (top-1/top-5), per-exit accuracy, DepthFL's exit ensemble,
  and for every global policy (``a = 0``: fixed, global_resource, robust) accuracy, top-5,
  exit histogram, average depth ē, depth saving 1 − ē/L and the accept/defer
  decomposition 𝓔_{e|A_e}, 𝓔_{e|D_e}, 𝓔_{e+1|D_e};
* client-local test data: mean / worst client accuracy and depth for all five policies
  (client-aware ones use the client's S_k, so they are evaluated only here, as the seed
  prescribes) and for full depth;
* the client profile S_k and its two terms (early-exit ViT paper, eqs. 4–7), computed by
  default on the model before round 1, θ^0 (``profile_on = "initial"``, early-exit ViT paper:
  "profiled once before the first communication round"), or on the evaluated model
  (``profile_on = "final"``).

``routing_adv`` — the same global policies on FGSM and PGD-10 examples generated against
the deepest exit (``model(x)``) with ε ∈ {1e-4, 1e-3, 1e-2}; no adversarial training.
Beside each policy's accuracy and depth saving: every exit's accuracy on the attacked
inputs and each policy's deferral gain per exit, Pr(D_e)(𝓔_{e|D_e} − 𝓔_{e+1|D_e}) (the
early-exit ViT paper's risk decomposition, eqs. 13–14: deferring helps exactly where it is
positive), so a routing claim under attack can be read against what the exits themselves do.

Our choices (all parameters): client-local test sets are drawn from the global test set
with each client's training label distribution (``client_test_size`` samples, per-class
counts by largest remainder, without replacement while a class has enough test samples);
clients are profiled on up to ``profile_samples`` of their training samples (a seeded
subset, the same at every evaluation, so S_k on θ^0 is one fixed vector per run). On θ^0
the exit heads are untrained (random init, even with a pretrained trunk), so the
confidence term U_k varies little between clients and the label entropy dominates S_k
after min–max normalisation; ``profile_on = "final"`` profiles on the trained model
instead. PGD's step is
``pgd_step_ratio`` · ε (2.5ε/10 = ε/4, Madry et al.) with a uniform random start.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, cast

import numpy as np
import torch
from pydantic import Field, field_validator
from torch import Tensor, nn

from fedshield.adversarial import fgsm, pgd
from fedshield.core.context import make_generator
from fedshield.core.flat import get_buffers, get_params, set_buffers, set_params
from fedshield.core.params import Params, parse_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.eval.base import EVALUATORS, EvalInputs
from fedshield.routing import (
    POLICIES,
    ClientProfile,
    named_policy,
    profile_clients,
    route,
    routing_metrics,
)

ALL_POLICIES = ("fixed", "global_resource", "robust", "client_resource", "client_robust")
GLOBAL_POLICIES = ("fixed", "global_resource", "robust")
_CLIENT_TEST, _PROFILE, _ADV = 0xC7, 0x9F, 0xAD  # purposes mixed into derived seeds


def _need_exits(model: nn.Module) -> None:
    if not hasattr(model, "forward_exits"):
        raise ConfigError(
            "eval.metrics 'routing'/'routing_adv' need a multi-exit model "
            f"(model.name = 'eevit' or 'eevit_small'), got {type(model).__name__}"
        )


@torch.no_grad()
def exit_probs(
    model: nn.Module,
    x: Tensor,
    batch_size: int,
    device: torch.device,
    depth: int | None = None,
) -> Tensor:
    """Softmax of exits 1..depth, ``[L, N, C]`` float32 on the CPU."""
    out = []
    for start in range(0, x.shape[0], batch_size):
        xb = x[start : start + batch_size].to(device)
        if xb.dtype == torch.uint8:
            xb = xb.float().div_(255.0)
        logits = model.forward_exits(xb, depth)  # type: ignore[operator]
        out.append(torch.stack([z.float().softmax(-1) for z in logits]).cpu())
    return torch.cat(out, dim=1)


def _float_x(data: TensorData) -> Tensor:
    return data.x.float().div(255.0) if data.x.dtype == torch.uint8 else data.x


def _acc(probs: Tensor, labels: Tensor) -> float:
    return float((probs.argmax(-1) == labels).double().mean()) if labels.numel() else float("nan")


def topk_acc(probs: Tensor, labels: Tensor, k: int = 5) -> float:
    """Top-k accuracy of ``[N, C]`` probabilities (k capped at C)."""
    k = min(k, probs.shape[-1])
    hit = (probs.topk(k, dim=-1).indices == labels[:, None]).any(-1)
    return float(hit.double().mean()) if labels.numel() else float("nan")


def client_test_sets(
    test: TensorData,
    clients: Sequence[TensorData],
    num_classes: int,
    size: int,
    seed: int,
) -> list[TensorData]:
    """Per-client test subsets with the client's training label distribution (our choice;
    the bundles carry no per-client test split). Per-class counts by largest remainder;
    drawn without replacement while the class has enough test samples, else with."""
    rng = np.random.default_rng([seed, _CLIENT_TEST])
    by_class = [np.flatnonzero(test.y.numpy() == c) for c in range(num_classes)]
    out = []
    for data in clients:
        q = data.class_counts(num_classes).double().numpy()
        q = q / q.sum()
        raw = q * size
        counts = np.floor(raw).astype(int)
        rest = size - counts.sum()
        counts[np.argsort(-(raw - counts), kind="stable")[:rest]] += 1
        idx = []
        for c, n in enumerate(counts):
            pool = by_class[c]
            if n == 0 or pool.size == 0:
                continue
            idx.append(rng.choice(pool, size=n, replace=n > pool.size))
        sel = torch.from_numpy(np.concatenate(idx)) if idx else torch.zeros(0, dtype=torch.long)
        out.append(test.subset(sel))
    return out


def _policy_dict(prefix: str, probs: Tensor, labels: Tensor, policy: str) -> dict[str, float]:
    """One global policy's metrics; per-exit accuracy is policy-free, so reported once."""
    exit_idx, _ = route(probs, policy)
    metrics = routing_metrics(probs, labels, exit_idx).as_dict(prefix)
    out = {k: v for k, v in metrics.items() if not k.endswith("/acc") or k == f"{prefix}/acc"}
    routed = probs.gather(0, exit_idx[None, :, None].expand(1, -1, probs.shape[-1]))[0]
    out[f"{prefix}/top5"] = topk_acc(routed, labels)
    return out


def _check_policies(names: Sequence[str]) -> list[str]:
    for name in names:
        POLICIES.get(name)  # raises naming the registered policies
    return list(names)


def _registered_policies(names: list[str], global_only: bool = False) -> list[str]:
    """A schema validator: every name a registered routing policy (did-you-mean), so a typo
    fails when the config is built, before data, not after the last round's training."""
    for name in names:
        if name not in POLICIES:
            close = difflib.get_close_matches(name, POLICIES.names(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown routing policy {name!r}{hint}; known: {', '.join(POLICIES.names())}"
            )
        if global_only and named_policy(name).client_aware:
            raise ValueError(f"{name!r} is client-local: use global policies (a = 0)")
    return names


class RoutingParams(Params):
    policies: list[str] = Field(
        list(ALL_POLICIES), description="registered routing policies to evaluate"
    )

    @field_validator("policies")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        return _registered_policies(v)

    client_test_size: int = Field(
        200, ge=1, description="samples in each client-local test set (drawn from the test set)"
    )
    profile_on: Literal["initial", "final"] = Field(
        "initial",
        description="profile clients on θ^0, the model before round 1 (early-exit ViT paper), "
        "or on the evaluated model",
    )
    profile_samples: int = Field(
        512, ge=1, description="training samples per client used for the confidence term"
    )
    num_shallow: int = Field(2, ge=1, description="P, the shallow exits of the profile")
    entropy_weight: float = Field(0.6, ge=0.0, description="weight of the label entropy H̃_k")
    confidence_weight: float = Field(
        0.4, ge=0.0, description="weight of the confidence deficit Ũ_k"
    )


class RoutingAdvParams(Params):
    policies: list[str] = Field(
        list(GLOBAL_POLICIES), description="global routing policies (a = 0) to attack"
    )

    @field_validator("policies")
    @classmethod
    def _known_global(cls, v: list[str]) -> list[str]:
        return _registered_policies(v, global_only=True)

    attacks: list[Literal["fgsm", "pgd"]] = Field(
        ["fgsm", "pgd"], description="attacks generated against the deepest exit"
    )
    eps: list[float] = Field([1e-4, 1e-3, 1e-2], description="ℓ∞ budgets ε (inputs in [0, 1])")
    pgd_steps: int = Field(10, ge=1, description="PGD iterations (early-exit ViT paper: 10)")
    pgd_step_ratio: float = Field(0.25, gt=0.0, description="PGD step size as a multiple of ε")
    adv_samples: int | None = Field(
        None, ge=1, description="seeded random test subset to attack; None = all"
    )
    clamp: tuple[float, float] | None = Field(
        (0.0, 1.0), strict=False, description="valid pixel range of the attacked inputs"
    )


_NEEDS_EXITS = ["needs_model=multi_exit"]


@contextmanager
def _weights(model: nn.Module, state: tuple[Tensor, Tensor] | None) -> Iterator[None]:
    """Temporarily load (params, buffers) into ``model``; restore the evaluated weights."""
    if state is None:
        yield
        return
    saved = (get_params(model).clone(), get_buffers(model).clone())
    try:
        set_params(model, state[0].to(saved[0].device))
        set_buffers(model, state[1].to(saved[1].device))
        yield
    finally:
        set_params(model, saved[0])
        set_buffers(model, saved[1])


def client_profile(model: nn.Module, inputs: EvalInputs, p: RoutingParams) -> ClientProfile:
    """S_k of every client (early-exit ViT paper) from its class counts and the shallow-exit
    confidence of θ^0 (``profile_on = "initial"``) or of the evaluated model (``"final"``) on a
    seeded subset of ≤ ``profile_samples`` of its training samples."""
    if p.profile_on == "initial" and inputs.initial is None:
        raise ConfigError(
            "eval.params.routing.profile_on = 'initial' needs the model before round 1 "
            "(EvalInputs.initial), which this caller does not provide; set profile_on = 'final'"
        )
    state = inputs.initial if p.profile_on == "initial" else None
    num_exits = cast(int, model.num_exits)  # a multi-exit model (see _need_exits)
    g = make_generator(inputs.seed, _PROFILE)
    shallow = []
    with _weights(model, state):
        for data in inputs.clients:
            n = len(data)
            sel = (
                torch.randperm(n, generator=g)[: p.profile_samples]
                if n > p.profile_samples
                else None
            )
            x = data.x if sel is None else data.x[sel]
            depth = min(p.num_shallow, num_exits)
            shallow.append(exit_probs(model, x, inputs.batch_size, inputs.device, depth=depth))
    counts = torch.stack([c.class_counts(inputs.bundle.num_classes).cpu() for c in inputs.clients])
    return profile_clients(
        counts,
        shallow,
        num_shallow=p.num_shallow,
        entropy_weight=p.entropy_weight,
        confidence_weight=p.confidence_weight,
    )


@EVALUATORS.register("routing", schema=RoutingParams, tags=_NEEDS_EXITS)
def routing_eval(model: nn.Module, inputs: EvalInputs, **params: Any) -> dict[str, float]:
    """Evaluates clean routing of the global multi-exit model on the global test set and on
    client-local test data, with the client profile S_k (early-exit ViT paper)."""
    p = parse_params(RoutingParams, params, "eval.params.routing")
    assert isinstance(p, RoutingParams)
    _need_exits(model)
    names = _check_policies(p.policies)
    dev, bs = inputs.device, inputs.batch_size
    test = inputs.bundle.test
    probs = exit_probs(model, test.x, bs, dev)
    labels = test.y.cpu()
    num_exits = probs.shape[0]
    out: dict[str, float] = {
        "route/full/acc": _acc(probs[-1], labels),
        "route/full/top5": topk_acc(probs[-1], labels),
        "route/ensemble/acc": _acc(probs.mean(0), labels),
    }
    for e in range(num_exits):
        out[f"route/exit/{e + 1}/acc"] = _acc(probs[e], labels)

    profile = client_profile(model, inputs, p)
    for k in range(len(inputs.clients)):
        out[f"profile/{k}/score"] = float(profile.score[k])
        out[f"profile/{k}/label_entropy"] = float(profile.label_entropy[k])
        out[f"profile/{k}/confidence_deficit"] = float(profile.confidence_deficit[k])

    for name in names:
        if not named_policy(name).client_aware:
            out.update(_policy_dict(f"route/{name}", probs, labels, name))

    # Client-local test data: every policy, client-aware ones with the client's S_k.
    local = client_test_sets(
        test, inputs.clients, inputs.bundle.num_classes, p.client_test_size, inputs.seed
    )
    local_probs = [exit_probs(model, d.x, bs, dev) for d in local]
    full = [_acc(pr[-1], d.y) for pr, d in zip(local_probs, local)]
    out["route_local/full/mean_acc"] = float(np.mean(full))
    out["route_local/full/worst_acc"] = float(np.min(full))
    for name in names:
        accs, depths = [], []
        for k, (pr, d) in enumerate(zip(local_probs, local)):
            m = routing_metrics(pr, d.y, route(pr, name, float(profile.score[k]))[0])
            accs.append(m.accuracy)
            depths.append(m.avg_depth)
        key = f"route_local/{name}"
        out[f"{key}/mean_acc"] = float(np.mean(accs))
        out[f"{key}/worst_acc"] = float(np.min(accs))
        out[f"{key}/avg_depth"] = float(np.mean(depths))
        out[f"{key}/depth_saving"] = 1 - float(np.mean(depths)) / num_exits
    return out


@EVALUATORS.register("routing_adv", schema=RoutingAdvParams, tags=_NEEDS_EXITS)
def routing_adv_eval(model: nn.Module, inputs: EvalInputs, **params: Any) -> dict[str, float]:
    """Evaluates the global routing policies' accuracy and depth saving under FGSM and PGD
    examples generated against the deepest exit (early-exit ViT paper)."""
    p = parse_params(RoutingAdvParams, params, "eval.params.routing_adv")
    assert isinstance(p, RoutingAdvParams)
    _need_exits(model)
    names = _check_policies(p.policies)
    if any(named_policy(n).client_aware for n in names):
        raise ConfigError("eval.params.routing_adv.policies: use global policies (a = 0)")
    attacks, eps, adv_samples, clamp = p.attacks, p.eps, p.adv_samples, p.clamp
    pgd_steps, pgd_step_ratio = p.pgd_steps, p.pgd_step_ratio
    dev, bs = inputs.device, inputs.batch_size
    test = inputs.bundle.test
    n = len(test) if adv_samples is None else min(adv_samples, len(test))
    # A seeded random subset, so a capped evaluation is not biased by the test-set order.
    sel = torch.randperm(len(test), generator=make_generator(inputs.seed, _ADV))[:n]
    x_all, y_all = _float_x(test)[sel], test.y[sel]
    clamp_t = clamp  # the schema's (lo, hi) tuple or None
    # Clean routing on the same subset: the reference each attacked number compares with.
    clean = exit_probs(model, x_all, bs, dev)
    out: dict[str, float] = {"route_adv/clean/full/acc": _acc(clean[-1], y_all)}
    for name in names:
        m = routing_metrics(clean, y_all, route(clean, name)[0])
        out[f"route_adv/clean/{name}/acc"] = m.accuracy
        out[f"route_adv/clean/{name}/depth_saving"] = m.depth_saving
    for attack in attacks:
        for i, e in enumerate(eps):
            gen = make_generator(inputs.seed, inputs.round, _ADV, i)
            advs = []
            for start in range(0, n, bs):
                xb, yb = x_all[start : start + bs].to(dev), y_all[start : start + bs].to(dev)
                if attack == "fgsm":
                    advs.append(fgsm(model, xb, yb, e, clamp=clamp_t).cpu())
                else:
                    step = pgd_step_ratio * e
                    adv = pgd(model, xb, yb, e, step, pgd_steps, clamp=clamp_t, generator=gen)
                    advs.append(adv.cpu())
            probs = exit_probs(model, torch.cat(advs), bs, dev)
            key = f"route_adv/{attack}/{e:g}"
            out[f"{key}/full/acc"] = _acc(probs[-1], y_all)
            for j in range(probs.shape[0]):
                out[f"{key}/exit/{j + 1}/acc"] = _acc(probs[j], y_all)
            for name in names:
                m = routing_metrics(probs, y_all, route(probs, name)[0])
                out[f"{key}/{name}/acc"] = m.accuracy
                out[f"{key}/{name}/depth_saving"] = m.depth_saving
                for dec in m.decomposition:
                    out[f"{key}/{name}/exit/{dec.exit}/deferral_gain"] = dec.deferral_gain
    return out


__all__ = [
    "ALL_POLICIES",
    "GLOBAL_POLICIES",
    "RoutingAdvParams",
    "RoutingParams",
    "client_profile",
    "client_test_sets",
    "exit_probs",
    "routing_adv_eval",
    "routing_eval",
    "topk_acc",
]
