"""Build: the C kernels as a static library compiled as C11 (build_clib), then the
libtorch binding (csrc/binding, one file per op and per backend) linked against it. Use
`pip install --no-build-isolation -e .`.

CUDA kernels (csrc/cuda, docs/cuda.md) only with ASCENDER_CUDA=1, a torch built with CUDA and
nvcc (CUDA_HOME); ASCENDER_CUDA_ARCHS picks the architectures ("80;90" by default, plus PTX of
the highest). Otherwise the build is CPU-only.

ASCENDER_OPT_LEVEL sets the host compilers' -O for the C kernels and the binding (3 by default; 0
compiles faster: the packaging test builds its wheel so, 97 s of CPU against 126). Only "g" (-Og) compiles
debug information in (-g, for a debugger); every other level builds without it (-g0, though Python's CFLAGS
say -g): the binding's largest file compiles in 21 s instead of 46 (2026-11-30)."""
import glob
import os
from concurrent.futures import ThreadPoolExecutor

import torch
from setuptools import setup
from setuptools.command.build_clib import build_clib
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

# Never -ffast-math (NaN/Inf handling) nor -march=native (portability). -fno-math-errno and
# -fno-trapping-math keep IEEE results (NaN, Inf) and let gcc vectorize exp and selects.
OPT_LEVELS = ("0", "1", "2", "3", "s", "g")  # not "fast": it implies -ffast-math
OPT_LEVEL = os.environ.get("ASCENDER_OPT_LEVEL", "3")
if OPT_LEVEL not in OPT_LEVELS:
    raise SystemExit(f"ASCENDER_OPT_LEVEL must be one of {', '.join(OPT_LEVELS)}; got {OPT_LEVEL!r}")
OPT = "-O" + OPT_LEVEL
DEBUG_INFO = "-g" if OPT_LEVEL == "g" else "-g0"
C_FLAGS = ["-std=c11", OPT, DEBUG_INFO, "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-Wall",
           "-Wextra", "-Wshadow"]
HEADERS = glob.glob("csrc/*.h") + glob.glob("csrc/cpu/*.h") + glob.glob("csrc/binding/*.h")
# the binding: every file but the CUDA backend's, which only a CUDA build compiles
BINDING = sorted(f for f in glob.glob("csrc/binding/*.cpp") if not f.endswith("_cuda.cpp"))
BINDING_CUDA = sorted(glob.glob("csrc/binding/*_cuda.cpp"))

kernels = (
    "ascender_kernels",
    {
        "sources": sorted(glob.glob("csrc/cpu/*.c")),
        "cflags": C_FLAGS,
        "obj_deps": {"": HEADERS},
    },
)


def cuda_wanted() -> bool:
    if os.environ.get("ASCENDER_CUDA") != "1":
        return False
    if torch.version.cuda is None:
        print("ascender_torch: ASCENDER_CUDA=1 but this torch has no CUDA; building the CPU kernels only")
        return False
    if CUDA_HOME is None:
        print("ascender_torch: ASCENDER_CUDA=1 but nvcc was not found (CUDA_HOME); building the CPU kernels only")
        return False
    return True


def cuda_arch_flags():
    archs = [a.strip() for a in os.environ.get("ASCENDER_CUDA_ARCHS", "80;90").split(";") if a.strip()]
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    top = max(archs, key=int)
    return flags + [f"-gencode=arch=compute_{top},code=compute_{top}"]


def binding_extension():
    common = dict(include_dirs=["csrc"], extra_link_args=["-fopenmp"])
    if not cuda_wanted():
        return CppExtension("ascender_torch._C", BINDING, depends=HEADERS, extra_compile_args=[OPT, DEBUG_INFO],
                            **common)
    cuda_headers = glob.glob("csrc/cuda/*.h") + glob.glob("csrc/cuda/*.cuh")
    return CUDAExtension(
        "ascender_torch._C",
        BINDING + BINDING_CUDA + sorted(glob.glob("csrc/cuda/*.cu")),
        depends=HEADERS + cuda_headers,
        define_macros=[("ASCENDER_WITH_CUDA", None)],
        # -lineinfo: source lines for ncu and compute-sanitizer; the code generated is the same
        extra_compile_args={"cxx": [OPT, DEBUG_INFO], "nvcc": ["-O3", "-std=c++17", "-lineinfo"] + cuda_arch_flags()},
        **common,
    )


class BuildKernelLibrary(build_clib):
    """The C kernels' sources compiled side by side, a compiler process per core (the forward and the
    backward take ~20 s each; build_clib would compile them one after the other)."""

    def build_libraries(self, libraries):
        compile_sources = self.compiler.compile

        def compile_in_parallel(sources, **options):
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                objects = pool.map(lambda source: compile_sources([source], **options), sources)
            return [obj for objs in objects for obj in objs]

        self.compiler.compile = compile_in_parallel
        super().build_libraries(libraries)


class BuildExtensionWithKernels(BuildExtension):
    """Builds the C kernel library first (editable installs skip the `build` command)."""

    def run(self):
        self.run_command("build_clib")
        super().run()


setup(
    libraries=[kernels],
    ext_modules=[binding_extension()],
    cmdclass={"build_clib": BuildKernelLibrary, "build_ext": BuildExtensionWithKernels},
)
