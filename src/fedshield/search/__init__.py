"""Budgeted searches of the attacker and the defense against each other (docs/cross-round.md,
"Searched attacker"): :mod:`~fedshield.search.attack_search` (Optuna over the ``quiet``
family), :mod:`~fedshield.search.defense_search` (Optuna over compositions),
:mod:`~fedshield.search.alternate` (best responses in turn, then held-out seeds) and
``fedshield recommend`` (:mod:`~fedshield.search.command`)."""
