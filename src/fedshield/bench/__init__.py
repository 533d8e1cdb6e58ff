"""``fedshield bench``: the robustness benchmark — defenses × attacks × Byzantine shares ×
heterogeneity × faults × attack modes × seeds, with hyper-parameters chosen per defense on
a validation split by the worst case over the attacks (ByzFL's protocol), worst cases
naming their attack, heat maps, resumable per-run results with provenance.

Modules: :mod:`.spec` (the TOML grid), :mod:`.plan` (runs and their configs),
:mod:`.lockstep` (runs trained as one batched computation), :mod:`.runner` (result files,
resume, backends), :mod:`.select` (the protocol), :mod:`.render` (tables, heat maps),
:mod:`.command` (the CLI). docs/bench.md has the user guide.
"""
