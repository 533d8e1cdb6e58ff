"""``[privacy]`` compatibility, decided before any data (docs/privacy.md): which components a
DP mechanism can cover. Called by the builder on the meta-device model and by
:func:`fedshield.flower.privacy.central_dp`; the runtime part (noise calibration from the
client sizes, accounting) is :mod:`fedshield.sim.privacy`."""

from __future__ import annotations

import importlib.util
from typing import Any

from torch import nn

from fedshield.errors import ConfigError
from fedshield.privacy.local import model_problems
from fedshield.privacy.sensitivity import bound_fn
from fedshield.registry import tags_of


def need_opacus(key: str) -> None:
    if importlib.util.find_spec("opacus") is None:
        raise ConfigError(f"{key} needs Opacus: pip install 'fedshield[privacy]'")


# -- client-level central DP -------------------------------------------------------------


def central_server_ok(server: Any) -> bool:
    """True when the server's registry entry declares ``central_dp``: it releases nothing
    computed from the uploads but the noised aggregate (θ^{t+1} = θ^t + η·Δ̃ and
    post-processing of it), as FedAvg, BR-DRAG, FLTrust and FedACG (momentum of Δ̃) do."""
    return "central_dp" in tags_of(server)


def check_central(cfg: Any, comp: Any, model: nn.Module) -> None:
    """The ConfigError of a ``[privacy.central]`` that cannot hold for these components and
    this model (structure only: run before data on the meta-device model)."""
    from fedshield.aggregators.drag import Drag
    from fedshield.aggregators.mean import Mean
    from fedshield.core.flat import get_buffers

    pc = cfg.privacy.central
    assert pc is not None
    key = "privacy.central"
    need_opacus(key)
    if not central_server_ok(comp.server):
        raise ConfigError(
            f"{key}: server.algorithm={cfg.server.algorithm!r} computes more than the noised "
            f"aggregate from the uploads (its own step or reference), which the noise does "
            f"not cover; use fedavg, brdrag, fltrust or fedacg"
        )
    uploads = sorted(comp.client.upload_spec(model))
    if uploads or "mask" in tags_of(comp.client).get("uploads", ()):
        what = ", ".join(uploads) if uploads else "coverage masks"
        raise ConfigError(
            f"{key}: client.algorithm={cfg.client.algorithm!r} uploads {what}, which the "
            f"server would use without clipping or noise (per-coverage-group aggregation has "
            f"group-size-dependent sensitivity and masks reveal each client's depth); "
            f"central DP supports clients that upload only their update"
        )
    if get_buffers(model).numel():
        raise ConfigError(
            f"{key}: model.name={cfg.model.name!r} has buffers (BatchNorm statistics) that "
            f"the server averages without noise; use a model without them (e.g. mlp, "
            f"cnn_small)"
        )
    rule = comp.aggregator
    if bound_fn(rule) is None:
        raise ConfigError(
            f"{key}: server.aggregator={cfg.server.aggregator!r} has no known L2 sensitivity "
            f"bound; declare one with fedshield.privacy.register_bound"
        )
    if isinstance(rule, (Mean, Drag)) and cfg.server.weighting != "uniform":
        raise ConfigError(
            f"{key} with server.aggregator={cfg.server.aggregator!r} needs "
            f"server.weighting='uniform' (DP-FedAvg's fixed denominator S; sample-count "
            f"weights make the sensitivity depend on the counts), got "
            f"{cfg.server.weighting!r}"
        )


def check_local(cfg: Any, comp: Any, model: nn.Module) -> None:
    """The ConfigError of a ``[privacy.local]`` that these components and this model cannot
    run (structure only: run before data on the meta-device model)."""
    pl = cfg.privacy.local
    assert pl is not None
    key = "privacy.local"
    need_opacus(key)
    client, name = comp.client, cfg.client.algorithm
    tags = tags_of(client)  # declared on the registry entry (fedshield.registry.TAGS)
    if "local_dp" not in tags:
        raise ConfigError(
            f"{key}: client.algorithm={name!r} runs its own training loop, which Opacus' "
            f"DP-SGD is not wired into; use sgd, fedprox, fedacg, scaffold or an "
            f"adversarial-training client (fedpgd, fedfat, fedtrades, fedmart, calfat)"
        )
    uploads = sorted(client.upload_spec(model))
    if uploads and "dp_uploads" not in tags:
        raise ConfigError(
            f"{key}: client.algorithm={name!r} uploads {', '.join(uploads)}, computed from "
            f"its data outside the DP-SGD gradients"
        )
    if getattr(client.params, "attack_eval_mode", True) is False:
        raise ConfigError(
            f"{key} with client.algorithm={name!r} needs client.params.attack_eval_mode=true: "
            f"per-sample gradients are captured from training-mode forward passes only, so "
            f"the attack's forward/backward passes must run in eval mode"
        )
    problems = model_problems(model)
    if problems:
        raise ConfigError(
            f"{key}: Opacus cannot compute per-sample gradients of model.name="
            f"{cfg.model.name!r} with client.algorithm={name!r}: {'; '.join(problems)}"
        )


__all__ = ["central_server_ok", "check_central", "check_local", "need_opacus"]
