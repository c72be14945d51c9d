"""The fused backward: gradcheck in float64, agreement with reference.py autograd, training
parity, opcheck with gradients, torch.compile, and the double-backward error."""

from __future__ import annotations

import pytest
import torch

import ascender_torch.modules as modules
from ascender_torch import ASCenderHead, ascender_attention
from ascender_torch import _spec as spec
from ascender_torch._spec import SCALAR_NAMES, Stat
from ascender_torch.reference import ascender_attention_reference

from cases import (CPU_FUSED, VARIANTS, full_scalars, make_masks, make_problem, on, op_arguments, resolvable_rows,
                   saved_stats)

GRAD_MODES = ("none", "causal", "key_padding", "attn_mask_stats", "attn_mask_seed")


def _gradcheck_case(variant, mode, N, k_neighbors=3, kappa_scale=1.0, B=1, H=2, seed=0, target=CPU_FUSED):
    tensors, scalars, opts = make_problem(B=B, H=H, N=N, d=4, dv=3, dz=3, da=3, seed=seed,
                                          k_neighbors=k_neighbors)
    scalars = full_scalars(scalars, H, torch.float64)
    scalars["kappa"] = scalars["kappa"] * kappa_scale
    masks = make_masks(mode, B, H, N, seed=seed)
    tensors, scalars, masks = on(target.device, tensors), on(target.device, scalars), on(target.device, masks)
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).unsqueeze(-1).double()
    assert keep.any()
    inputs = [t.clone().requires_grad_() for t in tensors] + [scalars[n].requires_grad_() for n in SCALAR_NAMES]

    def f(q, k, v, z, h, *sc):
        y = ascender_attention(q, k, v, z, h, **dict(zip(SCALAR_NAMES, sc)), **opts, **masks, variant=variant)
        return y * keep

    # the block-wise path: fast mode (random projections of the Jacobian; its full Jacobians would take
    # minutes), its gradients equal the fused op's to 1e-10 anyway (test_blockwise.py)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=target.backend != "fused",
                                    nondet_tol=target.nondet_tol)
    return tensors, scalars, opts, masks


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("N", [1, 2, 3, 5, 17])
def test_gradcheck(target, variant, mode, N):
    _gradcheck_case(variant, mode, N, B=2 if mode == "key_padding" else 1, target=target)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradcheck_k_larger_than_N(variant):
    _gradcheck_case(variant, "causal", 6, k_neighbors=40)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("clamped", [True, False])
def test_gradcheck_eta_clamp(variant, clamped):
    """eta = clamp(rho / kappa, 0, 1): at 1 (no gradient to kappa or rho) or strictly inside."""
    scale = 1e-3 if clamped else 1e3
    tensors, scalars, opts, masks = _gradcheck_case(variant, "none", 9, kappa_scale=scale)
    st = saved_stats(tensors, scalars, opts, masks, variant)
    ratio = st[..., Stat.RHO] / (scalars["kappa"].reshape(1, -1, 1) + 1e-6)
    assert (ratio > 1).all() if clamped else (ratio < 1).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradcheck_relu_both_sides(variant):
    """Some a_ij below delta and some above (the relu of the redundancy kernel)."""
    tensors, scalars, opts, masks = _gradcheck_case(variant, "none", 8)
    hn = torch.nn.functional.normalize(tensors[4], dim=-1)
    a = hn @ hn.transpose(-2, -1)
    delta = scalars["delta"].reshape(1, -1, 1, 1)
    assert (a > delta).any() and (a < delta).any()


def _grads(fn, tensors, scalars, opts, masks, variant, upstream):
    inputs = [t.clone().requires_grad_() for t in tensors]
    sc = {n: s.clone().requires_grad_() for n, s in scalars.items()}
    y = fn(*inputs, **sc, **opts, **masks, variant=variant)
    grads = torch.autograd.grad(y, inputs + [sc[n] for n in SCALAR_NAMES], upstream)
    return grads[:5], torch.stack(grads[5:])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_float32_gradients_match_reference_at_N256(variant, causal):
    B, H, N = 1, 2, 256
    tensors, scalars, opts = make_problem(B=B, H=H, N=N, d=16, dv=16, dz=8, da=8, dtype=torch.float32, seed=3)
    scalars = full_scalars(scalars, H, torch.float32)
    masks = dict(is_causal=causal)
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).unsqueeze(-1)
    assert keep.float().mean() > 0.95
    upstream = torch.randn(B, H, N, 16, generator=torch.Generator().manual_seed(1)) * keep
    got, got_sc = _grads(ascender_attention, tensors, scalars, opts, masks, variant, upstream)
    as64 = lambda t: t.double()  # noqa: E731
    want, want_sc = _grads(ascender_attention_reference, tuple(map(as64, tensors)),
                           {n: as64(s) for n, s in scalars.items()}, opts, masks, variant, as64(upstream))
    for name, g, w in zip("qkvzh", got, want):
        err = (g.double() - w).abs().max() / w.abs().max()
        assert err <= 1e-4, f"d{name}: relative error {err:.2e}"
    # the nine scalar gradients as one vector per head (a lambda's gradient is ~0 by the scale
    # invariance of the row normalization, so it is judged against the others' scale)
    err = (got_sc.double() - want_sc).abs().max() / want_sc.abs().max()
    assert err <= 1e-4, f"scalars: relative error {err:.2e}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", GRAD_MODES + ("all",))
@pytest.mark.parametrize("N", [12, 70])
def test_float64_gradients_match_reference(target, variant, mode, N):
    tensors, scalars, opts = make_problem(N=N, seed=4)
    scalars = full_scalars(scalars, 2, torch.float64)
    masks = make_masks(mode, 2, 2, N, seed=4)
    tensors, scalars, masks = on(target.device, tensors), on(target.device, scalars), on(target.device, masks)
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).unsqueeze(-1)
    upstream = torch.randn(2, 2, N, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(target.device) * keep
    got, got_sc = _grads(ascender_attention, tensors, scalars, opts, masks, variant, upstream)
    want, want_sc = _grads(ascender_attention_reference, tensors, scalars, opts, masks, variant, upstream)
    for name, g, w in zip("qkvzh", got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10 * w.abs().max().item(), msg=f"d{name}")
    torch.testing.assert_close(got_sc, want_sc, rtol=1e-9, atol=1e-10 * want_sc.abs().max().item())


def test_zero_dim_scalar_gradient_is_the_sum_over_heads():
    tensors, _, opts = make_problem(H=3, N=8)
    om = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    om_h = torch.full((3,), 0.3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 3, 8, 6, dtype=torch.float64)
    (d0,) = torch.autograd.grad(ascender_attention(*tensors, **opts, omega_coh=om), om, g)
    (dh,) = torch.autograd.grad(ascender_attention(*tensors, **opts, omega_coh=om_h), om_h, g)
    assert d0.shape == () and dh.shape == (3,)
    torch.testing.assert_close(d0, dh.sum())


@pytest.mark.parametrize("used", ["out", "aux", "align"])
def test_the_backward_gets_only_the_used_outputs_gradients(used):
    """Outputs the loss does not use reach the backward op as None, not as tensors of zeros (as they did before
    2026-11-29: with grad_aux or grad_u given the kernels run the aux and heading paths of the backward). A loss
    without y gets grad_out as zeros. The gradients match the twin's in every case."""
    from torch.utils._python_dispatch import TorchDispatchMode
    tensors, scalars, opts = make_problem(H=2, N=9)
    opts = dict(opts, variant="paper", return_aux=True)
    seen = {}

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.ascender.ascender_bwd.default:
                a = spec.ASCENDER_BWD.bind(args, kwargs or {})
                seen.update(grad_aux=a["grad_aux"], grad_u=a["grad_u"], grad_out=a["grad_out"])
            return func(*args, **(kwargs or {}))

    def loss(y, aux):
        return {"out": y.square().sum(), "aux": aux["coh"].square().sum() + aux["sep"].sum(),
                "align": aux["align"].square().sum()}[used]

    ts = [t.clone().requires_grad_() for t in tensors]
    with Spy():
        got = torch.autograd.grad(loss(*ascender_attention(*ts, **scalars, **opts)), ts)
    ref = [t.clone().requires_grad_() for t in tensors]
    want = torch.autograd.grad(loss(*ascender_attention_reference(*ref, **scalars, **opts)), ref, allow_unused=True)
    want = [torch.zeros_like(t) if w is None else w for t, w in zip(ref, want)]  # (v reaches no aux term)
    assert (seen["grad_aux"] is None) == (used != "aux")
    assert (seen["grad_u"] is None) == (used != "align")
    assert bool((seen["grad_out"] == 0).all()) == (used != "out")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-9)


def test_masked_rows_and_keys_get_no_gradient():
    tensors, scalars, opts = make_problem(N=6)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, 4:] = True
    kpm[1] = True
    q, k, v = (t.clone().requires_grad_() for t in tensors[:3])
    y = ascender_attention(q, k, v, *tensors[3:], **scalars, **opts, key_padding_mask=kpm, variant="paper")
    y.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert torch.equal(q.grad[1], torch.zeros_like(q.grad[1]))  # batch 1 sees nothing
    assert torch.equal(v.grad[0, :, 4:], torch.zeros_like(v.grad[0, :, 4:]))  # padded values unused


def test_double_backward_raises():
    tensors, _, opts = make_problem(N=5)
    q = tensors[0].clone().requires_grad_()
    y = ascender_attention(q, *tensors[1:], **opts)
    (gq,) = torch.autograd.grad(y.sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gq.sum().backward()


def _train(head_cls_kwargs, use_reference, monkeypatch, steps=50):
    if use_reference:
        monkeypatch.setattr(modules, "ascender_attention", ascender_attention_reference)
    else:
        monkeypatch.setattr(modules, "ascender_attention", ascender_attention)
    torch.manual_seed(0)
    vocab, d_model, N = 20, 16, 64
    emb = torch.nn.Embedding(vocab, d_model).double()
    head = ASCenderHead(d_model, 8, k=4, **head_cls_kwargs).double()
    out = torch.nn.Linear(8, vocab).double()
    params = [*emb.parameters(), *head.parameters(), *out.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-2)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (2, N), generator=g)
    targets = torch.randint(0, vocab, (2, N), generator=g)
    losses = []
    for _ in range(steps):
        Y, _, _ = head(emb(tokens), need_weights=False, is_causal=True)
        loss = torch.nn.functional.cross_entropy(out(Y).reshape(-1, vocab), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float64)


@pytest.mark.parametrize("variant", VARIANTS)
def test_training_parity_with_reference(variant, monkeypatch):
    fused = _train(dict(variant=variant), False, monkeypatch)
    ref = _train(dict(variant=variant), True, monkeypatch)
    assert fused[-1] < fused[0]  # it learns
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_opcheck_with_gradients(variant):
    tensors, scalars, opts = make_problem(N=6)
    scalars = full_scalars(scalars, 2, torch.float64)
    args = op_arguments(tuple(t.clone().requires_grad_() for t in tensors),
                        {n: s.requires_grad_() for n, s in scalars.items()}, dict(opts, tau_coh=0.5, scale=0.3),
                        dict(attn_mask=torch.ones(6, 6, dtype=torch.bool).tril()), variant)
    torch.library.opcheck(torch.ops.ascender.ascender_fwd.default, (), args)  # the four default utilities
    # the backward op itself, on non-contiguous inputs (its fake must report contiguous gradients)
    plain = {n: a.detach().transpose(1, 2).contiguous().transpose(1, 2) if isinstance(a, torch.Tensor) and a.dim() == 4
             else (a.detach() if isinstance(a, torch.Tensor) else a) for n, a in args.items()}
    grad_out = torch.randn(2, 2, 6, 6, dtype=torch.float64)
    torch.library.opcheck(torch.ops.ascender.ascender_bwd.default, (grad_out,), plain,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_rows32_has_columns_for_the_half_types_only():
    """The forward's rows32 output: float32 [B, H, Nq, len(Stat) + dz + d + dv + 2] for float16 / bfloat16 from
    ascender_fwd (fake kernel, meta tensors), no columns for the other dtypes (the CPU kernel) and from
    ascender_infer; the backward refuses one of another width, naming it."""
    tensors, scalars, opts = make_problem(N=6)  # d = 8, dz = 4, dv = 6
    args = op_arguments(tensors, full_scalars(scalars, 2, torch.float64), dict(opts, scale=0.3), {}, "paper")
    rows32 = dict(zip(spec.ASCENDER_FWD.returns, torch.ops.ascender.ascender_fwd(**args)))["rows32"]
    assert rows32.shape == (2, 2, 6, 0) and rows32.dtype == torch.float32
    half = {n: a.to("meta", torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for n, a in args.items()}
    widths = ((torch.ops.ascender.ascender_fwd, len(Stat) + 4 + 8 + 6 + 2), (torch.ops.ascender.ascender_infer, 0))
    for op, width in widths:
        got = dict(zip(spec.ASCENDER_FWD.returns, op(**half)))["rows32"]
        assert got.shape == (2, 2, 6, width) and got.dtype == torch.float32 and got.device.type == "meta"
    saved = dict(zip(spec.ASCENDER_FWD.returns, torch.ops.ascender.ascender_fwd(**args)))
    saved["rows32"] = torch.zeros(2, 2, 6, 3)
    with pytest.raises(RuntimeError, match=r"ascender: rows32 must have shape \[2, 2, 6, 0\], got shape \[2, 2, 6, 3\]"):
        torch.ops.ascender.ascender_bwd(torch.ones(2, 2, 6, 6, dtype=torch.float64), **args, **saved)


def test_compile_fullgraph_gradients_match_eager():
    torch.manual_seed(0)
    head = ASCenderHead(16, 8, k=3, variant="paper").double()
    X = torch.randn(2, 10, 16, dtype=torch.float64, requires_grad=True)

    def forward(x):
        return head(x, need_weights=False, is_causal=True)[0]

    eager = forward(X)
    g_eager = torch.autograd.grad(eager.square().sum(), [X, *head.parameters()])
    compiled = torch.compile(forward, fullgraph=True)(X)  # the default (inductor) backend
    g_comp = torch.autograd.grad(compiled.square().sum(), [X, *head.parameters()])
    # the op's output bit for bit (inductor may order the projections' and a loss's reductions
    # differently from eager, so those are compared to rounding only through the gradients)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_backward_is_deterministic():
    tensors, scalars, opts = make_problem(B=1, H=2, N=300, d=16, dtype=torch.float32)
    upstream = torch.randn(1, 2, 300, 6)
    first = _grads(ascender_attention, tensors, scalars, opts, dict(is_causal=True), "paper", upstream)
    second = _grads(ascender_attention, tensors, scalars, opts, dict(is_causal=True), "paper", upstream)
    for a, b in zip(first[0] + (first[1],), second[0] + (second[1],)):
        assert torch.equal(a, b)


def test_rows_with_only_grad_u_past_a_short_blocks_rows():
    """A block whose upstream rows fit in a short width (here rows 0-3) computes its row products at that
    width; rows past it that have only grad_u (20-29) must get nothing from the lanes it did not write,
    whatever an earlier (b, h) of the same call left there: (b, h) 1's gradients do not depend on (b, h) 0's."""
    tensors, scalars, opts = make_problem(B=2, H=1, N=40, d=8, dtype=torch.float32, seed=1, per_head=False)
    grads = []
    for first in (0.0, 100.0):
        t = [x.clone().requires_grad_() for x in tensors]
        out = torch.ops.ascender.ascender_fwd(**op_arguments(t, scalars, opts, {}, "seed"))
        y, u = out[0], out[2]
        gy, gu = torch.zeros_like(y), torch.zeros_like(u)
        gy[0], gy[1, :, :4], gu[1, :, 20:30] = first, 1.0, 1.0
        grads.append([g[1] for g in torch.autograd.grad((y * gy).sum() + (u * gu).sum(), t)])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
