"""Every test starts from the same global RNG state, so a failure reproduces."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_global_rng():
    torch.manual_seed(0)
