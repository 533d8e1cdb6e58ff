"""The full-knowledge local model poisoning attacks of Fang, Cao, Jia & Gong (USENIX
Security 2020, "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning").

Both push the aggregate against s, the sign of the change the rule would make under no
attack (their "changing direction"), computed here through the configured rule on the
round's before-attack updates (the attackers' own rows are their honest updates, as in
the paper: ``needs_own_update``). They are applied to the uploaded updates g_i = w_i − θ^t
(the global model w_Re is the origin of that space), as the authors' released code does
for gradients.

* ``fang_krum`` (§4.2, against Krum and Multi-Krum): every attacker uploads −λs. λ starts
  at the paper's upper bound

      λ₀ = min_{i∈B} Σ_{l∈Γ_i} ‖g_l − g_i‖ / ((m − 2c − 1) √d) + max_{i∈B} ‖g_i‖ / √d

  (Theorem 1; B the benign rows, Γ_i the m − c − 2 benign rows nearest to g_i, m rows of
  which c Byzantine, d coordinates; the authors' and the NDSS'21 code divide by the same
  (m − 2c − 1)·√d) and is halved until the rule selects the crafted rows, or
  falls below ``threshold``. "Selected" is read from the rule's output: the aggregate
  moves when the crafted rows move (a relative 1e-4 step along s), so the same test
  serves Krum, Multi-Krum, Bulyan or a plugin selection rule.
* ``fang_trim`` (§4.2, against Trimmed Mean and Median): per coordinate j with benign
  maximum w_max,j and minimum w_min,j, each attacker samples uniformly in
  [w_max,j, b·w_max,j] (or [w_max,j, w_max,j/b] when w_max,j ≤ 0) where s_j = −1, and in
  [w_min,j/b, w_min,j] (or [b·w_min,j, w_min,j] when w_min,j ≤ 0) where s_j = 1; b = 2.
  A coordinate with s_j = 0 is treated as s_j = 1.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import pairwise_sq_dists, row_norms
from fedshield.attacks._common import CohortAttack, Ctx, Rng, with_rows
from fedshield.attacks._oracle import RuleOracle, benign_oracle, selects
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params


def change_direction(updates: Tensor, oracle: RuleOracle) -> Tensor:
    """s = sign of the rule's aggregate of the before-attack rows (the mean when the rule
    cannot run on them)."""
    before = oracle(updates)
    if before is None or not bool(torch.isfinite(before).all()):
        before = updates.mean(dim=0)
    return torch.sign(before)


def krum_lambda_bound(benign: Tensor, num_rows: int, num_byzantine: int) -> float:
    """λ₀ of Fang et al. §4.2 (module docstring) for the ``[n, d]`` benign rows, m =
    ``num_rows`` and c = ``num_byzantine``. (m − 2c − 1) is floored at 1 and Γ_i capped at
    the n − 1 other benign rows, so the bound stays defined beyond Krum's condition."""
    n, d = benign.shape
    first = 0.0
    k = min(num_rows - num_byzantine - 2, n - 1)
    if k >= 1:
        d2, _ = pairwise_sq_dists(benign)
        dist = d2.clamp_min(0).sqrt().fill_diagonal_(math.inf)
        sums = dist.topk(k, dim=1, largest=False).values.sum(dim=1)
        first = float(sums.min()) / (max(num_rows - 2 * num_byzantine - 1, 1) * math.sqrt(d))
    second = float(row_norms(benign).max()) / math.sqrt(d)
    return first + second


class FangKrumParams(Params):
    threshold: float = Field(
        1e-5, gt=0.0, description="stop halving λ below this (the paper's ε = 1e-5)"
    )


class FangTrimParams(Params):
    b: float = Field(2.0, gt=1.0, description="interval factor b of the sampled values (paper: 2)")


@ATTACKS.register("fang_krum", tags=["kind=update", "omniscient", "needs_rule"])
class FangKrum(CohortAttack):
    """Fang et al. 2020's full-knowledge attack on Krum / Multi-Krum: upload −λs, λ halved until
    selected.

    s is the sign of the configured rule's before-attack aggregate and λ starts at the
    paper's upper bound (module docstring); every attacker uploads the same vector. The λ
    used is kept in ``last_lambda``."""

    params_schema = FangKrumParams
    needs_rule = True
    threshold: float

    #: λ used in the last call (None before the first call or with no attacker)
    last_lambda: float | None = None

    def forget(self) -> None:
        self.last_lambda = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        f = int(mask.sum())
        pool, _, oracle = benign_oracle(updates, mask, context)
        s = change_direction(updates, oracle)
        lam = krum_lambda_bound(pool, updates.shape[0], f)

        def selected(lam: float) -> bool:
            return selects(oracle, updates, mask, -lam * s, -(lam * 1e-9) * s)

        while lam >= self.threshold and not selected(lam):
            lam /= 2
        self.last_lambda = lam
        return with_rows(updates, mask, -lam * s)


@ATTACKS.register("fang_trim", tags=["kind=update", "omniscient", "needs_rule"])
class FangTrim(CohortAttack):
    """Fang et al. 2020's full-knowledge attack on Trimmed Mean / Median: benign extremes pushed
    against s.

    Each attacker draws its own values from the paper's intervals (module docstring) with
    the round's attack generator, so a run stays a pure function of its seed."""

    params_schema = FangTrimParams
    needs_rule = True
    b: float

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool, _, oracle = benign_oracle(updates, mask, context)
        s = change_direction(updates, oracle)
        return with_rows(updates, mask, trim_values(pool, s, int(mask.sum()), self.b, generator))


def trim_values(
    benign: Tensor, s: Tensor, f: int, b: float, generator: torch.Generator | None
) -> Tensor:
    """``[f, d]`` values of Fang's Trim attack (module docstring) for the benign rows and
    direction s: u ~ U[1, b] per attacker and coordinate; the extreme e_j (w_max,j where
    s_j < 0, else w_min,j) becomes e_j·u where that moves away from 0 towards the attack
    side, e_j/u otherwise, which gives exactly the paper's four intervals."""
    device = generator.device if generator is not None else benign.device
    u = torch.rand((f, benign.shape[1]), generator=generator, dtype=benign.dtype, device=device)
    u = 1.0 + (b - 1.0) * u.to(benign.device)
    down = s < 0  # s_j = −1: push the coordinate up, from the benign maximum
    extreme = torch.where(down, benign.max(dim=0).values, benign.min(dim=0).values)
    grow = down == (extreme > 0)
    return torch.where(grow, extreme * u, extreme / u)


__all__ = ["FangKrum", "FangTrim", "change_direction", "krum_lambda_bound", "trim_values"]
