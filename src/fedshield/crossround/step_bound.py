"""A server-side step bound: a trust region from the steps the server applied before.

The rule bounds one round on its own rows; when a cohort (or a depth tier) holds more
attackers than the rule can outvote, the step it returns is theirs — and with fixed
attackers such cohorts recur (docs/cross-round.md, "Measured": Median ends at 0.40 vs 0.83 when the
attackers are spread evenly). The step bound clips, per coverage block G (the columns held by the
same rows, :func:`fedshield.algorithms.server.aggregation.coverage_groups`; one block
without masks), the applied step Δθ = θ^{t+1} − θ^t to

    ‖Δθ_G‖ ≤ κ · med_{s ∈ last k rounds, Δθ_{s,G} ≠ 0} ‖Δθ_{s,G}‖                    (1)

the lower median of the norms the last ``window`` applied steps had on those columns (a
trust region in the sense of Sun et al. 2019's server-side norm bounding, with its radius
taken from the run's own history instead of a constant). Before a block has a history
(the first round, or a block no earlier step moved) its radius is κ · η_g · the lower
median of the norms of the rows that hold it, the honest scale when the cohort has an
honest majority. What enters the history is the applied (clipped) step, so a run of
attacked rounds raises the radius by at most κ per round only once they are the majority
of the window: a minority of bad rounds in the last k never moves the median.

Memory: the last k applied steps, O(k·d) (``step_bound/steps`` [k, d] and the count of
recorded steps ``step_bound/count`` in the server state), so the radius of any block —
and blocks change with the cohort — is computed from the same history.

The bound caps how far an attacked round moves θ; it does not choose the direction (a
clipped attacked step is still the attackers'): it turns "θ thrown away" into "one
bounded bad step that the honest rounds after it correct". Server state other than θ
(Centered Clipping's centre, momentum) is the server's own and is not clipped.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import row_norms
from fedshield.algorithms.server.aggregation import coverage_groups
from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.core.flat import stack_rows
from fedshield.core.params import Params
from fedshield.crossround.base import (
    ROUND_DEFENSES,
    Acted,
    BoundInput,
    RoundDefense,
    State,
    reset_note,
)


class StepBoundParams(Params):
    kappa: float = Field(
        3.0, ge=1.0, le=1e6, description="κ: a block's step is at most κ × its recent median"
    )
    window: int = Field(
        5, ge=1, le=1000, description="k: the applied steps whose median norm is the scale"
    )


def step_blocks(rows: list[ClientUpdate], d: int, device: torch.device) -> list[Tensor]:
    """The column index sets of the coverage blocks of ``rows`` (all d columns when no row
    has a mask; columns nobody holds are not a block: no row moved them)."""
    if all(u.mask is None for u in rows):
        return [torch.arange(d, device=device)]
    full = torch.ones(d, dtype=torch.bool, device=device)
    masks = torch.stack([full if u.mask is None else u.mask.to(device) for u in rows])
    return [cols for _, cols in coverage_groups(masks)]


def lower_median(values: Tensor) -> float | None:
    """The lower median of a 1-D tensor; None when it is empty."""
    if values.numel() == 0:
        return None
    return float(values.sort().values[(values.numel() - 1) // 2])


def history_scale(history: Tensor, cols: Tensor) -> float | None:
    """Eq. (1)'s median: the lower median of the non-zero norms of the recorded steps
    ``history`` ([k', d]) on the columns ``cols``; None when none moved them."""
    if history.shape[0] == 0:
        return None
    norms = row_norms(history.index_select(1, cols))
    return lower_median(norms[norms > 0])


def rows_scale(rows: list[ClientUpdate], cols: Tensor) -> float | None:
    """The lower median of the norms, on ``cols``, of the rows that hold those columns."""
    first = cols[:1]
    held = [u.delta for u in rows if u.mask is None or bool(u.mask.index_select(0, first).all())]
    if not held:
        return None
    return lower_median(row_norms(stack_rows(held).index_select(1, cols)))


def clip_block(delta: Tensor, cols: Tensor, radius: float) -> float:
    """Scale ``delta[cols]`` in place to norm ≤ ``radius`` (> 0, float64); returns
    ‖Δ_G‖/radius."""
    part = delta.index_select(0, cols).double()
    norm = float(part.norm())
    ratio = norm / radius
    if ratio > 1.0:
        delta.index_copy_(0, cols, (part * (radius / norm)).to(delta.dtype))
    return ratio


@ROUND_DEFENSES.register("step_bound", tags=["memory=k*d", "bounds_step"])
class StepBound(RoundDefense):
    """A trust region: each coverage block's step is clipped to κ × the median norm of the
    last k applied steps.

    Memory O(k·d): the last ``window`` applied steps, in the server state."""

    state_parts = ("steps", "count")

    params_schema = StepBoundParams
    kappa: float
    window: int

    def _history(self, state: State, like: Tensor) -> tuple[Tensor, int, Acted]:
        steps, count = state.get(self.key("steps")), state.get(self.key("count"))
        k, d = self.window, like.numel()
        fresh = (like.new_zeros(k, d), 0, Acted())
        if steps is None and count is None:
            return fresh
        ok = (
            steps is not None
            and count is not None
            and steps.shape == (k, d)
            and steps.dtype == like.dtype
            and count.shape == ()
            and count.dtype == torch.int64
            and int(count) >= 0
        )
        if not ok:
            return (*fresh[:2], reset_note(self.name, "(steps/count)"))
        assert steps is not None and count is not None
        return steps.to(like.device), int(count), Acted()

    def bound(self, step: BoundInput, state: State, ctx: RoundContext) -> tuple[Tensor, Acted]:
        steps, count, acted = self._history(state, step.after)
        delta = (step.after - step.before).flatten()
        if not bool(torch.isfinite(delta).all()):
            return step.after, acted  # the non-finite guard refuses this step
        delta = delta.clone()
        recorded = steps[: min(count, self.window)]
        clipped, worst = 0, 0.0
        for cols in step_blocks(step.rows, delta.numel(), delta.device):
            scale = history_scale(recorded, cols)
            if scale is None:
                rows = rows_scale(step.rows, cols)
                scale = None if rows is None else rows * abs(step.lr)
            if scale is None or scale <= 0.0:
                continue  # no scale known for this block: the rule's own bound holds
            ratio = clip_block(delta, cols, self.kappa * scale)
            worst = max(worst, ratio)
            clipped += int(ratio > 1.0)
        steps = steps.clone()
        steps[count % self.window] = delta
        acted.state = {
            self.key("steps"): steps,
            self.key("count"): torch.tensor(count + 1, dtype=torch.int64, device=delta.device),
        }
        acted.metrics |= {
            f"defense/{self.name}/clipped_blocks": float(clipped),
            f"defense/{self.name}/ratio": worst,
        }
        return step.before + delta.view_as(step.before), acted


__all__ = ["StepBound", "clip_block", "history_scale", "rows_scale", "step_blocks"]
