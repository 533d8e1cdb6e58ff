"""FedCART's client (FedCART paper: L_CART, gradient prototypes): contrastive-aligned
adversarial training of (r, h), plus per-class gradient prototypes of the auxiliary
classifier h'.

Per mini-batch (x, y), with x' = PGD-K(CE) against (r, h):

    L_CART = L_NAT + L_AT + γ · L_Align
    L_NAT = CE(h(r(x)), y),  L_AT = CE(h(r(x')), y),  L_Align = SupCon({ẑ} ∪ {ẑ'}) (τ = 0.1)
    γ = ι · (1 − (1/B) Σ_i 1[argmax h(r(x_i)) = argmax h(r(x'_i))])   (no gradient; ι = 1)

``at_loss = "trades" | "mart" | "taet"`` replaces L_NAT + L_AT by the TRADES, MART or TAET
loss on (r, h) ("any AT loss + FedCART", FedCART paper, Tab. 6; TAET: natural CE for
``stabilize_rounds`` rounds, then HARL on x'). Switches ``nat``, ``at``, ``align`` are the
ablations "no L_NAT", "no L_AT", "no L_Align".

Prototypes (when the server asks: payload extra ``fedcart/proto_head``) are computed on the
model *as received* (r^{(t)}, h'^{(t)}), as CReFF does: for each local class c,
g_{k,c} = mean over its samples of ∇_{h'}[CE(h'(r(x)), y) and CE(h'(r(x')), y)], with x'
against the received (r, h). Uploaded as extras ``fedcart/prototypes`` [C, C·D + C] and
``fedcart/counts`` [C]; ``fedcart/head_shape`` = (C, D) is always uploaded.

Our choice (``proto_views = "mean"``, default): a prototype averages the natural and the
adversarial per-sample gradients (½ of the first implementation's sum), so ḡ_c has the
scale of the single CE gradient that the server's virtual features are matched to; with the
sum the target's bias component lies outside the reachable range. ``proto_views = "sum"``
is the first implementation's form (docs/results/fedcart.md, "Implementation choices that
matter for these numbers").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from fedshield.adversarial.linf import Draws
from fedshield.algorithms.client.adversarial_training import (
    AdversarialClient,
    ATParams,
    eval_mode,
    taet_stage,
    with_round,
)
from fedshield.algorithms.client.base import CLIENT_ALGORITHMS, GLOBAL_RNG
from fedshield.algorithms.client.pieces import Batch, Trained
from fedshield.core.context import ClientUpdate, Payload
from fedshield.core.flat import set_buffers, set_params
from fedshield.core.integrity import FieldSpec
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.losses import align_loss, class_gradient_sums, harl_loss, mart_loss, trades_loss
from fedshield.models.dual_head import DualHead

PROTO_HEAD = "fedcart/proto_head"  # payload: 0 → prototypes of h', 1 → of h ("no h'")
PROTOTYPES = "fedcart/prototypes"
COUNTS = "fedcart/counts"
HEAD_SHAPE = "fedcart/head_shape"


class FedCARTParams(ATParams):
    nat: bool = Field(True, description="Include L_NAT; false is the ablation 'no L_NAT'.")
    at: bool = Field(True, description="Include L_AT; false is the ablation 'no L_AT'.")
    align: bool = Field(True, description="Include γ·L_Align; false is the ablation 'no L_Align'.")
    tau: float = Field(0.1, gt=0.0, description="Temperature τ of the SupCon alignment loss.")
    iota: float = Field(1.0, ge=0.0, description="Scale ι in γ = ι·(1 − agreement).")
    at_loss: Literal["ce", "trades", "mart", "taet"] = Field(
        "ce",
        description="Local AT loss: 'ce' is L_NAT + L_AT; 'trades', 'mart' or 'taet' use that "
        "loss instead (AT loss + FedCART, FedCART paper, Tab. 6).",
    )
    beta: float = Field(6.0, ge=0.0, description="Weight β of the TRADES/MART KL term.")
    stabilize_rounds: int = Field(
        40,
        ge=0,
        description="With at_loss='taet': rounds of TAET's natural-CE stage before HARL.",
    )
    harl_alpha: float = Field(0.1, ge=0.0, description="With at_loss='taet': HARL's α.")
    harl_beta: float = Field(0.1, ge=0.0, description="With at_loss='taet': HARL's β.")
    harl_gamma: float = Field(0.1, ge=0.0, description="With at_loss='taet': HARL's γ.")
    proto_steps: int | None = Field(
        None,
        ge=0,
        description="PGD steps of the prototypes' x' (unset: steps; 0: natural view only).",
    )
    proto_views: Literal["mean", "sum"] = Field(
        "mean",
        description="A prototype is the mean (ours) or the sum (the first implementation) of "
        "the two views' gradients.",
    )
    proto_batch: int = Field(256, ge=1, description="Batch size of the prototype pass.")

    @model_validator(mode="after")
    def _check(self) -> FedCARTParams:
        if self.at_loss != "ce" and not (self.nat and self.at):
            raise ValueError(
                f"nat/at switch the CE terms only; with at_loss={self.at_loss!r} the "
                f"{self.at_loss.upper()} loss replaces both, so leave them true"
            )
        if not (self.nat or self.at or self.align):
            raise ValueError("nat, at and align are all false: the local loss would be empty")
        return self


def cart_objective(
    p: FedCARTParams,
    logits: Tensor,
    logits_adv: Tensor | None,
    z: Tensor,
    z_adv: Tensor | None,
    y: Tensor,
    stage: int = 0,
) -> Tensor:
    """L_CART = L_AT + γ·L_Align (FedCART paper, adaptive γ) from the main path's features
    and logits.

    L_AT is TRADES, MART, TAET's stage loss (1: natural CE, 2: HARL) or CE on the natural
    and/or adversarial logits (the ``nat``/``at`` ablation switches); γ = ι·(1 − agreement of
    the natural and adversarial predictions)."""
    terms: list[Tensor] = []
    if p.at_loss == "trades":
        assert logits_adv is not None
        terms.append(trades_loss(logits, logits_adv, y, p.beta))
    elif p.at_loss == "mart":
        assert logits_adv is not None
        terms.append(mart_loss(logits, logits_adv, y, p.beta))
    elif stage == 1:  # TAET's stabilisation stage: natural CE
        terms.append(F.cross_entropy(logits, y))
    elif stage == 2:
        assert logits_adv is not None
        terms.append(harl_loss(logits_adv, y, p.harl_alpha, p.harl_beta, p.harl_gamma))
    else:
        if p.nat:
            terms.append(F.cross_entropy(logits, y))
        if p.at:
            assert logits_adv is not None
            terms.append(F.cross_entropy(logits_adv, y))
    if p.align:
        assert z_adv is not None and logits_adv is not None
        with torch.no_grad():  # γ is a weight, not a path for gradients
            agree = (logits.argmax(1) == logits_adv.argmax(1)).float().mean()
            gamma = p.iota * (1.0 - agree)
        terms.append(gamma * align_loss(z, z_adv, y, p.tau))
    return torch.stack(terms).sum()


@CLIENT_ALGORITHMS.register(
    "fedcart", tags=["needs_model=dual_head", "uploads=prototypes", "local_dp"]
)
class FedCARTClient(AdversarialClient):
    """FedCART's client trains (r, h) on L_CART and uploads gradient prototypes of h'
    (FedCART paper)."""

    params_schema = FedCARTParams
    params: FedCARTParams

    @property
    def p(self) -> FedCARTParams:
        return self.params

    def round_payload(self, payload: Payload, rnd: int) -> Payload:
        # TAET's stage depends on the round.
        return with_round(payload, rnd) if self.p.at_loss == "taet" else payload

    def upload_spec(self, model: nn.Module) -> dict[str, FieldSpec]:
        return upload_fields(model)

    def known_extras(self, class_counts: Tensor) -> dict[str, Tensor]:
        # n_{k,c} are the client's label counts: a lie would pick which prototypes vote.
        return {COUNTS: class_counts.to(torch.float32)}

    # -- local loss ------------------------------------------------------------------
    def _stage(self, payload: Payload) -> int:
        p = self.p
        return taet_stage(payload, p.stabilize_rounds) if p.at_loss == "taet" else 0

    def examples(self, model: nn.Module, b: Batch, draws: Draws) -> Tensor | None:
        """x' against the main path (r, h): TRADES' KL ascent or PGD-K, when a term uses it."""
        p = self.p
        main = _dual(model).main_path()
        if p.at_loss == "trades":
            return self.trades_examples(main, b.x, draws)
        if p.at or p.align or p.at_loss == "mart" or self._stage(b.payload) == 2:
            return self.pgd_examples(main, b.x, b.y, draws=draws)
        return None

    def objective(self, model: nn.Module, b: Batch, x_adv: Tensor | None) -> Tensor:
        net = _dual(model)
        z = net.forward_features(b.x)
        logits = net.main_head(z)
        z_adv = net.forward_features(x_adv) if x_adv is not None else None
        logits_adv = net.main_head(z_adv) if z_adv is not None else None
        return cart_objective(self.p, logits, logits_adv, z, z_adv, b.y, self._stage(b.payload))

    # -- prototypes ------------------------------------------------------------------
    def finish_clients(self, trained: Trained, updates: list[ClientUpdate]) -> None:
        net = _dual(trained.model)
        c, d = net.head.out_features, net.num_features
        for u in updates:
            u.extras[HEAD_SHAPE] = torch.tensor([c, d], dtype=torch.float32, device=trained.device)
        flag = trained.payload.extras.get(PROTO_HEAD)
        if flag is None:  # the server does no CART step: save the prototype pass
            return
        # Prototypes are taken at the received model w'_k = (r^{(t)}, h'^{(t)}), not the
        # locally trained one (CReFF): reset the shared model object to the payload.
        set_params(net, trained.payload.params)
        set_buffers(net, trained.payload.buffers)
        head = net.main_head if float(flag) >= 0.5 else net.head
        protos, counts = self.cohort_prototypes(
            net, head, trained.data, trained.draws, trained.device
        )
        for i, u in enumerate(updates):
            u.extras[PROTOTYPES] = protos[i]
            u.extras[COUNTS] = counts[i]

    def prototypes(
        self, net: DualHead, head: nn.Linear, data: TensorData, device: torch.device
    ) -> tuple[Tensor, Tensor]:
        """One client's per-class mean gradients of ``head`` ([C, C·D + C]) and class
        counts ([C]), its PGD starts from the global RNG."""
        protos, counts = self.cohort_prototypes(net, head, [data], lambda i: GLOBAL_RNG, device)
        return protos[0], counts[0]

    def cohort_prototypes(
        self,
        net: DualHead,
        head: nn.Linear,
        data: Sequence[TensorData],
        draws: Callable[[int], Draws],
        device: torch.device,
    ) -> tuple[Tensor, Tensor]:
        """Every client's per-class mean gradients of ``head`` ([K, C, C·D + C]) and class
        counts ([K, C]) at the model ``net`` holds. It is in eval mode (features as the
        inference model computes them), so samples are independent: the clients' data go
        through in one stream of ``proto_batch`` rows; client ``i``'s PGD starts are drawn
        from ``draws(i)`` in its own batch order, as one client alone would draw them."""
        p = self.p
        steps = p.steps if p.proto_steps is None else p.proto_steps
        c = head.out_features
        w, b = head.weight.detach(), head.bias.detach()
        views = 2 if steps > 0 else 1
        xs, ys, noise = [], [], []
        for i, d in enumerate(data):
            x, y = d.batch(None, device)
            xs.append(x)
            ys.append(y)
            if steps > 0:
                eps, _ = self.budget(x)
                for start in range(0, len(d), p.proto_batch):
                    noise.append(draws(i).uniform(x[start : start + p.proto_batch], -eps, eps))
        x_all, y_all = torch.cat(xs), torch.cat(ys)
        noise_all = torch.cat(noise) if noise else None
        feats: list[list[Tensor]] = [[] for _ in range(views)]
        with eval_mode(net):
            for start in range(0, len(y_all), p.proto_batch):
                sl = slice(start, start + p.proto_batch)
                x, y = x_all[sl], y_all[sl]
                views_x = [x]
                if noise_all is not None:
                    given = _GivenNoise(noise_all[sl])
                    views_x.append(self.pgd_examples(net.main_path(), x, y, steps, given))
                with torch.no_grad():
                    for v, xv in enumerate(views_x):
                        feats[v].append(net.forward_features(xv))
        z_views = [torch.cat(f) for f in feats]
        sums = torch.zeros(len(data), c, w.numel() + c, device=device, dtype=w.dtype)
        counts = torch.zeros(len(data), c, device=device, dtype=w.dtype)
        offset = 0
        for i, d in enumerate(data):
            seg = slice(offset, offset + len(d))
            offset += len(d)
            for z in z_views:
                s, n = class_gradient_sums(z[seg], w, b, y_all[seg], c)
                sums[i] += s
            counts[i] = n
        denom = counts * (views if p.proto_views == "mean" else 1)
        return sums / denom.clamp_min(1.0)[:, :, None], counts


class _GivenNoise:
    """:class:`~fedshield.adversarial.linf.Draws` returning starts drawn beforehand (the
    prototype pass draws per client, then attacks the clients' rows together)."""

    def __init__(self, noise: Tensor) -> None:
        self.noise = noise

    def uniform(self, like: Tensor, low: float, high: float) -> Tensor:
        assert like.shape == self.noise.shape
        return self.noise

    def normal(self, like: Tensor) -> Tensor:
        raise AssertionError("the prototype pass draws uniform starts only")


def upload_fields(model: nn.Module) -> dict[str, FieldSpec]:
    """What a FedCART client may upload besides Δθ: prototypes [C, C·D + C], class counts
    [C] (non-negative integers) and the head shape (C, D), which must match the server's own
    model (the simulator's and the Flower-native strategy's upload checks)."""
    net = _dual(model)
    c, d = net.head.out_features, net.num_features
    return {
        PROTOTYPES: FieldSpec((c, c * d + c)),
        COUNTS: FieldSpec((c,), min=0.0, integral=True),
        HEAD_SHAPE: FieldSpec((2,), dtype=torch.float32, equals=torch.tensor([c, d]).float()),
    }


def _dual(model: nn.Module) -> DualHead:
    if not isinstance(model, DualHead):
        raise ConfigError(
            f"client.algorithm='fedcart' needs model.name='dual_head' (r, h, h'), got "
            f"{type(model).__name__}; set model.params.backbone to the network you want"
        )
    return model


__all__ = [
    "COUNTS",
    "HEAD_SHAPE",
    "PROTOTYPES",
    "PROTO_HEAD",
    "FedCARTClient",
    "FedCARTParams",
    "upload_fields",
]
