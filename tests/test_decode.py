"""Decode shape: Nq <= N queries that are the last Nq of the N tokens (bottom-right causal
alignment), so cached generation can ask for its newest rows only."""

from __future__ import annotations

import pytest
import torch

from ascender_torch import ascender_attention
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.reference import ascender_attention_reference

from cases import VARIANTS, make_problem, on


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Nq", [1, 3, 11])
def test_last_rows_of_the_full_computation(target, variant, causal, Nq):
    (q, k, v, z, h), scalars, opts = on(target.device, make_problem(N=11, seed=7))
    kpm = torch.zeros(2, 11, dtype=torch.bool, device=target.device)
    kpm[1, 5] = True
    kw = dict(**scalars, **opts, variant=variant, is_causal=causal, key_padding_mask=kpm)
    full = ascender_attention(q, k, v, z, h, **kw)
    part = ascender_attention(q[:, :, -Nq:], k, v, z, h, **kw)
    assert part.shape == (2, 2, Nq, 6)
    torch.testing.assert_close(part, full[:, :, -Nq:], rtol=1e-12, atol=1e-14)
    ref = ascender_attention_reference(q[:, :, -Nq:], k, v, z, h, **kw)
    torch.testing.assert_close(part, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_gradients_match_reference(target, variant):
    (q, k, v, z, h), scalars, opts = on(target.device, make_problem(N=9, seed=8))
    am = (torch.rand(2, 2, 3, 9, generator=torch.Generator().manual_seed(0)) > 0.2).to(target.device)  # [B, H, Nq, N]
    inputs = [t.clone().requires_grad_() for t in (q[:, :, -3:], k, v, z, h)]
    sc = [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]
    kw = dict(**opts, variant=variant, is_causal=True, attn_mask=am)
    g = torch.randn(2, 2, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(target.device)
    got = torch.autograd.grad(ascender_attention(*inputs, **dict(zip(SCALAR_NAMES, sc)), **kw), inputs + sc, g)
    want = torch.autograd.grad(ascender_attention_reference(*inputs, **dict(zip(SCALAR_NAMES, sc)), **kw),
                               inputs + sc, g)
    assert got[0].shape == (2, 2, 3, 8)
    for a, b in zip(got[:5], want[:5]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10 * b.abs().max().item())
    # the nine scalar gradients as one vector (lambda's are ~0 by scale invariance: see test_backward)
    got_sc, want_sc = torch.stack(got[5:]), torch.stack(want[5:])
    torch.testing.assert_close(got_sc, want_sc, rtol=1e-9, atol=1e-10 * want_sc.abs().max().item())


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_gradcheck(variant):
    (q, k, v, z, h), scalars, opts = make_problem(B=1, N=6, d=4, dv=3, dz=3, da=3, seed=9)
    inputs = [t.clone().requires_grad_() for t in (q[:, :, -2:], k, v, z, h)]
    inputs += [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]

    def f(*args):
        return ascender_attention(*args[:5], **dict(zip(SCALAR_NAMES, args[5:])), **opts, variant=variant,
                                  is_causal=True)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=False)


def test_more_queries_than_keys_is_an_error():
    (q, k, v, z, h), _, opts = make_problem(N=5)
    with pytest.raises(RuntimeError, match=r"N >= Nq = 5, got \[2, 2, 4, 8\]"):
        ascender_attention(q, k[:, :, :4], v[:, :, :4], z[:, :, :4], h[:, :, :4], **opts)
