#!/usr/bin/env bash
# Re-measure every table of docs/results/ and the README on the bundled data, 3 seeds each,
# then collect the sweeps' CSVs under docs/results/data/ and re-render the documents.
#
#   tools/measure_results.sh [GRID ...]     # default: every grid below
#
# Each sweep resumes where it stopped (finished runs are kept), so the script can be
# re-run after an interruption. Two runs at a time, one torch thread each.
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-.venv/bin/fedshield}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-0,1,2}
JOBS=${JOBS:-2}

GRIDS=(
  clean-digits-cpu
  brdrag-attacks-20-cpu brdrag-attacks-40-cpu brdrag-attacks-60-cpu brdrag-attacks-80-cpu
  drag-baselines-cpu drag-participation-cpu drag-alpha-cpu drag-c-cpu
  fedcart-methods-cpu fedcart-baselines-cpu fedcart-ablations-cpu
  fedcart-rho-cpu fedcart-rho-calfat-cpu
  eevit-alpha-cpu eevit-baselines-cpu
)
[ $# -gt 0 ] && GRIDS=("$@")

mkdir -p runs
if [ $# -eq 0 ]; then  # the demo table of the README: what `make demo` prints (seed 0)
  "$FS" sweep --grid demo -q --out runs/demo > runs/demo.log 2>&1
  "$PY" tools/render_results.py --collect runs/demo > /dev/null
fi
for g in "${GRIDS[@]}"; do
  echo "== $g ($(date +%H:%M))"
  "$FS" sweep --grid "$g" --seeds "$SEEDS" -j "$JOBS" -q --out "runs/$g" > "runs/$g.log" 2>&1 \
    || { echo "sweep $g failed: see runs/$g.log"; exit 1; }
  "$PY" tools/render_results.py --collect "runs/$g" > /dev/null
done
"$PY" tools/render_results.py
