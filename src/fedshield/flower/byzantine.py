"""Where a configured attack runs on Flower (DRAG paper, Sec. I-A on a real network).

* **Data attacks** (``label_flip``): on the malicious SuperNode, which poisons its own data
  and then trains honestly.
* **Row-local update attacks** (``sign_flip``, ``scaling``: they read only the attacker's own
  update, ``needs_own_update = True``): on the malicious SuperNode, after local training.
* **Omniscient update attacks** (``min_max``, ``min_sum``, ``alie``, ``ipm``; they read the
  round's benign updates) and attacks that ignore the own update (``noise``): in the
  strategy, which is the only place that sees every update of the round. This models the
  literature's omniscient colluding adversary. ``noise`` is placed there too because it
  draws from the round's shared attack stream, so Flower and simulator runs match exactly.
* **Defense-aware attacks** (``needs_rule``: ``alie_opt``, ``fang_krum``, ``adaptive_root``,
  ...): in the strategy, which holds the configured rule and every update.

An attack class may state its placement explicitly with a class attribute
``omniscient = True`` (strategy) or ``False`` (SuperNode); otherwise ``needs_own_update``
decides, as above. ``model_replacement`` poisons its data on the SuperNode and boosts its
update in the strategy (``omniscient = True``: its γ = S/f reads the cohort's size).
"""

from __future__ import annotations

from fedshield.attacks.base import DataAttack, UpdateAttack


def _update_on_client(attack: UpdateAttack) -> bool:
    """The update part runs on the SuperNode: row-local, not defense-aware (a
    ``needs_rule`` attack needs the server's rule and every row: the strategy's job)."""
    if getattr(attack, "needs_rule", False):
        return False
    return not bool(getattr(attack, "omniscient", not attack.needs_own_update))


def runs_on_client(attack: object) -> bool:
    """True when the malicious SuperNode applies ``attack`` itself (for an attack that is
    both, ``model_replacement``, its data part)."""
    if isinstance(attack, DataAttack):
        return True
    if isinstance(attack, UpdateAttack):
        return _update_on_client(attack)
    return False


def local_update_attack(attack: object) -> bool:
    """True for an update attack that the SuperNode applies to its own update. An attack
    that is also a data attack (``model_replacement``) poisons on the SuperNode and is
    placed for its update part like any update attack."""
    return isinstance(attack, UpdateAttack) and _update_on_client(attack)
