"""Fuzz the Flower-native strategies' transport (docs/security.md: *who* sent a reply is untrusted).

Each named strategy of :mod:`fedshield.flower.catalogue` runs one round on 10 in-process
nodes whose honest replies move θ by a small seeded step; then the reply set is forged the
ways an attacker who talks to the strategy directly would: one node's 1e30 reply delivered
again and again, replies to another node's instruction, a reply from a node that was not
sampled, a count of 2⁵³ with a 1e30 model, a reply without any count. Recorded: how many
replies were kept (never more than the sampled nodes), whether θ stayed finite, and the
step against the honest round's step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from torch import nn

from fedshield.flower import catalogue as C
from fedshield.flower.adapter import FedshieldRule
from fedshield.flower.arrays import ModelLayout
from fedshield.flower.local import set_task_identity

NODES = 10


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 5)
        self.fc2 = nn.Linear(5, 3)


def _initial() -> ArrayRecord:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ArrayRecord(_Net().state_dict())


def _moved(arrays: ArrayRecord, seed: int, scale: float) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    return {
        k: (a.numpy() + scale * g.standard_normal(a.numpy().shape)).astype(a.numpy().dtype)
        for k, a in arrays.items()
    }


def _reference(arrays: ArrayRecord, server_round: int) -> ArrayRecord:
    """The server's trusted root training: a fixed small move of θ."""
    return ArrayRecord({k: Array(v) for k, v in _moved(arrays, 999 + server_round, 0.05).items()})


#: Every named strategy, built as a user would (root data where the method needs it).
STRATEGIES: dict[str, Callable[[], FedshieldRule]] = {
    "DRAG": lambda: C.DRAG(),
    "BRDRAG": lambda: C.BRDRAG(reference_fn=_reference),
    "FLTrust": lambda: C.FLTrust(reference_fn=_reference),
    "FedExP": lambda: C.FedExP(),
    "FedACG": lambda: C.FedACG(),
    "FedDyn": lambda: C.FedDyn(),
    "SCAFFOLD": lambda: C.SCAFFOLD(),
    "Krum": lambda: C.Krum(),
    "MultiKrum": lambda: C.MultiKrum(),
    "Median": lambda: C.Median(),
    "TrimmedMean": lambda: C.TrimmedMean(),
    "Bulyan": lambda: C.Bulyan(),
    "GeoMed": lambda: C.GeoMed(),
    "RFA": lambda: C.RFA(weighting="samples"),
    "RAGA": lambda: C.RAGA(),
    "CenteredClipping": lambda: C.CenteredClipping(),
    "NormClip": lambda: C.NormClip(),
    "MDA": lambda: C.MDA(),
    "MeaMed": lambda: C.MeaMed(),
    "MoNNA": lambda: C.MoNNA(reference_fn=_reference),
    "CAF": lambda: C.CAF(),
    "SMEA": lambda: C.SMEA(),
    "DnC": lambda: C.DnC(),
    "SignGuard": lambda: C.SignGuard(),
    "ClippedClustering": lambda: C.ClippedClustering(),
    "RLR": lambda: C.RLR(),
    "FLAME": lambda: C.FLAME(),
    "FoolsGold": lambda: C.FoolsGold(),
    "FedshieldRule(mean)": lambda: FedshieldRule(aggregator="mean"),
}


def _reply(instruction: Message, arrays: dict[str, np.ndarray], count: Any) -> Message:
    metrics = MetricRecord({} if count is None else {"num-examples": count})
    content = RecordDict(
        {"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}), "metrics": metrics}
    )
    return Message(content, reply_to=instruction)


def _huge(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: np.full_like(a.numpy(), 1e30) for k, a in arrays.items()}


def _from(msg: Message, node: int) -> Message:
    msg.metadata.__dict__["_src_node_id"] = node  # what a forged or misrouted reply claims
    return msg


Forge = Callable[[list[Message], list[Message], ArrayRecord], list[Message]]

FORGERIES: dict[str, Forge] = {
    "duplicate_x10": lambda r, s, a: r[1:] + [_reply(s[0], _huge(a), 10)] * 11,
    "wrong_instruction_x10": lambda r, s, a: r
    + [_from(_reply(s[1], _huge(a), 10), s[0].metadata.dst_node_id) for _ in range(10)],
    "unsampled_node": lambda r, s, a: r + [_from(_reply(s[2], _huge(a), 10), 4242)],
    "count_2e53_huge": lambda r, s, a: [_reply(s[0], _huge(a), 2**53), *r[1:]],
    "no_count": lambda r, s, a: [_reply(s[0], _huge(a), None), *r[1:]],
}


@dataclass
class FlowerCase:
    strategy: str
    forgery: str
    kept: int
    sampled: int
    finite: bool
    step: float
    honest_step: float
    robust: bool
    error: str = ""

    @property
    def bounded(self) -> bool:
        """Under a robust rule the step stays within 3× the honest round's step."""
        return not self.robust or self.step <= 3.0 * self.honest_step + 1e-12


def _round(make: Callable[[], FedshieldRule], forge: Forge | None) -> tuple[float, dict, bool]:
    set_task_identity()
    strategy = make()
    arrays = _initial()
    nodes = list(range(1, NODES + 1))

    class _Grid:
        def get_node_ids(self) -> list[int]:
            return nodes

    sent = list(strategy.configure_train(1, arrays, ConfigRecord({}), _Grid()))  # type: ignore[arg-type]
    for i, msg in enumerate(sent):
        msg.metadata.__dict__["_message_id"] = f"fuzz-{i}"  # as a grid does on push
    replies = [_reply(m, _moved(arrays, int(m.metadata.dst_node_id), 0.1), 20) for m in sent]
    if forge is not None:
        replies = forge(replies, sent, arrays)
    new, metrics = strategy.aggregate_train(1, replies)
    layout = ModelLayout.of(arrays)
    before, _ = layout.decode(arrays)
    after = before if new is None else layout.decode(new)[0]
    finite = bool(torch.isfinite(after).all())
    step = float((after.double() - before.double()).norm()) if finite else math.inf
    return step, dict(metrics or {}), strategy.server.robust


def run_cases() -> list[FlowerCase]:
    """Every strategy × every forgery (module docstring)."""
    out = []
    logging.disable(logging.WARNING)
    try:
        for name, make in STRATEGIES.items():
            honest, _, robust = _round(make, None)
            for forgery, forge in FORGERIES.items():
                try:
                    step, m, _ = _round(make, forge)
                except Exception as err:
                    out.append(
                        FlowerCase(name, forgery, -1, NODES, False, math.inf, honest, robust,
                                   f"{type(err).__name__}: {err}")  # fmt: skip
                    )
                    continue
                kept = int(m.get("sys/kept", 0))
                ok = math.isfinite(step)
                out.append(FlowerCase(name, forgery, kept, NODES, ok, step, honest, robust))
    finally:
        logging.disable(logging.NOTSET)
    return out


#: Quiet attackers in an :class:`~fedshield.flower.attacker.AttackedStrategy`:
#: colluding rows at the published radius, an opportunist attacking whenever one attacker
#: is in, directed rows a cache keeps.
QUIET: tuple[tuple[str, dict[str, Any]], ...] = (
    ("stealth", {"h": 1.0}),
    ("opportunist", {"threshold": 1}),
    ("cache_poison", {"scale": 1e6}),
)


@dataclass
class QuietFlowerCase:
    strategy: str
    attack: str
    scale: float
    finite: bool
    rewritten: int = 0
    #: the published radius a stealth attack used last ("step_bound", ...; None: other)
    source: str | None = None
    error: str = ""


def quiet_case(
    name: str,
    attack: str,
    params: dict[str, Any],
    scale: float,
    defenses: tuple[str, ...] = ("cache", "step_bound", "reputation"),
    rounds: int = 2,
) -> QuietFlowerCase:
    """``rounds`` rounds of strategy ``name`` behind ``defenses``, nodes 1–3 Byzantine with
    ``attack`` rewriting their replies in an ``AttackedStrategy`` (the defenses published in
    its context), honest replies moving θ by ``scale`` × a seeded normal draw."""
    from fedshield.crossround import build_round_defenses
    from fedshield.flower.attacker import AttackedStrategy

    case = QuietFlowerCase(name, attack, scale, True)
    logging.disable(logging.WARNING)
    try:
        set_task_identity()
        inner = STRATEGIES[name]()
        inner.server.round_defenses = build_round_defenses(list(defenses), {})  # type: ignore[attr-defined]
        strategy = AttackedStrategy(inner, attack, params, nodes=(1, 2, 3))
        arrays = _initial()
        layout = ModelLayout.of(arrays)
        nodes = list(range(1, NODES + 1))

        class _Grid:
            def get_node_ids(self) -> list[int]:
                return nodes

        for rnd in range(1, rounds + 1):
            grid: Any = _Grid()
            sent = list(strategy.configure_train(rnd, arrays, ConfigRecord({}), grid))
            for i, msg in enumerate(sent):
                msg.metadata.__dict__["_message_id"] = f"quiet-{rnd}-{i}"
            replies = [
                _reply(m, _moved(arrays, 100 * rnd + int(m.metadata.dst_node_id), scale), 20)
                for m in sent
            ]
            new, _ = strategy.aggregate_train(rnd, replies)
            case.rewritten += strategy.last_byzantine
            arrays = arrays if new is None else new
            case.source = getattr(strategy.attack, "last_source", None)
            case.finite = bool(torch.isfinite(layout.decode(arrays)[0]).all())
            if not case.finite:
                break
    except Exception as err:
        case.finite = False
        case.error = f"{type(err).__name__}: {err}"
    finally:
        logging.disable(logging.NOTSET)
    return case


__all__ = [
    "FORGERIES",
    "QUIET",
    "STRATEGIES",
    "FlowerCase",
    "QuietFlowerCase",
    "quiet_case",
    "run_cases",
]
