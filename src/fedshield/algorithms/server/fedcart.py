"""FedCART's server (FedCART paper: gradient prototypes, the CART step): aggregate, then
the CART step.

``update``: the model through the configured aggregator (FedAvg or any Byzantine rule —
composition is a feature), and the clients' gradient prototypes class by class through the
same rule (:func:`aggregate_prototypes`; docs/security.md §2): under a non-robust rule the
count-weighted mean

    ḡ_c = Σ_k n_{k,c} g_{k,c} / Σ_k n_{k,c}     (clients holding class c),

every holder's row first held to what an honest prototype can be
(:mod:`~fedshield.algorithms.server.prototype_bound`; the quiet-attacker reproducer,
docs/security.md §6b: a class of two holders, one
sending its row × 1e30, had a prototype of 1.9e29 under every rule).

``post_step`` (the CART step, on the aggregated flat vector):

1. virtual features Z_v (V per class, server state, warm-started across rounds, initialised
   N(0, 1)) follow at most T_V optimiser steps of gradient matching (eq. 9):
   min Σ_c ‖∇_{h'} CE(h'(Z_{v,c}), c) − ḡ_c‖²  (MSE; ``distance = "cos"``: CReFF's cosine);
2. h' is re-trained on (Z_v, labels) by mini-batch SGD (eq. 10): a fresh head every round
   (CReFF; ``retrain_warm_start`` keeps the current one), for at most T_R = 300 passes over
   Z_v (CReFF's 300 epochs).

Matching stops on a plateau of its MSE (:func:`~fedshield.losses.plateaued`: relative
improvement below a tolerance over a window). Re-training stops on the same rule over its
full-data CE, or at a target loss, but never before ``retrain_min_epochs`` passes: the
previous default (300 warm-started *steps*, rule over 3 passes, no minimum) stopped after
96 steps on round 1's flat start with h' untrained and hit its cap while the loss still fell
in every later round (the re-measurement). The defaults were chosen by the sweeps in
``docs/results/cart_step.md`` (``tools/cart_step_sweep.py``). Logged per round:
``cart/match_start``, ``cart/match_end``, ``cart/match_steps``, ``cart/retrain_start``,
``cart/retrain_loss`` (full-data CE of h' on Z_v after re-training), ``cart/retrain_steps``,
``cart/retrain_epochs``.

Ablations: ``cart = false`` (no CART step; h' := h every round, so inference uses r + h)
and ``aux_head = false`` (no h': the CART step re-trains h itself, then h' := h).

The heads are located in the flat vector by the dual-head layout (``models/dual_head.py``):
the last 2P entries are [h, h'], P = C·D + C, with (C, D) uploaded by the clients (read
once, the value most clients upload). Our choices: a class absent from a round keeps its
last prototype (only matters under partial participation); classes never seen are left
out of matching and re-training.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor

from fedshield.aggregators.base import Aggregator
from fedshield.aggregators.fields import aggregate_field, is_robust
from fedshield.algorithms.client.base import batch_slices
from fedshield.algorithms.client.fedcart import COUNTS, HEAD_SHAPE, PROTO_HEAD, PROTOTYPES
from fedshield.algorithms.server.base import SERVER_ALGORITHMS, ServerRound, ServerStep, State
from fedshield.algorithms.server.fedavg import Aggregated, FedAvg
from fedshield.algorithms.server.prototype_bound import bound_prototypes
from fedshield.config import MAX_EPOCHS, MAX_STEPS
from fedshield.core.context import ClientUpdate, Payload, RoundContext, make_generator
from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.losses.gradient_matching import (
    Distance,
    Optimizer,
    plateaued,
    synthesize_features,
)

# Defaults of the CART step, chosen by the sweeps in docs/results/cart_step.md: Adam at 0.1
# brings the matching MSE to its plateau in 200–550 steps where CReFF's SGD at 0.1 is still
# far off after 100 (and SGD at 1 after 1000); re-training is CReFF's (a fresh head, lr
# 0.01, 300 epochs) with a plateau rule that may fire only after 50 epochs.
MATCH_OPTIMIZER: Optimizer
MATCH_ITERS, MATCH_OPTIMIZER, MATCH_LR = 1000, "adam", 0.1
MATCH_WINDOW, MATCH_TOL = 50, 1e-3
RETRAIN_EPOCHS, RETRAIN_MIN_EPOCHS, RETRAIN_LR = 300, 50, 0.01
RETRAIN_WINDOW, RETRAIN_TOL, RETRAIN_WARM_START = 10, 1e-3, False

log = logging.getLogger("fedshield")

_ZV_INIT, _RETRAIN = 0xCA57, 0xCA58  # purposes mixed into derived seeds


#: Ceilings of the CART step's sizes (a config typo must not allocate V × C × D for ever).
MAX_VIRTUAL = 100_000


class FedCARTServerParams(Params):
    """The CART step's switches, sizes, optimisers and stopping rules (FedCART paper, eqs.
    9–10; defaults: CReFF and docs/results/cart_step.md)."""

    cart: bool = Field(
        True, description="Run the CART step; false is the ablation 'no CART' (h' := h)."
    )
    aux_head: bool = Field(
        True, description="Re-train h'; false is the ablation 'no h'' (the step re-trains h)."
    )
    num_virtual: int = Field(
        100, ge=1, le=MAX_VIRTUAL, description="V, the number of virtual features per class."
    )
    match_iters: int = Field(
        MATCH_ITERS,
        ge=0,
        le=MAX_STEPS,
        description="T_V, the cap on gradient-matching steps per round.",
    )
    match_optimizer: Optimizer = Field(
        MATCH_OPTIMIZER, description="Optimiser of the virtual features: 'adam' or 'sgd'."
    )
    match_lr: float = Field(MATCH_LR, gt=0.0, description="Step size of the matching optimiser.")
    match_momentum: float = Field(
        0.0, ge=0.0, lt=1.0, description="Momentum of the matching optimiser when it is SGD."
    )
    match_window: int = Field(
        MATCH_WINDOW,
        ge=0,
        description="Matching stops when its loss fell by less than match_tol over this many "
        "steps (0 disables the rule).",
    )
    match_tol: float = Field(
        MATCH_TOL, ge=0.0, description="Relative-improvement tolerance of the matching plateau."
    )
    distance: Distance = Field(
        "mse", description="Gradient distance: 'mse' (FedCART eq. 9) or 'cos' (CReFF's cosine)."
    )
    warm_start_features: bool = Field(True, description="Keep Z_v across rounds (warm start).")
    feature_init_std: float = Field(
        1.0, gt=0.0, description="Standard deviation of the N(0, std²) initial Z_v."
    )
    retrain_epochs: int | None = Field(
        RETRAIN_EPOCHS,
        ge=1,
        le=MAX_EPOCHS,
        description="T_R, the cap on re-training passes over Z_v per round (CReFF: 300 epochs; "
        "unset: only retrain_steps caps it).",
    )
    retrain_steps: int | None = Field(
        None,
        ge=0,
        le=MAX_STEPS,
        description="A cap on re-training SGD steps per round (unset: none; 300 with "
        "retrain_epochs unset was the previous default).",
    )
    retrain_min_epochs: int = Field(
        RETRAIN_MIN_EPOCHS,
        ge=0,
        le=MAX_EPOCHS,
        description="Passes over Z_v before the stopping rule may fire (a flat start never "
        "stops re-training).",
    )
    retrain_target_loss: float | None = Field(
        None,
        ge=0.0,
        description="Stop re-training once the full-data CE on Z_v is at most this (after "
        "the minimum; unset: the plateau rule alone).",
    )
    retrain_lr: float = Field(RETRAIN_LR, gt=0.0, description="SGD step size of re-training.")
    retrain_batch: int = Field(
        32, ge=1, le=MAX_VIRTUAL, description="Mini-batch size of re-training."
    )
    retrain_window: int = Field(
        RETRAIN_WINDOW,
        ge=0,
        description="Re-training stops when its full-data loss fell by less than retrain_tol "
        "over this many passes over Z_v (0 disables the rule).",
    )
    retrain_tol: float = Field(
        RETRAIN_TOL,
        ge=0.0,
        description="Relative-improvement tolerance of the re-training plateau.",
    )
    retrain_warm_start: bool = Field(
        RETRAIN_WARM_START,
        description="Start re-training from the current head; false: a fresh one every round "
        "(CReFF).",
    )
    proto_weighting: Literal["class_counts", "client_samples"] = Field(
        "class_counts",
        description="Weights of the prototype mean over the holders of a class: their class "
        "counts n_{k,c} (ours) or their sample counts N_k (the FedCART paper's formula).",
    )

    @model_validator(mode="after")
    def _a_cap(self) -> FedCARTServerParams:
        if self.retrain_epochs is None and self.retrain_steps is None:
            raise ValueError("set retrain_epochs or retrain_steps: re-training needs a cap")
        return self


def _valid_rows(updates: list[ClientUpdate], c: int, p: int) -> list[ClientUpdate]:
    """Updates whose prototypes and counts have the announced shapes and finite values (the
    engine screens uploads first; this keeps a malformed row from crashing the stack)."""
    out = []
    for u in updates:
        g, n = u.extras.get(PROTOTYPES), u.extras.get(COUNTS)
        if g is None or n is None or tuple(g.shape) != (c, p) or tuple(n.shape) != (c,):
            continue
        if bool(torch.isfinite(g).all()) and bool(torch.isfinite(n).all()):
            out.append(u)
    return out


def aggregate_prototypes(
    updates: list[ClientUpdate],
    rule: Aggregator | None = None,
    shape: tuple[int, int] | None = None,
    weighting: Literal["class_counts", "client_samples"] = "class_counts",
    num_features: int | None = None,
    bias_max: float = 1.0,
    stats: dict[str, float] | None = None,
) -> tuple[Tensor, Tensor] | None:
    """(ḡ [C, P], Σ_k n_{k,c} [C]) over the updates that carry prototypes, or None.

    Class by class over the clients that hold the class (n_{k,c} > 0), ḡ_c is
    :func:`~fedshield.aggregators.fields.aggregate_field` of their rows with their counts
    as weights: the count-weighted mean ḡ_c = Σ_k n_{k,c} g_{k,c} / Σ_k n_{k,c} under a
    non-robust rule (``rule = None`` too), the configured robust rule (holders weighted
    alike: a self-reported count cannot buy a class) or the coordinate-wise median otherwise
    (docs/security.md §2); the simulator also replaces the counts by the label counts it knows.
    ``weighting = "client_samples"`` is the FedCART paper's formula, ḡ_c = Σ_k N_k g_{k,c} / Σ_k N_k
    with N_k the client's sample count (over the holders of c: a client without the class
    has no g_{k,c}); a class-c prototype of a client with many samples but few of class c
    then weighs as much as its head classes'. A class nobody holds gets a zero row and a
    zero total. Rows whose shape is not ``shape``
    ([C, C·D + C]; unset: the shape most rows have) or that hold non-finite values are left
    out. With ``num_features`` D given (the server's head), every holder's row is first held
    to what an honest prototype can be
    (:func:`~fedshield.algorithms.server.prototype_bound.bound_prototypes`, ``bias_max``
    its v), so no holder — not even half of a class's two — sets a prototype beyond honest
    scale; ``stats["cart/bounded_rows"]`` counts the rows that bound changed."""
    rows = [u for u in updates if PROTOTYPES in u.extras]
    if not rows:
        return None
    if shape is None:
        found = Counter(tuple(u.extras[PROTOTYPES].shape) for u in rows).most_common(1)[0][0]
        if len(found) != 2:
            return None
        shape = (found[0], found[1])
    c, p = shape
    rows = _valid_rows(rows, c, p)
    if not rows:
        return None
    counts = torch.stack([u.extras[COUNTS] for u in rows]).clamp_min(0.0)  # [K, C]
    protos = torch.stack([u.extras[PROTOTYPES] for u in rows])  # [K, C, P]
    if num_features is not None:
        protos, changed = bound_prototypes(protos, counts > 0, num_features, bias_max)
        if stats is not None:
            stats["cart/bounded_rows"] = float(changed)
    if weighting == "client_samples":  # N_k: the client's whole sample count, every class
        sizes = counts.sum(1, keepdim=True).expand_as(counts)
    else:
        sizes = counts
    mean = protos.new_zeros(c, p)
    for k in range(c):
        holders = counts[:, k] > 0
        if not bool(holders.any()):
            continue
        if rule is None:
            w = sizes[holders, k]
            mean[k] = (w / w.sum()) @ protos[holders, k]
        else:  # a robust rule weighs the holders alike: counts are self-reported on Flower
            rw = None if is_robust(rule) else sizes[holders, k]
            mean[k], _ = aggregate_field(protos[holders, k], rw, rule)
    return mean, counts.sum(0)


@dataclass(frozen=True)
class RetrainResult:
    """The re-trained head, its full-data CE before and after, the SGD steps taken and the
    passes over the data they completed."""

    weight: Tensor
    bias: Tensor
    start: float
    loss: float
    steps: int
    epochs: int = 0


def retrain_linear(
    weight: Tensor,
    bias: Tensor,
    z: Tensor,
    y: Tensor,
    *,
    steps: int | None = None,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
    window: int = 0,
    tol: float = 0.0,
    epochs: int | None = None,
    min_epochs: int = 0,
    target_loss: float | None = None,
) -> RetrainResult:
    """Mini-batch SGD on CE(W z + b, y) from (weight, bias) (FedCART eq. 10).

    At most ``epochs`` passes over (z, y) (CReFF counts its 300 in passes) and at most
    ``steps`` steps (``None``: no cap of that kind; one of them must be set). At the end of
    every pass the full-data CE L is computed; once ``min_epochs`` passes are done, the run
    stops when L ≤ ``target_loss`` or L has plateaued over the last ``window`` passes
    (:func:`plateaued`, relative ``tol``). The minimum is what keeps a flat start (a head
    that barely moves in its first passes, as in round 1) from looking converged.

    The gradient of the batch-mean CE of a linear head is written out, (p − e_y) zᵀ / B and
    mean(p − e_y), as in :mod:`fedshield.losses.gradient_matching`: the same SGD step as
    autograd + ``torch.optim.SGD``, without their per-step overhead (CReFF's 300 epochs
    are ~10⁴ steps a round)."""
    n = len(y)
    per_pass = max(1, -(-n // batch_size))  # batch_slices draws one permutation a pass
    caps = [c for c in (steps, None if epochs is None else epochs * per_pass) if c is not None]
    if not caps:
        raise ValueError("retrain_linear: set steps or epochs (a cap on the re-training)")
    w, b = weight.detach().clone(), bias.detach().clone()
    target = F.one_hot(y, w.shape[0]).to(z.dtype)

    def full_loss() -> float:
        return float(F.cross_entropy(z @ w.T + b, y))

    with torch.no_grad():
        history = [full_loss()]
        done = 0
        for zb, tb in _batches(z, target, batch_size, min(caps), generator):
            # fused (addmm, in-place): ~10⁴ steps a round of [B, D] × [D, C] products,
            # where the per-op overhead is most of the time
            e = torch.addmm(b, zb, w.T).softmax(dim=-1).sub_(tb)
            step = -lr / len(zb)
            w.addmm_(e.T, zb, alpha=step)
            b.add_(e.sum(0), alpha=step)
            done += 1
            if done % per_pass:
                continue
            history.append(full_loss())
            if done // per_pass < min_epochs:
                continue
            reached = target_loss is not None and history[-1] <= target_loss
            if reached or plateaued(history, window, tol):
                break
        end = history[-1] if done % per_pass == 0 else full_loss()
    return RetrainResult(w, b, history[0], end, done, done // per_pass)


def _batches(
    z: Tensor, target: Tensor, batch_size: int, steps: int, generator: torch.Generator
) -> Iterator[tuple[Tensor, Tensor]]:
    """The (features, one-hot targets) mini-batches of :func:`batch_slices` (the same
    permutation draws, the same rows in the same order), gathered once an epoch instead of
    once a step, each batch a contiguous slice: re-training 15 % faster, the same steps bit
    for bit."""
    epoch: tuple[Tensor, Tensor, Tensor] | None = None
    for perm, part in batch_slices(len(z), batch_size, steps, generator):
        if epoch is None or epoch[0] is not perm:
            idx = perm.to(z.device)
            epoch = (perm, z[idx], target[idx])
        yield epoch[1][part], epoch[2][part]


def _head_shape(updates: list[ClientUpdate], num_params: int) -> Tensor | None:
    """(C, D) as the most clients upload it, kept only when two heads of C·D + C entries fit
    in the parameter vector (an untrusted field: one client cannot set it alone)."""
    shapes = [
        tuple(int(v) for v in u.extras[HEAD_SHAPE].tolist())
        for u in updates
        if HEAD_SHAPE in u.extras
        and u.extras[HEAD_SHAPE].shape == (2,)
        and bool(torch.isfinite(u.extras[HEAD_SHAPE]).all())
    ]
    fits = [(c, d) for c, d in shapes if c >= 1 and d >= 1 and 2 * (c * d + c) <= num_params]
    if not fits:
        return None
    c, d = Counter(fits).most_common(1)[0][0]
    return torch.tensor([c, d], dtype=torch.float32)


@SERVER_ALGORITHMS.register("fedcart", tags=["needs_client=fedcart"])
class FedCARTServer(FedAvg):
    """FedCART's server aggregates with the configured rule, then synthesizes class-balanced
    virtual features and re-trains the inference head h' on them (FedCART paper, eqs. 9–10)."""

    params_schema = FedCARTServerParams
    params: FedCARTServerParams
    #: v, the largest size of an honest prototype's bias entry: 1 for the clients' default
    #: ``proto_views = "mean"``, 2 for ``"sum"`` (set at build time from the client's
    #: parameters; :mod:`~fedshield.algorithms.server.prototype_bound`).
    proto_bias_max: float = 1.0

    @property
    def p(self) -> FedCARTServerParams:
        return self.params

    def state_spec(self, params: Tensor) -> dict[str, Tensor | None]:
        """The head shape (C, D) read in round 1, and the prototypes, their class counts
        and the virtual features, whose shapes follow from it (any shape, finite)."""
        later: dict[str, Tensor | None] = {"head_shape": torch.zeros(2)}
        later |= {"proto": None, "proto_seen": None, "zv": None}
        return super().state_spec(params) | later

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        extras: dict[str, Tensor] = {}
        if self.p.cart:  # ask for prototypes of the head the CART step re-trains
            extras[PROTO_HEAD] = params.new_tensor(0.0 if self.p.aux_head else 1.0)
        return Payload(params, buffers, extras)

    def step(self, rnd: ServerRound, agg: Aggregated) -> ServerStep:
        step = super().step(rnd, agg)
        updates = rnd.updates
        new = dict(rnd.state)
        if "head_shape" not in new:  # fixed by the model: read once, as most clients say
            head_shape = _head_shape(updates, rnd.params.numel())
            if head_shape is None:
                raise ConfigError(
                    "server.algorithm='fedcart' needs client.algorithm='fedcart' and "
                    "model.name='dual_head' (no update carried the FedCART extras)"
                )
            new["head_shape"] = head_shape
        c, d = (int(v) for v in new["head_shape"].tolist())
        shape = (c, c * d + c)
        stats: dict[str, float] = {}
        protos = (
            aggregate_prototypes(
                updates, self.aggregator, shape, self.p.proto_weighting,
                num_features=d, bias_max=self.proto_bias_max, stats=stats,
            )  # fmt: skip
            if self.p.cart
            else None
        )
        step.metrics.update(stats)
        if protos is not None:
            mean, total = protos
            seen = total > 0
            proto = new.get("proto", torch.zeros_like(mean))
            # Absent classes keep their last prototype (our choice, see module docstring).
            new["proto"] = torch.where(seen[:, None], mean, proto)
            new["proto_seen"] = new.get("proto_seen", torch.zeros_like(total)) + seen.to(total)
            step.metrics["cart/classes_this_round"] = float(seen.sum())
        elif self.p.cart and "proto" not in new:
            raise ConfigError(
                "server.algorithm='fedcart': no client uploaded gradient prototypes "
                "(client.algorithm must be 'fedcart')"
            )
        return ServerStep(step.params, step.buffers, new, step.metrics)

    def post_step(self, step: ServerStep, rnd: ServerRound) -> ServerStep:
        ctx = rnd.ctx
        c, d = (int(v) for v in step.state["head_shape"].tolist())
        p_len = c * d + c
        n = step.params.numel()
        main, aux = slice(n - 2 * p_len, n - p_len), slice(n - p_len, n)
        params = step.params.clone()
        metrics = dict(step.metrics)
        if not self.p.cart:  # ablation "no CART": inference r + h' = r + h
            params[aux] = params[main]
            return ServerStep(params, step.buffers, step.state, metrics)

        p = self.p
        target = aux if p.aux_head else main
        head = params[target]
        weight, bias = head[: c * d].view(c, d), head[c * d :]
        state = dict(step.state)
        zv = self._virtual_features(state, c, d, params, ctx)
        classes = torch.nonzero(state["proto_seen"] > 0).flatten()
        match = synthesize_features(
            zv[classes], weight, bias, classes, state["proto"][classes],
            iters=p.match_iters, lr=p.match_lr, momentum=p.match_momentum,
            distance=p.distance, optimizer=p.match_optimizer,
            window=p.match_window, tol=p.match_tol,
        )  # fmt: skip
        if not bool(torch.isfinite(match.features).all()):
            return self._skip(step, params, metrics, "matching")
        zv = zv.clone()
        zv[classes] = match.features
        state["zv"] = zv

        labels = classes.repeat_interleave(zv.shape[1])
        gen = make_generator(ctx.seed, ctx.round, _RETRAIN)
        if not p.retrain_warm_start:  # CReFF: a fresh linear layer every round
            # nn.Linear's default init, U(±1/√D), drawn from the seeded generator.
            bound = d**-0.5
            fresh = torch.empty(c * d + c).uniform_(-bound, bound, generator=gen)
            fresh = fresh.to(params)
            weight, bias = fresh[: c * d].view(c, d), fresh[c * d :]
        fit = retrain_linear(
            weight, bias, match.features.reshape(-1, d), labels,
            steps=p.retrain_steps, epochs=p.retrain_epochs, min_epochs=p.retrain_min_epochs,
            target_loss=p.retrain_target_loss, lr=p.retrain_lr, batch_size=p.retrain_batch,
            generator=gen, window=p.retrain_window, tol=p.retrain_tol,
        )  # fmt: skip
        if not (bool(torch.isfinite(fit.weight).all()) and bool(torch.isfinite(fit.bias).all())):
            return self._skip(step, params, metrics, "re-training")
        params[target] = torch.cat([fit.weight.flatten(), fit.bias])
        if not p.aux_head:  # ablation "no h'": the inference head follows h
            params[aux] = params[main]
        metrics.update(
            {
                "cart/match_start": match.start,
                "cart/match_end": match.end,
                "cart/match_steps": float(match.steps),
                "cart/retrain_start": fit.start,
                "cart/retrain_loss": fit.loss,
                "cart/retrain_steps": float(fit.steps),
                "cart/retrain_epochs": float(fit.epochs),
                "cart/classes": float(len(classes)),
            }
        )
        return ServerStep(params, step.buffers, state, metrics)

    def _skip(
        self, step: ServerStep, params: Tensor, metrics: dict[str, float], phase: str
    ) -> ServerStep:
        """Keep h' and Z_v as they were when a phase produced non-finite values (possible
        only from extreme prototypes under a non-robust rule): θ never turns NaN here."""
        log.warning("FedCART: the CART step's %s was not finite; h' and Z_v kept", phase)
        metrics["cart/skipped"] = 1.0
        if not self.p.aux_head:
            c, d = (int(v) for v in step.state["head_shape"].tolist())
            p_len = c * d + c
            params[-p_len:] = params[-2 * p_len : -p_len]
        return ServerStep(params, step.buffers, step.state, metrics)

    def _virtual_features(
        self, state: State, c: int, d: int, like: Tensor, ctx: RoundContext
    ) -> Tensor:
        """Z_v [C, V, D]: kept from the last round (warm start) or drawn N(0, std²)."""
        shape = (c, self.p.num_virtual, d)
        zv = state.get("zv")
        if zv is not None and self.p.warm_start_features and tuple(zv.shape) == shape:
            return zv
        # Seeded by (seed, round) when re-drawn every round, by the seed alone otherwise.
        warm = self.p.warm_start_features
        gen = (
            make_generator(ctx.seed, _ZV_INIT)
            if warm
            else make_generator(ctx.seed, ctx.round, _ZV_INIT)
        )
        z = torch.randn(shape, generator=gen) * self.p.feature_init_std
        return z.to(device=like.device, dtype=like.dtype)


__all__ = [
    "FedCARTServer",
    "FedCARTServerParams",
    "RetrainResult",
    "aggregate_prototypes",
    "retrain_linear",
]
