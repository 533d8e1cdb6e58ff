"""The round loop's hook for defense-aware attacks (``needs_rule`` → ``context=``): the
attack receives the configured rule object (pre-aggregators included) and the server's
weights; only an attack of the known-reference threat model (``needs_reference``) receives
r^t, and it is the r^t the server then aggregates with."""

from __future__ import annotations

import copy
from typing import Any

import torch

from fedshield import config as cfgmod
from fedshield.aggregators.base import AGGREGATORS
from fedshield.aggregators.fltrust import FLTrust
from fedshield.attacks.base import ATTACKS, AttackContext, UpdateAttack
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

SEEN: dict[str, list[Any]] = {"contexts": [], "server_refs": []}


class _Probe(UpdateAttack):
    """Records the context it is given and uploads the honest rows unchanged."""

    needs_rule = True

    def __call__(
        self,
        updates: torch.Tensor,
        byzantine: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        context: AttackContext | None = None,
    ) -> torch.Tensor:
        SEEN["contexts"].append(context)
        return updates.clone()


@ATTACKS.register("_probe_rule", tags=["kind=update", "needs_rule"])
class ProbeRule(_Probe):
    """Test probe: a defense-aware attack that does not know r^t."""


@ATTACKS.register("_probe_known", tags=["kind=update", "needs_rule", "needs_reference"])
class ProbeKnown(_Probe):
    """Test probe: a defense-aware attack that knows r^t."""

    needs_reference = True


@AGGREGATORS.register("_probe_fltrust", tags=["robust", "needs_reference"])
class ProbeFLTrust(FLTrust):
    """Test probe: FLTrust recording the reference the server passes."""

    def aggregate(self, updates, weights=None, *, reference=None):
        SEEN["server_refs"].append(reference.clone())
        return super().aggregate(updates, weights, reference=reference)


def _run(small_cfg: dict, attack: str, **server: Any) -> Simulator:
    raw = copy.deepcopy(small_cfg)
    raw["rounds"] = 2
    raw["data"].update(num_clients=8, root_size=40)
    raw["server"].update(clients_per_round=8, **server)
    raw["attack"] = {"name": attack, "fraction": 0.25, "mode": "per_round"}
    SEEN["contexts"].clear()
    SEEN["server_refs"].clear()
    sim = Simulator(build(cfgmod.validate(raw)))
    sim.run()
    return sim


def test_known_reference_attack_gets_the_servers_root_update(small_cfg: dict) -> None:
    sim = _run(small_cfg, "_probe_known", algorithm="fltrust", aggregator="_probe_fltrust")
    ctxs = SEEN["contexts"]
    assert len(ctxs) == 2 and all(c.rule is sim.comp.aggregator for c in ctxs)
    for ctx, server_ref in zip(ctxs, SEEN["server_refs"], strict=True):
        assert ctx.reference is not None
        assert torch.equal(ctx.reference, server_ref)  # the very r^t the rule runs with
    assert ctxs[0].weights is not None and ctxs[0].weights.shape == (8,)  # samples weighting


def test_other_defense_aware_attacks_get_no_reference(small_cfg: dict) -> None:
    _run(small_cfg, "_probe_rule", algorithm="fltrust", aggregator="fltrust")
    assert SEEN["contexts"] and all(c.reference is None for c in SEEN["contexts"])


def test_the_rule_in_the_context_is_the_composed_rule(small_cfg: dict) -> None:
    sim = _run(
        small_cfg,
        "_probe_rule",
        aggregator="trimmed_mean",
        aggregator_args={"f": 2},
        pre_aggregators=["nnm"],
        weighting="samples",
    )
    ctx = SEEN["contexts"][0]
    assert ctx.rule is sim.comp.aggregator and ctx.rule.registry_name == "nnm+trimmed_mean"
    assert ctx.weights is not None and ctx.weights.shape == (8,)
