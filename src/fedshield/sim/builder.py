"""Config → components: data, partition, model, client/server algorithms, aggregator, attack.

Everything that can be checked without data is checked first (names, method parameters,
aggregator feasibility), so a bad config fails in milliseconds with the key it concerns.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from fedshield.aggregators.base import AGGREGATORS, Aggregator
from fedshield.algorithms.client import CLIENT_ALGORITHMS, LocalSpec
from fedshield.algorithms.server import SERVER_ALGORITHMS
from fedshield.algorithms.server.base import ServerAlgorithm
from fedshield.algorithms.server.cohort import rows_needed
from fedshield.attacks.base import ATTACKS
from fedshield.config import ExperimentConfig
from fedshield.core.params import Params
from fedshield.data import TensorData, carve, load_dataset, make_long_tail, partition
from fedshield.errors import ConfigError
from fedshield.models import build_model
from fedshield.models.base import build_parsed
from fedshield.models.layout import apply_layout, choose_layout
from fedshield.registry import Entry, tags_of
from fedshield.sim.byzantine_budget import (
    SKIP_WARN,
    ByzantineBudget,
    auto_invited,
    default_invited,
    recommendation,
    run_budget,
)
from fedshield.sim.majorities import state_groups
from fedshield.sim.state import Components, Experiment

if TYPE_CHECKING:  # at run time imported inside the functions that use it
    from fedshield.crossround.recommended import ThreatModel

log = logging.getLogger("fedshield")
#: The build-time recommendation line, which ``fedshield run`` shows on the console.
statement_log = logging.getLogger("fedshield.statement")


def load_plugins(modules: list[str] | tuple[str, ...] = ()) -> None:
    """Import every module that registers components (built-in, entry points, ``modules``)."""
    from fedshield.plugins import load_plugins as load

    load(modules)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"run.device={name!r}: not a device (auto, cpu, cuda[:N], mps)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"run.device={name!r} but no CUDA device is available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"run.device={name!r}: only {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"run.device={name!r} but MPS is not available")
    return dev


def read_sections(cfg: ExperimentConfig) -> dict[str, Params]:
    """The validated parameters of the run's dataset, partitioner and model, each read once:
    ``data.params``, ``data.partition`` (from the ``[data]`` fields its schema declares) and
    ``model.params`` (absent for a plugin model whose factory forwards ``**kwargs``);
    :func:`build_components` adds each evaluator's ``eval.params.<name>``."""
    from fedshield.data import parse_dataset_params, partitioner_params
    from fedshield.models.base import MODELS, forwards_kwargs, parse_model_params

    d = cfg.data
    out = {
        "data.params": parse_dataset_params(d.dataset, d.params),
        "data.partition": partitioner_params(d.partition, d),
    }
    if not forwards_kwargs(MODELS.entry(cfg.model.name, "model.name")):
        out["model.params"] = parse_model_params(cfg.model.name, cfg.model.params)
    return out


def check_data_sizes(cfg: ExperimentConfig, train_size: int | None, parsed: Params) -> None:
    """Sizes impossible for a train split of ``train_size`` samples (the dataset's declared
    size; None: unknown before the files are read): root/val sets that leave nothing, more
    clients than samples, ``min_size`` × clients or shards beyond the samples. The long-tail
    profile only removes samples, so the declared size bounds what the partition gets and
    a config refused here could not run; the same checks run again on the loaded data.
    ``parsed``: the partitioner's parameters (:func:`read_sections`)."""
    from fedshield.data import check_carve, check_sizes

    if train_size is None:
        return
    d = cfg.data
    sizes = {k: v for k, v in {"root": d.root_size, "val": d.val_size}.items() if v > 0}
    n = check_carve(train_size, sizes) if sizes else train_size
    where = f" ({d.dataset!r} has {train_size} training samples"
    where += f", {n} after the root/validation sets)" if sizes else ")"
    try:
        check_sizes(n, d.num_clients, d.partition, d.min_size, parsed=parsed)
    except ConfigError as err:
        raise ConfigError(f"{err}{where}") from None


def _check_tags(
    cfg: ExperimentConfig, entries: dict[str, Entry[Any]], model_tags: dict[str, frozenset[str]]
) -> None:
    """Compatibility of the chosen components, decided from their registry tags."""
    client, server, agg = (entries[k] for k in ("client", "server", "aggregator"))
    family = model_tags.get("family", frozenset())
    model_name = cfg.model.name
    for key, e in (
        ("client.algorithm", client),
        *[(f"eval.metrics ({n})", entries[n]) for n in cfg.eval.metrics],
    ):
        need = e.tag_values("needs_model")
        if need and family and not need & family:
            raise ConfigError(
                f"{key}={e.name!r} needs a model of family {' or '.join(sorted(need))}, but "
                f"model.name={model_name!r} is {' / '.join(sorted(family))}"
            )
    need_client = server.tag_values("needs_client")
    if need_client and client.name not in need_client:
        raise ConfigError(
            f"server.algorithm={server.name!r} needs client.algorithm="
            f"{' or '.join(repr(n) for n in sorted(need_client))}, got {client.name!r}"
        )
    for tag in server.tag_values("needs_aggregator"):
        if not (agg.has(tag) or getattr(agg.obj, tag, False) is True):
            raise ConfigError(
                f"server.algorithm={server.name!r} needs a server.aggregator tagged {tag!r} "
                f"(e.g. drag, brdrag, fltrust), got {agg.name!r}"
            )


def derive_byzantine_count(
    rule: Aggregator, entry: Entry[Any], cfg: ExperimentConfig, invited: int | None = None
) -> Aggregator:
    """A rule whose schema has a Byzantine count ``f`` left unset gets it from the attack
    budget (:func:`fedshield.sim.byzantine_budget.run_budget`): per_round, the exact count
    ⌊fraction × S⌋; fixed, the ``attack.f_quantile`` quantile of the hypergeometric count
    per cohort — within what S rows allow (logged). Without an attack it stays unset and
    the round step gives it its breakdown on the sampled cohort (never a silent 0)."""
    if "f" not in entry.schema.model_fields or getattr(rule, "f", 0) is not None:
        return rule
    if cfg.attack.name == "none" or cfg.attack.fraction <= 0:
        return rule
    budget = _budget(rule, cfg, invited)
    wanted = budget.attackers if budget.mode == "per_round" else budget.quantile_f
    f = budget.f
    if f is None:
        return rule
    if wanted is not None and f < wanted:
        log.warning(
            "server.aggregator=%r: attack.fraction=%s (%s) means f=%d of S=%d, more than the "
            "rule tolerates; using its largest f=%d",
            entry.name,
            cfg.attack.fraction,
            cfg.attack.mode,
            wanted,
            cfg.server.clients_per_round,
            f,
        )
    return rule.replace(f=f)


def _budget_args(cfg: ExperimentConfig) -> dict[str, Any]:
    from fedshield.sim.faults import arrival_of

    a = cfg.attack
    return {
        "mode": a.mode,
        "fraction": a.fraction,
        "population": cfg.data.num_clients,
        "cohort": cfg.server.clients_per_round,
        "f_quantile": a.f_quantile,
        "attacked": a.name != "none",
        "arrival": arrival_of(cfg),
    }


def invited_count(cfg: ExperimentConfig, rule: Aggregator) -> int:
    """S': the clients invited per round (``server.over_select``): ⌈factor·S⌉ (at most M)
    for a number, the statement's choice for ``"auto"``
    (:func:`fedshield.sim.byzantine_budget.auto_invited`; S without [faults]). Unset, it is
    ``"auto"`` under [faults] where the rounds would otherwise skip
    (:func:`fedshield.sim.byzantine_budget.default_invited`: attacked runs only where that
    makes them live) — a robust rule needs rows that dropouts, availability and deadlines
    take away (a median named alone skipped 28 of 30 rounds at 30 % dropout; docs/faults.md,
    liveness) — and S otherwise; ``over_select = 1`` opts out."""
    s, m, over = cfg.server.clients_per_round, cfg.data.num_clients, cfg.server.over_select
    if over is not None and over != "auto":
        return min(m, math.ceil(float(over) * s - 1e-9))
    args = _budget_args(cfg)
    if args["arrival"] is None:
        return s
    return auto_invited(rule, **args) if over == "auto" else default_invited(rule, **args)


def _budget(rule: Aggregator, cfg: ExperimentConfig, invited: int | None = None) -> ByzantineBudget:
    return run_budget(rule, **_budget_args(cfg), invited=invited)


def _threat(cfg: ExperimentConfig) -> ThreatModel:
    from fedshield.crossround import recommended

    return recommended.ThreatModel(cfg.data.root_size > 0, cfg.attack.mode, cfg.faults is not None)


def default_pre_aggregators(cfg: ExperimentConfig, entry: Entry[Any]) -> tuple[list[str], str]:
    """``server.pre_aggregators`` as the run applies them, and what the console line says of
    them. Set, or with ``server.round_defenses`` set (the defense configured by hand,
    ``[]`` included: a paper's bare rule), they are the configured ones. Otherwise a rule
    tagged ``robust`` and named alone runs behind the pre-aggregators of its recommended
    configuration (:func:`fedshield.crossround.recommended.for_rule` over every candidate
    that runs it; a ``reference_free`` rule no candidate runs, behind the no-root
    recommendation's): the median behind nearest-neighbour mixing (Allouah et al., "Fixing
    by Mixing", AISTATS 2023), whose candidate holds every measured cell better than the
    bare median's (docs/cross-round.md, "Default"). None under ``[privacy.central]``, as for
    the round defenses. Resolved here, not written into the config, so a resumed or replayed
    run resolves the same."""
    from fedshield.crossround import recommended

    s = cfg.server
    names = list(s.pre_aggregators)
    hand = names or s.pre_aggregator_args or s.round_defenses is not None
    if hand or not entry.has("robust"):
        return names, ""
    if cfg.privacy is not None and cfg.privacy.central is not None:
        return names, ""
    conf = recommended.for_rule(_threat(cfg), entry.name, None)
    # a rule no candidate runs gets the no-root recommendation's: mixing is defined for the
    # reference-free rules (Allouah et al.), not for one that scores rows by a reference
    foreign = conf.rule() != entry.name and not entry.has("reference_free")
    if not conf.pre_aggregators or foreign:
        return names, ""
    return list(conf.pre_aggregators), f"pre-aggregators [{', '.join(conf.pre_aggregators)}] and "


def default_round_defenses(
    cfg: ExperimentConfig, entry: Entry[Any], pre: tuple[list[str], str] | None = None
) -> tuple[list[str], str]:
    """``server.round_defenses`` as the run applies them, and what the console line says of
    them. Set (``[]`` included: the opt-out), they are the configured ones. Unset, a rule
    tagged ``robust`` gets the recommended round defenses for the run's threat model
    (:func:`fedshield.crossround.recommended.for_rule`): a rule called robust is meant to
    hold the rounds its cohort's attackers outnumber it too (docs/cross-round.md,
    "Default"), with or without a simulated ``[attack]`` (a deployment has none), less those
    that keep a model per client (:func:`~fedshield.crossround.recommended.default_defenses`);
    under
    ``[privacy.central]`` none, whose accounting covers no round defense. ``pre``: the
    pre-aggregators the run applies (:func:`default_pre_aggregators`; default: the
    configured ones). Resolved here, not written into the config, so a config without the
    key hashes as before."""
    from fedshield.crossround import recommended

    s = cfg.server
    pre_names, pre_said = pre if pre is not None else (list(s.pre_aggregators), "")
    if s.round_defenses is not None:
        names = list(s.round_defenses)
        return names, f"server.round_defenses={names}" if names else "no round defenses"
    if not entry.has("robust"):
        return [], "no round defenses"
    if cfg.privacy is not None and cfg.privacy.central is not None:
        return [], "no round defenses by default under [privacy.central] (not in its accounting)"
    conf = recommended.for_rule(_threat(cfg), entry.name, pre_names)
    kept, heavy = recommended.default_defenses(conf)
    less = f" less {', '.join(heavy)}: O(M·d) memory, opt in" if heavy else ""
    return list(kept), (
        f"{pre_said}round defenses [{', '.join(kept)}] by default for the robust rule "
        f"{entry.name!r} "
        f"(those of {conf.name!r}{less}; opt out: server.round_defenses = [])"
    )


#: Under [faults] a robust rule named alone also gets ``fill`` where its cache — a row of θ
#: and a coverage mask per client, in the server state and every checkpoint — fits in this.
FILL_DEFAULT_BYTES = 256 * 2**20


def default_fill(
    cfg: ExperimentConfig,
    defenses: tuple[list[str], str],
    meta: nn.Module | None,
    uploads: frozenset[str],
) -> tuple[list[str], str]:
    """The default round defenses with ``fill`` in front under ``[faults]`` (docs/faults.md,
    liveness): attackers always answer while honest clients drop out or miss deadlines, so
    the rows that arrive over-represent attackers (at 30 % attackers and 60 % honest
    dropout they are half of them) and the cached rows of the silent invitees give the rule
    back the invited cohort's share. Only where the defaults were not set by hand, the
    cache fits :data:`FILL_DEFAULT_BYTES`, the client uploads no method extras and
    attackers are not re-drawn per round (the pairs the builder refuses)."""
    names, said = defenses
    a = cfg.attack
    if (
        cfg.server.round_defenses is not None
        or not names
        or "fill" in names
        or cfg.faults is None
        or meta is None
        or uploads - {"mask"}
        or (a.name != "none" and a.mode == "per_round")
    ):
        return defenses
    d = sum(p.numel() for p in meta.parameters())
    size = cfg.data.num_clients * d * (meta_bytes(meta) + 1)
    mib = f"{size / 2**20:.3g} MiB"
    if size > FILL_DEFAULT_BYTES:
        return names, f"{said}; not fill under [faults]: its cache would hold {mib}, opt in"
    return ["fill", *names], f"{said}; fill under [faults] (a cached row per client: {mib})"


def short_rounds(cfg: ExperimentConfig) -> str:
    """``server.short_rounds`` as the run applies it (unset: the servers' default, pad)."""
    return cfg.server.short_rounds or ServerAlgorithm.short_rounds


def meta_bytes(meta: nn.Module) -> int:
    """Bytes per parameter of the model's floating dtype."""
    return next((p.element_size() for p in meta.parameters() if p.is_floating_point()), 4)


def state_budget(
    cfg: ExperimentConfig,
    rule: Aggregator,
    invited: int | None = None,
    defenses: tuple[list[str], str] | None = None,
    pre: list[str] | None = None,
) -> ByzantineBudget:
    """The run's Byzantine statement (logged) for the built rule; refuses a rule that
    cannot outvote that f on the sampled cohort even when every client answers (a rule
    behind Bucketing: f attackers spoil up to f of the ⌈S/s⌉ buckets). Under [faults] the
    liveness line too: who arrives, the expected share of skipped rounds (a warning above
    a tenth). ``defenses``: the round defenses the run applies and their phrase
    (:func:`default_round_defenses`; default: the configured ones). The recommendation
    line goes to the console (logger ``fedshield.statement``, which ``fedshield run``
    shows). ``pre``: the pre-aggregators the run applies (default: the configured ones)."""
    pre = list(cfg.server.pre_aggregators) if pre is None else pre
    if defenses is None:
        names = list(cfg.server.round_defenses or [])
        defenses = names, f"server.round_defenses={names}" if names else "no round defenses"
    applied, said = defenses
    budget = _budget(rule, cfg, invited)
    s = budget.asked
    need = rows_needed(rule, budget.f)
    if need is None or need > s:
        raise ConfigError(
            f"server.aggregator={cfg.server.aggregator!r} behind server.pre_aggregators "
            f"[{', '.join(pre) or 'none'}] cannot outvote f={budget.f} Byzantine clients of "
            f"a cohort of S={s} (needs {need or 'more'} rows); set server.aggregator_args.f, "
            "a smaller bucket size or a larger server.clients_per_round"
        )
    line = budget.line(repr(rule))
    if budget.p_exceeds > 0:  # what acts on the rounds the rule cannot defend alone
        line += f"; {said}"
    (log.warning if budget.p_exceeds >= 0.01 else log.info)(line)
    fills = "fill" in applied
    pads = short_rounds(cfg) == "pad"
    live = budget.liveness_line(repr(rule), fills, pads)
    if live is not None and budget.arrival is not None:
        skips = budget.arrival["p_skip"] > SKIP_WARN and not (fills or pads)
        (log.warning if skips else log.info)(live)
    # fill added by default under [faults] is liveness, not a departure from the
    # recommendation (whose defenses were measured without faults)
    liveness = ["fill"] if cfg.server.round_defenses is None else []
    server = {
        "algorithm": cfg.server.algorithm,
        "aggregator": cfg.server.aggregator,
        "pre_aggregators": list(pre),
        "round_defenses": [n for n in applied if n not in liveness],
    }
    budget.recommended = recommendation(
        root=cfg.data.root_size > 0,
        mode=cfg.attack.mode,
        faults=cfg.faults is not None,
        server=server,
    )
    budget.recommended["round_defenses"] = {"applied": applied, "said": said}
    log.info(budget.recommended["line"])
    statement_log.info("%s; this run: %s", budget.recommended["short"], said)
    return budget


def build_components(cfg: ExperimentConfig) -> Components:
    """Every component, validated against its registry schema and tags, before any data is
    loaded: names (did-you-mean), nested parameters, compatibility, device."""
    from fedshield.data import dataset_info
    from fedshield.eval import EVALUATORS
    from fedshield.eval.base import check_evaluators
    from fedshield.models import model_tags
    from fedshield.models.base import meta_model

    load_plugins(cfg.plugins)
    c, s, d = cfg.client, cfg.server, cfg.data
    # Each registry entry's parameters are read once here; build() takes them from
    # Components.parsed (the same values, no second validation).
    parsed = read_sections(cfg)
    info = dataset_info(d.dataset, parsed["data.params"])
    check_data_sizes(cfg, info.train_size, parsed["data.partition"])
    model_params = parsed.get("model.params", cfg.model.params)
    tags = model_tags(cfg.model.name, model_params)
    meta = None
    if info.input_shape is not None and info.num_classes is not None:
        # The whole model section against the data's shape, on the meta device (no memory);
        # pretrained weights are files, checked when the model is really built.
        meta = meta_model(cfg.model.name, info.input_shape, info.num_classes, model_params)
        tags = tags_of(meta)
    entries: dict[str, Entry[Any]] = {}
    for name in cfg.eval.metrics:
        entries[name] = EVALUATORS.entry(name, "eval.metrics")
        where = f"eval.params.{name}"
        parsed[where] = entries[name].parse(cfg.eval.params.get(name, {}), where)
    unlisted = sorted(set(cfg.eval.params) - set(cfg.eval.metrics))
    for name in unlisted:  # a preset's params stay when eval.metrics drops the evaluator
        EVALUATORS.entry(name, f"eval.params.{name}")  # a typo is still refused
        log.warning("eval.params.%s is ignored: %r is not in eval.metrics", name, name)
    if info.num_classes is not None:  # else after loading, in build()
        check_evaluators(cfg.eval.metrics, cfg.eval.params, info.num_classes, parsed)
    spec = LocalSpec(
        lr=c.lr,
        batch_size=c.batch_size,
        steps=c.local_steps,
        epochs=c.local_epochs,
        momentum=c.momentum,
        weight_decay=c.weight_decay,
    )
    entries["client"] = CLIENT_ALGORITHMS.entry(c.algorithm, "client.algorithm")
    client = entries["client"].obj(spec, entries["client"].parse(c.params, "client.params"))

    entries["server"] = SERVER_ALGORITHMS.entry(s.algorithm, "server.algorithm")
    server_cls = entries["server"].obj
    if "aggregator" not in s.model_fields_set:  # e.g. server.algorithm = "drag" → "drag" rule
        s.aggregator = server_cls.default_aggregator
    entries["aggregator"] = AGGREGATORS.entry(s.aggregator, "server.aggregator")
    agg_args = entries["aggregator"].parse(s.aggregator_args, "server.aggregator_args")
    probe = entries["aggregator"].obj(**agg_args.kwargs())
    pre = default_pre_aggregators(cfg, entries["aggregator"])
    if pre[0] or s.pre_aggregator_args:  # the rows the rule needs behind them
        from fedshield.preaggregators import compose

        probe = compose(pre[0], s.pre_aggregator_args, probe, cfg.seed)
    invited = invited_count(cfg, probe)
    aggregator = derive_byzantine_count(
        entries["aggregator"].obj(**agg_args.kwargs()), entries["aggregator"], cfg, invited
    )
    if pre[0] or s.pre_aggregator_args:  # NNM, Bucketing, ... in front of the rule
        from fedshield.preaggregators import compose

        aggregator = compose(pre[0], s.pre_aggregator_args, aggregator, cfg.seed)
    try:
        aggregator.validate(s.clients_per_round)
    except ConfigError as err:
        raise ConfigError(f"server.aggregator={s.aggregator!r}: {err}") from None
    _check_tags(cfg, entries, tags)
    if meta is not None:
        client.check_model(meta)  # tiers and exit layout against the model, before data
    defenses = default_round_defenses(cfg, entries["aggregator"], pre)
    defenses = default_fill(cfg, defenses, meta, tags_of(client).get("uploads", frozenset()))
    budget = state_budget(cfg, aggregator, invited, defenses, pre[0])
    server = server_cls(
        aggregator,
        lr=s.lr,
        weighting=s.weighting,
        params=entries["server"].parse(s.params, "server.params"),
    )
    # No attack: its breakdown on S (not on S' invited: over-selection must not ask the rule
    # for every invited row); the round step caps it by the breakdown on the cohort asked.
    server.byzantine_f = budget.f
    server.short_rounds = short_rounds(cfg)
    if getattr(client.params, "proto_views", None) == "sum" and hasattr(server, "proto_bias_max"):
        server.proto_bias_max = 2.0  # FedCART: summed views double an honest bias entry
    names = defenses[0]
    if names or s.round_defense_args:  # cached rows, step bound (crossround)
        from fedshield.crossround import build_round_defenses, check_compatible

        built = build_round_defenses(names, s.round_defense_args)
        if built is not None:
            uploads = tags_of(client).get("uploads", frozenset())
            check_compatible(
                built, uploads, cfg.privacy is not None and cfg.privacy.central is not None
            )
            a = cfg.attack
            if "fill" in names and a.name != "none" and a.mode == "per_round":
                # A client's cached row may be from a round it attacked in: a filled row
                # could add a Byzantine row beyond this round's ⌊fraction·S⌋.
                raise ConfigError(
                    "server.round_defenses: 'fill' lends cached rows, and under "
                    "attack.mode='per_round' a client's cached row may be from a round it "
                    "attacked in; use attack.mode='fixed' or another defense"
                )
            server.round_defenses = built

    attack = None
    if cfg.attack.name != "none":
        entry = ATTACKS.entry(cfg.attack.name, "attack.name")
        attack = entry.obj(**entry.parse(cfg.attack.params, "attack.params").kwargs())
    elif cfg.attack.fraction > 0:
        raise ConfigError(
            f"attack.fraction={cfg.attack.fraction} but attack.name='none'; "
            f"choose an attack (see `fedshield list attacks`)"
        )
    if server.needs_root and cfg.data.root_size == 0:
        raise ConfigError(
            f"server.aggregator={s.aggregator!r} needs a root dataset: set data.root_size > 0"
        )
    resolve_device(cfg.run.device)
    if cfg.faults is not None:  # fault model names, parameters, trace files
        from fedshield.sim.faults import check_faults

        check_faults(cfg)
    comp = Components(client, server, aggregator, attack, budget, parsed)
    if cfg.privacy is not None and meta is not None:  # what cannot be private, before data
        from fedshield.privacy.checks import check_central, check_local

        if cfg.privacy.central is not None:
            check_central(cfg, comp, meta)
        if cfg.privacy.local is not None:
            check_local(cfg, comp, meta)
    return comp


def check_coverage(
    cfg: ExperimentConfig,
    comp: Components,
    model: nn.Module,
    clients: list[TensorData],
    num_classes: int,
) -> None:
    """Refuse, before training, a rule that can run on no cohort at all for some parameters:
    with depth/width-limited clients the rule runs per coverage group (docs/security.md §2), and a
    group held by fewer clients than the rule's minimum (Krum's 2f + 3, ...) even under full
    participation is undefined. Smaller cohorts at run time degrade safely instead."""
    from fedshield.algorithms.server.aggregation import adapted_rule, coverage_groups

    if "mask" not in tags_of(comp.client).get("uploads", ()):
        return
    rule = comp.aggregator
    if "min_clients" not in tags_of(rule):
        return
    d = sum(p.numel() for p in model.parameters())
    full = torch.ones(d, dtype=torch.bool, device=next(model.parameters()).device)
    masks = [
        comp.client.expected_mask(k, model, clients[k].class_counts(num_classes))
        for k in range(cfg.data.num_clients)
    ]
    if all(m is None for m in masks):
        return
    stacked = torch.stack([full if m is None else m for m in masks])
    s = cfg.server.clients_per_round
    for rows, cols in coverage_groups(stacked):
        n = min(int(rows.numel()), s)
        run = adapted_rule(rule, n)
        if run is None or run is not rule:
            raise ConfigError(
                f"server.aggregator={cfg.server.aggregator!r} with "
                f"server.aggregator_args={cfg.server.aggregator_args} cannot aggregate the "
                f"{cols.numel()} parameters held by only {rows.numel()} of "
                f"{cfg.data.num_clients} clients (client.params sets the depth/width tiers); "
                f"use fewer Byzantine slots (f), deeper tiers or another rule"
            )


def choose_byzantine(cfg: ExperimentConfig) -> tuple[int, ...]:
    """The fixed Byzantine set A (DRAG paper, Sec. I-A): round(fraction·M) workers chosen by the
    seed."""
    if cfg.attack.name == "none" or cfg.attack.mode != "fixed":
        return ()
    m = cfg.data.num_clients
    a = int(round(cfg.attack.fraction * m))
    rng = np.random.default_rng([cfg.seed, 0xB1A5])
    return tuple(sorted(int(i) for i in rng.choice(m, size=a, replace=False)))


def build(
    cfg: ExperimentConfig, components: Components | None = None, bundle: Any = None
) -> Experiment:
    """Data, partition and model for ``cfg``; ``components`` (fresh, from
    :func:`build_components` on the same config) saves checking them a second time;
    ``bundle`` (the loaded dataset of ``cfg.data``, never modified here) saves loading it
    again for runs of the same data (``fedshield bench``)."""
    if components is None:
        components = build_components(cfg)
    device = resolve_device(cfg.run.device)
    d = cfg.data
    parsed = components.parsed
    if bundle is None:
        bundle = load_dataset(d.dataset, d.root, d.download, parsed["data.params"])
    train = bundle.train
    if d.long_tail.rho > 1:
        train = make_long_tail(train, bundle.num_classes, d.long_tail.rho, cfg.seed)
    sizes = {k: v for k, v in {"root": d.root_size, "val": d.val_size}.items() if v > 0}
    train, held = carve(train, sizes, cfg.seed) if sizes else (train, {})
    parts = partition(
        train.y, d.num_clients, d.partition, cfg.seed, min_size=d.min_size,
        parsed=parsed["data.partition"],
    )  # fmt: skip
    clients = [train.subset(p) for p in parts]
    if device.type == "cuda":  # small federated datasets fit on the device: no per-step copies
        clients = [c.to(device) for c in clients]
    torch.manual_seed(cfg.seed)
    if "model.params" in parsed:
        model = build_parsed(
            cfg.model.name, bundle.input_shape, bundle.num_classes, parsed["model.params"]
        )
    else:
        model = build_model(
            cfg.model.name, bundle.input_shape, bundle.num_classes, **cfg.model.params
        )
    model.to(device)
    setting = cfg.run.memory_format or "auto"
    layout, why = choose_layout(setting, tags_of(model), bundle.input_shape, device)
    apply_layout(model, layout)
    log.info("memory layout: %s (%s)", layout, why)
    check_coverage(cfg, components, model, clients, bundle.num_classes)
    state_groups(cfg, components, model, clients, bundle.num_classes)
    from fedshield.eval.base import check_evaluators

    check_evaluators(cfg.eval.metrics, cfg.eval.params, bundle.num_classes, parsed)
    exp = Experiment(
        cfg=cfg,
        components=components,
        bundle=bundle,
        clients=clients,
        train=train,
        root=held.get("root"),
        val=held.get("val"),
        model=model,
        byzantine=choose_byzantine(cfg),
        device=device,
    )
    if cfg.run.vectorize is True:  # "auto" decides (and logs) at the first round instead
        from fedshield.sim.vectorized import require_vectorizable

        require_vectorizable(exp)
    return exp
