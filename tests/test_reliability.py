"""Regression tests of issue 17's reproducers: no crash, no silent garbage, a clear error naming
the argument. (The hypothesis fuzzer is tests/test_fuzz.py.)"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

from ascender_torch import ASCenderAttention, MagnitudeAttention, ascender_attention, magnitude_attention
from ascender_torch._spec import EPS_HEADING, SCALAR_NAMES, Stat
from ascender_torch.backends import attention_backend
from ascender_torch.reference import ascender_attention_reference

from cases import VARIANTS, fused_forward, full_scalars, make_problem, on, op_arguments, rel_err


@pytest.fixture(autouse=True)
def _quiet_backend_notes():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "ascender_torch: ", RuntimeWarning)
        yield


@pytest.mark.parametrize("n_iter", [2 ** 60, 2 ** 61, 2 ** 61 - 1, 2 ** 62, 2 ** 63 - 1])
@pytest.mark.parametrize("backward", [False, True])
def test_magnitude_huge_n_iter_is_an_allocation_error(n_iter, backward):
    """A size product with n_iter used to wrap around (heap corruption, segfault, hang): now the
    allocation fails cleanly and the message names n_iter."""
    q = torch.randn(1, 1, 4, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match=rf"could not allocate .*n_iter = {n_iter}\)"):
        y = magnitude_attention(q, q, q, n_iter=n_iter)
        if backward:
            y.sum().backward()


@pytest.mark.parametrize("name", ["lambda_align", "kappa", "key_padding_mask", "attn_mask", "attn_bias"])
def test_one_meta_argument_is_a_device_error(name):
    """A meta argument sends the call to the fake kernel, which now checks like the real one
    (it used to return uninitialised CPU memory)."""
    (q, k, v, z, h), _, opts = make_problem(N=5)
    arg = dict(lambda_align=torch.tensor(1.0, dtype=torch.float64), kappa=torch.tensor(2.0, dtype=torch.float64),
               key_padding_mask=torch.zeros(2, 5, dtype=torch.bool), attn_mask=torch.ones(5, 5, dtype=torch.bool),
               attn_bias=torch.zeros(5, 5, dtype=torch.float64))[name].to("meta")
    with pytest.raises(RuntimeError, match=rf"ascender: {name} must be on the device of q \(cpu\), got meta"):
        ascender_attention(q, k, v, z, h, **opts, **{name: arg})


def test_meta_magnitude_arguments_are_a_device_error():
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    for name in ("t_raw", "beta", "gamma"):
        with pytest.raises(RuntimeError, match=rf"magnitude: {name} must be on the device of q \(cpu\), got meta"):
            magnitude_attention(q, q, q, **{name: torch.tensor(0.5, dtype=torch.float64, device="meta")})


def test_all_meta_arguments_infer_shapes():
    tensors, _, opts = make_problem(N=5)
    y = ascender_attention(*(t.to("meta") for t in tensors), **opts, variant="paper")
    assert y.device.type == "meta" and y.shape == (2, 2, 5, 6)


def test_the_fake_kernel_checks_under_torch_compile():
    tensors, _, opts = make_problem(N=5)

    def f(q, k, v, z, h):
        return torch.ops.ascender.ascender_fwd(q, k, v, z, h, *(torch.ones((), dtype=torch.float64),) * 9,
                                               scale=0.5, tau_sep=-1.0)[0]

    with pytest.raises(Exception, match="tau_sep must be a finite number > 0, got -1"):
        torch.compile(f, fullgraph=True, backend="eager")(*tensors)


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_mode_ad_and_torch_func(variant):
    """Forward-mode AD and torch.func transforms run on the block-wise backend (the fused ops have
    no jvp or vmap rule; they used to give an all-zero Jacobian or an internal error)."""
    (q, k, v, z, h), scalars, opts = make_problem(B=1, N=6)

    def f(q):
        return ascender_attention(q, k, v, z, h, **scalars, **opts, variant=variant)

    reverse = torch.autograd.functional.jacobian(f, q)  # the fused backward
    torch.testing.assert_close(torch.func.jacfwd(f)(q), reverse, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.func.jacrev(f)(q), reverse, rtol=1e-10, atol=1e-12)
    tangent = torch.randn_like(q)
    with fwAD.dual_level():
        y = f(fwAD.make_dual(q, tangent))
        jvp = fwAD.unpack_dual(y).tangent
    torch.testing.assert_close(jvp, (reverse * tangent).sum(dim=(-4, -3, -2, -1)), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.func.grad(lambda q: f(q).square().sum())(q),
                               torch.autograd.grad(f(q.requires_grad_()).square().sum(), q)[0], rtol=1e-10, atol=1e-12)
    batch = torch.stack([q.detach(), 2 * q.detach()])
    torch.testing.assert_close(torch.func.vmap(f)(batch), torch.stack([f(x) for x in batch]), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("empty", ["B", "H", "N", "d"])
def test_zero_sizes_with_aux(variant, empty):
    shape = dict(B=2, H=2, N=5, d=8)
    shape[empty] = 0
    B, H, N, d = shape.values()
    q = torch.randn(B, H, N, d, dtype=torch.float64)
    z = torch.randn(B, H, N, 4, dtype=torch.float64)
    y, aux = ascender_attention(q, q, q, z, z, variant=variant, return_aux=True)
    assert y.shape == (B, H, N, d) and all(t.shape == (B, H, N) for t in aux.values())


@pytest.mark.parametrize("module", [lambda: ASCenderAttention(16, 2), lambda: MagnitudeAttention(16, 2)])
@pytest.mark.parametrize("shape", [(0, 5, 16), (2, 0, 16)])
def test_modules_with_zero_batch_or_tokens(module, shape):
    out, _ = module()(torch.randn(*shape))
    assert out.shape == shape


def test_bad_attn_mask_with_attn_bias_gets_the_mask_message():
    tensors, _, opts = make_problem(N=5)
    with pytest.raises(RuntimeError, match=r"ascender: attn_mask must be broadcastable to \[B, H, Nq, N\] = "
                                           r"\[2, 2, 5, 5\], got shape \[5, 4\]"):
        ascender_attention(*tensors, **opts, attn_mask=torch.ones(5, 4, dtype=torch.bool),
                           attn_bias=torch.zeros(5, 5, dtype=torch.float64))


def test_zero_dim_q_with_aux():
    tensors, _, opts = make_problem(N=5)
    with pytest.raises(RuntimeError, match=r"ascender: q must be a 4-D tensor \[B, H, Nq, d\], got shape \[\]"):
        ascender_attention(torch.tensor(1.0, dtype=torch.float64), *tensors[1:], **opts, return_aux=True)


@pytest.mark.parametrize("cls", [ASCenderAttention, MagnitudeAttention])
def test_zero_heads(cls):
    with pytest.raises(ValueError, match=f"{cls.__name__}: n_heads must be a positive int, got 0"):
        cls(16, 0)


def test_reference_default_scale_with_zero_feature_size():
    q = torch.randn(1, 1, 3, 0, dtype=torch.float64)
    z = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    v = torch.randn(1, 1, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(ascender_attention_reference(q, q, v, z, z), ascender_attention(q, q, v, z, z))


@pytest.mark.parametrize("kw,error,pattern", [
    (dict(scale=1e39), RuntimeError, r"ascender: scale overflows the compute dtype of q \(Float\): 1e\+39"),
    (dict(tau_coh=1e39), RuntimeError, r"ascender: tau_coh overflows the compute dtype of q \(Float\)"),
    (dict(alpha_align=-1e39), RuntimeError, r"ascender: alpha_align overflows"),
    (dict(lambda_align=1e39), ValueError, r"lambda_align must be a finite number in the dtype of q "
                                          r"\(torch.float32\), got 1e\+39"),
    (dict(alibi_slopes=1e39), ValueError, r"alibi_slopes must be finite in the dtype of q"),
    (dict(score_temp=-1e-6), ValueError, r"score_temp \+ 1e-6 is a denominator and must not be 0"),
    (dict(kappa=-1e-6), ValueError, r"kappa \+ 1e-6 is a denominator and must not be 0"),
])
def test_values_that_overflow_or_divide_by_zero(kw, error, pattern):
    tensors, _, opts = make_problem(N=5, dtype=torch.float32)
    with pytest.raises(error, match=pattern):
        ascender_attention(*tensors, **dict(opts, **kw))


@pytest.mark.parametrize("name, value, dtype, pattern", [
    ("score_temp", torch.tensor(-1e-6, dtype=torch.float64), torch.float64,
     r"score_temp \+ 1e-6 is a denominator and must not be 0, got score_temp = -1e-06"),
    ("kappa", torch.tensor([2.0, -1e-6], dtype=torch.float64), torch.float64,
     r"kappa \+ 1e-6 is a denominator and must not be 0, got kappa = \[2.0, -1e-06\]"),
    # 0 in the float32 arithmetic of the block-wise path and the CUDA kernels (not in double)
    ("score_temp", torch.tensor(-1e-6, dtype=torch.float32), torch.float32, r"score_temp \+ 1e-6 is a denominator"),
    ("score_temp", -1e-6, torch.float32, r"score_temp \+ 1e-6 is a denominator"),
    ("lambda_sep", torch.tensor([1e39, 1.0], dtype=torch.float64), torch.float32,
     r"lambda_sep must be finite in the dtype of q \(torch.float32\) where it is finite, got \[1e\+39, 1.0\]"),
    ("omega_coh", 1e5, torch.float16, r"omega_coh must be a finite number in the dtype of q \(torch.float16\)"),
    ("omega_coh", torch.tensor([1.0, 1e5]), torch.float16,
     r"omega_coh must be finite in the dtype of q \(torch.float16\) where it is finite, got \[1.0, 100000.0\]"),
], ids=["f64-tensor", "per-head", "f32-tensor", "f32-number", "overflow", "f16-number", "f16-tensor"])
def test_scalar_tensors_get_the_checks_of_numbers(name, value, dtype, pattern):
    """Issue 29 item 2: a learnable scalar given as a tensor is checked like a number (a zero
    denominator used to give all-NaN rows, an overflowing float64 parameter inf), on every backend;
    a number overflowing float16 became inf in the cast to q's dtype."""
    tensors, _, opts = make_problem(N=5, dtype=dtype)
    for backend in ("fused", "blockwise", "dense"):
        with attention_backend(backend), pytest.raises(ValueError, match=pattern):
            ascender_attention(*tensors, **opts, **{name: value})


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_a_zero_denominator_is_refused_exactly_where_the_arithmetic_gives_0(dtype):
    """score_temp + 1e-6 is refused for the values whose sum is 0 in the compute dtype of q (float32 for bfloat16),
    and a number also where it is 0 in double, and only for them: the check compares with the one such value
    instead of adding (a tensor op per call)."""
    tensors, _, opts = make_problem(N=5, dtype=dtype)
    near = torch.tensor(-1e-6, dtype=torch.float32)
    candidates = [-1e-6, float(near), float(torch.nextafter(near, torch.tensor(0.0))),
                  float(torch.nextafter(near, torch.tensor(-1.0))), float(torch.tensor(-1e-6, dtype=torch.bfloat16))]
    compute = torch.float32 if dtype == torch.bfloat16 else dtype
    for value in candidates:
        for given in (torch.tensor([value, 1.0], dtype=torch.float64), value):
            t = torch.tensor(value, dtype=torch.float64).to(dtype).to(compute)
            if bool(t + 1e-6 == 0) or (not isinstance(given, torch.Tensor) and value + 1e-6 == 0):
                with pytest.raises(ValueError, match=r"score_temp \+ 1e-6 is a denominator"):
                    ascender_attention(*tensors, **dict(opts, score_temp=given))
            else:
                ascender_attention(*tensors, **dict(opts, score_temp=given))


@pytest.mark.parametrize("value", ["a", "1.5", None, 1j, [0.1, 0.2], True, torch.tensor(0.5j), torch.tensor(True)],
                         ids=repr)
def test_a_scalar_of_the_wrong_type_is_named(value):
    """A learnable scalar that is not a real number or tensor is a TypeError naming it (it used to fail
    inside float() without the name; "1.5" and True were taken as numbers, a complex tensor lost its
    imaginary part)."""
    tensors, _, opts = make_problem(N=5)
    kind = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
    with pytest.raises(TypeError, match=rf"omega_sep must be a real number, a 0-dim or an \[H\] real tensor, "
                                        rf"got {re.escape(kind)}"):
        ascender_attention(*tensors, **opts, omega_sep=value)


@pytest.mark.parametrize("name", ["attn_mask", "key_padding_mask", "attn_bias", "global_mask", "document_ids"])
def test_a_mask_that_is_not_a_tensor_is_named(name):
    tensors, _, opts = make_problem(N=5)
    with pytest.raises(TypeError, match=rf"ascender_attention: {name} must be a torch.Tensor or None, got list"):
        ascender_attention(*tensors, **opts, **{name: [[True] * 5] * 5})


def test_a_boolean_attn_bias_is_refused():
    """An SDPA-style boolean mask passed as attn_bias was added as a 0/1 bias."""
    tensors, _, opts = make_problem(N=5)
    with pytest.raises(TypeError, match=r"attn_bias must be a real tensor, added to the scores, got a torch.bool "
                                        r"tensor \(a boolean mask goes in attn_mask, True = may attend\)"):
        ascender_attention(*tensors, **opts, attn_bias=torch.ones(5, 5, dtype=torch.bool))


@pytest.mark.parametrize("mask", [None, torch.ones(5, 5, dtype=torch.bool)], ids=["bias-only", "with-mask"])
@pytest.mark.parametrize("shape", [(5, 4), (3, 1, 5, 5)])
def test_a_misshaped_attn_bias_is_named_with_its_shape(mask, shape):
    """The -inf entries of attn_bias are folded into attn_mask: a mis-shaped bias was reported as a bad
    attn_mask, or with the combined shape of the two."""
    tensors, _, opts = make_problem(N=5)
    with pytest.raises(RuntimeError, match=rf"ascender: attn_bias must be broadcastable to \[B, H, Nq, N\] = "
                                           rf"\[2, 2, 5, 5\], got shape \[{', '.join(map(str, shape))}\]"):
        ascender_attention(*tensors, **opts, attn_mask=mask, attn_bias=torch.zeros(*shape, dtype=torch.float64))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype, scale, scaled, tol", [
    pytest.param(torch.float32, 1e19, (4,), dict(y=1e-4, grad=1e-3), id="f32-h-1e19"),
    pytest.param(torch.float64, 1e150, (2, 4), dict(y=1e-10, grad=1e-9), id="f64-h-v-1e150"),
])
def test_scaled_h_and_v_give_the_unscaled_result(target, variant, dtype, scale, scaled, tol):
    """Issue 17 item 5, on every backend: a = h^_i . h^_j does not depend on the scale of h, and y
    scales with v. float32 h scaled by 1e19, and float64 h and v by 1e150, whose raw products
    overflow, give the unscaled result: y (divided by the scale of v) and the gradients of a loss on
    it equal the unscaled ones (those of the scaled inputs divided by the scale), nothing non-finite."""
    tensors, scalars, opts = make_problem(N=23, dtype=dtype, seed=5)
    tensors, scalars = on(target.device, tensors), on(target.device, scalars)
    v_scale = scale if 2 in scaled else 1.0

    def run(s):
        inputs = [(t * s if i in scaled else t.clone()).requires_grad_() for i, t in enumerate(tensors)]
        y = ascender_attention(*inputs, **scalars, **opts, variant=variant) / (v_scale if s != 1.0 else 1.0)
        y.square().sum().backward()
        return y, [t.grad for t in inputs]

    y, g = run(1.0)
    y_big, g_big = run(scale)
    assert torch.isfinite(y_big).all() and all(torch.isfinite(t).all() for t in g_big)
    torch.testing.assert_close(y_big, y, rtol=tol["y"], atol=tol["y"] / 10)
    for i, (a, b) in enumerate(zip(g_big, g)):
        torch.testing.assert_close(a * (scale if i in scaled else 1.0), b, rtol=tol["grad"], atol=tol["grad"] / 10)


@pytest.mark.parametrize("backend", ["fused", "blockwise"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["z", "h"])
@pytest.mark.parametrize("N, grad", [(7, False), (7, True), (40, False), (40, True)])
def test_nan_in_a_latent_reaches_exactly_the_twins_rows(backend, variant, name, N, grad):
    """NaN in one token's z or h: the rows that see the token (and the token's own row) are NaN,
    as in the twin; the clamps phi = ws max(a - delta, 0) and D = max(., 0) used to turn it into 0
    (x86 max returns the zero for NaN). N = 7 without grad runs the decode kernel, N = 40 the tiled
    one; with grad the tiled forward of the autograd op."""
    tensors, scalars, opts = make_problem(N=N, seed=3)
    tensors[("z", "h").index(name) + 3][1, 0, 4, 1] = float("nan")
    want = ascender_attention_reference(*tensors, **scalars, **opts, variant=variant, is_causal=True)
    inputs = [t.clone().requires_grad_(grad) for t in tensors]
    with attention_backend(backend, block_rows=3):
        got = ascender_attention(*inputs, **scalars, **opts, variant=variant, is_causal=True)
    nan_rows = torch.isnan(want).any(-1)
    assert nan_rows[1, 0, 4:].all() and not nan_rows[1, 0, :4].any() and not nan_rows[0].any()
    assert torch.equal(torch.isnan(got).all(-1), nan_rows)
    torch.testing.assert_close(got[~nan_rows], want[~nan_rows], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", ["fused", "blockwise"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["q", "k", "v", "z", "h"])
def test_maps_of_a_row_that_sees_a_nan_are_nan(backend, variant, name):
    """The inspection maps follow the output: every map of a row that sees a non-finite input is NaN
    (the fused kernel used to write finite A = 0 and partly finite biases there), the other rows'
    maps are the twin's. Exception: S_base of a key the row cannot see is the raw product, so a NaN
    k gives NaN in that column of every row (the twin computes on its cleaned inputs)."""
    tensors, scalars, opts = make_problem(N=9, seed=3)
    tensors[("q", "k", "v", "z", "h").index(name)][1, 0, 4, 1] = float("nan")
    y, want = ascender_attention_reference(*tensors, **scalars, **opts, variant=variant, is_causal=True,
                                           return_maps=True)
    with attention_backend(backend, block_rows=3):
        _, got = ascender_attention(*tensors, **scalars, **opts, variant=variant, is_causal=True, return_maps=True)
    sick = torch.isnan(y).any(-1)
    assert sick[1, 0, 4].all() and not sick[0].any()
    for key in want:
        assert torch.isnan(got[key][sick]).all(), key
        clean_got, clean_want = got[key][~sick], want[key][~sick]
        if key == "S_base" and name == "k" and backend == "fused":
            assert torch.isnan(got[key][1, 0, :, 4]).all()
            clean_got, clean_want = got[key][~sick][:, :4], want[key][~sick][:, :4]
        torch.testing.assert_close(clean_got, clean_want, rtol=1e-9, atol=1e-9, msg=key)


@pytest.mark.parametrize("backend", ["fused", "blockwise"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mask_stats", [True, False])
@pytest.mark.parametrize("N", [7, 40])
def test_an_empty_row_with_nan_inputs_passes_no_gradient(backend, variant, mask_stats, N):
    """A row without a visible key outputs the constant 0, so its NaN own inputs reach nothing, even
    with an upstream gradient on that row (the fuzzer's loss leaves such rows out): token 0 is
    padded and the attention causal, so row 0 is empty; NaN in all of token 0's q, k, v, z, h. Every
    output and gradient equals the twin's with token 0 finite (the CPU backward used to put the
    empty row's NaN z into the column products of every key of its block: 0 * NaN). Without
    mask_stats token 0 is in every row's statistics set, so there only q and v of token 0 are NaN."""
    tensors, scalars, opts = make_problem(N=N, seed=4)
    kpm = torch.zeros(2, N, dtype=torch.bool)
    kpm[:, 0] = True
    kw = dict(**opts, variant=variant, is_causal=True, key_padding_mask=kpm, mask_stats=mask_stats)
    g = torch.randn(2, 2, N, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def run(inputs, op):
        inputs = [t.clone().requires_grad_() for t in inputs]
        sc = {n: s.clone().requires_grad_() for n, s in scalars.items()}
        y = op(*inputs, **sc, **kw)
        y.backward(g)
        return [y] + [t.grad for t in inputs] + [s.grad for s in sc.values()]

    want = run(tensors, ascender_attention_reference)
    bad = [t.clone() for t in tensors]
    for i in ((0, 1, 2, 3, 4) if mask_stats else (0, 2)):
        bad[i][:, :, 0] = float("nan")
    with attention_backend(backend, block_rows=3):
        got = run(bad, ascender_attention)
    assert torch.equal(got[0][:, :, 0], torch.zeros_like(got[0][:, :, 0]))
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.isfinite(a).all(), i
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9, msg=str(i))


@pytest.mark.parametrize("backend", ["fused", "blockwise", "dense"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_nan_per_head_scalar_stays_in_its_head(backend, variant):
    """Issue 29 item 3, SPEC section 11 for per-head values: each learnable scalar (and the ALiBi
    slopes and the sink logits) NaN in head 0 only. Every row of head 0 with a visible key is NaN (row 0 of a causal
    call has n = 1: the fused kernels used to leave it finite for a NaN omega), head 1 is the twin's
    with head 0 finite, and a loss over head 1 has finite gradients equal to those with head 0
    finite, the NaN entry's own gradient 0 (the block-wise and dense backends gave NaN gradients for
    every input of head 0: 0 x NaN)."""
    tensors, scalars, opts = make_problem(N=7, seed=9)
    scalars = full_scalars(scalars, 2, torch.float64)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 0] = True  # batch 1: row 0 has no visible key (output 0 whatever its head's scalars)
    kw = dict(**opts, variant=variant, is_causal=True, key_padding_mask=kpm,
              alibi_slopes=torch.tensor([0.3, 0.5], dtype=torch.float64))
    scalars["sinks"] = torch.tensor([0.2, -0.4], dtype=torch.float64)
    learnable = SCALAR_NAMES + ("sinks",)

    def run(name, value, op):
        inputs = [t.clone().requires_grad_() for t in tensors]
        sc = {n: s.clone().requires_grad_() for n, s in scalars.items()}
        given = dict(kw, **sc)
        given[name] = given[name].detach().clone()
        given[name][0] = value
        given[name].requires_grad_(name != "alibi_slopes")
        with attention_backend(backend, block_rows=3):
            y = op(*inputs, **given)
        y[:, 1].sum().backward()
        return y, [t.grad for t in inputs] + [given[n].grad for n in learnable]

    want = ascender_attention_reference(*tensors, **dict(kw, **scalars))[:, 1]
    for name in learnable + ("alibi_slopes",):
        y, grads = run(name, float("nan"), ascender_attention)
        y_ok, grads_ok = run(name, 0.4, ascender_attention)
        head0 = torch.isnan(y[:, 0]).all(-1)
        assert head0[0].all() and torch.equal(head0[1], torch.tensor([False] + [True] * 6)), name
        assert torch.equal(y[:, 1], y_ok[:, 1]), name
        assert rel_err(y[:, 1], want) <= 1e-10, name
        for i, (g, g_ok) in enumerate(zip(grads, grads_ok)):
            if g is None:  # (alibi_slopes is not differentiable)
                continue
            assert torch.isfinite(g).all(), (name, i)
            if i >= 5 and learnable[i - 5] == name:
                assert g[0] == 0 and g[1] == g_ok[1], name
            else:
                torch.testing.assert_close(g, g_ok, rtol=1e-12, atol=1e-14, msg=f"{name}: {i}")
    # a sink of +inf has a finite limit, every weight of its head 0 (the block-wise sink weight was inf - inf)
    (y, grads), (y_ok, grads_ok) = run("sinks", float("inf"), ascender_attention), run("sinks", 0.4, ascender_attention)
    assert torch.equal(y[:, 0], torch.zeros_like(y[:, 0])) and torch.equal(y[:, 1], y_ok[:, 1])
    for i, (g, g_ok) in enumerate(zip(grads, grads_ok)):
        assert torch.isfinite(g).all(), ("sinks", i)
        torch.testing.assert_close(g, g_ok, rtol=1e-12, atol=1e-14, msg=f"sinks +inf: {i}")


def test_sinks_with_huge_logits_on_every_backend():
    """With sinks, the twin took x - log(e^sink + sum e^x) at logits near 1e11, which kept 5 digits:
    two tied largest weights of 1/2 came out 3e-5 apart from the fused op's (found by the fuzzer).
    Every backend agrees to rounding, and the rows are a convex mix of the values."""
    g = torch.Generator().manual_seed(4)
    q, k, v, z, h = (torch.randn(1, 2, 5, 2, generator=g, dtype=torch.float64) * 1e6 for _ in range(5))
    k[..., 3, :] = k[..., 1, :]  # two equal largest scores for many rows
    v[..., 3, :] = v[..., 1, :]
    kw = dict(variant="seed", sinks=torch.tensor([1.5, -2.0], dtype=torch.float64))
    want = ascender_attention_reference(q, k, v, z, h, **kw)
    assert want.abs().max() <= v.abs().max()
    for backend in ("fused", "blockwise", "dense"):
        with attention_backend(backend):
            assert rel_err(ascender_attention(q, k, v, z, h, **kw), want) <= 1e-14, backend


@pytest.mark.parametrize("neighbours", ["semantic", "scores"])
def test_unit_keys_that_cancel_give_a_zero_heading(neighbours):
    """Issue 29 item 4(a): with d = 1 every unit key is +1 or -1, so an even neighbour set with as
    many of each sums to 0 in exact arithmetic, and to a rounding residue that differs between
    implementations (the fused kernels' k^ = k (1 / |k|) is not exactly 1). The heading is 0 there on
    every backend (||m|| <= 1e-5 |N|): outputs and gradients agree to rounding, with and without
    autograd (the decode kernel for few query rows). The fused op used to normalize the residue and
    differed from the twin by 0.9."""
    g = torch.Generator().manual_seed(2)
    N = 8  # (<= 8 query rows: the decode kernel without autograd)
    magnitude = torch.rand(1, 2, N, 1, generator=g, dtype=torch.float64) + 0.5
    k = magnitude * torch.tensor([1, 1, -1, -1, 1, -1, 1, -1], dtype=torch.float64).view(1, 1, N, 1)
    q = torch.randn(1, 2, N, 1, generator=g, dtype=torch.float64)
    v, z, h = (torch.randn(1, 2, N, f, generator=g, dtype=torch.float64) for f in (3, 2, 2))
    tensors = (q, k, v, z, h)
    # (the top 4 scores of a row are its 4 largest q_i k_l, of one sign: there, 6 of the 7 other keys)
    kw = dict(variant="paper", k_neighbors=4 if neighbours == "semantic" else 6, neighbours=neighbours, omega_align=1.0)
    fwd = fused_forward(tensors, {}, {}, {}, **kw)
    cnt = (fwd["nbr"] >= 0).sum(-1)
    zero = fwd["stats"][..., Stat.UNORM] <= EPS_HEADING * cnt
    assert zero.sum() >= 3 and (fwd["u"][zero] == 0).all() and (fwd["u"][~zero].abs() == 1).all()
    up = torch.randn(1, 2, N, 3, generator=g, dtype=torch.float64)

    def run(backend, grad=True):
        inputs = [t.clone().requires_grad_(grad) for t in tensors]
        with attention_backend(backend, block_rows=4):
            y = ascender_attention(*inputs, **kw)
        if not grad:
            return [y]
        y.backward(up)
        return [y] + [t.grad for t in inputs]

    want = run("dense")
    for backend in ("fused", "blockwise"):
        for got, w in zip(run(backend) + run(backend, grad=False), want + want[:1]):
            assert rel_err(got, w) <= 1e-12, backend


@pytest.mark.parametrize("entries, slot", [((0, 7), 1), ((-2, 0), 0), ((-1, 3), 1)],
                         ids=["past N", "below -1", "after -1"])
def test_hand_made_neighbour_lists_are_an_error_naming_nbr(entries, slot):
    """The backward op reads the saved nbr to index keys: a list the forward cannot write (an index outside
    [0, N), or a key after the -1 that ends a list) is refused, naming nbr and the entry (it used to be read
    out of bounds)."""
    tensors, scalars, opts = make_problem(N=7)
    scalars, opts = full_scalars(scalars, 2, torch.float64), dict(opts, scale=0.3, k_neighbors=2)
    saved = fused_forward(tensors, scalars, opts, {}, "paper")
    saved["nbr"] = saved["nbr"].clone()
    saved["nbr"][1, 0, 4] = torch.tensor(entries)
    with pytest.raises(RuntimeError, match=r"ascender: nbr must list, per row, key indices in \[0, N\) = \[0, 7\) "
                                           rf"followed only by -1 .*got {entries[slot]} at \[1, 0, 4, {slot}\]"):
        torch.ops.ascender.ascender_bwd(torch.ones(2, 2, 7, 6, dtype=torch.float64),
                                        **op_arguments(tensors, scalars, opts, {}, "paper"), **saved)


def test_numbers_are_made_once_and_serve_inference_then_training():
    """The learnable scalars given as numbers become constants made once per value, dtype, device and stream
    (a fill per scalar and call was nine kernel launches a call on CUDA): no fill after the first call; a
    constant first made under inference_mode serves a later training call's backward; a refused number
    is refused on every call (nothing cached for it)."""
    tensors, _, opts = make_problem(N=6)
    odd = dict(omega_sep=0.3125, kappa=1.8125, lambda_coh=0.6875)  # values no other test passes
    with torch.inference_mode():
        y0 = ascender_attention(*tensors, **opts, **odd)
    inputs = [t.clone().requires_grad_() for t in tensors]
    y = ascender_attention(*inputs, **opts, **odd)
    y.sum().backward()
    torch.testing.assert_close(y.detach(), y0, rtol=1e-12, atol=1e-12)  # (the inference kernel: equal to rounding)
    assert all(t.grad is not None for t in inputs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, torch.no_grad():
        ascender_attention(*tensors, **opts, **odd)
    fills = [e.name for e in prof.events() if e.name in ("aten::full", "aten::fill_")]
    assert not fills, fills
    for _ in range(2):
        with pytest.raises(ValueError, match=r"score_temp \+ 1e-6 is a denominator"):
            ascender_attention(*tensors, **opts, score_temp=-1e-6)


def test_a_number_met_first_inside_a_torch_func_transform_is_not_cached_as_its_wrapper():
    """A fill inside torch.func.jvp (or grad) is the transform's wrapper even where q comes from outside it;
    cached, it sent every later plain call with that number to the block-wise path, silently (found in review,
    2026-11-30)."""
    tensors, _, opts = make_problem(N=6)
    q, k, v, z, h = tensors
    odd = dict(omega_coh=0.40625)  # a value no other test passes
    with attention_backend("blockwise"):
        torch.func.jvp(lambda kk: ascender_attention(q, kk, v, z, h, **opts, **odd), (k,), (torch.ones_like(k),))
    args = [t.clone().requires_grad_() for t in tensors]
    y = ascender_attention(*args, **opts, **odd)
    assert "ascender_fwd" in type(y.grad_fn).__name__, type(y.grad_fn).__name__  # the fused op's backward
