# `make demo` and `make test` each work on a fresh clone: they create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedshield-installed

.PHONY: install demo test test-slow lint bench results clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch/torchvision pinned to the releases on this machine's disk (see README).
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[test,flower,privacy,track,hf]'
	# AutoAttack/FGSM reference (see pyproject: its requests pin conflicts with flwr's).
	$(PY) -m pip install -q --no-deps 'torchattacks>=3.5'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fedshield sweep --grid demo --out runs/demo

# Each phase prints its wall time (tools/timed.sh); the 25 slowest tests are listed.
# `make test` is everything but the long end-to-end runs marked `slow` (Flower deployments
# killed mid-round, the results pages' sampled cells, accuracy targets): `make test-slow`
# runs those, and CI (.ci/run) runs both.
test: $(STAMP)
	tools/timed.sh lint $(VENV)/bin/ruff check src tests bench tools
	tools/timed.sh types $(PY) -m mypy  # the files and settings: [tool.mypy] in pyproject.toml
	tools/timed.sh tests $(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow" --durations=25
	# the kernel-dependent tests again under other CPU kernel paths
	tools/timed.sh "kernel variants" tools/kernel_variants.sh $(PY)

test-slow: $(STAMP)
	tools/timed.sh "slow tests" $(PY) -m pytest -q -n 2 --dist loadgroup -m slow --durations=15

# One results page from nothing at this commit (docs/results/pages.toml; `fedshield results page`):
#   make results PAGE=brdrag [OUT=runs/results]   (OUT=. publishes docs/results/ in place)
#   make results PAGE=brdrag ONLY=brdrag-ct-cpu [JOBS=2]   (those jobs; the others' data as published)
#   make results PAGE=drag PART=1/4 [STORE=dir]   (part 1 of 4 of its missing runs, records
#                                                  only; docs/results-store.md)
PAGE ?=
OUT ?= runs/results
ONLY ?=
JOBS ?=
PART ?=
STORE ?=
results: $(STAMP)
	@test -n "$(PAGE)" || { $(PY) -m fedshield.results page --list; echo "error: give PAGE=<one of the pages above>" >&2; exit 2; }
	$(PY) -m fedshield.results page "$(PAGE)" --out "$(OUT)" $(if $(ONLY),--only "$(ONLY)") $(if $(JOBS),-j "$(JOBS)") $(if $(PART),--part "$(PART)") $(if $(STORE),--store "$(STORE)")

bench: $(STAMP)
	$(PY) bench/bench_round.py

clean:
	rm -rf runs .pytest_cache .mypy_cache
