"""Packaging as a user meets it: the sdist holds every source file a build needs (the CUDA kernels
and headers included) plus the tests and docs; a wheel built from that sdist holds every
subpackage and the compiled extension; installed (non-editable, into a virtual environment) it
imports and runs from outside the source tree.

The tree is copied to a temporary directory first, so nothing is written into the checkout. One
build compiles the extension, at -O0 (ASCENDER_OPT_LEVEL=0, setup.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_SHIPPED = (".ci/", ".gitignore")  # CI wiring and the top-level ignore file stay in the repository
BUILD_OUTPUTS = ("build", "dist", "__pycache__", ".pytest_cache", "demo_out")


def _source_files():
    """The files of the source tree, relative paths: git's list in a checkout, else a walk without
    build outputs (e.g. in an unpacked sdist)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return sorted(f for f in files if (ROOT / f).is_file())
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_file() and not any(part in BUILD_OUTPUTS or part.endswith(".egg-info") for part in path.parts) \
                and path.suffix not in (".so", ".o", ".a", ".pyc") and rel != "tests/c/test_kernels":
            files.append(rel)
    return sorted(files)


def _backend(hook, source_dir, out_dir):
    """Runs a PEP 517 hook of setuptools' backend (what pip runs, without build isolation)."""
    code = f"from setuptools import build_meta; print(build_meta.{hook}({str(out_dir)!r}))"
    # -O0: what is tested here is the packaging, not the optimizer (its wheel: 97 s of CPU against 126 at -O3)
    env = dict(os.environ, ASCENDER_OPT_LEVEL="0")
    result = subprocess.run([sys.executable, "-c", code], cwd=source_dir, capture_output=True, text=True, env=env)
    assert result.returncode == 0, f"{hook} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return Path(out_dir) / result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """sdist of a copy of the tree, then a wheel built from the unpacked sdist."""
    tmp = tmp_path_factory.mktemp("packaging")
    files = _source_files()
    src = tmp / "src"
    for rel in files:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    sdist = _backend("build_sdist", src, tmp / "dist")
    with tarfile.open(sdist) as tar:
        try:
            tar.extractall(tmp / "unpacked", filter="data")
        except TypeError:  # Python without extraction filters
            tar.extractall(tmp / "unpacked")
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel = _backend("build_wheel", unpacked, tmp / "dist")
    return dict(tmp=tmp, files=files, sdist=sdist, wheel=wheel)


def test_sdist_holds_the_whole_source_tree(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    expected = [f for f in built["files"] if not f.startswith(NOT_SHIPPED)]
    missing = [f for f in expected if f not in names]
    assert not missing, f"the sdist lacks {missing}"
    assert any(f.startswith("csrc/cuda/") and f.endswith(".cu") for f in names)
    assert not [n for n in names if n.endswith((".so", ".o", ".a", ".pyc"))]


def test_wheel_holds_every_subpackage_and_the_extension(built):
    with zipfile.ZipFile(built["wheel"]) as whl:
        names = set(whl.namelist())
    modules = [f for f in built["files"] if f.startswith("ascender_torch/") and f.endswith(".py")]
    missing = [f for f in modules if f not in names]
    assert not missing, f"the wheel lacks {missing}"
    assert "ascender_torch/integrations/hf/__init__.py" in names
    assert any(n.startswith("ascender_torch/_C") and n.endswith((".so", ".pyd")) for n in names)
    assert not [n for n in names if n.startswith(("csrc/", "tests/"))]


def test_installed_wheel_runs_outside_the_source_tree(built):
    """A non-editable install into a virtual environment that sees this interpreter's packages
    (torch, transformers) but imports ascender_torch from the venv."""
    venv = built["tmp"] / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(built["wheel"])],
                   check=True)
    code = """
import torch, ascender_torch
from ascender_torch import ascender_attention
assert ascender_torch.__file__.startswith(VENV), ascender_torch.__file__
q = torch.randn(1, 2, 5, 8)
y = ascender_attention(q, q, q, q[..., :4], q[..., :4], is_causal=True)
assert y.shape == (1, 2, 5, 8) and bool(torch.isfinite(y).all())
try:
    import transformers  # noqa: F401
except ImportError:
    pass
else:
    from ascender_torch.integrations import hf
    assert hf.__file__.startswith(VENV)
print("ok")
""".replace("VENV", repr(str(venv)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([str(python), "-c", code], cwd=built["tmp"], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.parametrize("level", ["fast", ""])
def test_build_refuses_an_unknown_optimization_level(level):
    """ASCENDER_OPT_LEVEL: -Ofast would bring -ffast-math (NaN/Inf handling), an unknown level a compiler
    error later; setup.py stops first, naming the variable and what it got."""
    env = dict(os.environ, ASCENDER_OPT_LEVEL=level)
    result = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode != 0
    assert "ASCENDER_OPT_LEVEL must be one of 0, 1, 2, 3, s, g; got " + repr(level) in result.stderr
