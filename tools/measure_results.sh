#!/usr/bin/env bash
# Re-measure every table of docs/results/ and the README on the bundled data, then collect the
# sweeps' CSVs under docs/results/data/ and re-render the documents.
#
#   tools/measure_results.sh                 # everything, with the seeds the documents use
#   tools/measure_results.sh GRID ...        # these grids only (SEEDS=0,1,2, EXTRA="--set ...")
#
# Each sweep resumes where it stopped (finished runs are kept), so the script can be re-run
# after an interruption. Two runs at a time, one torch thread each.
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-.venv/bin/fedshield}
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-2}

# run_grid GRID SEEDS [--set KEY=VALUE ...]
run_grid() {
  local g=$1 seeds=$2
  shift 2
  echo "== $g seeds $seeds $* ($(date +%H:%M))"
  "$FS" sweep --grid "$g" --seeds "$seeds" -j "$JOBS" -q --out "runs/$g" "$@" > "runs/$g.log" 2>&1 \
    || { echo "sweep $g failed: see runs/$g.log"; exit 1; }
  "$PY" tools/render_results.py --collect "runs/$g" > /dev/null
}

mkdir -p runs
if [ $# -gt 0 ]; then
  # shellcheck disable=SC2086
  for g in "$@"; do run_grid "$g" "${SEEDS:-0,1,2}" ${EXTRA:-}; done
else
  # The README's demo table: what `make demo` prints (seed 0).
  "$FS" sweep --grid demo -q --out runs/demo > runs/demo.log 2>&1
  "$PY" tools/render_results.py --collect runs/demo > /dev/null
  for g in clean-digits-cpu brdrag-attacks-20-cpu brdrag-attacks-40-cpu brdrag-attacks-60-cpu \
           brdrag-attacks-80-cpu drag-baselines-cpu drag-participation-cpu eevit-alpha-cpu; do
    run_grid "$g" 0,1,2
  done
  # FedCART grids: robust evaluation (PGD-20, CW∞ on 500 images) at the last round only;
  # it does not change training, and it is most of a run's CPU time at every 5 rounds.
  for g in fedcart-methods-cpu fedcart-ablations-cpu fedcart-rho-cpu fedcart-rho-calfat-cpu \
           fedcart-baselines-cpu; do
    run_grid "$g" 0,1,2 --set eval.every=20
  done
  # Hyper-parameter sweeps and the early-exit baselines: one seed.
  run_grid eevit-baselines-cpu 0
  run_grid drag-c-cpu 0
  run_grid drag-alpha-cpu 0
  # The defense × attack grid of docs/results/robustness.md ("Under attack"), ~3 h here.
  "$PY" tools/attack_grid.py run --rounds 20 -j "$JOBS" > runs/attack-grid.log 2>&1
  "$PY" tools/attack_grid.py cells --rounds 20 > /dev/null
fi
"$PY" tools/render_results.py
