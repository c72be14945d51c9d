"""Test session setup: a private torch.compile (inductor) cache, so compiled graphs of an
earlier build of the extension are never reused; every test starts from the same global RNG
state, so a failure reproduces."""

import os
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ascender-inductor-")

import pytest  # noqa: E402
import torch  # noqa: E402

from cases import TARGETS  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_global_rng():
    torch.manual_seed(0)


@pytest.fixture(params=TARGETS)
def target(request):
    """A grid case's device and backend (cases.TARGETS), active for the whole test."""
    with request.param.use():
        yield request.param
