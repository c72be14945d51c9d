"""The fused C forward against reference.py: values, maps, saved statistics."""

from __future__ import annotations

import pytest
import torch

from ascender_torch import ascender_attention
from ascender_torch.backends import attention_backend
from ascender_torch.reference import ascender_attention_reference

from ascender_torch._spec import Stat

from cases import (DTYPES, FORWARD_TOL, MASK_MODES, VARIANTS, fused_forward, make_masks, make_problem, on,
                   rel_err, resolvable_rows)


def _compare(target, dtype, variant, mode, N, d, dv=5, k_neighbors=3, duplicates=False, per_head=True, B=2, H=2):
    tensors, scalars, opts = make_problem(B=B, H=H, N=N, d=d, dv=dv, dtype=dtype, seed=N * 7 + d,
                                          duplicates=duplicates, per_head=per_head,
                                          k_neighbors=k_neighbors)
    masks = make_masks(mode, B, H, N, seed=N)
    with target.use(N):
        y = ascender_attention(*on(target.device, tensors), **on(target.device, scalars), **opts,
                               **on(target.device, masks), variant=variant).cpu()
    # the oracle runs in float64 on the very same (possibly float32-rounded) inputs
    as64 = lambda t: t.to(torch.float64)  # noqa: E731
    y_ref = ascender_attention_reference(*map(as64, tensors), **{n: as64(s) for n, s in scalars.items()},
                                         **opts, **masks, variant=variant)
    assert y.dtype == dtype and y.shape == (B, H, N, dv)
    assert torch.isfinite(y).all()
    if dtype == torch.float32:
        rows = resolvable_rows(tensors, scalars, opts, masks, variant, rel=1e-3, floor=1e-7)
        assert rows.float().mean() >= 0.75, "test problem is too degenerate to say anything"
        y, y_ref = y[rows], y_ref[rows]
    err, tol = rel_err(y, y_ref), target.tolerance(dtype)
    assert err <= tol, f"relative error {err:.3e} > {tol:.0e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
@pytest.mark.parametrize("N", [1, 2, 3, 7, 16, 65, 200])
@pytest.mark.parametrize("d", [8, 64])
def test_fused_matches_reference(target, dtype, variant, mode, N, d):
    _compare(target, dtype, variant, mode, N, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["none", "all"])
def test_a_0_dim_scalar_is_every_heads_value(target, dtype, variant, mode):
    """A learnable scalar given as a 0-dim tensor reaches the kernels as one value that every head reads (the binding
    copies nothing: asc_fwd_args.scalars_shared); the same values given as [H] tensors give the same output, and
    the 0-dim gradients are the sums of the [H] ones."""
    B, H, N = 2, 3, 9
    tensors, _, opts = make_problem(B=B, H=H, N=N, dtype=dtype, seed=5)
    values = dict(lambda_align=1.3, lambda_sep=0.8, omega_align=0.6, omega_sep=-0.4, omega_coh=0.5, score_temp=0.9,
                  delta=0.1, kappa=2.5)  # lambda_coh per head below: shared and per-head scalars in one call
    per_head = torch.tensor([0.7, 1.1, 1.6], dtype=dtype)
    masks = on(target.device, make_masks(mode, B, H, N, seed=3))
    results = []
    for shape in ((), (H,)):
        scalars = {n: torch.full(shape, v, dtype=dtype, device=target.device, requires_grad=True)
                   for n, v in values.items()}
        coh = per_head.to(target.device).requires_grad_()
        inputs = [t.to(target.device).requires_grad_() for t in tensors]
        with target.use(N):
            y = ascender_attention(*inputs, **scalars, lambda_coh=coh, **opts, **masks, variant=variant)
        y.backward(torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape).to(y))
        grads = {n: t.grad.sum() for n, t in scalars.items()}
        results.append((y.detach(), [t.grad for t in inputs], grads, coh.grad))
    (y0, g0, s0, c0), (y1, g1, s1, c1) = results
    torch.testing.assert_close(y0, y1, rtol=0, atol=0)
    for a, b in zip(g0 + [c0], g1 + [c1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for n in values:
        torch.testing.assert_close(s0[n], s1[n], rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["none", "causal", "key_padding"])
def test_k_neighbors_larger_than_N(target, dtype, variant, mode):
    _compare(target, dtype, variant, mode, N=5, d=8, k_neighbors=50)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
def test_duplicate_tokens(target, dtype, variant, mode):
    _compare(target, dtype, variant, mode, N=9, d=8, duplicates=True)


@pytest.mark.parametrize("neighbours", ["semantic", "scores"])
@pytest.mark.parametrize("structure", [{}, dict(is_causal=True, window_size=(40, 0))], ids=["full", "causal-window"])
def test_exact_ties_go_to_the_lower_index(neighbours, structure):
    """SPEC section 4's tie rule on exact ties: every token twice, at shuffled places, so that each
    key's affinity (and score) ties exactly with its copy's. The fused kernels' neighbour lists are
    the rule's, ranked here by (value, index) from values formed pair by pair (equal inputs, equal
    values); and dk, which goes to the chosen one of two equal keys, is the same on the three
    backends (the twin and the block-wise path ranked values from a matrix product, which rounded two
    equal keys' values apart: dk differed from the fused one by 1e-2 relative, y by 1e-15). N = 74:
    a full key tile and a partial one; causal with a window, the blocks read subsets of the keys."""
    g = torch.Generator().manual_seed(11)
    M, k_nb = 37, 5
    base = [torch.randn(1, 2, M, f, generator=g, dtype=torch.float64) for f in (8, 8, 5, 4, 6)]
    where = torch.randperm(2 * M, generator=g)
    tensors = [torch.cat([t, t], 2)[:, :, where] for t in base]
    q, k, _, _, h = tensors
    rows = (q, k) if neighbours == "scores" else (torch.nn.functional.normalize(h, dim=-1),) * 2
    value = (rows[0].unsqueeze(-2) * rows[1].unsqueeze(-3)).sum(-1)  # (a positive scale keeps the order)
    t = torch.arange(2 * M)
    seen = (t.unsqueeze(0) <= t.unsqueeze(1)) & (t.unsqueeze(0) >= t.unsqueeze(1) - 40) if structure else True
    value = value.masked_fill(torch.eye(2 * M, dtype=torch.bool) | ~torch.as_tensor(seen), -torch.inf)
    want = torch.sort(value, dim=-1, descending=True, stable=True)
    want = torch.where(want.values[..., :k_nb] > -torch.inf, want.indices[..., :k_nb], -1)
    kw = dict(variant="paper", k_neighbors=k_nb, neighbours=neighbours, omega_align=1.0, **structure)
    assert torch.equal(fused_forward(tensors, {}, {}, {}, **kw)["nbr"], want)
    up = torch.randn(1, 2, 2 * M, 5, generator=g, dtype=torch.float64)

    def run(backend):
        inputs = [t.clone().requires_grad_() for t in tensors]
        with attention_backend(backend, block_rows=7):
            y = ascender_attention(*inputs, **kw)
        y.backward(up)
        return [y] + [t.grad for t in inputs]

    fused = run("fused")
    for backend in ("blockwise", "dense"):
        for name, got, want_ in zip(("y", "dq", "dk", "dv", "dz", "dh"), run(backend), fused):
            assert rel_err(got, want_) <= 1e-12, (backend, name)


@pytest.mark.parametrize("variant", VARIANTS)
def test_all_tokens_identical(variant):
    """Every bias row is constant (std = 0): normalized biases are exactly 0."""
    x = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    q, k, v = x.expand(2, 3, 6, 8).clone(), x.expand(2, 3, 6, 8).clone(), torch.randn(2, 3, 6, 4, dtype=torch.float64)
    z, h = x[..., :4].expand(2, 3, 6, 4).clone(), x[..., 4:].expand(2, 3, 6, 4).clone()
    y, maps = ascender_attention(q, k, v, z, h, variant=variant, return_maps=True)
    for name in ("b_align", "b_sep", "b_coh"):
        assert maps[name].abs().max().item() < 1e-9, name
    torch.testing.assert_close(y, v.mean(2, keepdim=True).expand_as(y), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_scalar_forms_agree(variant):
    """A python number, a 0-dim tensor and an [H] tensor of equal values give equal outputs."""
    tensors, _, opts = make_problem(H=3, N=11)
    a = ascender_attention(*tensors, **opts, variant=variant, omega_sep=0.3, kappa=2.0)
    b = ascender_attention(*tensors, **opts, variant=variant, omega_sep=torch.tensor(0.3, dtype=torch.float64),
                           kappa=torch.tensor(2.0, dtype=torch.float64))
    c = ascender_attention(*tensors, **opts, variant=variant, omega_sep=torch.full((3,), 0.3, dtype=torch.float64),
                           kappa=torch.full((3,), 2.0, dtype=torch.float64))
    assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("variant", VARIANTS)
def test_per_head_scalars_act_per_head(variant):
    """Changing head 1's omega changes head 1 only."""
    tensors, scalars, opts = make_problem(H=2, N=12)
    y0 = ascender_attention(*tensors, **scalars, **opts, variant=variant)
    scalars["omega_coh"] = scalars["omega_coh"].clone()
    scalars["omega_coh"][1] += 1.0
    y1 = ascender_attention(*tensors, **scalars, **opts, variant=variant)
    assert torch.equal(y0[:, 0], y1[:, 0])
    assert not torch.allclose(y0[:, 1], y1[:, 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
def test_maps_match_reference(target, dtype, variant, mode):
    tensors, scalars, opts = make_problem(N=10, dtype=dtype)
    masks = make_masks(mode, 2, 2, 10)
    _, maps = ascender_attention(*on(target.device, tensors), **on(target.device, scalars), **opts, **on(target.device, masks),
                                 variant=variant, return_maps=True)
    maps = on("cpu", maps)
    _, want = ascender_attention_reference(*tensors, **scalars, **opts, **masks, variant=variant, return_maps=True)
    rows = torch.ones(2, 2, 10, dtype=torch.bool)
    if dtype == torch.float32:
        rows = resolvable_rows(tensors, scalars, opts, masks, variant, rel=1e-3, floor=1e-7)
    assert set(maps) == {"S_base", "b_align", "b_sep", "b_coh", "A"}
    for name in maps:
        assert maps[name].shape == (2, 2, 10, 10)
        assert not maps[name].requires_grad
        assert rel_err(maps[name][rows], want[name][rows]) <= 10 * target.tolerance(dtype), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_statistics(variant):
    """The statistics the backward will reuse: log-sum-exp, row moments, rho, centroid, u."""
    tensors, scalars, opts = make_problem(N=9)
    q, k, v, z, h = tensors
    fwd = fused_forward(tensors, scalars, opts, {}, variant)
    stats, u, c, nbr = fwd["stats"], fwd["u"], fwd["c"], fwd["nbr"]
    assert stats.shape == (2, 2, 9, len(Stat))
    T = (scalars["score_temp"] + 1e-6).reshape(1, 2, 1, 1)
    _, maps = ascender_attention_reference(*tensors, **scalars, **opts, variant=variant, return_maps=True)
    # A = exp(S/T - lse): recover S/T from the maps and check the log-sum-exp column
    om = {n: scalars[n].reshape(1, 2, 1, 1) for n in ("omega_align", "omega_sep", "omega_coh")}
    S = maps["S_base"] + om["omega_align"] * maps["b_align"] + om["omega_sep"] * maps["b_sep"] \
        + om["omega_coh"] * maps["b_coh"]
    torch.testing.assert_close(stats[..., Stat.LSE], torch.logsumexp(S / T, -1), rtol=1e-12, atol=1e-12)
    assert torch.equal(stats[..., Stat.COUNT], torch.full_like(stats[..., Stat.COUNT], 9.0))
    wc = torch.exp(-((z.unsqueeze(-2) - z.unsqueeze(-3)) ** 2).sum(-1) / (1.0 + 1e-6))
    torch.testing.assert_close(c, wc @ z / (wc.sum(-1, keepdim=True) + 1e-6), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(stats[..., Stat.WC_SUM], wc.sum(-1), rtol=1e-12, atol=1e-12)
    if variant == "seed":
        torch.testing.assert_close(u, torch.nn.functional.normalize(k, dim=-1), rtol=1e-12, atol=1e-12)
        assert nbr.shape == (2, 2, 9, 0)
    else:
        assert nbr.shape == (2, 2, 9, 3)
        hn = torch.nn.functional.normalize(h, dim=-1)
        a = hn @ hn.transpose(-2, -1) - 3 * torch.eye(9, dtype=h.dtype)  # exclude self
        assert torch.equal(nbr, torch.topk(a, 3, dim=-1).indices)
        kn = torch.nn.functional.normalize(k, dim=-1)
        want_u = torch.nn.functional.normalize(
            torch.gather(kn.unsqueeze(2).expand(2, 2, 9, 9, 8), 3,
                         nbr.unsqueeze(-1).expand(2, 2, 9, 3, 8)).sum(3), dim=-1)
        torch.testing.assert_close(u, want_u, rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_are_zero():
    tensors, scalars, opts = make_problem(N=6)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1] = True
    for variant in ("seed", "paper"):
        y = ascender_attention(*tensors, **scalars, **opts, key_padding_mask=kpm, variant=variant)
        assert torch.equal(y[1], torch.zeros_like(y[1]))
        assert torch.isfinite(y).all()


def test_deterministic_across_calls():
    """Many rows per thread, dynamic schedule: the same bits every call."""
    tensors, scalars, opts = make_problem(B=1, H=3, N=300, d=16, dtype=torch.float32)
    a = ascender_attention(*tensors, **scalars, **opts, variant="paper", is_causal=True)
    b = ascender_attention(*tensors, **scalars, **opts, variant="paper", is_causal=True)
    assert torch.equal(a, b)
