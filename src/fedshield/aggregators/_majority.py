"""Rules that tolerate f Byzantine rows out of S when 2f < S (Trimmed Mean, MDA, MeaMed, MoNNA,
CAF, SMEA, DnC).

ByzFL 0.0.11 states each of them with this one condition (``2f ≥ n`` raises); the largest
feasible f on S rows is therefore ⌊(S − 1)/2⌋ (the default when f is left unset, see
:class:`~fedshield.aggregators.base.ByzantineCountRule`).
"""

from __future__ import annotations

from fedshield.aggregators.base import ByzantineCountRule, ConfigError, dropped_note


class HonestMajorityRule(ByzantineCountRule):
    """A :class:`ByzantineCountRule` whose only condition is 2f < S."""

    @staticmethod
    def largest_f(num_rows: int) -> int | None:
        return (num_rows - 1) // 2 if num_rows >= 1 else None

    def check_f(self, f: int, num_rows: int, dropped: int = 0) -> None:
        if 2 * f >= num_rows:
            raise ConfigError(
                f"{self._name}: f={f} needs more than 2f = {2 * f} rows per round, "
                f"got S={num_rows}{dropped_note(dropped)}"
            )


__all__ = ["HonestMajorityRule"]
