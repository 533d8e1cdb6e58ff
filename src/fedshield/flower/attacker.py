"""fedshield's attacks in someone else's Flower app: chosen nodes turned into attackers.

Score your own Flower strategy under attack without writing an attacker client. Two
pieces, used alone or together, with any registered attack (``fedshield list attacks``):

* :func:`attacker_mod` — a Flower client mod. On the nodes you choose (by
  ``partition-id``, else node id) it runs your ClientApp's training honestly, then
  applies a **row-local** update attack to that node's own update (``sign_flip``,
  ``scaling``, ``model_replacement``'s boost) and returns the forged model. Data attacks
  (``label_flip``, ``backdoor``, ``model_replacement``'s poisoning) need your data: call
  ``mod.poison(context, x, y, num_classes)`` where your ``train`` loads it (it returns the
  data unchanged on honest nodes). For an attack that needs the other nodes' updates
  (``alie``, ``min_max``, ``alie_opt``, ``mimic``, ... and ``noise``, which draws from
  the round's shared stream) the node only marks its honest reply as Byzantine (a
  ``ConfigRecord`` ``fs.attacker``) and leaves the rewrite to the strategy wrapper; such
  an attack is refused at construction unless you say so (``rewritten_by_strategy=True``),
  as the mod alone would do nothing.
* :class:`AttackedStrategy` — wraps any Message-API strategy (Flower's ``FedAvg``,
  ``FedMedian``, ``Krum``, fedshield's :mod:`~fedshield.flower.strategies`, yours). Before
  your strategy aggregates, it forms the round's pseudo-gradients g_m = θ_m − θ^t over the
  floating-point arrays, rewrites the Byzantine rows (replies marked by the mod, or from
  the node ids you name) with the attack — omniscient attacks read every reply, as the
  literature's colluding adversary does — strips the marks, and hands the replies on.
  Defense-aware attacks (``needs_rule``) are given your strategy's rule: fedshield's
  strategies expose theirs (``strategy.server.aggregator``); for any other strategy pass
  ``rule=`` (a registered name or an :class:`~fedshield.aggregators.base.Aggregator`;
  default the sample-weighted mean, Flower's ``FedAvg``). The known-reference threat model
  (``adaptive_root``) gets r^t from ``reference_fn`` when you give one.

::

    mod = attacker_mod("alie", nodes={0, 1}, rewritten_by_strategy=True)
    app = ClientApp(mods=[mod])                   # your ClientApp, unchanged otherwise
    strategy = AttackedStrategy(FedAvg(), "alie")  # your strategy, wrapped
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from torch import Tensor

from fedshield import attacks
from fedshield.aggregators.base import AGGREGATORS, Aggregator
from fedshield.attacks.base import AttackContext, DataAttack, UpdateAttack, published_state
from fedshield.core.context import make_generator
from fedshield.errors import ConfigError
from fedshield.flower.byzantine import local_update_attack

#: the record a Byzantine node adds to its reply for the strategy wrapper (stripped there)
MARK = "fs.attacker"
#: purpose mixed into the attack generator's seed (distinct from the simulator's streams)
_FLOWER_ATTACK = 0xA77


def _build(attack: str | UpdateAttack | DataAttack, params: dict[str, Any] | None) -> Any:
    if isinstance(attack, str):
        return attacks.build(attack, **(params or {}))
    if params:
        raise ValueError("params= is for an attack given by name")
    return attack


def _is_train(msg: Message) -> bool:
    return msg.metadata.message_type == "train"


def float_keys(record: ArrayRecord) -> list[str]:
    """The keys of the floating-point arrays of a record, in record order."""
    return [k for k, a in record.items() if np.issubdtype(np.dtype(a.dtype), np.floating)]


def flat(record: ArrayRecord, keys: list[str]) -> Tensor:
    """Those arrays as one float64 vector."""
    parts = [np.asarray(record[k].numpy(), dtype=np.float64).reshape(-1) for k in keys]
    return torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.float64)


def with_flat(record: ArrayRecord, keys: list[str], vec: Tensor) -> ArrayRecord:
    """A copy of ``record`` whose arrays ``keys`` hold ``vec`` (each in its own dtype and
    shape; values beyond that dtype's range are clamped to it)."""
    out: dict[str, Array] = {}
    offset = 0
    values = vec.detach().cpu().numpy()
    for k, a in record.items():
        arr = a.numpy()
        if k in keys:
            n = arr.size
            chunk = values[offset : offset + n].reshape(arr.shape)
            info = np.finfo(arr.dtype)
            arr = np.clip(chunk, info.min, info.max).astype(arr.dtype)
            offset += n
        out[k] = Array(np.ascontiguousarray(arr))
    return ArrayRecord(out)


class AttackerMod:
    """The client mod of :func:`attacker_mod` (call it as a Flower mod; see the module
    docstring). ``nodes``: partition ids (node ids where the node config has none)."""

    def __init__(
        self,
        attack: str | UpdateAttack | DataAttack,
        nodes: Collection[int],
        params: dict[str, Any] | None = None,
        *,
        arrays_key: str = "arrays",
        seed: int = 0,
        rewritten_by_strategy: bool = False,
    ) -> None:
        self.attack = _build(attack, params)
        strategy_side = isinstance(self.attack, UpdateAttack) and not local_update_attack(
            self.attack
        )  # read off the attack's declaration (fedshield.flower.byzantine)
        if strategy_side and not rewritten_by_strategy:  # alone the mod would only mark
            name = attack if isinstance(attack, str) else type(self.attack).__name__
            raise ConfigError(
                f"attacker_mod({name!r}): this attack needs the other clients' updates "
                f"(or the server's rule), which a client mod never sees; the mod only "
                f"marks its nodes' replies for AttackedStrategy(your_strategy, {name!r}) "
                f"on the server. Wrap your strategy and pass rewritten_by_strategy=True"
            )
        self.nodes = frozenset(int(n) for n in nodes)
        self.arrays_key = arrays_key
        self.seed = seed

    def is_attacker(self, context: Context) -> bool:
        pid = context.node_config.get("partition-id")
        return int(pid if pid is not None else context.node_id) in self.nodes

    def poison(
        self, context: Context, x: Tensor, y: Tensor, num_classes: int
    ) -> tuple[Tensor, Tensor]:
        """(x, y) poisoned by a data attack on an attacker node, else unchanged."""
        if isinstance(self.attack, DataAttack) and self.is_attacker(context):
            return self.attack.poison(x, y, num_classes)
        return x, y

    def __call__(
        self, msg: Message, context: Context, call_next: Callable[..., Message]
    ) -> Message:
        if not _is_train(msg) or not self.is_attacker(context):
            return call_next(msg, context)
        reply = call_next(msg, context)
        if reply.has_error() or not isinstance(self.attack, UpdateAttack):
            return reply
        if not local_update_attack(self.attack):  # needs the other nodes: the strategy's job
            reply.content[MARK] = ConfigRecord({"byzantine": True})
            return reply
        start = msg.content.array_records[self.arrays_key]
        trained = reply.content.array_records[self.arrays_key]
        keys = float_keys(trained)
        theta = flat(start, keys)
        row = (flat(trained, keys) - theta)[None, :]
        config = msg.content.config_records.get("config", ConfigRecord())
        rnd = int(config.get("server-round", 0))  # type: ignore[arg-type]  # a record value
        gen = make_generator(self.seed, rnd, context.node_id % 2**31, _FLOWER_ATTACK)
        forged = self.attack(row, torch.ones(1, dtype=torch.bool), generator=gen)[0]
        reply.content[self.arrays_key] = with_flat(trained, keys, theta + forged)
        return reply


def attacker_mod(
    attack: str | UpdateAttack | DataAttack,
    nodes: Collection[int],
    params: dict[str, Any] | None = None,
    **kwargs: Any,
) -> AttackerMod:
    """A Flower client mod turning the nodes ``nodes`` into attackers with ``attack`` (a
    registered name with its ``params``, or an attack object). See the module docstring."""
    return AttackerMod(attack, nodes, params, **kwargs)


class AttackedStrategy(Strategy):
    """``strategy`` with the Byzantine replies rewritten by ``attack`` before it
    aggregates (module docstring). ``nodes``: node ids that are Byzantine whatever their
    replies say (besides the replies an :func:`attacker_mod` marked)."""

    def __init__(
        self,
        strategy: Strategy,
        attack: str | UpdateAttack,
        params: dict[str, Any] | None = None,
        *,
        nodes: Collection[int] = (),
        rule: str | Aggregator | None = None,
        reference_fn: Callable[[int, ArrayRecord], Tensor] | None = None,
        arrays_key: str = "arrays",
        weighted_by_key: str = "num-examples",
        seed: int = 0,
    ) -> None:
        self.strategy = strategy
        self.attack = _build(attack, params)
        if not isinstance(self.attack, UpdateAttack):
            raise ValueError(
                f"AttackedStrategy rewrites updates; {type(self.attack).__name__} is a data "
                "attack: use attacker_mod(...).poison on the attacker nodes"
            )
        self.nodes = frozenset(int(n) for n in nodes)
        self.rule = AGGREGATORS.build(rule) if isinstance(rule, str) else rule
        self.reference_fn = reference_fn
        self.arrays_key = arrays_key
        self.weighted_by_key = weighted_by_key
        self.seed = seed
        self._start: dict[int, ArrayRecord] = {}
        #: Byzantine replies rewritten in the last round (for inspection)
        self.last_byzantine = 0

    # -- the wrapped strategy -------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._start = {server_round: arrays}  # θ^t, the origin of the pseudo-gradients
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Any:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()

    def __getattr__(self, name: str) -> Any:  # the wrapped strategy's own attributes
        if name.startswith("__") or "strategy" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["strategy"], name)

    # -- the attack -----------------------------------------------------------------------
    def _rule(self) -> Aggregator | None:
        if self.rule is not None:
            return self.rule
        server = getattr(self.strategy, "server", None)
        return getattr(server, "aggregator", None)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        ok = [m for m in replies if not m.has_error() and self.arrays_key in m.content]
        byz = [MARK in m.content or m.metadata.src_node_id in self.nodes for m in ok]
        for m in ok:
            if MARK in m.content:
                del m.content[MARK]
        self.last_byzantine = sum(byz)
        start = self._start.get(server_round)
        if self.last_byzantine and start is not None:
            self._rewrite(server_round, start, ok, byz)
        return self.strategy.aggregate_train(server_round, replies)

    def _rewrite(
        self, server_round: int, start: ArrayRecord, ok: list[Message], byz: list[bool]
    ) -> None:
        keys = float_keys(start)
        theta = flat(start, keys)
        matrix = torch.stack(
            [flat(m.content.array_records[self.arrays_key], keys) - theta for m in ok]
        )
        mask = torch.tensor(byz)
        gen = make_generator(self.seed, server_round, _FLOWER_ATTACK)
        kwargs: dict[str, Any] = {}
        if self.attack.needs_rule:
            # what a fedshield strategy publishes about its defenses (docs/security.md §6b)
            server = getattr(self.strategy, "server", None)
            defenses = getattr(server, "round_defenses", None)
            chain = defenses.defenses if defenses is not None else ()
            state = getattr(self.strategy, "state", None) or {}
            kwargs["context"] = AttackContext(
                rule=self._rule(),
                weights=self._weights(ok),
                reference=self._reference(server_round, start),
                defenses=chain,
                published=published_state(chain, state),
                lr=float(getattr(server, "lr", 1.0)),
                byzantine_f=getattr(server, "byzantine_f", None),
            )
        forged = self.attack(matrix, mask, generator=gen, **kwargs)
        for i, m in enumerate(ok):
            if byz[i]:
                trained = m.content.array_records[self.arrays_key]
                m.content[self.arrays_key] = with_flat(trained, keys, theta + forged[i])

    def _weights(self, ok: list[Message]) -> Tensor | None:
        if getattr(self.strategy, "weighting", "samples") == "uniform":
            return None
        counts = []
        for m in ok:
            metrics = next(iter(m.content.metric_records.values()), MetricRecord())
            counts.append(float(metrics.get(self.weighted_by_key, 1.0)))  # type: ignore[arg-type]
        return torch.tensor(counts, dtype=torch.float64)

    def _reference(self, server_round: int, start: ArrayRecord) -> Tensor | None:
        if not self.attack.needs_reference or self.reference_fn is None:
            return None
        return self.reference_fn(server_round, start).to(torch.float64)


__all__ = [
    "MARK",
    "AttackedStrategy",
    "AttackerMod",
    "attacker_mod",
    "flat",
    "float_keys",
    "with_flat",
]
