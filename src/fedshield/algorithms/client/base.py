"""The client-algorithm contract and the shared local-SGD loop (FedAvg's local rule; DRAG
paper, Sec. II-A).

``local_update(model, rnd) -> ClientUpdate``, ``rnd`` one client's round
(:class:`~fedshield.algorithms.client.pieces.ClientRound`). An algorithm is defined
by per-step pieces, each written once and run by two backends — this module's sequential
loop (one client) and the batched trainer of :mod:`fedshield.sim.vectorized` (a cohort,
``torch.func.vmap`` over the clients' stacked parameters), in the spirit of FedJAX's
``for_each_client`` (the algorithm says what a client does, the backend how clients run):

* :meth:`~ClientAlgorithm.constants` — one client's values for the round (CalFAT's class
  prior, SCAFFOLD's h − h_m, FedDyn's ∇L_k(θ_k^{t−1})); the batched trainer stacks them;
* :meth:`~ClientAlgorithm.examples` — inputs computed before the gradient (adversarial x'),
  one client's view, random numbers from ``draws``;
* :meth:`~ClientAlgorithm.objective` — one client's mini-batch loss;
* :meth:`~ClientAlgorithm.adjust` — the gradient change before the SGD step (FedProx,
  SCAFFOLD, FedDyn) on a :class:`~fedshield.algorithms.client.pieces.GradStep`, whose
  tensors have a leading client axis or none;
* :meth:`~ClientAlgorithm.finish_clients` — extras to upload and client-state updates.

Whether an algorithm batches is derived from what it defines (:func:`batches`): a class
that overrides none of :data:`SEQUENTIAL_HOOKS` is described by its pieces alone. One that
owns its loop (multi-exit, width, FedTAET) trains client by client and reuses the pieces
it can.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.sgd import sgd

from fedshield.adversarial.linf import Draws, GeneratorDraws
from fedshield.algorithms.client.pieces import (
    Batch,
    ClientContext,
    ClientRound,
    GradStep,
    LocalSpec,
    Trained,
    split_like,
)
from fedshield.core.context import (
    ClientUpdate,
    Payload,
    derive_seed,
    make_generator,
    seed_global_rng,
)
from fedshield.core.flat import copy_into, flatten, model_tensors
from fedshield.core.integrity import FieldSpec
from fedshield.core.params import NoParams, Params
from fedshield.core.seeds import ROOT, TORCH
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.registry import Registry

#: The sequential loop's random numbers: the global RNG, seeded per (seed, round, client).
GLOBAL_RNG = GeneratorDraws(None)


class SGDStep:
    """``torch.optim.SGD(params, lr, momentum, weight_decay)``'s ``step`` and
    ``zero_grad(set_to_none=True)`` for one client's loop: its functional form
    (``torch.optim.sgd.sgd``, which ``SGD.step`` calls, so the kernels and their order are
    the optimizer's), parameters without a gradient skipped and momentum buffers created
    at a parameter's first step, as the optimizer does."""

    def __init__(self, params: list[Tensor], spec: LocalSpec) -> None:
        self.params = params
        self.spec = spec
        self.momenta: list[Tensor | None] = [None] * len(params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        spec = self.spec
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        params = [self.params[i] for i in live]
        grads = [p.grad for p in params]
        momenta = [self.momenta[i] for i in live] if spec.momentum != 0 else []
        with torch.no_grad():
            sgd(
                params,
                grads,  # type: ignore[arg-type]  # the live ones: not None
                momenta,
                weight_decay=spec.weight_decay,
                momentum=spec.momentum,
                lr=spec.lr,
                dampening=0.0,
                nesterov=False,
                maximize=False,
            )
        for i, buf in zip(live, momenta):
            self.momenta[i] = buf


def batch_slices(
    n: int, batch_size: int, steps: int, generator: torch.Generator
) -> Iterator[tuple[Tensor, slice]]:
    """``steps`` mini-batches drawn epoch by epoch from fresh permutations (last one partial),
    as (the epoch's permutation, the batch's slice of it): a caller that gathers its data
    once an epoch slices the gathered rows. A client without samples is refused (its epochs
    are empty: the loop never ended)."""
    if n <= 0:
        raise ConfigError(f"a client with {n} samples cannot train: local training needs data")
    done = 0
    while done < steps:
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            yield perm, slice(start, start + batch_size)
            done += 1
            if done == steps:
                return


def batch_indices(
    n: int, batch_size: int, steps: int, generator: torch.Generator
) -> Iterator[Tensor]:
    """The sample indices of :func:`batch_slices`' mini-batches."""
    for perm, part in batch_slices(n, batch_size, steps, generator):
        # one batch an epoch: the permutation itself (a slice costs µs per step)
        yield perm if batch_size >= n else perm[part]


def autocast(ctx: ClientContext) -> contextlib.AbstractContextManager:
    if ctx.amp and ctx.device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class ClientAlgorithm:
    """Plain local SGD; the base of every client algorithm."""

    params_schema: type[Params] = NoParams
    #: The validated parameters; a subclass re-declares it with its schema (``params:
    #: ProxParams`` next to ``params_schema = ProxParams``) so its fields type-check.
    params: Params
    #: The server's broadcast extras its pieces read (a Flower client helper decodes them:
    #: :class:`fedshield.flower.client_tools.AlgorithmClient`).
    payload_extras: tuple[str, ...] = ()
    #: :meth:`adjust` applies to parameters the loss never reaches (FedCART's h', a frozen
    #: exit): they get a zero gradient first, so the optimizer steps them (weight decay,
    #: SCAFFOLD's correction). Otherwise SGD skips them, as ``torch.optim.SGD`` skips a
    #: parameter whose ``grad`` is None.
    fills_missing_grads: bool = False
    #: Sample-level DP-SGD (:class:`fedshield.privacy.local.LocalDPSGD`), set from
    #: ``[privacy.local]`` by :func:`fedshield.sim.privacy.attach_privacy`; None: plain SGD.
    dp_sgd: Any = None

    def __init__(self, spec: LocalSpec, params: Params | None = None) -> None:
        self.spec = spec
        self.params = params if params is not None else self.params_schema()

    def reads_step_size(self) -> bool:
        """Whether :meth:`finish` reads the local step size ``spec.lr`` (SCAFFOLD option
        II's (θ^t − θ_m)/(Uη)). A client helper in a user's own loop, whose optimizer
        fedshield does not see, then needs it given
        (:class:`fedshield.flower.client_tools.AlgorithmClient`)."""
        return False

    # -- what this algorithm uploads (the server checks it: core.integrity) -----------
    def upload_spec(self, model: nn.Module) -> dict[str, FieldSpec]:
        """The extras this algorithm may upload, with their exact shapes (docs/security.md §1); an
        upload carrying any other extra is rejected."""
        return {}

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`ConfigError` when this algorithm cannot train ``model`` (its
        family, tiers, exit layout). Called before any data is loaded, on the model built on
        PyTorch's meta device (``build_components``), so the check reads structure only."""

    def known_extras(self, class_counts: Tensor) -> dict[str, Tensor]:
        """Extras whose true value the server knows from the partition (e.g. per-class
        sample counts, from the client's label counts ``class_counts``): where self-reported
        counts are not trusted they replace what the client uploads (docs/security.md §1)."""
        return {}

    def expected_mask(
        self, client_id: int, model: nn.Module, class_counts: Tensor | None = None
    ) -> Tensor | None:
        """The coverage mask client ``client_id`` must upload (None: full coverage), as the
        server predicts it from the client's tier and, where a method needs it, its label
        counts ``class_counts`` (known to the server, like the partition)."""
        return None

    def init_state(self, num_params: int) -> dict[str, Tensor]:
        """Per-client state kept by the engine across rounds (checkpointed)."""
        return {}

    #: θ-shaped state keys created at the first participation (SCAFFOLD's h_m), declared
    #: so state read back is checked against θ (:meth:`state_spec`).
    later_state: tuple[str, ...] = ()

    def state_spec(self, params: Tensor) -> dict[str, Tensor | None]:
        """Every key a client's state may hold, with a reference tensor (None: any shape):
        :meth:`init_state`'s and the θ-shaped :attr:`later_state` (θ: ``params``)."""
        spec: dict[str, Tensor | None] = {k: params for k in self.later_state}
        return spec | self.init_state(params.numel())

    # -- the per-step pieces (both backends) -----------------------------------------
    def round_payload(self, payload: Payload, rnd: int) -> Payload:
        """The payload as the pieces see it in round ``rnd`` (default: as broadcast)."""
        return payload

    def constants(self, model: nn.Module, c: ClientRound) -> dict[str, Tensor]:
        """One client's constants of the round; the batched trainer stacks them on a
        leading client axis and the other pieces see the client's (or group's) rows."""
        return {}

    def examples(self, model: nn.Module, b: Batch, draws: Draws) -> Tensor | None:
        """Inputs computed before the gradient (adversarial examples x'); None for none.
        One client's view (inside ``vmap`` when batched); random numbers from ``draws``."""
        return None

    def objective(self, model: nn.Module, b: Batch, x_adv: Tensor | None) -> Tensor:
        """One client's mini-batch loss (``model(x)`` runs with that client's parameters)."""
        return F.cross_entropy(model(b.x), b.y)

    def adjust(self, step: GradStep) -> None:
        """Change ``step.grads`` in place before the optimizer step (default: nothing)."""

    def finish_clients(self, trained: Trained, updates: list[ClientUpdate]) -> None:
        """Add extras to the uploads and update the client states (default: nothing)."""

    def loss(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        payload: Payload,
        consts: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """One mini-batch's loss as the sequential loop computes it: :meth:`examples` drawn
        from the global RNG, then :meth:`objective`."""
        b = Batch(x, y, payload, {} if consts is None else consts)
        return self.objective(model, b, self.examples(model, b, GLOBAL_RNG))

    # -- the sequential loop -----------------------------------------------------------
    def local_update(self, model: nn.Module, rnd: ClientRound) -> ClientUpdate:
        """One client's round of local training on ``model`` (the shared module)."""
        # One walk of the module tree for the whole client (set, train mode, read back).
        tensors = model_tensors(model)
        params = tensors.params
        copy_into(params, rnd.payload.params)
        copy_into(tensors.float_buffers, rnd.payload.buffers)
        if not tensors.training:
            model.train()
        spec, data, ctx = self.spec, rnd.data, rnd.ctx
        payload = self.round_payload(rnd.payload, ctx.round)
        rnd = rnd.replace(payload=payload)
        consts = self.constants(model, rnd)
        adjusts = _overrides(type(self), "adjust")
        start = split_like(payload.params, params) if adjusts else []
        kept: dict[str, Tensor] = {}
        total = torch.zeros((), device=ctx.device)
        steps = spec.num_steps(len(data))
        batches = batch_indices(len(data), spec.batch_size, steps, ctx.generator)
        # DP-SGD: the loss sees Opacus' per-sample-gradient wrapper of the same model, and
        # Opacus drives a torch.optim.SGD; otherwise that optimizer's update is applied
        # through its functional form (SGDStep), the same arithmetic without the
        # optimizer object's per-client set-up and per-step wrappers.
        dp = opt = None
        sgd = SGDStep(params, spec)
        if self.dp_sgd is not None:
            opt = torch.optim.SGD(
                params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
            )
            dp = self.dp_sgd.session(
                model, opt, len(data), spec.batch_size, ctx.generator, ctx.device
            )
        net = model if dp is None else dp.model
        try:
            for step, idx in enumerate(batches):
                x, y = data.batch(idx, ctx.device)
                if dp is None:
                    sgd.zero_grad()
                else:
                    dp.zero_grad()
                with autocast(ctx):
                    loss = self.loss(net, x, y, payload, consts)
                loss.backward()
                if dp is not None:  # per-sample clip + noise → p.grad, before the terms
                    dp.privatize()  # that do not read the data (FedProx's μ(θ − θ_start))
                if adjusts:
                    grads = self._model_grads(params)
                    gs = GradStep(grads, params, start, payload, consts, step, kept=kept)
                    with torch.no_grad():
                        self.adjust(gs)
                if opt is None:
                    sgd.step()
                else:
                    opt.step()
                total += loss.detach().float()
        finally:
            if dp is not None:
                dp.close()
        update = ClientUpdate(
            client_id=ctx.client_id,
            delta=flatten(params, payload.params).sub_(payload.params),
            num_examples=len(data),
            buffers=flatten(tensors.float_buffers, payload.params),
            metrics={"train/loss": float(total) / max(steps, 1)},
        )
        return self._finish_one(model, update, rnd, steps, kept)

    def _finish_one(
        self,
        model: nn.Module,
        update: ClientUpdate,
        rnd: ClientRound,
        steps: int,
        kept: dict[str, Tensor],
    ) -> ClientUpdate:
        """:meth:`finish_clients` for one client trained ``steps`` steps sequentially."""
        trained = Trained(
            model,
            rnd.payload,
            [rnd.data],
            [rnd.state],
            [steps],
            self.spec,
            rnd.device,
            _global_rng,
            kept,
        )
        self.finish_clients(trained, [update])
        return update

    def _model_grads(self, params: list[Tensor]) -> list[Tensor]:
        """Every parameter's gradient; a parameter the loss does not reach gets a zero one
        (set as its ``grad`` only when :attr:`fills_missing_grads`, else SGD skips it)."""
        grads = []
        for p in params:
            if p.grad is None:
                zero = torch.zeros_like(p)
                if self.fills_missing_grads:
                    p.grad = zero
                grads.append(zero)
            else:
                grads.append(p.grad)
        return grads

    # -- for training loops written by hand (fedshield.flower.client_tools) ------------
    def adjust_grads(
        self, model: nn.Module, rnd: ClientRound, start: list[Tensor], step: int
    ) -> None:
        """:meth:`adjust` on ``model``'s ``p.grad`` in a loop of your own (one client;
        ``start``: the round's start point per parameter, or empty for θ^t =
        ``rnd.payload.params``). :meth:`constants` are read from ``rnd`` (its data may be
        empty: :func:`hand_round`); what :meth:`adjust` keeps waits in ``rnd.state`` for
        :meth:`finish`."""
        params: list[Tensor] = list(model.parameters())
        payload, state = rnd.payload, rnd.state
        start = start or split_like(payload.params, params)
        consts = self.constants(model, rnd)
        kept = {k[len(_KEPT) :]: v for k, v in state.items() if k.startswith(_KEPT)}
        with torch.no_grad():
            self.adjust(
                GradStep(self._model_grads(params), params, start, payload, consts, step, kept=kept)
            )
        state.update({_KEPT + k: v for k, v in kept.items()})

    def finish(self, model: nn.Module, update: ClientUpdate, rnd: ClientRound) -> ClientUpdate:
        """:meth:`finish_clients` for one client after a loop of your own that called
        :meth:`adjust_grads` ``steps`` times (``self.spec.num_steps(len(rnd.data))``)."""
        state = rnd.state
        kept = {k[len(_KEPT) :]: state.pop(k) for k in [k for k in state if k.startswith(_KEPT)]}
        return self._finish_one(model, update, rnd, self.spec.num_steps(len(rnd.data)), kept)


#: Hooks only the sequential loop calls: a class overriding one trains client by client.
SEQUENTIAL_HOOKS = ("local_update", "loss")
_KEPT = "_kept/"
_NO_DATA = TensorData(torch.zeros(0), torch.zeros(0, dtype=torch.int64))


def root_round(
    payload: Payload, data: TensorData, seed: int, rnd: int, device: torch.device
) -> ClientRound:
    """The server's training on its root dataset (DRAG paper, eqs. 12–13) as one
    client's round: client id −1 and random numbers from (``seed``, ``rnd``, root), the
    global RNG (dropout) seeded from them as the engine seeds it for a client."""
    seed_global_rng(derive_seed(seed, rnd, ROOT, TORCH), device)
    ctx = ClientContext(-1, rnd, make_generator(seed, rnd, ROOT), device)
    return ClientRound(payload, data, {}, ctx)


def hand_round(payload: Payload, state: dict[str, Tensor]) -> ClientRound:
    """A client's round in a training loop written by hand, whose data fedshield does not
    see (:meth:`ClientAlgorithm.adjust_grads`, :meth:`ClientAlgorithm.finish`)."""
    device = payload.params.device
    return ClientRound(payload, _NO_DATA, state, ClientContext(0, 0, torch.Generator(), device))


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(ClientAlgorithm, name)


def _global_rng(row: int) -> Draws:
    return GLOBAL_RNG


def batches(algo: ClientAlgorithm | type[ClientAlgorithm]) -> bool:
    """True when the algorithm (an instance or its class) is defined by its per-step pieces
    alone — it overrides none of :data:`SEQUENTIAL_HOOKS` — so the batched trainer can run
    it."""
    cls = algo if isinstance(algo, type) else type(algo)
    return not any(_overrides(cls, h) for h in SEQUENTIAL_HOOKS)


CLIENT_ALGORITHMS: Registry[type[ClientAlgorithm]] = Registry("client algorithm")
