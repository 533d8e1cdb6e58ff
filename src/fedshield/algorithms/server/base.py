"""The server-algorithm contract (DESIGN: init / broadcast / update, state as a value).

A server algorithm owns no mutable state of its own: the engine passes the global
parameters and the algorithm's state dict in, and stores what comes back, so a checkpoint
is just those values. Aggregation math lives in :mod:`fedshield.aggregators`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from fedshield.aggregators.base import Aggregator
from fedshield.aggregators.fields import aggregate_field, is_robust
from fedshield.core.context import ClientUpdate, Payload, RoundContext
from fedshield.core.flat import stack_rows
from fedshield.core.params import NoParams, Params
from fedshield.errors import ConfigError
from fedshield.registry import Registry, tags_of

State = dict[str, Tensor]


class ServerServices(Protocol):
    """What the round loop offers a server algorithm beyond the updates."""

    def root_update(self, params: Tensor, buffers: Tensor, ctx: RoundContext) -> ClientUpdate:
        """Train a copy of θ on the server's root dataset with the client rule (DRAG paper,
        eqs. 12–13)."""
        ...


@dataclass(frozen=True)
class ServerRound:
    """One round's inputs to a server algorithm's step (:meth:`ServerAlgorithm.update`,
    then :meth:`ServerAlgorithm.post_step`): θ^t, its buffers, the algorithm's state, the
    screened uploads, the round's context and what the round loop offers beyond them
    (None: nothing, e.g. no root dataset). One value, so a new algorithm reads what it
    needs and a new input reaches every algorithm without a signature change."""

    params: Tensor
    buffers: Tensor
    state: State
    updates: list[ClientUpdate]
    ctx: RoundContext
    services: ServerServices | None = None

    def replace(self, **changes: Any) -> ServerRound:
        """This round with some inputs changed (the rows a defense chose, its own state)."""
        return replace(self, **changes)

    def deltas(self) -> Tensor:
        """The ``[S, d]`` update matrix of :attr:`updates`."""
        return stack_deltas(self.updates)

    def root_update(self) -> ClientUpdate:
        """θ^t trained on the server's root dataset with the client rule (DRAG paper,
        eqs. 12–13)."""
        if self.services is None:
            raise ConfigError("this server algorithm trains on root data, which this round lacks")
        return self.services.root_update(self.params, self.buffers, self.ctx)


@dataclass
class ServerStep:
    params: Tensor
    buffers: Tensor
    state: State
    metrics: dict[str, float] = field(default_factory=dict)


def stack_deltas(updates: list[ClientUpdate]) -> Tensor:
    """The ``[S, d]`` update matrix (no copy when the engine already stacked the rows)."""
    return stack_rows([u.delta for u in updates])


def client_weights(updates: list[ClientUpdate], weighting: str, like: Tensor) -> Tensor | None:
    """Sample-count weights (``samples``) or ``None`` for the uniform 1/S form. The counts
    are the screened ones: the server's own partition sizes when it knows them
    (docs/security.md §1)."""
    if weighting == "uniform":
        return None
    return torch.tensor(
        [float(u.num_examples) for u in updates], device=like.device, dtype=like.dtype
    )


class ServerAlgorithm:
    """Base: broadcast θ, aggregate pseudo-gradients with the configured rule, step η_g."""

    params_schema: type[Params] = NoParams
    #: The validated parameters; a subclass re-declares it with its schema (``params:
    #: ProxParams`` next to ``params_schema = ProxParams``) so its fields type-check.
    params: Params
    #: The aggregator used when the config leaves ``server.aggregator`` unset.
    default_aggregator: str = "mean"
    #: Broadcast extras that only optional client parts read (DRAG's r: local calibration);
    #: a Flower-native strategy sends them only to clients that use them.
    optional_broadcast: tuple[str, ...] = ()
    #: The Byzantine count f of a sampled cohort that the run states (the builder from the
    #: attack budget, a Flower strategy's ``byzantine_f``); None: the rule's own f, else its
    #: breakdown on the cohort (:mod:`fedshield.algorithms.server.cohort`).
    byzantine_f: int | None = None
    #: A round that keeps fewer rows than the rule needs for f: ``"pad"`` completes it with
    #: zero rows (votes to keep θ, :mod:`fedshield.algorithms.server.padding`), ``"skip"``
    #: keeps θ (``server.short_rounds``).
    short_rounds: str = "pad"
    #: θ-shaped state keys created after round 1 (DRAG's r, FedACG's m), declared so state
    #: read back is checked against θ (:meth:`state_spec`, fedshield.core.state_check).
    later_state: tuple[str, ...] = ()

    def __init__(
        self,
        aggregator: Aggregator,
        *,
        lr: float = 1.0,
        weighting: str = "samples",
        params: Params | None = None,
    ) -> None:
        self.aggregator = aggregator
        self.lr = lr
        self.weighting = weighting
        self.params = params if params is not None else self.params_schema()

    @property
    def needs_root(self) -> bool:
        """True when the server trains on a root dataset (BR-DRAG, FLTrust)."""
        return self.aggregator.needs_reference

    @property
    def robust(self) -> bool:
        """True when the configured rule is a Byzantine defense (registry tag ``robust``)."""
        return is_robust(self.aggregator)

    def init_state(self, params: Tensor) -> State:
        """Server state (checkpointed). A rule that clips around a centre (Centered
        Clipping) gets it here: v = 0 before round 1, then the previous aggregate."""
        if "needs_center" in tags_of(self.aggregator):
            return {"center": params.new_zeros(params.shape)}
        return {}

    def state_spec(self, params: Tensor) -> dict[str, Tensor | None]:
        """Every key the state may ever hold, with a reference tensor of its shape and dtype
        (None: any shape, finite): :meth:`init_state`'s and the θ-shaped
        :attr:`later_state`. A key outside it in state read back is refused."""
        spec: dict[str, Tensor | None] = {k: params for k in self.later_state}
        defenses = getattr(self, "round_defenses", None)  # fedshield.crossround: any shape
        spec |= {k: None for k in (defenses.state_keys() if defenses is not None else ())}
        return spec | self.init_state(params)

    def weights(self, updates: list[ClientUpdate], like: Tensor) -> Tensor | None:
        """The rule's per-client weights: sample counts for rules defined with them (RFA,
        whatever ``weighting`` says), else as ``server.weighting`` says."""
        if "sample_weighted" in tags_of(self.aggregator):
            return client_weights(updates, "samples", like)
        return client_weights(updates, self.weighting, like)

    def aggregate_field(self, rows: Tensor, weights: Tensor | None) -> Tensor:
        """A secondary field of the screened uploads (buffers, Δh, squared norms, ...)
        through the configured rule or its robust counterpart (:mod:`aggregators.fields`)."""
        return aggregate_field(rows, weights, self.aggregator)[0]

    def aggregate_buffers(
        self, buffers: Tensor, updates: list[ClientUpdate], weights: Tensor | None
    ) -> Tensor:
        """Buffers (BatchNorm statistics): the weighted mean (DRAG paper, Sec. II-A), or the
        robust counterpart of the configured rule when it is a Byzantine defense
        (docs/security.md §2)."""
        if buffers.numel() == 0:
            return buffers
        return self.aggregate_field(stack_rows([u.buffers for u in updates]), weights)

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        return Payload(params=params, buffers=buffers)

    def update(self, rnd: ServerRound) -> ServerStep:
        """θ^{t+1}, buffers, state and metrics from the round's screened uploads."""
        raise NotImplementedError

    def post_step(self, step: ServerStep, rnd: ServerRound) -> ServerStep:
        """A server step after aggregation (FedCART's classifier re-training); default none."""
        return step


SERVER_ALGORITHMS: Registry[type[ServerAlgorithm]] = Registry("server algorithm")
