"""The results: the run store and the results pages made from it.

The run store (docs/results-store.md): one small record per finished run, valid across
commits by evidence. :mod:`~fedshield.results.store` writes and reads records,
:mod:`~fedshield.results.validity` says whether one still counts at the current code
(replaying its first rounds where the code changed), :mod:`~fedshield.results.campaign`
splits a campaign's missing runs over machines. A run's process loads these (and the
commands' arguments, :mod:`fedshield.results.__main__`), nothing else of this package.

The pages (docs/results/index.md): :mod:`~fedshield.results.pages` (docs/results/pages.toml:
the pages and their jobs), :mod:`~fedshield.results.make` (a page's jobs run and the page
rendered), :mod:`~fedshield.results.render` (the table blocks of README.md and docs/),
:mod:`~fedshield.results.header` (a page's header block), :mod:`~fedshield.results.collect`
(data files and their provenance), :mod:`~fedshield.results.paired` (paired per-seed
verdicts), :mod:`~fedshield.results.curves` (curves over rounds),
:mod:`~fedshield.results.sampling` (a page's sampled cell re-run). ``fedshield results
status|replay|page|render|paired|curves`` (``python -m fedshield.results``).
"""

#: The modules of this package a run's process may load (``fedshield run`` / ``sweep``):
#: the others, the pages', are imported only by the ``fedshield results`` command when it
#: runs (tests/test_import_graph.py, tests/test_run_store.py).
RUN_SIDE = frozenset({"fedshield.results", "fedshield.results.__main__", "fedshield.results.store",
                      "fedshield.results.validity", "fedshield.results.campaign"})  # fmt: skip
