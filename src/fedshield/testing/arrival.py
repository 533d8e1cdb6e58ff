"""Fuzz WHICH rows arrive: the round step meets honest dropouts, late
(partial) rows, duplicated rows and forged ids while the attackers always answer.

The simulator side replays a real round (:meth:`Simulator.end_round`, via the
:mod:`fedshield.testing.fuzz` pairs) of S = 10 sampled clients, 2 of them Byzantine
(1e30-scaled or crafted rows, always kept), with a seeded arrival pattern applied to the
honest rows. The Flower side runs the same patterns through a Flower-native strategy's
``aggregate_train`` (:mod:`fedshield.testing.flower_fuzz`'s in-process nodes).

Property (docs/security.md §2c): θ stays finite; no robust rule moves θ beyond
``STEP_FACTOR`` × its clean round's step; and the f the round reports (``sys/f``) is never
below the f of the full cohort — missing, late or duplicated rows never lower it
(``docs/security.md`` §2c, :mod:`fedshield.algorithms.server.cohort`).
"""

from __future__ import annotations

import copy
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ConfigRecord, Message

from fedshield.core.context import ClientUpdate
from fedshield.testing import flower_fuzz as ff
from fedshield.testing import fuzz

#: The bound on one round's step under a robust rule: 10× the clean step.
STEP_FACTOR = 10.0
#: Attackers among the S = 10 sampled rows, and the largest share of the 8 honest rows
#: that goes missing (70 %: 5 of 8).
ATTACKERS = 2
MAX_MISSING = 0.7


def crafted(honest: list[torch.Tensor]) -> torch.Tensor:
    """A crafted in-distribution row (ALIE, Baruch et al. NeurIPS 2019, eq. 3 with z = 1.5):
    the honest mean minus 1.5 coordinate-wise standard deviations — what a rule that trusts
    the bulk of the rows lets through."""
    h = torch.stack([x.double() for x in honest])
    std = h.std(0) if len(honest) > 1 else torch.zeros_like(h[0])
    return (h.mean(0) - 1.5 * std).to(honest[0].dtype)


@dataclass
class Arrival:
    """One arrival pattern: ``missing`` honest rows never answer; ``late`` kept honest rows
    return a quarter of their work (partial local steps); ``duplicate``: an attacker's row
    arrives twice; ``forged``: attacker rows claim an unsampled id and a missing honest
    client's id."""

    missing: int
    late: int = 0
    duplicate: bool = False
    forged: bool = False

    @property
    def label(self) -> str:
        parts = [f"missing{self.missing}"]
        parts += [f"late{self.late}"] if self.late else []
        parts += ["duplicate"] if self.duplicate else []
        parts += ["forged"] if self.forged else []
        return "+".join(parts)


def patterns(honest: int, rng: random.Random, extra: int = 4) -> list[Arrival]:
    """Every dropout count up to ``MAX_MISSING`` of ``honest`` rows alone, then ``extra``
    combinations (seeded dropouts and late rows) with a duplicate, forged ids, both and
    neither."""
    top = math.floor(MAX_MISSING * honest)
    out = [Arrival(k) for k in range(top + 1)]
    for i in range(extra):  # duplicates, forged ids, both, neither; late rows seeded
        k = rng.randint(0, top)
        out.append(Arrival(k, rng.randint(0, honest - k), i % 4 in (0, 2), i % 4 in (1, 2)))
    return out


@dataclass
class SimCase:
    aggregator: str
    attack: str
    pattern: str
    finite: bool
    step: float
    clean_step: float
    f: float | None
    cohort_f: float | None
    robust: bool
    error: str = ""

    @property
    def ok(self) -> bool:
        bounded = not self.robust or self.step <= STEP_FACTOR * self.clean_step
        return not self.error and self.finite and bounded and f_kept(self.f, self.cohort_f)


def f_kept(f: float | None, cohort_f: float | None) -> bool:
    """The round's ``sys/f`` is at least the full cohort's; a rule without a Byzantine count
    (a root-reference rule: BR-DRAG, FLTrust) reports none either way."""
    if cohort_f is None:
        return f is None
    return f is not None and f >= cohort_f


def _clone(u: ClientUpdate, delta: torch.Tensor | None = None, cid: int | None = None) -> Any:
    c = fuzz._clone(u)
    if delta is not None:
        c.delta = delta.clone()
    if cid is not None:
        c.client_id = cid
    return c


def sim_rows(pair: fuzz.Pair, attack: str, a: Arrival, rng: random.Random) -> list[ClientUpdate]:
    """The rows that arrive in ``pair``'s round: the first ``ATTACKERS`` of the cohort are
    Byzantine and always answer; honest rows go missing, late, or are shadowed."""
    rows = pair.honest
    bad, honest = rows[:ATTACKERS], rows[ATTACKERS:]
    if attack == "norm_1e30":
        evil = [u.delta / u.delta.norm().clamp_min(1e-30) * 1e30 for u in bad]
    else:
        evil = [crafted([u.delta for u in honest])] * len(bad)
    order = list(range(len(honest)))
    rng.shuffle(order)
    gone, kept = order[: a.missing], sorted(order[a.missing :])
    late = set(kept[: a.late])
    out = [_clone(u, e) for u, e in zip(bad, evil)]
    out += [_clone(honest[i], 0.25 * honest[i].delta if i in late else None) for i in kept]
    if a.duplicate:
        out.append(_clone(bad[0], evil[0]))
    if a.forged:
        out.append(_clone(bad[1], evil[1], cid=10_000))  # a client nobody sampled
        if gone:  # a missing honest client's id: unverifiable, so it counts as an arrival
            out.append(_clone(honest[gone[0]], evil[1]))
    return out


def run_sim(pair: fuzz.Pair, attack: str, a: Arrival, rng: random.Random,
            clean: tuple[float, float | None]) -> SimCase:  # fmt: skip
    """Replay ``pair``'s round with the rows of ``a`` (``clean``: the full honest cohort's
    step and ``sys/f``)."""
    sim = pair.sim
    sim.state, sim.records = copy.deepcopy(pair.start), []
    ups = sim_rows(pair, attack, a, rng)
    res = SimCase(pair.aggregator, attack, a.label, True, 0.0, clean[0], None, clean[1],
                  pair.robust)  # fmt: skip
    try:
        m = sim.end_round(pair.plan, ups, apply_update_attack=False)
    except Exception as err:  # recorded: the test names the case
        res.error = f"{type(err).__name__}: {err}"
        return res
    res.finite = fuzz._state_finite(sim)
    res.step = float((sim.state.params.double() - pair.start.params.double()).norm())
    res.f = _f(m)
    return res


def _f(m: dict[str, Any]) -> float | None:
    return float(m["sys/f"]) if "sys/f" in m else None


def clean_round(pair: fuzz.Pair) -> tuple[float, float | None]:
    """The full honest cohort's step and reported f."""
    sim = pair.sim
    sim.state, sim.records = copy.deepcopy(pair.start), []
    m = sim.end_round(pair.plan, [fuzz._clone(u) for u in pair.honest], apply_update_attack=False)
    step = float((sim.state.params.double() - pair.start.params.double()).norm())
    return step, _f(m)


# -- Flower ---------------------------------------------------------------------------------


@dataclass
class FlowerCase:
    strategy: str
    attack: str
    pattern: str
    finite: bool
    step: float
    clean_step: float
    f: float | None
    cohort_f: float | None
    kept: float
    missing: int

    @property
    def ok(self) -> bool:
        bounded = self.step <= STEP_FACTOR * self.clean_step
        return self.finite and bounded and f_kept(self.f, self.cohort_f)


def flower_round(
    make: Callable[[], Any], attack: str, a: Arrival | None, rng: random.Random
) -> tuple[float, dict[str, Any], bool]:
    """One round on ``ff.NODES`` in-process nodes; ``a`` None: every node honest and
    answering. Late rows on Flower: an honest node's reply to the previous round's
    instruction (it arrives after the server moved on) beside its partial-work reply."""
    ff.set_task_identity()
    strategy = make()
    arrays = ff._initial()
    nodes = list(range(1, ff.NODES + 1))

    class _Grid:
        def get_node_ids(self) -> list[int]:
            return nodes

    prev = list(strategy.configure_train(1, arrays, ConfigRecord({}), _Grid()))
    for i, msg in enumerate(prev):
        msg.metadata.__dict__["_message_id"] = f"r1-{i}"
    strategy = make()
    sent = list(strategy.configure_train(2, arrays, ConfigRecord({}), _Grid()))
    for i, msg in enumerate(sent):
        msg.metadata.__dict__["_message_id"] = f"r2-{i}"

    def honest_reply(m: Message, scale: float = 0.1) -> Message:
        return ff._reply(m, ff._moved(arrays, int(m.metadata.dst_node_id), scale), 20)

    if a is None:
        replies = [honest_reply(m) for m in sent]
    else:
        bad, honest = sent[:ATTACKERS], sent[ATTACKERS:]
        if attack == "norm_1e30":
            evil = ff._huge(arrays)
        else:
            hs = [ff._moved(arrays, int(m.metadata.dst_node_id), 0.1) for m in honest]
            evil = {k: crafted([torch.from_numpy(h[k]) for h in hs]).numpy() for k in hs[0]}
        order = list(range(len(honest)))
        rng.shuffle(order)
        gone, kept = order[: a.missing], sorted(order[a.missing :])
        late = set(kept[: a.late])
        replies = [ff._reply(m, evil, 20) for m in bad]
        replies += [honest_reply(honest[i], 0.025 if i in late else 0.1) for i in kept]
        replies += [honest_reply(prev[ATTACKERS + i]) for i in late]  # last round's, late
        if a.duplicate:
            replies.append(ff._reply(bad[0], evil, 20))
        if a.forged:
            replies.append(ff._from(ff._reply(bad[1], evil, 20), 4242))
            if gone:
                replies.append(ff._from(ff._reply(bad[1], evil, 20),
                                        int(honest[gone[0]].metadata.dst_node_id)))  # fmt: skip
    new, metrics = strategy.aggregate_train(2, replies)
    layout = ff.ModelLayout.of(arrays)
    before, _ = layout.decode(arrays)
    after = before if new is None else layout.decode(new)[0]
    finite = bool(torch.isfinite(after).all())
    step = float((after.double() - before.double()).norm()) if finite else math.inf
    return step, dict(metrics or {}), finite


def run_flower(names: list[str], attacks: list[str], seed: int = 0) -> list[FlowerCase]:
    """Every named strategy × attack × arrival pattern (seeded)."""
    out = []
    logging.disable(logging.WARNING)
    try:
        for name in names:
            make = ff.STRATEGIES[name]
            clean, cm, _ = flower_round(make, "", None, random.Random(seed))
            cohort_f = _f(cm)
            rng = random.Random(seed)
            for attack in attacks:
                for a in patterns(ff.NODES - ATTACKERS, rng):
                    step, m, finite = flower_round(make, attack, a, rng)
                    out.append(FlowerCase(name, attack, a.label, finite, step, clean, _f(m),
                                          cohort_f, float(m.get("sys/kept", -1)),
                                          a.missing))  # fmt: skip
    finally:
        logging.disable(logging.NOTSET)
    return out


__all__ = [
    "ATTACKERS", "MAX_MISSING", "STEP_FACTOR", "Arrival", "FlowerCase", "SimCase",
    "clean_round", "crafted", "f_kept", "flower_round", "patterns", "run_flower", "run_sim",
    "sim_rows",
]  # fmt: skip
