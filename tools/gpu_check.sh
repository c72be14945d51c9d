#!/usr/bin/env bash
# tools/gpu_check.sh -- the GPU playbook (docs/cuda.md, "GPU playbook"): one prepared call on a machine
# with a CUDA GPU, a CUDA build of torch, nvcc and ideally compute-sanitizer, cuobjdump and ncu, that
# fits a lent session (15 device-minutes, machine start included): the whole default run stops its
# stages at GPU_CHECK_BUDGET seconds (default 510), a stage that would start with less time left than it
# needs is skipped and says so. Run from anywhere (it changes to the repository root):
#
#     tools/gpu_check.sh prepare     HERE, before the call (no GPU): the cost model's estimate and the
#                                    compiler's report (make cuda-cost: registers, shared memory, spills),
#                                    the PTX check (make check-cuda), the mma / ldmatrix / cp.async count
#                                    in each kernel source's PTX; says what to carry to the call
#     make gpu-check                 ON THE GPU: every stage below, in order
#     tools/gpu_check.sh STAGE...    some of them: env build sass cgrid pytest sanitize bench ncu ncusrc
#
# It installs nothing from the network. Results: one Markdown file, appended to by every stage and
# ending with a table of the stages (pass/fail/skipped, seconds): $OUT/gpu_check.md when OUT is set (the
# device tool returns that folder), else gpu_results/gpu_check_<UTC time>.md (GPU_CHECK_RESULTS
# overrides both). Exit status 1 if a stage failed. Copy the summary into "GPU runs" of docs/cuda.md.
#
# Stages:
#   env       machine, driver, torch, CUDA, compilers, commit
#   build     the extension with the CUDA kernels for the GPU's own architecture only
#             (ASCENDER_CUDA=1 python setup.py build_ext --inplace) and, at the same time, the
#             CUDA-vs-CPU harness and the intrinsics' self-test of tests/cuda_emu with nvcc
#   sass      cuobjdump -sass of the extension and the self-test: per kernel the HMMA (tensor-core),
#             LDSM (ldmatrix), LDGSTS (cp.async) and LDL/STL (local memory) instructions; fails if the
#             self-test's kernels lack HMMA / LDSM / LDGSTS, or a kernel matching SASS_TC_KERNELS (a regex,
#             the tensor-core kernels' names; empty: none) lacks HMMA or uses local memory
#   cgrid     the intrinsics' self-test on the GPU (the emulator's fragment tables against the hardware),
#             then every case of the emulator's grid (four dtypes) against the CPU kernels
#   pytest    tests/test_cuda.py, the shared case grid on its CUDA targets (cuda-fused, cuda-blockwise) and
#             context parallelism's world of one through NCCL, on 8 pytest-xdist workers when the plugin is there
#   sanitize  compute-sanitizer memcheck (leak check), racecheck, synccheck, initcheck on the --few cases
#             (racecheck in float32 and bfloat16), memcheck on the intrinsics' self-test and through the binding
#   bench     benchmarks/bench_cuda.py: the issue's targets at N = 4096, bf16 (seed: fused, fused with
#             the row-per-warp kernels, block-wise, sdpa flash, the decode / window / N = 131072 / matmul
#             scenarios; paper: fused, sdpa flash; causal seed: fused, F2 swept, causal flash; seed at d = 128:
#             fused, sdpa flash), forward-only
#             sizes 1024-16384 in bf16 and float32, the time of each kernel of one seed call (full and causal,
#             --kernels: torch.profiler) and the device's idle time between them,
#             then the compiled rows (block-wise and the twin) if time is left and BENCH_COMPILED != 0;
#             a fused scenario projected past BENCH_MAX_SECONDS (default 20) per fwd+bwd is skipped (N = 131072
#             runs at ~16 s each: three of them and the warm-up are a minute of the lease);
#             with the cost model's estimate beside the measurement when it was carried
#   ncu       Nsight Compute (--clock-control none) on the first launch of a kernel whose name matches
#             each KERNEL:VARIANT[:causal|:decode] of NCU_RUNS (causal: the benchmark's causal call; decode: its
#             decode scenario, e.g. dec_kernel:seed:decode) (default "fwd_kernel_tc:seed b2c_kernel:seed": the tiled
#             forward and the backward's key-major sweep, its largest kernel in the cost model and the one whose
#             estimate the static SASS disputes: docs/cuda.md) at N = 4096: speed of light,
#             compute (tensor pipe), memory, occupancy, launch statistics, warp stalls
#   ncusrc    where the instructions go, for the same NCU_RUNS: ncu's SourceCounters and InstructionStats
#             with speed of light, occupancy, launch and warp-state statistics (the extension is built
#             with -lineinfo) beside the results file: the details page (ncu_KERNEL_VARIANT_details.txt) and
#             the source page with CUDA lines and their SASS (ncu_KERNEL_VARIANT_source.csv.gz), from which
#             tools/ncu_hot_lines.py prints the opcode mix and the hottest lines; the .ncu-rep itself only
#             with NCU_KEEP_REP=1 (a device call returns at most 8 files of 16 MiB)
# The estimate: tests/cuda_emu/build/cost/cuda_cost.md from `prepare` (carry that one file; COST_REPORT
# overrides the path).

set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-510}
COST_REPORT=${COST_REPORT:-tests/cuda_emu/build/cost/cuda_cost.md}
SASS_TC_KERNELS=${SASS_TC_KERNELS:-}
NCU_RUNS=${NCU_RUNS:-fwd_kernel_tc:seed b2c_kernel:seed}

if [ "${1:-}" = prepare ]; then
    set -e
    make check-cuda
    make cuda-cost
    echo
    echo "gpu_check prepare: spills and stack frames of the kernels (nvcc -Xptxas -v, sm_90):"
    grep -E "bytes stack frame" tests/cuda_emu/build/cost/ptxas.txt | sort | uniq -c || true
    echo "gpu_check prepare: tensor-core instructions in the PTX (sm_90) of each source:"
    tmp=$(mktemp -d)
    for f in csrc/cuda/*.cu; do
        nvcc -std=c++17 -O3 -arch=sm_90 -Icsrc -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ \
            -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -ptx "$f" -o "$tmp/k.ptx"
        printf '  %-32s mma.sync %5d  ldmatrix %5d  cp.async %5d\n' "$f" "$(grep -c 'mma.sync' "$tmp/k.ptx")" \
            "$(grep -c 'ldmatrix' "$tmp/k.ptx")" "$(grep -c 'cp.async.cg' "$tmp/k.ptx")"
    done
    rm -rf "$tmp"
    echo "gpu_check prepare: carry $COST_REPORT to the call (run tool: carry=[\"$COST_REPORT\"])"
    exit 0
fi

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

if [ $# -gt 0 ]; then STAGES=("$@"); else STAGES=(env build sass cgrid pytest sanitize bench ncu); fi
SUMMARY=()
FAILED=0
SANITIZER=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2>/dev/null || true)
CUOBJDUMP=$(command -v cuobjdump || ls "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" 2>/dev/null || true)
NCU=$(command -v ncu || ls "${CUDA_HOME:-/usr/local/cuda}/bin/ncu" /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
HARNESS=tests/cuda_emu/build/gpu/test_kernels
SELFTEST=tests/cuda_emu/build/gpu/mma_selftest

left() { echo $((BUDGET - ($(date +%s) - START))); }

# stage NAME NEED CMD...: runs CMD (a shell function) under a timeout of the time left, if at least NEED
# seconds are; its output goes to the terminal and the results file
stage() {
    local name=$1 need=$2
    shift 2
    local t0 rc limit
    limit=$(left)
    if [ "$limit" -lt "$need" ]; then
        SUMMARY+=("| $name | skipped: ${limit} s left of the budget, needs ${need} s | 0 s |")
        echo "== gpu_check: $name: skipped (${limit} s left, needs ${need})"
        return
    fi
    printf '\n## %s (%s)\n\n```\n' "$name" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$RES"
    echo "== gpu_check: $name (up to ${limit} s)"
    t0=$(date +%s)
    STAGE_END=$(( $(date +%s) + limit ))
    ("$@") 2>&1 | tee -a "$RES"
    rc=${PIPESTATUS[0]}
    printf '```\n' >> "$RES"
    local verdict="pass"
    [ "$rc" -eq 0 ] || { verdict="FAIL (exit $rc)"; FAILED=1; }
    SUMMARY+=("| $name | $verdict | $(( $(date +%s) - t0 )) s |")
    echo "== gpu_check: $name: $verdict"
}

# a command bounded by what is left of the stage's time (its deadline, not its whole limit: a stage of several
# commands, such as sanitize, gave each of them the whole limit and overran the call on 2026-11-29)
bounded() {
    local rem=$(( STAGE_END - $(date +%s) - 5 ))
    timeout --kill-after=10 "$(( rem > 10 ? rem : 10 ))" "$@"
}

gpu_arch() { "$PY" -c "import torch; a, b = torch.cuda.get_device_capability(0); print(f'{a}{b}')"; }

env_info() {
    date -u
    uname -srm
    nproc
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.sm,clocks.max.sm --format=csv
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
    for t in "$SANITIZER" "$CUOBJDUMP" "$NCU"; do [ -n "$t" ] && echo "tool: $t"; done
    if git rev-parse HEAD > /dev/null 2>&1; then
        echo "commit $(git rev-parse HEAD) $(git status --porcelain | wc -l) changed files"
    else
        echo "commit: unknown (no git repository here)"
    fi
    if [ -s "$COST_REPORT" ]; then echo "cost model report: $COST_REPORT ($(tail -1 "$COST_REPORT"))"; fi
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
}

build() {
    local cc jobs
    cc=$(gpu_arch) || return 1
    jobs=$(nproc)
    echo "building for sm_$cc only ($jobs jobs): the extension and, beside it, the harness"
    make -C tests/cuda_emu -j"$(( jobs / 2 > 1 ? jobs / 2 : 1 ))" build/gpu/test_kernels build/gpu/mma_selftest \
        GPU_ARCH="sm_$cc" > "$ROOT/build_harness.log" 2>&1 &
    local harness=$!
    ASCENDER_CUDA=1 ASCENDER_CUDA_ARCHS=$cc MAX_JOBS=$jobs bounded "$PY" setup.py build_ext --inplace \
        > "$ROOT/build_ext.log" 2>&1
    local rc=$?
    wait $harness
    local hrc=$?
    tail -3 "$ROOT/build_ext.log"
    tail -2 "$ROOT/build_harness.log"
    [ $rc -eq 0 ] || { echo "setup.py build_ext failed (full log: build_ext.log)"; return $rc; }
    [ $hrc -eq 0 ] || { echo "the harness build failed (full log: build_harness.log)"; return $hrc; }
    "$PY" - << 'EOF' || return 1
from ascender_torch import _C
built = getattr(_C, "CUDA_BUILT", 0)
print("ascender_torch._C.CUDA_BUILT =", built)
assert built == 1, "the extension was built without the CUDA kernels (see build_ext.log)"
EOF
}

need_build() {
    "$PY" -c "from ascender_torch import _C; assert _C.CUDA_BUILT" > /dev/null 2>&1 && [ -x "$HARNESS" ] &&
        [ -x "$SELFTEST" ] || build
}

# per kernel of a cuobjdump -sass listing: HMMA, LDSM, LDGSTS, LDL/STL counts
sass_table() {
    awk '
        /Function : / { if (fn != "") print fn, h, l, g, loc; fn = $NF; h = l = g = loc = 0; next }
        /HMMA/ { h++ } /LDSM/ { l++ } /LDGSTS/ { g++ } /[[:space:]](LDL|STL)[[:space:].]/ { loc++ }
        END { if (fn != "") print fn, h, l, g, loc }'
}

sass() {
    need_build || return 1
    [ -n "$CUOBJDUMP" ] || { echo "cuobjdump not found"; return 1; }
    local so rc=0 tmp
    so=$(ls ascender_torch/_C*.so | head -1)
    tmp=$(mktemp -d)
    echo "kernel HMMA LDSM LDGSTS local(LDL/STL)"
    "$CUOBJDUMP" -sass "$SELFTEST" | sass_table | tee "$tmp/selftest"
    "$CUOBJDUMP" -sass "$so" | sass_table | tee "$tmp/ext"
    awk '$2 > 0 { h = 1 } $3 > 0 { l = 1 } $4 > 0 { g = 1 } END { exit !(h && l && g) }' "$tmp/selftest" ||
        { echo "FAIL: the intrinsics' self-test has no HMMA, LDSM or LDGSTS in its SASS"; rc=1; }
    if [ -n "$SASS_TC_KERNELS" ]; then
        awk -v re="$SASS_TC_KERNELS" '$1 ~ re && ($2 == 0 || $5 > 0) { print "FAIL: " $1 " (HMMA " $2 ", local " $5 ")"; bad = 1 }
            END { exit bad }' "$tmp/ext" || rc=1
    fi
    rm -rf "$tmp"
    return $rc
}

cgrid() {
    need_build || return 1
    "./$SELFTEST" || return 1
    bounded "./$HARNESS"
}

pytests() {
    need_build || return 1
    local par=()
    "$PY" -c "import xdist" 2> /dev/null && par=(-n 8)
    bounded "$PY" -m pytest -q -p no:cacheprovider "${par[@]}" tests -rs \
        -k "(test_cuda or cuda-fused or cuda-blockwise or nccl) and not compute_sanitizer"
}

sanitize() {
    need_build || return 1
    [ -n "$SANITIZER" ] || { echo "compute-sanitizer not found"; return 1; }
    local rc=0 tool
    echo "-- memcheck (leak check) on the --few cases, float64 / float32 / bfloat16"
    bounded "$SANITIZER" --tool memcheck --leak-check full --error-exitcode 3 "./$HARNESS" --few --quiet || rc=1
    # (bfloat16's racecheck before float32's tools: it is the slowest, and the fourth run's deadline cut it off last)
    echo "-- racecheck on the --few cases, bfloat16 (the tiled kernels' mma path)"
    bounded "$SANITIZER" --tool racecheck --error-exitcode 3 "./$HARNESS" --few --quiet --dtype bf16 || rc=1
    for tool in racecheck synccheck initcheck; do
        echo "-- $tool on the --few cases, float32 (the tiled kernels' FFMA path)"
        bounded "$SANITIZER" --tool "$tool" --error-exitcode 3 "./$HARNESS" --few --quiet --dtype f32 || rc=1
    done
    echo "-- memcheck on the intrinsics' self-test"
    bounded "$SANITIZER" --tool memcheck --error-exitcode 3 "./$SELFTEST" > /dev/null || rc=1
    echo "-- memcheck through the Python binding (tests/test_cuda.py::test_compute_sanitizer_memcheck)"
    bounded "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py -k compute_sanitizer -rs || rc=1
    return $rc
}

bench() {
    need_build || return 1
    local rc=0 est=()
    [ -s "$COST_REPORT" ] && est=(--estimate "$COST_REPORT")
    echo "-- seed variant, N = 4096, bf16: the targets, tiled against row-per-warp and against F2 swept, the block-wise"
    echo "   path, the scenarios"
    bounded "$PY" benchmarks/bench_cuda.py --sizes 4096 --variant seed --repeats 3 \
        --impls fused fused-rowwarp fused-f2sweep blockwise sdpa-flash --scenarios matmul decode window long \
        --max-seconds "${BENCH_MAX_SECONDS:-20}" --kernels "${est[@]}" || rc=1
    echo "-- paper variant, N = 4096, bf16"
    bounded "$PY" benchmarks/bench_cuda.py --sizes 4096 --variant paper --repeats 3 --impls fused sdpa-flash \
        "${est[@]}" || rc=1
    echo "-- causal, seed, N = 4096, bf16: the causal statistics' prefix key sums against F2 swept, causal flash"
    bounded "$PY" benchmarks/bench_cuda.py --sizes 4096 --variant seed --repeats 3 --causal \
        --impls fused fused-f2sweep sdpa-flash --kernels || rc=1
    echo "-- wide heads, seed, N = 4096, d = dv = 128, bf16: one block per SM (docs/cuda.md, \"Wide heads\"), against flash"
    bounded "$PY" benchmarks/bench_cuda.py --sizes 4096 --variant seed --repeats 3 --head-dim 128 \
        --impls fused sdpa-flash --kernels || rc=1
    echo "-- d = dv = 256, seed, N = 2048, bf16: B2c in 16-key blocks (docs/cuda.md, \"B2c in narrow key blocks\"),"
    echo "   against the row-per-warp backward it replaced and flash"
    bounded "$PY" benchmarks/bench_cuda.py --sizes 2048 --variant seed --repeats 3 --head-dim 256 \
        --impls fused fused-rowwarp sdpa-flash --kernels || rc=1
    echo "-- forward only, both variants, N = 1024 / 4096 / 16384, bf16 and float32"
    for v in seed paper; do
        bounded "$PY" benchmarks/bench_cuda.py --sizes 1024 4096 16384 --dtypes bfloat16 float32 --variant "$v" \
            --repeats 5 --forward-only --impls fused sdpa-flash || rc=1
    done
    if [ "${BENCH_COMPILED:-1}" = 1 ] && [ "$(left)" -gt 150 ]; then
        echo "-- compiled: the block-wise path and the dense twin under torch.compile (seed, N = 4096)"
        bounded "$PY" benchmarks/bench_cuda.py --sizes 4096 --variant seed --repeats 3 \
            --impls fused blockwise blockwise-compiled compiled || rc=1
    else
        echo "-- compiled rows skipped: BENCH_COMPILED=${BENCH_COMPILED:-1}, $(left) s left"
    fi
    return $rc
}

# ncu_call RUN: sets k (the kernel's name) and args (bench_cuda.py's arguments) for one KERNEL:VARIANT[:MODE] of
# NCU_RUNS: the forward alone for a forward kernel, forward+backward otherwise, the causal call or the decode
# scenario (after a short forward at N = 256) for MODE causal or decode
ncu_call() {
    local run=$1 v mode
    k=${run%%:*} v=${run#*:}
    mode=${v#*:}
    [ "$mode" = "$v" ] && mode=
    v=${v%%:*}
    args=(--variant "$v" --repeats 1 --impls fused)
    case "$mode" in
        decode) args+=(--sizes 256 --forward-only --scenarios decode) ;;
        causal) args+=(--sizes 4096 --causal) ;;
        *) args+=(--sizes 4096) ;;
    esac
    [[ $k == *fwd* && $mode != decode ]] && args+=(--forward-only)
    return 0
}

ncu_profile() {
    need_build || return 1
    [ -n "$NCU" ] || { echo "ncu not found"; return 1; }
    local run k args rc=0
    for run in $NCU_RUNS; do
        ncu_call "$run"
        echo "-- ncu: the first launch of a kernel named *$k* ($run; bench_cuda.py ${args[*]})"
        bounded "$NCU" --clock-control none --kernel-name "regex:$k" --launch-count 1 --section SpeedOfLight \
            --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
            --section LaunchStats --section WarpStateStats "$PY" benchmarks/bench_cuda.py "${args[@]}" || rc=1
    done
    return $rc
}

ncu_source() {
    need_build || return 1
    [ -n "$NCU" ] || { echo "ncu not found"; return 1; }
    local run k args rc=0 dir base
    dir=$(dirname "$RES")
    for run in $NCU_RUNS; do
        ncu_call "$run"
        base="$dir/ncu_${run//[^A-Za-z0-9]/_}"
        echo "-- ncu source counters: the first launch of *$k* ($run; bench_cuda.py ${args[*]}) -> $base.*"
        bounded "$NCU" --clock-control none --kernel-name "regex:$k" --launch-count 1 --section SourceCounters \
            --section InstructionStats --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats --import-source yes -f -o "$base" "$PY" benchmarks/bench_cuda.py \
            "${args[@]}" > /dev/null || { rc=1; continue; }
        "$NCU" --import "$base.ncu-rep" --page details > "${base}_details.txt" 2>&1 || rc=1
        grep -E "Duration|Executed Ipc A|Registers Per|Dynamic Shared|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Executed Instructions  |Local Memory Spilling" \
            "${base}_details.txt"
        # both views: each CUDA line with its metrics summed, then its SASS instructions (17-25 MB as text)
        "$NCU" --import "$base.ncu-rep" --page source --csv --print-source cuda,sass | gzip -6 > "${base}_source.csv.gz" ||
            rc=1
        "$PY" tools/ncu_hot_lines.py "${base}_source.csv.gz" --top 30 || rc=1
        # the report itself is over what a device call returns (8 files of at most 16 MiB): kept on request
        [ "${NCU_KEEP_REP:-0}" = 1 ] || rm -f "$base.ncu-rep"
    done
    return $rc
}

for s in "${STAGES[@]}"; do
    case "$s" in
        env) stage env 5 env_info ;;
        build) stage build 90 build ;;
        sass) stage sass 5 sass ;;
        cgrid) stage cgrid 20 cgrid ;;
        pytest) stage pytest 60 pytests ;;
        sanitize) stage sanitize 30 sanitize ;;
        bench) stage bench 60 bench ;;
        ncu) stage ncu 30 ncu_profile ;;
        ncusrc) stage ncusrc 30 ncu_source ;;
        *) echo "gpu_check: unknown stage '$s' (prepare, or: env build sass cgrid pytest sanitize bench ncu ncusrc)"; exit 2 ;;
    esac
done

{
    printf '\n## Summary (%s, %s s of a %s s budget)\n\n| stage | result | time |\n|---|---|---|\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(( $(date +%s) - START ))" "$BUDGET"
    printf '%s\n' "${SUMMARY[@]}"
} | tee -a "$RES"
echo "gpu_check: results in $RES"
exit $FAILED
