"""Attention sinks (shared/SPEC.md section 12): a learnable logit per head (or per row: a 3-D tensor
broadcastable to [B, H, Nq], docs/backward.md) that joins the softmax's denominator only. The twin against hand-computed cases; every backend (the grid's targets, the
decode kernel in test_decode.py) against the twin's autograd, gradcheck in float64; the statistics
never see the sink; a row without a visible key gives 0 and passes the sink no gradient."""

from __future__ import annotations

import re

import pytest
import torch

from ascender_torch import ascender_attention
from ascender_torch._spec import SCALAR_NAMES, Stat
from ascender_torch.reference import ascender_attention_reference

from cases import (MASK_MODES, VARIANTS, fused_forward, full_scalars, make_masks, make_problem, on,
                   rel_err, resolvable_rows)

SINKS = torch.tensor([0.4, -1.1], dtype=torch.float64)  # one logit per head of make_problem's H = 2
# per-row sinks of the shapes a 3-D tensor may have, folded into the mask modes of the grid below (none and
# all keep the per-head SINKS): [B, H, Nq], [1, H, Nq], [B, 1, 1] and [B, H, 1]
ROW_SINKS = {"causal": (2, 2, 13), "key_padding": (1, 2, 13), "attn_mask_stats": (2, 1, 1), "attn_mask_seed": (2, 2, 1)}
OMEGA_ZERO = dict(omega_align=0.0, omega_sep=0.0, omega_coh=0.0, score_temp=1.0 - 1e-6)


def _by_hand(q, k, v, sinks, mask):
    """y_i = sum_j exp(x_ij) v_j / (exp(sink) + sum_{l visible} exp(x_il)), x = q.k / sqrt(d), written
    out with explicit exponentials (float64, small values: no max shift needed); 0 without a visible key."""
    x = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    e = torch.where(mask, x.exp(), torch.zeros_like(x))
    den = (sinks.unsqueeze(-1) if sinks.dim() == 3 else sinks.reshape(1, -1, 1, 1)).exp() + e.sum(-1, keepdim=True)
    y = (e / den) @ v
    return torch.where(mask.any(-1, keepdim=True), y, torch.zeros_like(y))


@pytest.mark.parametrize("variant", VARIANTS)
def test_twin_with_omega_zero_is_the_hand_computed_sink_softmax(variant):
    """The twin with omega = 0 and score_temp + 1e-6 = 1 is GPT-OSS's attention: written out by hand,
    causal with token 0 padded (row 0 sees nothing: 0), per-head, 0-dim and per-row sinks; a sink of -1e4
    is no sink at all."""
    (q, k, v, z, h), _, opts = make_problem(N=6, seed=1)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[:, 0] = True
    mask = (~kpm).reshape(2, 1, 1, 6) & torch.ones(6, 6, dtype=torch.bool).tril()
    rows = torch.randn(2, 2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for sinks in (SINKS, torch.tensor(0.7, dtype=torch.float64), rows, rows[:1, :, :1]):
        got = ascender_attention_reference(q, k, v, z, h, **OMEGA_ZERO, **opts, variant=variant, is_causal=True,
                                           key_padding_mask=kpm, sinks=sinks)
        want = _by_hand(q, k, v, sinks.expand(2) if sinks.dim() == 0 else sinks, mask)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # (score_temp + 1e-6 = 1 to rounding)
        assert got[:, :, 0].abs().max() == 0
    plain = ascender_attention_reference(q, k, v, z, h, **opts, variant=variant)
    torch.testing.assert_close(ascender_attention_reference(q, k, v, z, h, **opts, variant=variant, sinks=-1e4), plain,
                               rtol=1e-13, atol=1e-15)  # (exp(x - lse) against softmax's rounding)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
def test_outputs_and_gradients_equal_the_twins(target, variant, mode):
    """float64, biases on: y, the aux terms and the gradients of q, k, v, z, h, every scalar and the
    sinks against the twin's autograd (1e-9 norm-wise; the scalars as one vector); float32 outputs.
    Per-head sinks, or per-row ones of the shapes in ROW_SINKS."""
    tensors, scalars, opts = make_problem(N=13, seed=5)
    scalars = full_scalars(scalars, 2, torch.float64)
    masks = make_masks(mode, 2, 2, 13, seed=5)
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).unsqueeze(-1)
    tensors, scalars, masks, keep = (on(target.device, x) for x in (tensors, scalars, masks, keep))
    up = torch.randn(2, 2, 13, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * keep.cpu()
    up = up.to(target.device)
    given = torch.randn(ROW_SINKS[mode], dtype=torch.float64, generator=torch.Generator().manual_seed(6)) \
        if mode in ROW_SINKS else SINKS

    def run(fn, dtype=torch.float64):
        inputs = [t.to(dtype).clone().requires_grad_() for t in tensors]
        sc = {n: s.to(dtype).clone().requires_grad_() for n, s in scalars.items()}
        sinks = given.to(target.device, dtype).clone().requires_grad_()
        y, aux = fn(*inputs, **sc, **opts, **masks, variant=variant, sinks=sinks, return_aux=True)
        loss = (y * up.to(dtype)).sum() + 0.3 * (aux["coh"] * keep[..., 0]).sum() + 0.5 * (aux["sep"] * keep[..., 0]).sum()
        grads = torch.autograd.grad(loss, inputs + [sc[n] for n in SCALAR_NAMES] + [sinks])
        return [y, aux["coh"], aux["sep"], *grads[:5]], torch.stack(grads[5:-1]), grads[-1]

    got, got_sc, got_sink = run(ascender_attention)
    want, want_sc, want_sink = run(ascender_attention_reference)
    for name, a, b in zip(("y", "coh", "sep", "dq", "dk", "dv", "dz", "dh"), got, want):
        assert rel_err(a, b) <= 1e-9, name
    assert rel_err(got_sc, want_sc) <= 1e-9
    assert got_sink.shape == given.shape and rel_err(got_sink, want_sink) <= 1e-9 and want_sink.abs().max() > 0
    y32 = ascender_attention(*(t.float() for t in tensors), **{n: s.float() for n, s in scalars.items()}, **opts,
                             **masks, variant=variant, sinks=given.float().to(target.device))
    rows = resolvable_rows(tensors, scalars, opts, masks, variant, rel=1e-3).unsqueeze(-1)
    assert rel_err(y32 * rows, want[0] * rows) <= target.tolerance(torch.float32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["causal", "all"])
def test_gradcheck(target, variant, mode):
    """gradcheck in float64 with respect to q, k, v, z, h, two scalars and the sinks, on rows with and
    without a visible key (mode "all" has an empty row 0, with per-row sinks [B, H, Nq])."""
    tensors, scalars, opts = make_problem(B=1, N=5, d=4, dv=3, dz=3, da=3, seed=2)
    scalars = full_scalars(scalars, 2, torch.float64)
    masks = make_masks(mode, 1, 2, 5, seed=2)
    tensors, scalars, masks = (on(target.device, x) for x in (tensors, scalars, masks))
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).unsqueeze(-1).double()
    fixed = {n: s for n, s in scalars.items() if n not in ("score_temp", "omega_coh")}
    inputs = [t.clone().requires_grad_() for t in tensors] + [
        scalars["score_temp"].clone().requires_grad_(), scalars["omega_coh"].clone().requires_grad_(),
        (SINKS if mode == "causal" else torch.linspace(-1.0, 1.2, 10, dtype=torch.float64).reshape(1, 2, 5)).to(
            target.device).clone().requires_grad_()]

    def f(q, k, v, z, h, temp, omega_coh, sinks):
        y = ascender_attention(q, k, v, z, h, **fixed, score_temp=temp, omega_coh=omega_coh, sinks=sinks, **opts,
                               **masks, variant=variant)
        return y * keep

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=target.backend != "fused",
                                    nondet_tol=target.nondet_tol)


def test_rows_without_a_visible_key_give_zero_and_no_sink_gradient(target):
    """Causal with token 0 padded: row 0 outputs 0 and, with an upstream gradient on it alone, the
    sink (and every input) gets exactly zero gradient; batch 1 fully padded likewise; per head and per row."""
    (q, k, v, z, h), scalars, opts = make_problem(N=5, seed=7)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, 0] = True
    kpm[1] = True
    tensors = on(target.device, (q, k, v, z, h))
    kpm = kpm.to(target.device)
    for given in (SINKS, torch.linspace(-1.0, 2.0, 20, dtype=torch.float64).reshape(2, 2, 5)):
        sinks = given.to(target.device).clone().requires_grad_()
        inputs = [t.clone().requires_grad_() for t in tensors]
        y = ascender_attention(*inputs, **on(target.device, scalars), **opts, is_causal=True, key_padding_mask=kpm,
                               sinks=sinks)
        assert y[0, :, 0].abs().max() == 0 and y[1].abs().max() == 0
        up = torch.zeros_like(y)
        up[0, :, 0] = 1.0
        up[1] = 1.0
        grads = torch.autograd.grad(y, inputs + [sinks], up)
        assert all(g.abs().max() == 0 for g in grads)


def test_statistics_never_see_the_sink():
    """The fused forward's saved statistics with and without sinks: every column but the log-sum-exp
    is the same to the bit (moments, density, centroid's sum and spread, gates, count), as are u, c
    and the neighbours; LSE becomes log(exp(LSE) + exp(sink)); the maps' weights sum to
    1 - exp(sink - LSE) on each row that sees a key."""
    tensors, scalars, opts = make_problem(N=9, seed=3)
    masks = dict(is_causal=True, key_padding_mask=torch.tensor([[True] + [False] * 8, [False] * 9]))
    plain = fused_forward(tensors, scalars, opts, masks, "paper")
    sunk = fused_forward(tensors, scalars, opts, masks, "paper", sinks=SINKS)
    for name in ("u", "c", "nbr"):
        assert torch.equal(plain[name], sunk[name]), name
    other = [s for s in Stat if s != Stat.LSE]
    assert torch.equal(plain["stats"][..., other], sunk["stats"][..., other])
    seen = torch.isfinite(plain["stats"][..., Stat.LSE])
    lse = torch.logaddexp(plain["stats"][..., Stat.LSE], SINKS.reshape(1, 2, 1))
    torch.testing.assert_close(sunk["stats"][..., Stat.LSE][seen], lse[seen], rtol=1e-14, atol=0)
    assert torch.isinf(sunk["stats"][..., Stat.LSE][~seen]).all()
    _, maps = ascender_attention(*tensors, **scalars, **opts, **masks, variant="paper", sinks=SINKS,
                                 return_maps=True)
    mass = 1 - (SINKS.reshape(1, 2, 1) - sunk["stats"][..., Stat.LSE]).exp()
    torch.testing.assert_close(maps["A"].sum(-1)[seen], mass[seen], rtol=1e-12, atol=0)
    assert maps["A"].sum(-1)[~seen].abs().max() == 0


def test_sinks_are_checked_naming_the_argument():
    tensors, scalars, opts = make_problem(N=4)
    want = r"sinks must be a 0-dim tensor or have shape \[H\] = \[2\] \(per head\), or be 3-D and broadcastable to " \
           r"\[B, H, Nq\] = \[2, 2, 4\] \(per row\), got shape "
    for shape in ((3,), (2, 2), (2, 3, 4), (2, 2, 2, 4)):  # (2-D is neither: a 1-D tensor is per head, 3-D per row)
        with pytest.raises(RuntimeError, match=want + re.escape(str(list(shape)))):
            ascender_attention(*tensors, **scalars, **opts, sinks=torch.zeros(shape, dtype=torch.float64))
    with pytest.raises(ValueError, match="sinks must be a finite number"):
        ascender_attention(*tensors, **scalars, **opts, sinks=float("inf"))
    y0 = ascender_attention(*tensors, **scalars, **opts, sinks=0.25)  # a number is every head's sink
    torch.testing.assert_close(y0, ascender_attention(*tensors, **scalars, **opts, sinks=torch.full((2,), 0.25)))


def test_a_nan_row_sink_poisons_its_row_only(target):
    """SPEC section 11 for per-row sinks: a NaN logit makes its own row NaN, no other; the gradients of a loss
    over the other rows are finite and those of the same sinks with that logit finite (its own gradient 0)."""
    tensors, scalars, opts = make_problem(N=7, seed=9)
    tensors, scalars = on(target.device, tensors), on(target.device, scalars)
    finite = torch.linspace(-1.0, 1.0, 28, dtype=torch.float64, device=target.device).reshape(2, 2, 7)
    bad = finite.clone()
    bad[0, 0, 3] = float("nan")
    keep = torch.ones(2, 2, 7, 1, dtype=torch.float64, device=target.device)
    keep[0, 0, 3] = 0.0

    def run(sinks):
        inputs = [t.clone().requires_grad_() for t in tensors] + [sinks.clone().requires_grad_()]
        y = ascender_attention(*inputs[:5], **scalars, **opts, variant="paper", is_causal=True, sinks=inputs[5])
        return y, torch.autograd.grad((y * keep).nan_to_num().sum(), inputs)

    (y, grads), (y_ok, grads_ok) = run(bad), run(finite)
    rows = keep[..., 0] > 0
    assert torch.equal(torch.isnan(y).all(-1), ~rows) and torch.equal(y[rows], y_ok[rows])
    for g, g_ok in zip(grads, grads_ok):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, g_ok, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("shape", [(2,), (2, 2, 70), (1, 2, 1)], ids=["head", "rows", "query-broadcast"])
def test_sink_gradients_do_not_depend_on_the_thread_count(shape):
    """The fused CPU backward sums the rows' sink gradients in row order after its parallel region: the same
    bits on one thread and on two (70 rows: three blocks of rows per (b, h))."""
    tensors, scalars, opts = make_problem(N=70, seed=12)
    sinks = torch.linspace(-1.0, 1.0, torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    up = torch.randn(2, 2, 70, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    threads, grads = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            inputs = [t.clone().requires_grad_() for t in tensors] + [sinks.clone().requires_grad_()]
            y = ascender_attention(*inputs[:5], **scalars, **opts, is_causal=True, sinks=inputs[5])
            grads.append(torch.autograd.grad(y, inputs, up))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*grads))
