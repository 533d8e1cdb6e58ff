"""Who arrives: the law of the rows a robust rule sees under ``[faults]`` (docs/faults.md,
"Liveness").

Honest clients are online with probability a (the product of the availability models'
:meth:`~fedshield.faults.base.FaultModel.rate`) and, once invited, answer with probability
r (the product of the response models'); attackers are always online and always answer
(unless ``faults.attackers_fail``: then they fault like everybody). Per round, with A of M
clients Byzantine and S' invited:

* ``invite = "online"`` (the default: the cohort is drawn from the clients online): the
  honest clients online are N ~ Binomial(M − A, a), the cohort holds
  X ~ Hypergeometric(A + N, A, min(S', A + N)) attackers — **over-represented**: at
  M = 50, A = 15, a = 0.5 the attackers are 15 of ~32.5 online clients, 46 % instead of
  30 % — and H ~ Binomial(min(S', A + N) − X, r) honest rows arrive;
* ``invite = "population"`` (the cohort is drawn from all M; an offline invitee is a
  missing row): X ~ Hypergeometric(M, A, S') — the population's share — and
  H ~ Binomial(S' − X, a·r).

The rule sees n = X + H rows of which B = X are Byzantine (Binomial(X, a·r) or
Binomial(X, r) when attackers fail too). Under ``attack.mode = "per_round"`` the cohort's
attackers are X = ⌊fraction·c⌋ of the c invited, c = min(S', Binomial(M, a)) online (every
client's availability applies). :func:`arrival_law` returns the joint law of (X, B, n); the
build-time statement (:mod:`fedshield.sim.byzantine_budget`) reads f, P(B > f), the
attackers' share among arriving rows and P(n < rows the rule needs) off it. Rounds are
treated as independent (a per-run deadline speed makes the same clients late every round:
the share is right on average, the spread is not).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

#: Probabilities below this are dropped from the sums (their total stays below 1e-9).
_NEGLIGIBLE = 1e-13


@dataclass(frozen=True)
class Arrival:
    """What the faults do to one round: honest online rate a, answer rate r, how the
    cohort is invited, whether attackers fault too, and the models that gave no rate."""

    online: float = 1.0
    answer: float = 1.0
    invite: str = "online"
    attackers_fail: bool = False
    unknown: tuple[str, ...] = ()

    @property
    def lossless(self) -> bool:
        return self.online >= 1.0 and self.answer >= 1.0


@functools.lru_cache(maxsize=4096)
def binom_pmf(n: int, p: float) -> np.ndarray:
    """P(K = k), k = 0..n, of K ~ Binomial(n, p) (cached: read-only)."""
    k = np.arange(n + 1)
    if p <= 0.0 or p >= 1.0:
        out = np.zeros(n + 1)
        out[0 if p <= 0.0 else n] = 1.0
    else:
        out = np.exp(_log_comb(n, k) + k * math.log(p) + (n - k) * math.log1p(-p))
    out.flags.writeable = False
    return out


@functools.cache
def _log_factorials(n: int) -> np.ndarray:
    """log(k!) for k = 0..n (n rounded up to a power of two, so few tables are built)."""
    size = 1 << max(n, 1).bit_length()
    out = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, size + 1)))])
    out.flags.writeable = False
    return out


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    lf = _log_factorials(n)
    return lf[n] - lf[k] - lf[n - k]


def hypergeom(population: int, marked: int, drawn: int) -> np.ndarray:
    """P(X = x), x = 0..drawn, of the marked among ``drawn`` of ``population`` (no
    replacement); log-gamma terms, so M in the thousands costs microseconds."""
    x = np.arange(drawn + 1)
    ok = (x <= marked) & (drawn - x <= population - marked)
    out = np.zeros(drawn + 1)
    if not ok.any():
        return out
    xs = x[ok]
    logp = _log_comb(marked, xs) + _log_comb(population - marked, drawn - xs)
    out[ok] = np.exp(logp - _log_comb(population, np.array([drawn]))[0])
    return out


@dataclass
class ArrivalLaw:
    """The joint law P[x, b, n] of a round's invited attackers x, Byzantine rows b that
    arrive and rows n that arrive (arrays indexed 0..S')."""

    joint: np.ndarray  # [S'+1, S'+1, S'+1]

    @property
    def invited_attackers(self) -> np.ndarray:
        """P(X = x)."""
        return self.joint.sum(axis=(1, 2))

    def p_byzantine_above(self, f: int) -> float:
        """P(B > f): the rows the rule sees hold more attackers than its f."""
        return float(self.joint.sum(axis=(0, 2))[f + 1 :].sum())

    def p_rows_below(self, need: int) -> float:
        """P(n < need): a round that keeps fewer rows than the rule needs (skipped)."""
        return float(self.joint.sum(axis=(0, 1))[:need].sum())

    def p_fails(self, f: int, need: int) -> float:
        """P(n < need or B > f): the round is skipped or its rule is outvoted."""
        bn = self.joint.sum(axis=0)
        b = np.arange(bn.shape[0])[:, None]
        n = np.arange(bn.shape[1])[None, :]
        return float(bn[(n < need) | (b > f)].sum())

    def share(self) -> float:
        """E[B / n | n > 0]: the attackers' expected share of the rows that arrive."""
        bn = self.joint.sum(axis=0)
        b = np.arange(bn.shape[0])[:, None]
        n = np.arange(bn.shape[1])[None, :]
        some = bn[:, 1:].sum()
        ratio = np.divide(b, n, out=np.zeros(bn.shape), where=n > 0)
        return float((bn * ratio).sum() / some) if some > 0 else 0.0

    def p_half(self) -> float:
        """P(n > 0 and 2B ≥ n): attackers are at least half the rows that arrive."""
        bn = self.joint.sum(axis=0)
        b = np.arange(bn.shape[0])[:, None]
        n = np.arange(bn.shape[1])[None, :]
        return float(bn[(n > 0) & (2 * b >= n)].sum())


def _add_cohort(
    joint: np.ndarray, weight: float, x_pmf: np.ndarray, size: int, r_h: float, r_b: float | None
) -> None:
    """Add ``weight`` × the law of a cohort of ``size`` with P(X = x) = ``x_pmf[x]``: its
    honest answer with ``r_h``, its attackers always (``r_b`` None) or with ``r_b``."""
    for x, px in enumerate(x_pmf):
        w = weight * px
        if w < _NEGLIGIBLE:
            continue
        h = binom_pmf(size - x, r_h)
        b_pmf = np.eye(1, x + 1, x)[0] if r_b is None else binom_pmf(x, r_b)
        for b, pb in enumerate(b_pmf):
            if pb * w < _NEGLIGIBLE:
                continue
            joint[x, b, b : b + len(h)] += w * pb * h


def arrival_law(
    *,
    population: int,
    invited: int,
    arrival: Arrival,
    attackers: int = 0,
    per_round_fraction: float | None = None,
) -> ArrivalLaw:
    """The joint law of (X, B, n) of one round (module docstring): ``attackers`` fixed
    Byzantine clients of ``population``, or ``per_round_fraction`` of each cohort."""
    m, s = population, min(invited, population)
    a, r = arrival.online, arrival.answer
    joint = np.zeros((s + 1, s + 1, s + 1))
    fail = arrival.attackers_fail
    if per_round_fraction is not None:
        pool = binom_pmf(m, a) if arrival.invite == "online" else np.eye(1, m + 1, m)[0]
        r_h = r if arrival.invite == "online" else a * r
        for online, w in enumerate(pool):
            if w < _NEGLIGIBLE:
                continue
            c = min(s, online)
            x = int(math.floor(per_round_fraction * c))
            _add_cohort(joint, w, np.eye(1, c + 1, x)[0], c, r_h, r_h if fail else None)
        return ArrivalLaw(joint)
    big_a = min(attackers, m)
    if arrival.invite == "population":
        x_pmf = hypergeom(m, big_a, s)
        _add_cohort(joint, 1.0, x_pmf, s, a * r, a * r if fail else None)
        return ArrivalLaw(joint)
    honest_on = binom_pmf(m - big_a, a)
    bad_on = binom_pmf(big_a, a) if fail else np.eye(1, big_a + 1, big_a)[0]
    for nb, wb in enumerate(bad_on):
        if wb < _NEGLIGIBLE:
            continue
        for nh, wh in enumerate(honest_on):
            w = wb * wh
            if w < _NEGLIGIBLE:
                continue
            pool = nb + nh
            c = min(s, pool)
            x_pmf = hypergeom(pool, nb, c) if pool else np.ones(1)
            _add_cohort(joint, w, x_pmf, c, r, r if fail else None)
    return ArrivalLaw(joint)


__all__ = ["Arrival", "ArrivalLaw", "arrival_law", "binom_pmf", "hypergeom"]
