"""Functional forms of the adversarial-training clients (SPEC §7) for vectorised cohorts:
FedPGD, FedFAT, FedTRADES, FedMART, CalFAT and FedCART (loss and prototype upload).

The inner maximisation runs per client inside ``vmap``: :func:`pgd_batched` and
:func:`trades_batched` are :func:`fedshield.adversarial.pgd` and
:func:`fedshield.adversarial.trades_pgd` with the input gradient taken by
``torch.func.grad`` (``torch.autograd.grad`` cannot run under ``vmap``) and the random
start drawn from the client's replayed stream, so x' is the sequential one to float
tolerance. The outer losses are the sequential ones, term by term, in the same order of
forward passes (dropout draws follow that order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedshield.adversarial.linf import Clamp, check_budget
from fedshield.adversarial.losses import ce_loss
from fedshield.algorithms.client.adversarial_training import (
    AdversarialClient,
    _num_classes,
    eval_mode,
)
from fedshield.algorithms.client.fedcart import (
    COUNTS,
    HEAD_SHAPE,
    PROTO_HEAD,
    PROTOTYPES,
    FedCARTParams,
    _dual,
    cart_objective,
)
from fedshield.algorithms.client.functional import ChunkResult, Draws, VectorForm
from fedshield.core.context import ClientUpdate, Payload
from fedshield.core.flat import set_buffers, set_params
from fedshield.data.bundle import TensorData
from fedshield.losses import (
    calibrated_ce,
    calibrated_logits,
    class_gradient_sums,
    class_log_prior,
    mart_loss,
    trades_loss,
)

CLAMP: Clamp = (0.0, 1.0)


def project(x_adv: Tensor, x: Tensor, eps: float, clamp: Clamp) -> Tensor:
    """:func:`fedshield.adversarial.linf.project` (same operation order) with out-of-place
    clamps, which have a ``vmap`` batching rule (``clamp_`` falls back to a slow loop)."""
    out = x + (x_adv.detach() - x).clamp(-eps, eps)
    return out if clamp is None else out.clamp(clamp[0], clamp[1])


def pgd_batched(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    alpha: float,
    steps: int,
    draws: Draws,
    clamp: Clamp = CLAMP,
) -> Tensor:
    """PGD-K on the summed CE from x + U(−ε, ε): x' ← Π(x' + α·sign(∇ₓ')) (Madry et al.),
    as :func:`fedshield.adversarial.pgd` with ``random_start=True, loss="ce"``."""
    check_budget(eps, alpha, steps)
    x = x.detach()
    adv = project(x + draws.uniform(x.shape, x.dtype, -eps, eps), x, eps, clamp)

    def objective(a: Tensor) -> Tensor:
        return ce_loss(model(a), y)

    for _ in range(steps):
        adv = project(adv + alpha * torch.func.grad(objective)(adv).sign(), x, eps, clamp)
    return adv.detach()


def trades_batched(
    model: nn.Module,
    x: Tensor,
    eps: float,
    alpha: float,
    steps: int,
    draws: Draws,
    transform: Callable[[Tensor], Tensor] | None = None,
    clamp: Clamp = CLAMP,
    start_std: float = 0.001,
) -> Tensor:
    """TRADES' inner problem, max KL(p(x) ‖ p(x')) by sign ascent from x + 0.001·N(0, 1),
    as :func:`fedshield.adversarial.trades_pgd` (same order: clean pass, then the draw)."""
    check_budget(eps, alpha, steps)
    x = x.detach()
    adjust = transform if transform is not None else (lambda z: z)
    with torch.no_grad():
        p_clean = F.softmax(adjust(model(x)), dim=1)
    adv = project(x + start_std * draws.normal(x.shape, x.dtype), x, eps, clamp)

    def kl(a: Tensor) -> Tensor:
        return F.kl_div(F.log_softmax(adjust(model(a)), dim=1), p_clean, reduction="sum")

    for _ in range(steps):
        adv = project(adv + alpha * torch.func.grad(kl)(adv).sign(), x, eps, clamp)
    return adv.detach()


def align_loss_batched(z_nat: Tensor, z_adv: Tensor, labels: Tensor, tau: float) -> Tensor:
    """FedCART's L_Align (SupCon over the 2B views, :func:`fedshield.losses.align_loss`)
    without data-dependent branches: in L_Align every anchor has a positive (its other
    view), so the mean over anchors with a positive is the mean over all anchors."""
    z = F.normalize(torch.cat([z_nat, z_adv]), dim=1)
    y = torch.cat([labels, labels])
    n = z.shape[0]
    self_mask = torch.eye(n, dtype=torch.bool, device=z.device)
    sim = (z @ z.T / tau).masked_fill(self_mask, float("-inf"))
    log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    pos = (y[:, None] == y[None, :]) & ~self_mask
    n_pos = pos.sum(dim=1)
    return (-log_prob.masked_fill(~pos, 0.0).sum(dim=1) / n_pos.clamp_min(1)).mean()


class ATForm(VectorForm):
    """x' = PGD-K against the client's model (eval mode unless ``attack_eval_mode=false``),
    then the algorithm's outer loss; subclasses override :meth:`loss`."""

    algo: AdversarialClient

    def pgd(
        self, model: nn.Module, x: Tensor, y: Tensor, draws: Draws, steps: int | None = None
    ) -> Tensor:
        p = self.algo.params
        eps, alpha = self.algo.budget(x)
        k = p.steps if steps is None else steps  # type: ignore[attr-defined]
        with eval_mode(model, p.attack_eval_mode):  # type: ignore[attr-defined]
            return pgd_batched(model, x, y, eps, alpha, k, draws)

    def trades(
        self,
        model: nn.Module,
        x: Tensor,
        draws: Draws,
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        p = self.algo.params
        eps, alpha = self.algo.budget(x)
        with eval_mode(model, p.attack_eval_mode):  # type: ignore[attr-defined]
            return trades_batched(model, x, eps, alpha, p.steps, draws, transform)  # type: ignore[attr-defined]

    def examples(
        self, model: nn.Module, x: Tensor, y: Tensor, consts: dict[str, Tensor], draws: Draws
    ) -> Tensor | None:
        return self.pgd(model, x, y, draws)

    def loss(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        x_adv: Tensor | None,
        payload: Payload,
        consts: dict[str, Tensor],
    ) -> Tensor:
        """FedPGD: CE(f(x'), y)."""
        return F.cross_entropy(model(x_adv), y)


class FATForm(ATForm):
    """FedFAT: CE(f(x), y) + CE(f(x'), y)."""

    def loss(self, model, x, y, x_adv, payload, consts):  # type: ignore[no-untyped-def]
        return F.cross_entropy(model(x), y) + F.cross_entropy(model(x_adv), y)


class TRADESForm(ATForm):
    """FedTRADES: CE(f(x), y) + β KL(p(x) ‖ p(x')), x' from the KL ascent."""

    def examples(self, model, x, y, consts, draws):  # type: ignore[no-untyped-def]
        return self.trades(model, x, draws)

    def loss(self, model, x, y, x_adv, payload, consts):  # type: ignore[no-untyped-def]
        return trades_loss(model(x), model(x_adv), y, self.algo.params.beta)  # type: ignore[attr-defined]


class MARTForm(ATForm):
    """FedMART: BCE-boosted CE on x' + β KL · (1 − p_y(x))."""

    def loss(self, model, x, y, x_adv, payload, consts):  # type: ignore[no-untyped-def]
        return mart_loss(model(x), model(x_adv), y, self.algo.params.beta)  # type: ignore[attr-defined]


LOG_PRIOR = "calfat/log_prior"


class CalFATForm(ATForm):
    """CalFAT: CE(s·(z' + τ log π_k), y) on x' from the KL ascent on calibrated logits;
    log π_k is a per-client constant."""

    def constants(
        self,
        model: nn.Module,
        payload: Payload,
        data: Sequence[TensorData],
        states: Sequence[dict[str, Tensor]],
        device: torch.device,
    ) -> dict[str, Tensor]:
        c = _num_classes(model, data[0], device)
        priors = [class_log_prior(d.class_counts(c)).to(device) for d in data]
        return {LOG_PRIOR: torch.stack(priors)}

    def examples(self, model, x, y, consts, draws):  # type: ignore[no-untyped-def]
        log_prior, tau = consts[LOG_PRIOR], self.algo.params.tau  # type: ignore[attr-defined]
        return self.trades(model, x, draws, lambda z: calibrated_logits(z, log_prior, tau))

    def loss(self, model, x, y, x_adv, payload, consts):  # type: ignore[no-untyped-def]
        p = self.algo.params
        return calibrated_ce(model(x_adv), y, consts[LOG_PRIOR], p.scale, p.tau)  # type: ignore[attr-defined]


class _GivenNoise:
    """Draws that return a pre-drawn start (the prototype pass draws outside ``vmap``)."""

    def __init__(self, noise: Tensor) -> None:
        self.noise = noise

    def uniform(self, shape: Sequence[int], dtype: torch.dtype, low: float, high: float) -> Tensor:
        assert tuple(shape) == tuple(self.noise.shape)
        return self.noise

    def normal(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        raise AssertionError("the prototype pass draws uniform starts only")


class FedCARTForm(ATForm):
    """FedCART's client: L_CART on (r, h) and, when the server asks, per-class gradient
    prototypes of h' at the received model (:mod:`fedshield.algorithms.client.fedcart`)."""

    @property
    def p(self) -> FedCARTParams:
        return self.algo.params  # type: ignore[return-value]

    def examples(self, model, x, y, consts, draws):  # type: ignore[no-untyped-def]
        p = self.p
        main = _dual(model).main_path()
        if p.at_loss == "trades":
            return self.trades(main, x, draws)
        if p.at or p.align or p.at_loss == "mart":
            return self.pgd(main, x, y, draws)
        return None

    def loss(self, model, x, y, x_adv, payload, consts):  # type: ignore[no-untyped-def]
        p = self.p
        net = _dual(model)
        z = net.forward_features(x)
        logits = net.main_head(z)
        z_adv = net.forward_features(x_adv) if x_adv is not None else None
        logits_adv = net.main_head(z_adv) if z_adv is not None else None
        return cart_objective(p, logits, logits_adv, z, z_adv, y, align=align_loss_batched)

    def finish(self, chunk: ChunkResult, updates: list[ClientUpdate]) -> None:
        net = _dual(chunk.model)
        c, d = net.head.out_features, net.num_features
        for u in updates:
            u.extras[HEAD_SHAPE] = torch.tensor([c, d], dtype=torch.float32, device=chunk.device)
        flag = chunk.payload.extras.get(PROTO_HEAD)
        if flag is None:  # the server does no CART step: no prototype pass
            return
        # At the received model (r^{(t)}, h'^{(t)}), as the sequential client does.
        set_params(net, chunk.payload.params)
        set_buffers(net, chunk.payload.buffers)
        head = net.main_head if float(flag) >= 0.5 else net.head
        protos, counts = self.prototypes(net, head, chunk)
        for i, u in enumerate(updates):
            u.extras[PROTOTYPES] = protos[i]
            u.extras[COUNTS] = counts[i]

    def prototypes(
        self, net: nn.Module, head: nn.Linear, chunk: ChunkResult
    ) -> tuple[Tensor, Tensor]:
        """Every chunk client's per-class mean gradients of ``head`` ([C_k, C, C·D + C]) and
        class counts ([C_k, C]). The model is shared (the received one) and in eval mode,
        so samples are independent: the chunk's data goes through in one stream of
        batches; each client's PGD starts are drawn from its own stream in the sequential
        batch order (``proto_batch`` rows at a time)."""
        p = self.p
        steps = p.steps if p.proto_steps is None else p.proto_steps
        c = head.out_features
        w, b = head.weight.detach(), head.bias.detach()
        views = 2 if steps > 0 else 1
        device = chunk.device
        xs, ys, noise = [], [], []
        for i, data in enumerate(chunk.data):
            x, y = data.batch(None, device)
            xs.append(x)
            ys.append(y)
            if steps > 0:
                eps, _ = self.algo.budget(x)
                for start in range(0, len(data), p.proto_batch):
                    shape = (min(p.proto_batch, len(data) - start), *x.shape[1:])
                    noise.append(chunk.streams.uniform_for(i, shape, x.dtype, -eps, eps))
        x_all, y_all = torch.cat(xs), torch.cat(ys)
        noise_all = torch.cat(noise) if noise else None
        feats: list[list[Tensor]] = [[] for _ in range(views)]
        with eval_mode(net):  # features as the inference model computes them
            for start in range(0, len(y_all), p.proto_batch):
                sl = slice(start, start + p.proto_batch)
                x, y = x_all[sl], y_all[sl]
                views_x = [x]
                if noise_all is not None:
                    main = net.main_path()  # type: ignore[operator]
                    views_x.append(self.pgd(main, x, y, _GivenNoise(noise_all[sl]), steps))
                with torch.no_grad():
                    for v, xv in enumerate(views_x):
                        feats[v].append(net.forward_features(xv))  # type: ignore[operator]
        z_views = [torch.cat(f) for f in feats]
        sums = torch.zeros(len(chunk.data), c, w.numel() + c, device=device)
        counts = torch.zeros(len(chunk.data), c, device=device)
        offset = 0
        for i, data in enumerate(chunk.data):
            seg = slice(offset, offset + len(data))
            offset += len(data)
            for z in z_views:
                s, n = class_gradient_sums(z[seg], w, b, y_all[seg], c)
                sums[i] += s
            counts[i] = n
        denom = counts * (views if p.proto_views == "mean" else 1)
        return sums / denom.clamp_min(1.0)[:, :, None], counts


__all__ = [
    "ATForm",
    "CalFATForm",
    "FATForm",
    "FedCARTForm",
    "MARTForm",
    "TRADESForm",
    "align_loss_batched",
    "pgd_batched",
    "trades_batched",
]
