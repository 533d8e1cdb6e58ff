"""``[privacy]`` → the mechanisms of a run, its compatibility checks and its accounting.

:func:`attach_privacy` is called by the :class:`~fedshield.sim.engine.Simulator` (on the
simulator and on both Flower apps) before any training: it refuses a combination whose
guarantee would not hold, with a :class:`ConfigError` naming the keys, hands
:class:`~fedshield.privacy.central.CentralDP` to the server algorithm (used inside
``FedAvg.aggregate``) and :class:`~fedshield.privacy.local.LocalDPSGD` to the client
algorithm (used in the local SGD loop), and returns the accounting callback that writes
ε(δ) into every round's record (``privacy/epsilon``; ``privacy/local_epsilon_max`` and
``_mean`` over the clients) and ``privacy.json`` (every client's ε) at the end.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshield.privacy.accountant import epsilon_of, noise_multiplier_for
from fedshield.privacy.central import CentralDP
from fedshield.privacy.checks import check_central, check_local
from fedshield.privacy.local import LocalDPSGD, sample_rate
from fedshield.sim.callbacks import Callback, RunView

if TYPE_CHECKING:

    from fedshield.sim.state import Experiment


@dataclass
class PrivacySetup:
    """The mechanisms of one run (None: off) and the callbacks that account for them."""

    central: CentralDP | None = None
    local: LocalDPSGD | None = None
    callbacks: list[Callback] = field(default_factory=list)


def build_central(exp: Experiment) -> CentralDP:
    """DP-FedAvg for ``exp``, or a ConfigError naming what cannot be made private."""
    cfg = exp.cfg
    check_central(cfg, exp.components, exp.model)
    pc = cfg.privacy.central  # type: ignore[union-attr]
    assert pc is not None
    q = cfg.server.clients_per_round / cfg.data.num_clients
    z = pc.noise_multiplier
    if z is None:
        z = noise_multiplier_for(pc.target_epsilon, pc.delta, q, cfg.rounds, "privacy.central")
    rule = exp.components.aggregator
    return CentralDP(rule=rule, clip=pc.clip, noise_multiplier=z, delta=pc.delta, sample_rate=q)


# -- sample-level local DP-SGD ----------------------------------------------------------


def local_steps(cfg: Any, sizes: list[int]) -> list[int]:
    """U_k: DP-SGD steps per participation of every client."""
    from fedshield.algorithms.client.base import LocalSpec

    c = cfg.client
    spec = LocalSpec(lr=c.lr, batch_size=c.batch_size, steps=c.local_steps, epochs=c.local_epochs)
    return [spec.num_steps(n) for n in sizes]


def participations(cfg: Any, upto: int) -> np.ndarray:
    """``[M]`` how many of rounds 1..upto each client was selected in (seeded cohorts)."""
    from fedshield.core.seeds import sample_cohort

    m, s = cfg.data.num_clients, cfg.server.clients_per_round
    counts = np.zeros(m, dtype=np.int64)
    for t in range(1, upto + 1):
        counts[list(sample_cohort(cfg.seed, t, m, s))] += 1
    return counts


def _pareto(points: set[tuple[float, int]]) -> list[tuple[float, int]]:
    """The (q, steps) pairs not dominated by another one (ε grows with both)."""
    return [p for p in points if not any(o != p and o[0] >= p[0] and o[1] >= p[1] for o in points)]


def build_local(exp: Experiment) -> LocalDPSGD:
    """DP-SGD for every client of ``exp``, or a ConfigError naming the combination."""
    cfg = exp.cfg
    check_local(cfg, exp.components, exp.model)
    pl = cfg.privacy.local  # type: ignore[union-attr]
    assert pl is not None
    key = "privacy.local"
    z = pl.noise_multiplier
    if z is None:
        sizes = [len(c) for c in exp.clients]
        counts = participations(cfg, cfg.rounds)
        steps = local_steps(cfg, sizes)
        points = {
            (sample_rate(cfg.client.batch_size, n), int(u * r))
            for n, u, r in zip(sizes, steps, counts)
            if r > 0
        }
        # One z for every client: the largest that any client needs to stay within target.
        needed = [
            noise_multiplier_for(pl.target_epsilon, pl.delta, q, s, key) for q, s in _pareto(points)
        ]
        z = max(needed, default=0.0)
    return LocalDPSGD(clip=pl.clip, noise_multiplier=z, delta=pl.delta)


# -- accounting --------------------------------------------------------------------------


class PrivacyAccounting(Callback):
    """ε(δ) after every round: the central mechanism's (``privacy/epsilon``) and every
    client's under DP-SGD (max and mean in the record; all of them in privacy.json).

    The accountant's ledger counts, per noise multiplier, the rounds (central) and each
    client's DP-SGD steps (local); every record also carries the z used in its round, so a
    resumed run whose z changed (a target ε over more rounds) composes the rounds of both
    sessions correctly."""

    def __init__(self, setup: PrivacySetup, cfg: Any, sizes: list[int]) -> None:
        self.setup = setup
        self.cfg = cfg
        self.steps = local_steps(cfg, sizes)
        self.rates = [sample_rate(cfg.client.batch_size, n) for n in sizes]
        self._reset()

    def _reset(self) -> None:
        self._central: dict[float, int] = {}
        self._local: list[dict[float, int]] = [{} for _ in self.steps]
        self._upto = 0

    def _add(self, rnd: int, z_central: float | None, z_local: float | None) -> None:
        if z_central is not None:
            self._central[z_central] = self._central.get(z_central, 0) + 1
        if z_local is not None:
            for k in _cohort(self.cfg, rnd):
                self._local[k][z_local] = self._local[k].get(z_local, 0) + self.steps[k]
        self._upto = rnd

    def _catch_up(self, sim: RunView | None, rnd: int) -> None:
        """Rebuild the ledger of rounds 1..rnd−1 (a resumed session) from their records."""
        self._reset()
        past = {int(r["round"]): r for r in (sim.records if sim is not None else [])}
        c, loc = self.setup.central, self.setup.local
        for t in range(1, rnd):
            r = past.get(t, {})
            zc = None if c is None else r.get("privacy/noise_multiplier", c.noise_multiplier)
            zl = (
                None
                if loc is None
                else r.get("privacy/local_noise_multiplier", loc.noise_multiplier)
            )
            self._add(t, zc, zl)

    def central_epsilon(self) -> float:
        c = self.setup.central
        assert c is not None
        history = [(z, c.sample_rate, n) for z, n in self._central.items()]
        return epsilon_of(history, c.delta)

    def local_epsilons(self) -> list[float]:
        loc = self.setup.local
        assert loc is not None
        return [
            epsilon_of([(z, q, n) for z, n in ledger.items()], loc.delta)
            for q, ledger in zip(self.rates, self._local)
        ]

    def after_round(
        self, sim: RunView | None, record: dict[str, Any], timing: dict[str, Any]
    ) -> None:
        rnd = int(record["round"])
        if rnd != self._upto + 1:
            self._catch_up(sim, rnd)
        c, loc = self.setup.central, self.setup.local
        zc = None if c is None else c.noise_multiplier
        self._add(rnd, zc, None if loc is None else loc.noise_multiplier)
        if c is not None:
            record["privacy/noise_multiplier"] = c.noise_multiplier
            record["privacy/epsilon"] = self.central_epsilon()
        if loc is not None:
            eps = self.local_epsilons()
            record["privacy/local_noise_multiplier"] = loc.noise_multiplier
            record["privacy/local_epsilon_max"] = max(eps)
            record["privacy/local_epsilon_mean"] = float(np.mean(eps))

    def report(self) -> dict[str, Any]:
        """What privacy.json holds: the mechanisms and ε after the rounds accounted so far."""
        out: dict[str, Any] = {
            "rounds": self._upto,
            "accountant": "opacus.accountants.RDPAccountant",
        }
        c = self.setup.central
        if c is not None:
            out["central"] = {
                "clip": c.clip,
                "noise_multiplier": c.noise_multiplier,
                "sample_rate": c.sample_rate,
                "delta": c.delta,
                "rounds_per_noise_multiplier": {str(z): n for z, n in self._central.items()},
                "epsilon": _finite(self.central_epsilon()),
            }
        loc = self.setup.local
        if loc is not None:
            out["local"] = {
                "clip": loc.clip,
                "noise_multiplier": loc.noise_multiplier,
                "delta": loc.delta,
                "sample_rate": self.rates,
                "steps": [sum(ledger.values()) for ledger in self._local],
                "epsilon": [_finite(e) for e in self.local_epsilons()],
            }
        return out

    def on_run_end(self, sim: RunView, summary: dict[str, Any]) -> None:
        if sim.out is None or not self._upto:
            return
        from fedshield.sim.checkpoint import atomic_write_text

        atomic_write_text(sim.out / "privacy.json", json.dumps(self.report(), indent=2) + "\n")


def _cohort(cfg: Any, rnd: int) -> tuple[int, ...]:
    from fedshield.core.seeds import sample_cohort

    return sample_cohort(cfg.seed, rnd, cfg.data.num_clients, cfg.server.clients_per_round)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def attach_privacy(exp: Experiment) -> PrivacySetup:
    """Build the ``[privacy]`` mechanisms of ``exp``, hand them to its server and client
    algorithms, and return them with their accounting callback (nothing when unset)."""
    pcfg = exp.cfg.privacy
    comp = exp.components
    setup = PrivacySetup()
    if pcfg is not None and pcfg.central is not None:
        setup.central = build_central(exp)
    if pcfg is not None and pcfg.local is not None:
        setup.local = build_local(exp)
    # Set (or clear) on the components every time, so a rebuilt Simulator matches its config.
    comp.server.central_dp = setup.central  # type: ignore[attr-defined]
    comp.client.dp_sgd = setup.local
    if setup.central is not None or setup.local is not None:
        setup.callbacks.append(PrivacyAccounting(setup, exp.cfg, [len(c) for c in exp.clients]))
    return setup


__all__ = [
    "PrivacyAccounting",
    "PrivacySetup",
    "attach_privacy",
    "build_central",
    "build_local",
    "check_central",
    "check_local",
    "local_steps",
    "participations",
]
