#!/usr/bin/env bash
# Re-run the kernel-dependent tests (marker `numerics`, tests/conftest.py) under the other
# float-kernel paths this machine can take, so a test that only passes on one CPU's kernels
# fails here, not on another machine of the same kind:
#   MKL_CBWR=COMPATIBLE / AVX2  MKL's conditional-numerical-reproducibility code paths;
#   ATEN_CPU_CAPABILITY         torch's own vectorised kernels (default = no SIMD dispatch);
#   ONEDNN_MAX_CPU_ISA          oneDNN's convolution kernels.
# On a CPU without MKL/x86 ISAs (ARM) the variables are ignored and the run repeats as is.
# The variants are the lines `variant ...` below (tools/demo_kernels.py reads them too).
set -euo pipefail
PY="${1:-.venv/bin/python}"
shift || true
x86=0
[[ "$(uname -m)" == x86_64 ]] && x86=1
# Only the files that hold them (tests/conftest.py's _NUMERIC_FILES, and files that mark
# single tests): collecting the whole suite to deselect three quarters of it cost each
# variant ~15 s.
mapfile -t FILES < <("$PY" -c 'import ast, pathlib
tests = pathlib.Path("tests")
tree = ast.parse((tests / "conftest.py").read_text())
names = next(n.value for n in tree.body if isinstance(n, ast.Assign)
             and getattr(n.targets[0], "id", "") == "_NUMERIC_FILES")
files = {e.value for e in names.elts}
files |= {f.name for f in tests.glob("test_*.py") if "mark.numerics" in f.read_text()}
print("\n".join(sorted(f"tests/{f}" for f in files)))')
run() {
    echo "== numerics under $*"
    env "$@" "$PY" -m pytest -q -n 2 --dist loadgroup -m numerics -p no:cacheprovider \
        "${FILES[@]}" "${EXTRA[@]}"
}
EXTRA=("$@")
if [[ $x86 == 1 ]]; then
    variant() { run "$@"; }
    variant MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41
    variant MKL_CBWR=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
else
    run MKL_CBWR=COMPATIBLE
fi
