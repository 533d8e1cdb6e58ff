"""``mimic``: the heterogeneity attack of Karimireddy, He & Jaggi (ICLR 2022, "Byzantine-
robust learning on heterogeneous datasets via bucketing", §4 and App. "Mimic").

Every attacker uploads a copy of one benign worker's update. Nothing is out of the benign
cloud, so no outlier filter can reject it, yet the rule's output is pulled towards that
worker's (non-IID) data: under heterogeneity the over-represented worker biases the model.

Which worker (``target``):

* ``"warmup"`` (default; the authors' ``MimicVariantAttacker``): during the first
  ``warmup`` attacked rounds (their default 1) the attackers estimate the direction z of
  largest variance of the benign updates by a running power iteration — round 0: μ = ḡ,
  z ∝ Σ_i ⟨g_i − μ, z₀⟩(g_i − μ) from a Gaussian z₀; round t < T: μ ← (tμ + ḡ)/(t + 1),
  z ← (t z + c/‖c‖)/(t + 1) normalised, c = Σ_i ⟨g_i − μ, z⟩(g_i − μ) — and copy the
  worker i maximising ⟨g_i, z⟩; from round T on that worker is fixed. A worker is its
  position among the round's benign rows (the paper's setting: every worker every round).
* ``"per_round"``: the worker most extreme along the top principal direction of this
  round's benign rows alone (a pure function of the round).
* an integer ε: that benign row every round (ByzFL's ``Mimic(epsilon)``).

The warm-up state (t, μ, z, the worker) is the attack's :meth:`Mimic.state_dict`, saved
in the run's checkpoint, so a resumed run continues with the same worker.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import W
from fedshield.attacks._common import CohortAttack, Ctx, Rng, honest_pool, with_rows
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params
from fedshield.errors import DataError


class MimicParams(Params):
    target: Annotated[int, Field(ge=0)] | Literal["warmup", "per_round"] = Field(
        "warmup",
        description="worker copied: 'warmup' (the authors': the worker furthest along the "
        "direction of largest variance estimated over the first `warmup` rounds, then "
        "fixed), 'per_round' (the most extreme along this round's top principal "
        "direction) or an index among the benign rows (ByzFL's epsilon; out of range: the "
        "last)",
    )
    warmup: int = Field(
        1,
        ge=1,
        description="rounds of direction estimation before the target is fixed (the "
        "authors' --mimic-warmup, default 1)",
    )


def principal_target(pool: Tensor) -> int:
    """The row of ``pool`` most extreme along the top principal direction z of the centred
    rows: argmax_i |⟨g_i − μ, z⟩| (``target = "per_round"``), z from the [n, n] Gram
    matrix in float64, so the choice is a pure function of the round."""
    if pool.shape[0] < 2:
        return 0
    centred = (pool - pool.mean(dim=0)).double()
    gram = centred @ centred.T
    _, vecs = torch.linalg.eigh(gram)
    # Projections of the rows on z are the top eigenvector of the Gram matrix times √λ:
    # the argmax of |projection| is the argmax of |eigenvector entry|.
    return int(vecs[:, -1].abs().argmax())


def power_step(pool: Tensor, mu: Tensor, z: Tensor) -> Tensor:
    """c/‖c‖ for c = Σ_i ⟨g_i − μ, z⟩(g_i − μ) (float64); z itself when c = 0 (identical
    rows: no direction to learn, and no 0/0)."""
    centred = pool.to(W) - mu
    c = (centred @ z) @ centred
    norm = torch.linalg.vector_norm(c)
    return c / norm if bool(norm > 0) and bool(torch.isfinite(norm)) else z


@ATTACKS.register("mimic", tags=["kind=update", "omniscient"])
class Mimic(CohortAttack):
    """Every attacker uploads a copy of one benign worker's update (Karimireddy et al. 2022).

    ``target``: ``"warmup"`` (default: the authors' warm-up-then-fixed worker),
    ``"per_round"`` or a fixed benign index (module docstring). The index copied is kept in
    ``last_target``."""

    params_schema = MimicParams
    needs_own_update = False
    target: int | str
    warmup: int

    #: benign row copied in the last call (None before the first call or with no attacker)
    last_target: int | None = None

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._t = 0  # attacked rounds seen
        self._mu: Tensor | None = None
        self._z: Tensor | None = None
        self._fixed: int | None = None

    def forget(self) -> None:
        self.last_target = None

    def state_dict(self) -> dict[str, Any]:
        """The warm-up state (for the run's checkpoint); empty for the stateless targets."""
        if self.target != "warmup":
            return {}
        return {"t": self._t, "mu": self._mu, "z": self._z, "fixed": self._fixed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.target != "warmup" or not state:
            return
        t, mu, z, fixed = (state.get(k) for k in ("t", "mu", "z", "fixed"))
        ok = fixed is None or isinstance(fixed, int)
        if not (isinstance(t, int) and t >= 0 and ok) or not all(
            v is None or isinstance(v, Tensor) for v in (mu, z)
        ):
            raise DataError("checkpoint: 'attack' is not mimic's warm-up state")
        self._t, self._mu, self._z, self._fixed = t, mu, z, fixed

    def _warmup_target(self, pool: Tensor, generator: Rng) -> int:
        avg = pool.to(W).mean(dim=0)
        t = self._t
        if t == 0 or self._mu is None or self._z is None:
            # z₀: the round's attack generator (the authors seed theirs with 0, our
            # fallback for a direct call without one)
            gen = generator if generator is not None else torch.Generator().manual_seed(0)
            z0 = torch.randn(pool.shape[1], generator=gen, dtype=W, device=gen.device)
            self._mu = avg
            self._z = power_step(pool, avg, z0.to(pool.device))
        elif t < self.warmup:
            mu = self._mu.to(pool.device)
            z = self._z.to(pool.device)
            self._mu = mu = t / (1 + t) * mu + avg / (1 + t)
            z = t / (1 + t) * z + power_step(pool, mu, z) / (1 + t)
            self._z = z / torch.linalg.vector_norm(z).clamp_min(1e-300)
        if t < self.warmup:
            # first maximum on ties, as the authors' loop (d > mv)
            self._fixed = int((pool.to(W) @ self._z.to(pool.device)).argmax())
        self._t = t + 1
        assert self._fixed is not None
        return min(self._fixed, pool.shape[0] - 1)

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool = honest_pool(updates, mask)
        if self.target == "warmup":
            i = self._warmup_target(pool, generator)
        elif self.target == "per_round":
            i = principal_target(pool)
        else:
            i = min(int(self.target), len(pool) - 1)
        self.last_target = i
        return with_rows(updates, mask, pool[i])


__all__ = ["Mimic", "power_step", "principal_target"]
