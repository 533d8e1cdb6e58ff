"""The run store: one small record per finished run, valid across commits by evidence
(docs/results-store.md). :mod:`~fedshield.results.store` writes and reads records,
:mod:`~fedshield.results.validity` says whether one still counts at the current code
(replaying its first rounds where the code changed), :mod:`~fedshield.results.parts`
splits a campaign's missing runs over machines. ``python -m fedshield.results status``.
"""
