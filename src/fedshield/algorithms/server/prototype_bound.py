"""What an honest gradient prototype can be, and every holder's row held to it
(docs/security.md §6b: a class of few holders, one of them an attacker).

A FedCART client's class-c prototype is the mean over its class-c samples (and views) of the
cross-entropy gradient of the linear head h'(z) = W z + b (the FedCART paper's gradient
prototypes), per sample

    ∂CE/∂b = p − e_c,   ∂CE/∂W = (p − e_c) zᵀ,   p = softmax(W z + b).

Hence, for an honest row (b, W) of class c, averaged over samples and views (``bias_max``
v = 1 for the default ``proto_views = "mean"``, 2 for ``"sum"``):

* **the bias part is a scaled simplex difference**: b_c ∈ [−v, 0], b_j ∈ [0, v] for j ≠ c and
  Σ_j b_j = 0 (p sums to one);
* **the weight part is bounded by the features**: ‖p − e_c‖² = (1 − p_c)² + Σ_{j≠c} p_j²
  ≤ 2 (1 − p_c)², so ‖W‖_F ≤ √2 · Z · |b_c| with Z the largest feature norm ‖r(x)‖.

The server does not see the features, so Z is estimated from the rows themselves: every
client's median over its classes of ẑ = ‖W‖_F / (√2 |b_c|) (a weighted feature norm of its
misclassified mass), then the lower median over the clients — one value per client, so a
minority of clients cannot move it past an honest one, however many classes they claim.

:func:`bound_prototypes` holds every row to that set: the bias part is scaled to ‖b‖_∞ ≤ v
(a scaled honest row keeps its direction), its signs and zero sum restored, and the weight
part is scaled to ‖W‖_F ≤ κ · √2 · ẑ · |b_c| (κ = 3: honest rows, whose ẑ is a weighted
mean of their own feature norms, stay untouched unless their features are three times the
cohort's). A class held by few clients — two, one of them an attacker, where no rule can
outvote — then has a prototype no larger than an honest one could be, instead of whatever
the attacker sends (a 1e30-scaled row made the server's prototype 1.9e29 and the class's
accuracy 0). Honest rows are unchanged (tests), so the bound applies under every rule.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: κ: rows whose weight part exceeds κ × the cohort's feature scale are scaled down.
PROTO_KAPPA = 3.0

_TINY = 1e-12


def feature_scale(protos: Tensor, holders: Tensor, num_features: int) -> float:
    """ẑ (module docstring): the lower median over clients of each client's median over the
    classes it holds of ‖W_{k,c}‖_F / (√2 |b_{k,c,c}|). ``protos`` [K, C, C·D + C],
    ``holders`` [K, C] bool. 0.0 when no row carries a misclassified mass."""
    k, c, _ = protos.shape
    x = protos.to(torch.float64)
    w_norm = x[:, :, : c * num_features].norm(dim=2)  # [K, C]
    idx = torch.arange(c, device=x.device)
    err = x[:, idx, c * num_features + idx].abs()  # |b_{k,c,c}|, [K, C]
    ratio = w_norm / (math.sqrt(2.0) * err.clamp_min(_TINY))
    usable = holders & (err > _TINY) & torch.isfinite(ratio)
    per_client = [float(ratio[i][usable[i]].median()) for i in range(k) if bool(usable[i].any())]
    if not per_client:
        return 0.0
    per_client.sort()
    return per_client[(len(per_client) - 1) // 2]


def bound_bias(bias: Tensor, cls: Tensor, bias_max: float) -> Tensor:
    """Rows ``bias`` [N, C] (row i of class ``cls[i]``) held to the honest set: scaled so
    ‖b‖_∞ ≤ ``bias_max`` (direction kept), then b_c ≤ 0 ≤ b_j and Σ_j b_j = 0 with
    b_c := −Σ_{j≠c} b_j (itself at most ``bias_max`` in size, the others scaled with it)."""
    n, c = bias.shape
    b = bias.to(torch.float64)
    top = b.abs().amax(dim=1, keepdim=True)
    b = b * torch.where(top > bias_max, bias_max / top.clamp_min(_TINY), 1.0)
    own = torch.nn.functional.one_hot(cls, c).bool()
    others = torch.where(own, 0.0, b.clamp_min(0.0))
    mass = others.sum(dim=1, keepdim=True)
    others = others * torch.where(mass > bias_max, bias_max / mass.clamp_min(_TINY), 1.0)
    out = others - own.to(b) * others.sum(dim=1, keepdim=True)
    return out.to(bias.dtype)


def bound_prototypes(
    protos: Tensor,
    holders: Tensor,
    num_features: int,
    bias_max: float = 1.0,
    kappa: float = PROTO_KAPPA,
) -> tuple[Tensor, int]:
    """``(rows held to the honest set, number of rows changed)`` for ``protos``
    [K, C, C·D + C] with ``holders`` [K, C] bool (module docstring). Rows of classes a
    client does not hold are returned as they are (they are never aggregated)."""
    k, c, p = protos.shape
    d = num_features
    if p != c * d + c:
        raise ValueError(f"prototypes of shape {tuple(protos.shape)} are not [K, C, C·D + C]")
    z = feature_scale(protos, holders, d)
    rows = protos[holders]  # [N, P]
    if rows.shape[0] == 0:
        return protos, 0
    cls = torch.nonzero(holders)[:, 1]
    x = rows.to(torch.float64)
    bias = bound_bias(x[:, c * d :], cls, bias_max).to(torch.float64)
    w = x[:, : c * d]
    err = bias.gather(1, cls[:, None]).abs()
    cap = kappa * math.sqrt(2.0) * z * err
    w_norm = w.norm(dim=1, keepdim=True)
    w = w * torch.where(w_norm > cap, cap / w_norm.clamp_min(_TINY), 1.0)
    bounded = torch.cat([w, bias], dim=1)
    # Changed beyond float rounding (the bias is recomputed from its parts).
    tol = 1e-6 * (1.0 + x.abs().amax(dim=1))
    changed = int(((bounded - x).abs().amax(dim=1) > tol).sum())
    out = protos.clone()
    out[holders] = bounded.to(protos.dtype)
    return out, changed


__all__ = ["PROTO_KAPPA", "bound_bias", "bound_prototypes", "feature_scale"]
