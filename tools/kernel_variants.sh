#!/usr/bin/env bash
# Re-run the kernel-dependent tests (marker `numerics`, tests/conftest.py) under every other
# float-kernel path this CPU can take, so a test that only passes on one CPU's kernels fails
# here, not on another machine of the same kind:
#   ATEN_CPU_CAPABILITY   torch's own vectorised kernels: the main test phase runs the
#                         highest the CPU has (AVX512 > AVX2 > DEFAULT, no SIMD dispatch);
#                         each level below it is a variant, so a machine with more paths
#                         tests more (AVX-512: AVX2 and DEFAULT; AVX2 only: DEFAULT);
#   MKL_CBWR              MKL's conditional-numerical-reproducibility path of that level;
#   ONEDNN_MAX_CPU_ISA    oneDNN's convolution kernels of that level.
# Every variant runs; the last line names the ones that failed (and each failure's report
# names its kernels: tests/conftest.py). Off x86 (ARM) there is no other path to take.
# The variants are the lines `variant LEVEL VAR=value ...` below (tools/demo_kernels.py
# reads them too).
set -uo pipefail
PY="${1:-.venv/bin/python}"
shift || true
EXTRA=("$@")
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
TOP="$("$PY" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')"
declare -A LEVEL=([DEFAULT]=0 [AVX2]=1 [AVX512]=2)
ran=()
failed=()
variant() {  # variant LEVEL VAR=value ...: run where LEVEL is below the main phase's
    local level="$1"
    shift
    [[ "$(uname -m)" == x86_64 && -n "${LEVEL[$TOP]:-}" ]] || return 0
    ((${LEVEL[${level^^}]} < ${LEVEL[$TOP]})) || return 0
    echo "== numerics under $* (main phase: $TOP)"
    if env "$@" "$PY" -m pytest -q -n 2 --dist loadgroup -m numerics -p no:cacheprovider \
        "${FILES[@]}" "${EXTRA[@]}"; then
        ran+=("$level")
    else
        failed+=("$level: $*")
    fi
}
variant default MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41
variant avx2 MKL_CBWR=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
if ((${#failed[@]})); then
    printf 'kernel variants FAILED under: %s\n' "${failed[@]}"
    exit 1
fi
if ((${#ran[@]})); then
    echo "kernel variants passed: ${ran[*]} (main phase: $TOP)"
else
    echo "kernel variants: this CPU has no kernel path besides the main phase's ($TOP)"
fi
