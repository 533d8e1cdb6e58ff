"""Fuzz the real round loop with crafted uploads (docs/security.md; ``tests/test_round_fuzz.py``).

For a (server algorithm, aggregator) pair the harness builds a small experiment on bundled
data, trains one honest cohort with the configured client algorithm, and then replays the
same round (:meth:`Simulator.end_round`, the code path every backend runs) with some rows
corrupted: NaN/±Inf entries, a wrong shape or dtype, huge finite entries (1e30, 3e38),
zero rows, lying sample counts, non-finite or negative-variance buffers, non-finite or huge
extras, forged coverage masks — in the first 1, half or all of the rows. It records whether
θ, the buffers and the server state stay finite, what the upload checks rejected, and the
size of the step next to the honest rows' scale.

``tools/robustness_report.py`` runs the full cross product and writes
``docs/results/robustness.md``; the test runs a seeded sample of it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fedshield import config as config_mod
from fedshield.core.context import ClientUpdate
from fedshield.errors import ConfigError
from fedshield.registry import tags_of
from fedshield.sim.builder import build
from fedshield.sim.engine import RoundPlan, Simulator

Corruption = Callable[[ClientUpdate, torch.Generator], bool]
"""Corrupts one upload in place; returns False when it does not apply to this upload."""


def _entries(u: ClientUpdate, value: float, g: torch.Generator) -> bool:
    d = u.delta.clone()
    idx = torch.randint(0, d.numel(), (max(1, d.numel() // 100),), generator=g)
    d[idx] = value
    u.delta = d
    return True


def _huge(scale: float) -> Corruption:
    def corrupt(u: ClientUpdate, g: torch.Generator) -> bool:
        sign = torch.randint(0, 2, u.delta.shape, generator=g).to(u.delta.dtype) * 2 - 1
        u.delta = sign * scale
        return True

    return corrupt


def _extra(kind: str) -> Corruption:
    def corrupt(u: ClientUpdate, g: torch.Generator) -> bool:
        floats = [k for k, v in u.extras.items() if v.is_floating_point() and v.numel()]
        if not floats:
            return False
        k = floats[0]
        v = u.extras[k].clone()
        if kind == "nan":
            v.view(-1)[0] = torch.nan
        else:
            v = v * 1e30 + 1e30
        u.extras = dict(u.extras, **{k: v})
        return True

    return corrupt


def _buffers_nan(u: ClientUpdate, g: torch.Generator) -> bool:
    if u.buffers.numel() == 0:
        return False
    b = u.buffers.clone()
    b[0] = torch.nan
    u.buffers = b
    return True


def _buffers_negative(u: ClientUpdate, g: torch.Generator) -> bool:
    if u.buffers.numel() == 0:
        return False
    u.buffers = torch.full_like(u.buffers, -1e30)
    return True


def _mask_forged(u: ClientUpdate, g: torch.Generator) -> bool:
    if u.mask is None:
        return False
    u.mask = torch.ones_like(u.mask)  # claims to hold everything
    return True


def _set(name: str, value: Any) -> Corruption:
    def corrupt(u: ClientUpdate, g: torch.Generator) -> bool:
        setattr(u, name, value)
        return True

    return corrupt


CORRUPTIONS: dict[str, Corruption] = {
    "nan": lambda u, g: _entries(u, float("nan"), g),
    "inf": lambda u, g: _entries(u, float("inf"), g),
    "neg_inf": lambda u, g: _entries(u, float("-inf"), g),
    "wrong_shape": lambda u, g: _set("delta", torch.zeros(u.delta.numel() + 1))(u, g),
    "float64": lambda u, g: _set("delta", u.delta.double())(u, g),
    "huge_1e30": _huge(1e30),
    "huge_3e38": _huge(3e38),
    "zero": lambda u, g: _set("delta", torch.zeros_like(u.delta))(u, g),
    "count_1e9": _set("num_examples", 10**9),
    "count_negative": _set("num_examples", -5),
    "count_fraction": _set("num_examples", 2.5),
    "count_1e400": _set("num_examples", 10**400),  # beyond float64: must not overflow weights
    "buffers_nan": _buffers_nan,
    "buffers_negative": _buffers_negative,
    "extra_nan": _extra("nan"),
    "extra_huge": _extra("huge"),
    "mask_forged": _mask_forged,
    "mask_short": lambda u, g: _set("mask", torch.ones(1, dtype=torch.bool))(u, g),
    "extras_none": _set("extras", None),
    "metrics_garbage": _set("metrics", {"train/loss": "x", "comm/bytes": [1]}),
    # Finite forgeries that keep the honest direction or flip it (ALIE/IPM-like scales),
    # and a bought weight: the largest count the checks accept with a huge row.
    "scaled_minus_100": lambda u, g: _set("delta", -100.0 * u.delta)(u, g),
    "norm_1e30": lambda u, g: _set("delta", u.delta / u.delta.norm().clamp_min(1e-30) * 1e30)(
        u, g
    ),
    "count_2e53_huge": lambda u, g: _set("num_examples", 2**53)(u, g) and _huge(1e30)(u, g),
}

#: Bad rows per case, out of the cohort's S = 10. With masks (tiers [1, 2, 3] cycled over
#: 10 clients) the widest-coverage clients come first: 2 bad rows are a minority of the
#: cohort and the majority of the 3-client deepest tier.
POSITIONS = (1, 2, 5, 10)

#: Aggregator arguments for a cohort of 10 with one tolerated attacker.
AGGREGATOR_ARGS: dict[str, dict[str, Any]] = {
    "krum": {"f": 1},
    "multikrum": {"f": 1},
    "trimmed_mean": {"f": 1},
    "bulyan": {"f": 1},
    "centered_clipping": {"tau": 1.0},
    "norm_clip": {"tau": 1.0},
}

#: The step bound tested under a robust rule with a minority of bad rows:
#: ‖θ⁺ − θ‖ ≤ BOUND · max(η, 1) · B, B = max(largest honest ‖g_m‖, ‖r‖, τ).
BOUND = 3.0


def base_config(
    server: str,
    aggregator: str,
    masks: bool = False,
    defaults: bool = False,
    trust_counts: bool | None = None,
) -> dict[str, Any]:
    """A seconds-long config on bundled digits; the client algorithm and model fit the
    server (the client its ``needs_client`` tag names, FedCART's dual head) or the mask case
    (a tiny multi-exit ViT). ``defaults``: the rule named without arguments (its defaults
    are part of the defense); ``trust_counts``: ``server.trust_counts`` (the fuzz trusts
    them: the count cap under a robust rule must then hold by itself)."""
    raw: dict[str, Any] = {
        "name": f"fuzz-{server}-{aggregator}",
        "seed": 0,
        "rounds": 1000,  # no evaluation inside the replayed round
        "data": {"dataset": "digits", "num_clients": 10, "partition": "iid", "root_size": 60},
        "model": {"name": "mlp", "params": {"hidden": 16, "batchnorm": True}},
        "client": {"algorithm": "sgd", "lr": 0.1, "batch_size": 16, "local_steps": 2},
        "server": {
            "algorithm": server,
            "aggregator": aggregator,
            "aggregator_args": {} if defaults else AGGREGATOR_ARGS.get(aggregator, {}),
            "clients_per_round": 10,
        },
        "eval": {"every": 1000},
        "run": {"progress": False, "device": "cpu"},
    }
    if trust_counts is not None:
        raw["server"]["trust_counts"] = trust_counts
    need = _needs_client(server)
    if need:
        raw["client"]["algorithm"] = need
    if server == "fedcart":
        raw["client"] |= {"algorithm": "fedcart", "params": {"steps": 1, "proto_steps": 0}}
        raw["model"] = {
            "name": "dual_head",
            "params": {"backbone": "mlp", "hidden": 16, "batchnorm": True},
        }
        raw["server"]["params"] = {"match_iters": 2, "retrain_steps": 2}
    if masks:
        raw["model"] = {
            "name": "eevit",
            "params": {"embed_dim": 16, "depth": 3, "num_heads": 2, "patch_size": 4},
        }
        raw["client"] |= {
            "algorithm": "multi_exit",
            "params": {"depths": [1, 2, 3], "optimizer": "sgd"},
            "local_steps": 1,
        }
    return raw


@dataclass
class Pair:
    """One buildable (server, aggregator[, masks]) combination, trained once."""

    server: str
    aggregator: str
    masks: bool
    defaults: bool
    sim: Simulator
    plan: RoundPlan
    honest: list[ClientUpdate]
    start: Any  # the RunState before the replayed round
    robust: bool
    honest_step: float | None = None


@dataclass
class CaseResult:
    server: str
    aggregator: str
    masks: bool
    defaults: bool
    corruption: str
    bad_rows: int
    finite: bool
    robust: bool = False
    rejected: dict[str, float] = field(default_factory=dict)
    step_norm: float = 0.0
    bound: float = float("inf")
    bounded: bool = True
    skipped: bool = False
    #: the round kept θ because the rule could not run or its step was non-finite
    held: bool = False
    error: str = ""
    #: ‖θ⁺ − θ‖ of the same round with no row corrupted (set by the report)
    honest_step: float = 0.0
    #: the bad rows are within what the rule promises to tolerate (f, else a minority)
    in_budget: bool = False


def make_pair(
    server: str,
    aggregator: str,
    masks: bool = False,
    defaults: bool = False,
    trust_counts: bool | None = None,
) -> Pair | None:
    """Build and train one honest cohort; None when the builder refuses the combination."""
    raw = base_config(server, aggregator, masks, defaults, trust_counts)
    try:
        cfg = config_mod.validate(raw, "fuzz config")
        sim = Simulator(build(cfg))
    except ConfigError:
        return None
    plan = sim.begin_round(1)
    honest = sim.train_cohort(plan)
    robust = "robust" in tags_of(sim.comp.aggregator)
    start = copy.deepcopy(sim.state)
    return Pair(server, aggregator, masks, defaults, sim, plan, honest, start, robust)


def _clone(u: ClientUpdate) -> ClientUpdate:
    return ClientUpdate(
        u.client_id,
        u.delta.clone(),
        u.num_examples,
        u.buffers.clone(),
        None if u.mask is None else u.mask.clone(),
        {k: v.clone() for k, v in u.extras.items()},
        dict(u.metrics),
    )


def _coverage(u: ClientUpdate) -> int:
    return u.delta.numel() if u.mask is None else int(u.mask.sum())


def _state_finite(sim: Simulator) -> bool:
    st = sim.state
    tensors = [st.params, st.buffers, *st.server_state.values()]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def run_case(pair: Pair, corruption: str, bad_rows: int, seed: int = 0) -> CaseResult:
    """Replay the pair's round with ``corruption`` applied to ``bad_rows`` rows: those of
    the widest coverage (the smallest coverage groups) first, else the first rows."""
    sim = pair.sim
    sim.state = copy.deepcopy(pair.start)
    sim.records = []
    g = torch.Generator().manual_seed(seed)
    ups = [_clone(u) for u in pair.honest]
    res = CaseResult(
        pair.server,
        pair.aggregator,
        pair.masks,
        pair.defaults,
        corruption,
        bad_rows,
        True,
        pair.robust,
    )
    # The widest-coverage clients first: with masks they form the smallest coverage groups
    # (the deepest tier), where one bad row weighs most; without masks, cohort order.
    order = sorted(range(len(ups)), key=lambda i: -_coverage(ups[i]))
    applied = [CORRUPTIONS[corruption](ups[i], g) for i in order[:bad_rows]]
    if not any(applied):
        res.skipped = True
        return res
    try:
        metrics = sim.end_round(pair.plan, ups, apply_update_attack=False)
    except Exception as err:
        res.finite = False
        res.error = f"{type(err).__name__}: {err}"
        return res
    res.finite = _state_finite(sim)
    res.rejected = {k: v for k, v in metrics.items() if k.startswith("sys/rejected/")}
    res.held = any(metrics.get(k) for k in ("sys/nonfinite_step", "sys/skipped", "sys/failed_step"))
    theta0 = pair.start.params
    res.step_norm = float((sim.state.params.double() - theta0.double()).norm())
    scale = max(float(u.delta.double().norm()) for u in pair.honest)
    scale = max(scale, float(metrics.get("agg/ref_norm", 0.0)))
    scale = max(scale, float(getattr(sim.comp.aggregator, "tau", 0.0) or 0.0))
    lr = max(sim.comp.server.lr, float(metrics.get("agg/eta_g", 1.0)), 1.0)
    res.bound = BOUND * lr * scale
    # A rule with a Byzantine count f promises nothing beyond f bad rows (a user's f = 1
    # with 2 attackers); with f derived, or rules without one, beyond a minority.
    rule = sim.comp.aggregator
    tolerated = rule.f_for(len(ups)) if hasattr(rule, "f_for") else (len(ups) - 1) // 2
    minority = 2 * bad_rows < len(ups) and bad_rows <= max(tolerated, 0)
    res.in_budget = minority
    if pair.robust and minority and pair.server != "fedcart":  # the CART step re-trains h'
        res.bounded = res.step_norm <= res.bound
    return res


def pair_honest_step(pair: Pair) -> float:
    """‖θ⁺ − θ‖ of the pair's round with every row honest (computed once per pair)."""
    if pair.honest_step is None:
        sim = pair.sim
        saved = (sim.state, sim.records)
        sim.state, sim.records = copy.deepcopy(pair.start), []
        sim.end_round(pair.plan, [_clone(u) for u in pair.honest], apply_update_attack=False)
        pair.honest_step = float((sim.state.params.double() - pair.start.params.double()).norm())
        sim.state, sim.records = saved
    return pair.honest_step


def _needs_client(server: str) -> str | None:
    """The client algorithm a server needs (its ``needs_client`` tag), if any."""
    from fedshield.algorithms.server import SERVER_ALGORITHMS

    need = SERVER_ALGORITHMS.entry(server).tag_values("needs_client")
    return min(need) if need else None


def pairs(masks: bool = False) -> Iterator[tuple[str, str]]:
    """Every (server, aggregator) name pair of the package's registries; plugins that other
    code registered in this process are left out, so the grid is the same everywhere."""
    from fedshield.aggregators.base import AGGREGATORS
    from fedshield.algorithms.server import SERVER_ALGORITHMS

    for s in SERVER_ALGORITHMS.package_names():
        if masks and _needs_client(s):  # SCAFFOLD's, FedCART's, FedDyn's: no masks
            continue
        for a in AGGREGATORS.package_names():
            yield s, a


__all__ = [
    "AGGREGATOR_ARGS",
    "BOUND",
    "CORRUPTIONS",
    "POSITIONS",
    "CaseResult",
    "Pair",
    "base_config",
    "make_pair",
    "pairs",
    "run_case",
]
