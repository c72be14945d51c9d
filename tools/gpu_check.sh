#!/usr/bin/env bash
# tools/gpu_check.sh -- the GPU playbook (docs/cuda.md, "GPU playbook"). Run from the repository
# root (or anywhere: it changes there) on a machine with a CUDA GPU, a CUDA build of torch, nvcc and
# ideally compute-sanitizer:
#
#     make gpu-check                 every stage, in order
#     tools/gpu_check.sh STAGE...    some of them: env build cgrid pytest sanitize bench profile
#
# It installs nothing from the network. `build` compiles the extension in place with the torch that
# is there (ASCENDER_CUDA=1 python setup.py build_ext --inplace, for the GPU's own architecture) and
# the CUDA-vs-CPU harness of tests/cuda_emu with nvcc; a later stage builds what it needs if it is
# missing, so the stages can be spread over several calls of a time-limited machine.
#
# Results: one Markdown file, appended to by every stage and ending with a table of the stages
# (pass/fail, seconds): $OUT/gpu_check.md when OUT is set (the device tool returns that folder),
# else gpu_results/gpu_check_<UTC time>.md (GPU_CHECK_RESULTS overrides both). Exit status 1 if a
# stage failed. Copy the summary into the "GPU runs" table of docs/cuda.md.
#
# Stages:
#   env       machine, driver, torch, CUDA, compilers, commit
#   build     the extension with the CUDA kernels; tests/cuda_emu/build/gpu/test_kernels
#   cgrid     the emulator's case grid (every ASCender and Magnitude case, four dtypes) on the GPU
#             against the CPU kernels
#   pytest    tests/test_cuda.py and the shared case grid on its CUDA targets (tests/cases.py TARGETS:
#             cuda-fused, cuda-blockwise); test_cuda.py's compute-sanitizer test runs in sanitize
#   sanitize  compute-sanitizer memcheck (with leak check), racecheck, synccheck, initcheck on a few
#             cases of the grid, and test_cuda.py's memcheck test through the Python binding
#   bench     benchmarks/bench_cuda.py: the issue's targets (N = 4096, B*H = 16, bf16) against the
#             seed module's autograd, the block-wise path and sdpa flash, and a run at N = 16384
#   profile   (not in the default list) ncu on the first launch of the fused forward and backward
#             kernels at N = 1024: speed of light, occupancy, registers and shared memory

set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if [ -n "${GPU_CHECK_RESULTS:-}" ]; then
    RES=$GPU_CHECK_RESULTS
elif [ -n "${OUT:-}" ]; then
    RES="$OUT/gpu_check.md"
else
    mkdir -p gpu_results
    RES="gpu_results/gpu_check_$(date -u +%Y%m%dT%H%M%SZ).md"
fi
mkdir -p "$(dirname "$RES")"
[ -s "$RES" ] || echo "# GPU check of ascender_torch" > "$RES"

if [ $# -gt 0 ]; then STAGES=("$@"); else STAGES=(env build cgrid pytest sanitize bench); fi
SUMMARY=()
FAILED=0
SANITIZER=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2>/dev/null || true)
HARNESS=tests/cuda_emu/build/gpu/test_kernels

# stage NAME CMD...: runs CMD (a shell function), its output to the terminal and the results file
stage() {
    local name=$1
    shift
    printf '\n## %s (%s)\n\n```\n' "$name" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$RES"
    echo "== gpu_check: $name"
    local t0 rc
    t0=$(date +%s)
    ("$@") 2>&1 | tee -a "$RES"
    rc=${PIPESTATUS[0]}
    printf '```\n' >> "$RES"
    local verdict="pass"
    [ "$rc" -eq 0 ] || { verdict="FAIL (exit $rc)"; FAILED=1; }
    SUMMARY+=("| $name | $verdict | $(( $(date +%s) - t0 )) s |")
    echo "== gpu_check: $name: $verdict"
}

gpu_arch() { "$PY" -c "import torch; a, b = torch.cuda.get_device_capability(0); print(f'{a}{b}')"; }

env_info() {
    date -u
    uname -srm
    nproc
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
    else
        echo "nvidia-smi: not found"
    fi
    "$PY" - << 'EOF'
import sys
import torch
print("python", sys.version.split()[0])
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "capability", f"{p.major}.{p.minor}", "SMs", p.multi_processor_count,
          "memory GiB", round(p.total_memory / 2**30, 1))
EOF
    nvcc --version | tail -2
    gcc --version | head -1
    if [ -n "$SANITIZER" ]; then "$SANITIZER" --version | head -2; else echo "compute-sanitizer: not found"; fi
    if git rev-parse HEAD > /dev/null 2>&1; then
        echo "commit $(git rev-parse HEAD) $(git status --porcelain | wc -l) changed files"
    else
        echo "commit: unknown (no git repository here)"
    fi
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
}

build() {
    local cc
    cc=$(gpu_arch) || return 1
    echo "building for sm_$cc"
    ASCENDER_CUDA=1 ASCENDER_CUDA_ARCHS=${ASCENDER_CUDA_ARCHS:-$cc} MAX_JOBS=${MAX_JOBS:-$(nproc)} \
        "$PY" setup.py build_ext --inplace > "$ROOT/build_ext.log" 2>&1
    local rc=$?
    tail -5 "$ROOT/build_ext.log"
    [ $rc -eq 0 ] || { echo "setup.py build_ext failed (full log: build_ext.log)"; return $rc; }
    "$PY" - << 'EOF' || return 1
import ascender_torch
from ascender_torch import _C
built = getattr(_C, "CUDA_BUILT", 0)
print("ascender_torch._C.CUDA_BUILT =", built)
assert built == 1, "the extension was built without the CUDA kernels (see build_ext.log)"
EOF
    make -C tests/cuda_emu -j"$(nproc)" build/gpu/test_kernels GPU_ARCH="sm_$cc"
}

need_build() {
    "$PY" -c "from ascender_torch import _C; assert _C.CUDA_BUILT" > /dev/null 2>&1 && [ -x "$HARNESS" ] || build
}

cgrid() {
    need_build || return 1
    "./$HARNESS"
}

pytests() {
    need_build || return 1
    "$PY" -m pytest -q -p no:cacheprovider tests -rs \
        -k "(test_cuda or cuda-fused or cuda-blockwise) and not compute_sanitizer"
}

sanitize() {
    need_build || return 1
    if [ -z "$SANITIZER" ]; then
        echo "compute-sanitizer not found: skipped"
        return 1
    fi
    local rc=0 tool
    echo "-- memcheck (leak check) on the --few cases, float64 / float32 / bfloat16"
    timeout 1200 "$SANITIZER" --tool memcheck --leak-check full --error-exitcode 3 "./$HARNESS" --few --quiet || rc=1
    for tool in racecheck synccheck initcheck; do
        echo "-- $tool on the --few cases, float32"
        timeout 1200 "$SANITIZER" --tool "$tool" --error-exitcode 3 "./$HARNESS" --few --quiet --dtype f32 || rc=1
    done
    echo "-- memcheck through the Python binding (tests/test_cuda.py::test_compute_sanitizer_memcheck)"
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py -k compute_sanitizer -rs || rc=1
    return $rc
}

bench() {
    need_build || return 1
    local rc=0
    echo "-- the issue's shapes: B*H = 16, N = 4096, bf16; the seed module (variant seed) and the paper variant"
    "$PY" benchmarks/bench_cuda.py --sizes 1024 4096 --dtypes bfloat16 --variant seed --repeats 3 --block-memory 256 4096 || rc=1
    "$PY" benchmarks/bench_cuda.py --sizes 1024 4096 --dtypes bfloat16 float32 --variant paper --repeats 3 || rc=1
    # the row-per-warp fused kernels took 5.5 s (forward) and 21 s (forward+backward) at N = 16384 on an
    # H100 (2026-11-23, docs/cuda.md): longer sizes run the block-wise path and sdpa only, until they are tiled
    echo "-- N = 16384: the block-wise path and sdpa flash"
    "$PY" benchmarks/bench_cuda.py --sizes 16384 --dtypes bfloat16 --repeats 1 --impls blockwise sdpa-flash || rc=1
    return $rc
}

profile() {
    need_build || return 1
    local ncu
    ncu=$(command -v ncu || ls "${CUDA_HOME:-/usr/local/cuda}/bin/ncu" /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    if [ -z "$ncu" ]; then
        echo "ncu not found: skipped"
        return 1
    fi
    echo "-- ncu: the first launch of each fused kernel at N = 1024, B*H = 16, bf16 (speed of light,"
    echo "   occupancy, launch statistics: registers, shared memory), to guide the tiled rewrite"
    local k rc=0
    for k in fwd_kernel bwd_kernel; do
        timeout 300 "$ncu" --kernel-name "regex:$k" --launch-count 1 --section SpeedOfLight --section Occupancy \
            --section LaunchStats "$PY" benchmarks/bench_cuda.py --sizes 1024 --dtypes bfloat16 --repeats 1 \
            --impls fused || rc=1
    done
    return $rc
}

for s in "${STAGES[@]}"; do
    case "$s" in
        env) stage env env_info ;;
        build) stage build build ;;
        cgrid) stage cgrid cgrid ;;
        pytest) stage pytest pytests ;;
        sanitize) stage sanitize sanitize ;;
        bench) stage bench bench ;;
        profile) stage profile profile ;;
        *) echo "gpu_check: unknown stage '$s' (env build cgrid pytest sanitize bench profile)"; exit 2 ;;
    esac
done

{
    printf '\n## Summary (%s)\n\n| stage | result | time |\n|---|---|---|\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf '%s\n' "${SUMMARY[@]}"
} | tee -a "$RES"
echo "gpu_check: results in $RES"
exit $FAILED
