"""Groups a minority of the cohort may own, held or refused at build time
(docs/security.md §2c and §2, the per-block bound).

Depth/width tiers aggregate per coverage group and FedCART aggregates class prototypes over
a class's holders: a group with h holders of which up to min(f, h) may be attackers can be
half attackers under the run's f although the cohort is not
(:func:`~fedshield.sim.byzantine_budget.group_statements`). Nothing is said where nothing
can own a group: no attack configured and no f stated (``server.aggregator_args.f``).
Otherwise, what the run does:

* **A coverage group** (the parameters a deeper tier holds) that its attackers can be half
  of is held by no rule: the per-block bound caps each step's size, not its direction, and
  ``server.round_defenses`` act on the whole step. Measured (early-exit ViT on
  digits, 2 of the 3 full-depth clients attacking with sign_flip): the deep exits end at
  0.10 under median with or without round defenses; FLTrust with 100 root samples did not
  train the shrunk twin at all (0.10 clean, 0.11 attacked), so no root-referenced rule is
  known to hold such a block either. With an attack
  configured and a robust rule the run is **refused** (:class:`~fedshield.errors.ConfigError`,
  one line naming the group; the attack's own count stands in for f under a rule that
  takes none); with a stated f and no attack it is one warning line; under a non-robust
  rule the run has no defense to lose there (one line).
* **A FedCART class** held by few clients: every holder's prototype is first held to what
  an honest prototype can be (:mod:`fedshield.algorithms.server.prototype_bound`), so the
  class prototype stays within an honest one's scale whoever owns the class; its direction
  may still be the attackers'. One line for all such classes.

The groups stay in the run's statement (summary.json ``byzantine.groups``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from fedshield.algorithms.server.cohort import configured_f
from fedshield.config import ExperimentConfig
from fedshield.data import TensorData
from fedshield.errors import ConfigError
from fedshield.registry import tags_of
from fedshield.sim.byzantine_budget import ByzantineBudget, group_statements
from fedshield.sim.state import Components

log = logging.getLogger("fedshield")


def can_be_owned(budget: ByzantineBudget, rule: Any) -> bool:
    """Whether any group can have attackers at all: an attack is configured, or the rule's
    own f is stated (a run that says it defends f attackers)."""
    return budget.mode != "none" or configured_f(rule) is not None


def _round_defenses(comp: Components) -> str:
    """The round defenses the run applies (configured, or the default of a robust rule)."""
    defenses = getattr(comp.server, "round_defenses", None)
    names = [d.name for d in defenses.defenses] if defenses is not None else []
    return f"server.round_defenses={names}" if names else "no server.round_defenses"


def tier_groups(
    comp: Components, model: nn.Module, clients: list[TensorData], num_classes: int
) -> list[tuple[str, list[int]]]:
    """``(name, holders)`` of every coverage group but the shared one (held by everyone:
    the round step's own f check covers it); [] when no client is depth/width-limited."""
    from fedshield.algorithms.server.aggregation import coverage_groups

    m = len(clients)
    masks = [
        comp.client.expected_mask(k, model, clients[k].class_counts(num_classes)) for k in range(m)
    ]
    if all(x is None for x in masks):
        return []
    d = sum(p.numel() for p in model.parameters())
    full = torch.ones(d, dtype=torch.bool, device=next(model.parameters()).device)
    groups = coverage_groups(torch.stack([full if x is None else x for x in masks]))
    return [
        (f"coverage group of {int(c.numel())} parameters", [int(r) for r in rows])
        for rows, c in groups
        if rows.numel() < m
    ]


def class_groups(clients: list[TensorData], num_classes: int) -> list[tuple[str, list[int]]]:
    """``(name, holders)`` of every class: the clients with at least one sample of it."""
    counts = [c.class_counts(num_classes) for c in clients]
    return [
        (f"class {c}", [k for k, n in enumerate(counts) if int(n[c]) > 0])
        for c in range(num_classes)
    ]


def hold_tiers(
    cfg: ExperimentConfig, comp: Components, named: list[tuple[str, list[int]]]
) -> list[dict[str, Any]]:
    """The coverage groups' statements; raises for an attacked run with a robust rule and a
    group its attackers may own (module docstring)."""
    budget, rule = comp.budget, comp.aggregator
    assert budget is not None
    robust = "robust" in tags_of(rule)
    does = (
        "nothing holds it: the per-block bound caps each step's size, not its direction"
        if robust
        else "no defense (the rule is not robust)"
    )
    # A rule that needs no count (FLTrust, BR-DRAG) still faces the attack's own.
    count = budget.quantile_f if budget.mode == "fixed" else budget.attackers
    f = budget.f if budget.f is not None else count
    out = group_statements(named, replace(budget, f=f), rule, does)
    for g in out:
        g["does"] = does
    if not out:
        return out
    g = min(out, key=lambda g: g["holders"])
    where = (
        f"the {g['group']} held by {g['holders']} of {cfg.data.num_clients} clients can have "
        f"{g['attackers']} attackers under f={f}"
    )
    if robust and budget.mode != "none":
        raise ConfigError(
            f"server.aggregator={cfg.server.aggregator!r} with client.params tiers: {where} "
            f"({cfg.attack.name}, attack.fraction={cfg.attack.fraction}, {budget.mode}); no "
            f"rule is known to hold a block its attackers can be half of ({_round_defenses(comp)}"
            "; measured: median 0.10 with or without round defenses); use tiers whose "
            "holders keep an honest majority (client.params.depths) or fewer attackers"
        )
    log.warning(
        "byzantine budget: %s%s: %s (%s)",
        where,
        f" and {len(out) - 1} more coverage group(s)" if len(out) > 1 else "",
        does,
        "an attack of that f would be refused at build time" if robust else _round_defenses(comp),
    )
    return out


def hold_classes(
    cfg: ExperimentConfig, comp: Components, named: list[tuple[str, list[int]]]
) -> list[dict[str, Any]]:
    """FedCART's classes its attackers may own: one line, every class in the statement."""
    budget, rule = comp.budget, comp.aggregator
    assert budget is not None
    does = (
        "each holder's prototype is held to the honest bound (bias simplex, κ × the cohort's "
        "feature scale) before the rule: the class prototype stays within honest scale, its "
        "direction may be the attackers' (they may own the class)"
    )
    out = group_statements(named, budget, rule, does)
    for g in out:
        g["does"] = does
    if out:
        lo, hi = min(g["holders"] for g in out), max(g["holders"] for g in out)
        log.warning(
            "byzantine budget: FedCART %s (%s holder(s) each) can have half or more of their "
            "holders attackers under f=%s: %s; %s act on the model, not on prototypes",
            ", ".join(g["group"] for g in out),
            lo if lo == hi else f"{lo}-{hi}",
            budget.f,
            does,
            _round_defenses(comp),
        )
    return out


def state_groups(
    cfg: ExperimentConfig,
    comp: Components,
    model: nn.Module,
    clients: list[TensorData],
    num_classes: int,
) -> None:
    """The groups' statements in ``comp.budget.groups``, logged once (module docstring);
    raises :class:`ConfigError` for an attacked tier no rule holds."""
    budget, rule = comp.budget, comp.aggregator
    uploads = tags_of(comp.client).get("uploads", frozenset())
    if budget is None or not ({"mask", "prototypes"} & uploads):
        return
    if not can_be_owned(budget, rule):
        budget.groups = []
        return
    statements: list[dict[str, Any]] = []
    if "mask" in uploads:
        statements += hold_tiers(cfg, comp, tier_groups(comp, model, clients, num_classes))
    if "prototypes" in uploads:
        statements += hold_classes(cfg, comp, class_groups(clients, num_classes))
    budget.groups = statements


__all__ = [
    "can_be_owned",
    "class_groups",
    "hold_classes",
    "hold_tiers",
    "state_groups",
    "tier_groups",
]
