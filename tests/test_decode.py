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


# ---------------------------------------------------------------- the decode kernel (docs/decode.md)

_DECODE_OPTIONS = {
    "plain": dict(),
    "causal-padding": dict(is_causal=True, key_padding_mask="kpm"),
    "attn_mask": dict(attn_mask="am"),
    "attn_mask-seed": dict(attn_mask="am", mask_stats=False, is_causal=True),
    "window-globals": dict(is_causal=True, window_size=[70, 0], global_tokens=3),
    "documents": dict(document_ids="docs"),
    "softcap-bias-alibi": dict(softcap=2.0, attn_bias="bias", alibi_slopes="slopes", is_causal=True),
    "scores-neighbours": dict(neighbours="scores", key_padding_mask="kpm"),
    # SPEC section 12, a sink per row ([B, H, Nq], docs/backward.md: the per-head [H] is its special case, the
    # same strides; GPT-OSS's cached generation in test_hf.py decodes with those)
    "sinks": dict(sinks="sinks", is_causal=True, key_padding_mask="kpm"),
}


def _decode_problem(N, dtype, options, Nq, seed=11, B=2, H=2):
    from cases import op_arguments
    tensors, scalars, opts = make_problem(B=B, H=H, N=N, d=8, dv=6, dz=4, da=5, dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed)

    def named(name):
        if name == "kpm":
            kpm = torch.rand(B, N, generator=g) < 0.2
            kpm[:, -1] = False
            return kpm
        if name == "am":
            return torch.rand(B, 1, N, N, generator=g) < 0.6
        if name == "docs":
            return torch.div(torch.arange(N), 400, rounding_mode="floor").repeat(B, 1)
        if name == "bias":
            return torch.randn(1, H, N, N, generator=g, dtype=torch.float64).to(dtype)
        if name == "sinks":
            return (torch.randn(B, H, N, generator=g, dtype=torch.float64) * 2).to(dtype)
        return torch.linspace(0.01, 0.002, H, dtype=dtype)  # slopes

    extra = {n: named(v) if isinstance(v, str) and n not in ("neighbours",) else v for n, v in options.items()}
    full = op_arguments(tensors, scalars, opts, {}, "paper", **extra)
    rows = dict(full, q=full["q"][:, :, -Nq:])
    for name in ("attn_mask", "attn_bias"):
        if rows[name] is not None:
            rows[name] = rows[name][..., -Nq:, :]
    if rows["sinks"] is not None and rows["sinks"].dim() == 3:
        rows["sinks"] = rows["sinks"][..., -Nq:]
    return full, rows


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("options", _DECODE_OPTIONS.values(), ids=_DECODE_OPTIONS.keys())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_decode_kernel_equals_the_rows_of_the_full_computation(variant, options, dtype):
    """ascender_infer's decode kernel (split over chunks of 512 keys: N = 1100 has three) on the last
    1, 4 and 8 queries against the tiled forward's rows of those queries, every output."""
    from ascender_torch._spec import ASCENDER_FWD
    from cases import rel_err
    for Nq in (1, 4, 8):
        full, rows = _decode_problem(1100, dtype, options, Nq)
        full["variant"] = rows["variant"] = variant
        want = dict(zip(ASCENDER_FWD.returns, torch.ops.ascender.ascender_fwd(**full)))
        got = dict(zip(ASCENDER_FWD.returns, torch.ops.ascender.ascender_infer(**rows)))
        tol = 1e-10 if dtype == torch.float64 else 2e-4
        for name in ("out", "u", "c", "aux"):
            assert rel_err(got[name], want[name][:, :, -Nq:]) < tol, (Nq, name)
        for col in range(got["stats"].shape[-1]):
            w, g_ = want["stats"][:, :, -Nq:, col], got["stats"][..., col]
            assert torch.equal(torch.isinf(w), torch.isinf(g_)), (Nq, col)
            fin = torch.isfinite(w)
            assert rel_err(g_[fin], w[fin]) < tol, (Nq, col)
        assert torch.equal(got["nbr"], want["nbr"][:, :, -Nq:]), Nq


def test_decode_kernel_does_not_depend_on_the_thread_count():
    """The key chunks are fixed and merged in order: one thread taking whole rows and two threads
    splitting each row's chunks (two rows: fewer than two per thread) give the same bits."""
    full, rows = _decode_problem(17000, torch.float32, dict(is_causal=True), 1, B=1, H=2)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(torch.ops.ascender.ascender_infer(**rows))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_only_a_result_nothing_differentiates_takes_the_inference_op():
    """The decode kernel's values agree with the tiled forward's to rounding, not bit for bit, and
    the backward recomputes the tiled forward's: so a differentiated call runs ascender_fwd."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.name())
            return func(*args, **(kwargs or {}))

    (q, k, v, z, h), scalars, opts = make_problem(N=9, seed=3)
    for grad, want in ((False, "ascender::ascender_infer"), (True, "ascender::ascender_fwd")):
        qq = q[:, :, -1:].clone().requires_grad_(grad)
        with Ops() as m:
            ascender_attention(qq, k, v, z, h, **scalars, **opts, is_causal=True)
        assert want in m.names and len({"ascender::ascender_infer", "ascender::ascender_fwd"} & m.names) == 1
    with torch.no_grad(), Ops() as m:
        ascender_attention(q[:, :, -1:].requires_grad_(), k, v, z, h, **scalars, **opts)
    assert "ascender::ascender_infer" in m.names
