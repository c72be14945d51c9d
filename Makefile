# The two commands of the README. Each installs what it needs first.
#   make demo   install, then the demo: train a small ASCender char-LM vs plain attention, write Fig. 1 and Fig. 4
#   make test   install, then the CUDA compile check, the C kernel tests (ASan/UBSan; -O3 per CPU
#               ISA), the CUDA kernels under the CPU emulator (tests/cuda_emu: ASan/UBSan and TSan)
#               and the whole pytest suite, each stage timed
#   make cuda-cost  the cost model of the CUDA kernels: counted by the emulator, an H100 estimate
#   make gpu-check  on a machine with a GPU: the playbook of docs/cuda.md (tools/gpu_check.sh)
#   make fuzz   the long fuzzing profile (tests/test_fuzz.py, 100,000 cases per property; make test
#               runs the short one)
#   make bench  install, then the forward and forward+backward benchmark tables

PYTHON ?= python3
PIP := $(PYTHON) -m pip

NVCC ?= $(shell command -v nvcc 2>/dev/null)
CUDA_GENCODE := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
# check-cuda's kernel sources: PTX for the lowest architecture the build supports (nvcc's front end with every
# warning an error) but no ptxas: the intrinsics' self-test goes through ptxas for sm_80 and sm_90 (every
# inline-asm instruction the kernels use), `make cuda-cost` runs ptxas -v for sm_90 before a GPU call and the GPU
# build assembles for real. ptxas was more than half of the check (ascender_bwd_tiled.cu: 96 s for sm_90 against
# 40 s for its PTX alone). One architecture: the kernels have no code path by __CUDA_ARCH__ (mma.cuh refuses
# below sm_80), so compute_90's front end saw what compute_80's sees; compute_80 is the stricter (it refuses a
# newer architecture's builtin). A second one doubled the check: 37.8 s against 18.5 for ascender_bwd_tiled_bf16.cu.
# NVVM unoptimized (-Xcicc -O0): the warnings are the front end's (cudafe++), and cicc still lowers every intrinsic
# and inline asm to PTX; its -O3 was 14.2 of the 15.8 s of ascender_bwd_tiled_bf16.cu (0.9 s at -O0), and the
# whole check went 96 -> 31 s on this 2-core machine (2026-11-29). The optimized code is what cuda-cost and the GPU
# build assemble.
CUDA_PTX_GENCODE := -gencode arch=compute_80,code=compute_80
# torch's CUDA builds define these: the kernels must not rely on implicit half conversions
HALF_FLAGS := -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__

.PHONY: install demo test test-c test-cuda-emu test-py check-cuda cuda-cost gpu-check fuzz bench clean

install:
	$(PIP) install --quiet torch==2.13.0 pytest pytest-xdist numpy safetensors "transformers>=5.20" matplotlib setuptools wheel
	$(PIP) install --quiet --no-build-isolation -e .

demo: install
	$(PYTHON) examples/demo.py

# The stages one after another, each timed (CI's budget is 20 minutes; the lines say where it goes).
TEST_STAGES := install check-cuda test-c test-cuda-emu test-py
test:
	@t0=$$(date +%s); for stage in $(TEST_STAGES); do t=$$(date +%s); \
		$(MAKE) --no-print-directory $$stage || exit 1; \
		echo "make test: $$stage took $$(( $$(date +%s) - t )) s"; done; \
	echo "make test: all stages passed in $$(( $$(date +%s) - t0 )) s"

# Compiles every CUDA source with plain nvcc (no torch) to PTX for sm_80, warnings as errors, the intrinsics' self-test
# (tests/cuda_emu/mma_selftest.cu) with a check that its PTX has every instruction of mma.cuh, and syntax-checks the
# CUDA backend of the binding against the installed (CPU) torch headers (a stub stands in for the
# header that only a CUDA build of torch generates); skipped without nvcc. The self-test and the binding's
# check run beside the kernel sources' pool (their logs printed after it): 86 -> 73 s on this 2-core machine
# (medians of four runs each, 2026-11-27).
check-cuda:
	@if [ -z "$(NVCC)" ]; then echo "check-cuda: nvcc not found, skipping the CUDA compile check"; exit 0; fi; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	( echo "check-cuda: $(NVCC) tests/cuda_emu/mma_selftest.cu (the intrinsics of csrc/cuda/mma.cuh) and its PTX"; \
	$(NVCC) -std=c++17 -O3 -Icsrc $(CUDA_GENCODE) $(HALF_FLAGS) -Werror all-warnings -Xcompiler -Wall,-Wextra \
		tests/cuda_emu/mma_selftest.cu -o "$$tmp/mma_selftest" || exit 1; \
	$(NVCC) -std=c++17 -O3 -Icsrc -arch=sm_80 -ptx $(HALF_FLAGS) tests/cuda_emu/mma_selftest.cu -o "$$tmp/mma.ptx" || exit 1; \
	for ins in mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 \
		mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ldmatrix.sync.aligned.m8n8.x4.shared.b16 \
		ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 \
		ldmatrix.sync.aligned.m8n8.x1.shared.b16 cp.async.cg.shared.global cp.async.commit_group cp.async.wait_group \
		cvt.rna.tf32.f32 cvt.rn.bf16x2.f32 cvt.rn.f16x2.f32 ex2.approx.ftz.f32 max.NaN.f32 \
		atom.acq_rel.gpu.global.add.u32; do \
		grep -q "$$ins" "$$tmp/mma.ptx" || { echo "check-cuda: $$ins missing from the PTX of mma.cuh"; exit 1; }; \
	done ) > "$$tmp/selftest.log" 2>&1 & selftest=$$!; \
	( mkdir -p "$$tmp/stub/c10/cuda/impl" && echo '#pragma once' > "$$tmp/stub/c10/cuda/impl/cuda_cmake_macros.h"; \
	cuda_inc=$$($(PYTHON) -c "import torch.utils.cpp_extension as c; print(c.CUDA_HOME or '/usr/local/cuda')")/include; \
	torch_inc=$$($(PYTHON) -c "import sysconfig, torch.utils.cpp_extension as c; print(' '.join('-isystem ' + p for p in c.include_paths() + [sysconfig.get_paths()['include']]))"); \
	for f in csrc/binding/*_cuda.cpp csrc/binding/module.cpp; do \
		echo "check-cuda: g++ -fsyntax-only $$f"; \
		g++ -std=c++20 -fsyntax-only -Wall -Wextra -Werror -DASCENDER_WITH_CUDA $$torch_inc -isystem "$$tmp/stub" \
			-isystem "$$cuda_inc" "$$f" || exit 1; \
	done ) > "$$tmp/binding.log" 2>&1 & binding=$$!; \
	ls csrc/cuda/*.cu | xargs -P 2 -I SRC sh -c 'echo "check-cuda: $(NVCC) -c SRC" && \
		$(NVCC) -std=c++17 -O3 -Icsrc $(CUDA_PTX_GENCODE) -Xcicc -O0 -Werror all-warnings -Xcompiler -Wall,-Wextra \
			-c SRC -o "'"$$tmp"'/$$(basename SRC).o"'; rc=$$?; \
	wait $$selftest || rc=1; cat "$$tmp/selftest.log"; wait $$binding || rc=1; cat "$$tmp/binding.log"; \
	[ $$rc -eq 0 ] || exit 1; echo "check-cuda: ok"

test-c:
	$(MAKE) -C tests/c -j2 check

# The kernels of csrc/cuda on the CPU (tests/cuda_emu, docs/cuda.md "The emulator"): built in
# parallel, then run under ASan/UBSan (full grid, four dtypes) and TSan (reduced grid) side by side
# (each grid as two shard processes; each target's output is printed whole when it ends).
test-cuda-emu:
	$(MAKE) -C tests/cuda_emu -j2 all
	$(MAKE) -C tests/cuda_emu -j2 --output-sync=target check

# The cost model of the CUDA kernels (docs/cuda.md "The cost model"): the emulator counts each launch's
# memory sectors, bank conflicts, mma and barriers at small N, and the warp instructions issued from the
# SASS (tools/sass_icount.py; nvcc and nvdisasm, NVDISASM=... where it is not in $(CUDA_HOME)/bin); the
# table estimates an H100's time at the benchmark's shape and ends with
# "estimated H100 fwd+bwd at N=4096, B*H=16, bf16: <x> ms".
# COST_ARGS="--sizes 192 384 576" and the like pass options to tests/cuda_emu/cuda_cost.cpp.
cuda-cost:
	$(MAKE) -C tests/cuda_emu -j2 build/cost/cuda_cost build/cost/ptxas.txt build/cost/sass.txt
	$(MAKE) -C tests/cuda_emu cost

# On a machine with a GPU: build with ASCENDER_CUDA=1, tests, compute-sanitizer, benchmark; one
# results file (docs/cuda.md "GPU playbook").
gpu-check:
	tools/gpu_check.sh

# Two pytest-xdist workers of one OpenMP thread each (the CI machine has 2 cores; two workers of two
# threads spin against each other: 573 s against 245 s for the suite in a fresh clone, 2026-11-26);
# tests that need more threads set them. Tests are independent of order and process. The log ends with the
# 15 slowest test phases: where the stage's time goes, for the next cut of CI time.
test-py:
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q -n 2 --durations=15

fuzz: install
	HYPOTHESIS_PROFILE=long $(PYTHON) -m pytest -q -p no:cacheprovider tests/test_fuzz.py --hypothesis-show-statistics

bench: install
	$(PYTHON) benchmarks/bench_forward.py
	$(PYTHON) benchmarks/bench_backward.py

clean:
	$(MAKE) -C tests/c clean
	$(MAKE) -C tests/cuda_emu clean
	rm -rf build *.egg-info ascender_torch/*.so
