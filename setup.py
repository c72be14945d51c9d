"""Build: the C kernels as a static library compiled as C11 (build_clib), then the
libtorch binding linked against it. Use `pip install --no-build-isolation -e .`."""
import glob

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# Never -ffast-math (NaN/Inf handling) nor -march=native (portability). -fno-math-errno and
# -fno-trapping-math keep IEEE results (NaN, Inf) and let gcc vectorize exp and selects.
C_FLAGS = ["-std=c11", "-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-Wall", "-Wextra",
           "-Wshadow"]
HEADERS = glob.glob("csrc/*.h") + glob.glob("csrc/cpu/*.h")

kernels = (
    "ascender_kernels",
    {
        "sources": sorted(glob.glob("csrc/cpu/*.c")),
        "cflags": C_FLAGS,
        "obj_deps": {"": HEADERS},
    },
)


class BuildExtensionWithKernels(BuildExtension):
    """Builds the C kernel library first (editable installs skip the `build` command)."""

    def run(self):
        self.run_command("build_clib")
        super().run()


setup(
    libraries=[kernels],
    ext_modules=[
        CppExtension(
            "ascender_torch._C",
            ["csrc/binding.cpp"],
            include_dirs=["csrc"],
            depends=HEADERS,
            extra_compile_args=["-O3"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtensionWithKernels},
)
