"""What only the CUDA kernels (csrc/cuda, docs/cuda.md) need beyond the shared grid (which runs
every fused-vs-reference and gradcheck case on "cuda" too, see cases.DEVICES): agreement with
the CPU kernels output by output, float16 / bfloat16 accuracy, finiteness on empty rows, tile
boundaries, and a compute-sanitizer memcheck run. Skipped without a CUDA device or when the
package was built without ASCENDER_CUDA=1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from ascender_torch import _ops, _spec, ascender_attention
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.reference import ascender_attention_reference, magnitude_attention_reference

from cases import MASK_MODES, VARIANTS, full_scalars, fused_forward, make_masks, make_problem, rel_err, resolvable_rows

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and _ops.CUDA_BUILT),
    reason="needs a CUDA device and the CUDA kernels (build with ASCENDER_CUDA=1)")

# norm-wise relative error bounds (rel_err) against float64 on the same rounded inputs
TOL_FWD = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
TOL_GRAD = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 2e-1}


def _problem(variant, mode, N, d=8, B=2, H=2, dtype=torch.float64, device="cuda", seed=None, Nq=None, dv=5, dz=4,
             da=4):
    """make_problem / make_masks with every scalar per head, moved to device and cast to dtype."""
    tensors, scalars, opts = make_problem(B=B, H=H, N=N, d=d, dv=dv, dz=dz, da=da,
                                          seed=N * 7 + d if seed is None else seed)
    scalars = full_scalars(scalars, H, torch.float64)
    masks = make_masks(mode, B, H, N, seed=N)
    if Nq is not None:
        tensors = (tensors[0][:, :, -Nq:],) + tensors[1:]
        if "attn_mask" in masks:
            masks["attn_mask"] = masks["attn_mask"][..., -Nq:, :]
    move = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)  # noqa: E731
    tensors = tuple(move(t) for t in tensors)
    scalars = {n: move(s) for n, s in scalars.items()}
    masks = {n: move(m) if isinstance(m, torch.Tensor) else m for n, m in masks.items()}
    return tensors, scalars, dict(opts, variant=variant), masks


def _as(tree, **kw):
    if isinstance(tree, dict):
        return {n: _as(v, **kw) for n, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_as(v, **kw) for v in tree)
    if isinstance(tree, torch.Tensor):
        return tree.to(**kw) if tree.is_floating_point() else tree.to(device=kw.get("device", tree.device))
    return tree


def _conditioned(tol, cpu, twin):
    """The bound on the CUDA kernels' distance from the CPU kernels' float64 result: tol, or 10x the CPU
    kernel's own distance from the float64 twin where the problem is ill-conditioned at that level (the
    paper heading's gradient with every mask combined, the Magnitude solve with padding: 1e-10 to 4e-7
    in float64 between the CPU kernels and the twin, which differ only in summation order);
    tests/cuda_emu's grid bounds such cases the same way."""
    return max(tol, 10 * rel_err(cpu, twin))


def _near(got, want, tol):
    """Norm-wise relative error within tol, or every entry within one step of got.dtype's subnormals:
    a gradient so small that the dtype cannot hold it to tol (kappa's is ~1e-7 in some float16
    cases, where float16 steps by 6e-8)."""
    step = torch.finfo(got.dtype).smallest_normal * torch.finfo(got.dtype).eps
    return rel_err(got, want) <= tol or (got.double() - want.double()).abs().max().item() <= step


def _grads(fn, tensors, scalars, opts, masks, upstream):
    """Gradients of sum(fn(...) * upstream) w.r.t. q, k, v, z, h and the nine scalars."""
    inputs = [t.detach().clone().requires_grad_() for t in tensors]
    sc = {n: s.detach().clone().requires_grad_() for n, s in scalars.items()}
    y = fn(*inputs, **sc, **opts, **masks)
    (y * upstream.to(y.dtype)).sum().backward()
    return y.detach(), [x.grad for x in inputs] + [sc[n].grad for n in SCALAR_NAMES]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
@pytest.mark.parametrize("N", [1, 40, 97])
def test_saved_outputs_match_cpu_kernel(variant, mode, N):
    """out, every stats column, u, c, aux and the neighbour indices of the CUDA and CPU kernels (float64)."""
    tensors, scalars, opts, masks = _problem(variant, mode, N)
    gpu = fused_forward(tensors, scalars, opts, masks, variant)
    cpu = fused_forward(_as(tensors, device="cpu"), _as(scalars, device="cpu"), opts, _as(masks, device="cpu"), variant)
    for name in _spec.ASCENDER_FWD.returns:
        g, c = gpu[name].cpu(), cpu[name]
        if name == "nbr":
            assert torch.equal(g, c)
            continue
        assert torch.equal(torch.isinf(g), torch.isinf(c)), name
        fin = torch.isfinite(c)
        assert rel_err(g[fin], c[fin]) <= 1e-10, name


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("N", [40, 97])
def test_rows32_is_what_the_half_outputs_round(variant, dtype, N):
    """rows32 (float32 stats | c | u | out | aux per row, which the tiled backward reads instead of a statistics
    pass and of the rounded y): rounded to the dtype, each column is the stored stats, c, u, out or aux bit for
    bit."""
    tensors, scalars, opts, masks = _problem(variant, "causal", N, dtype=dtype)
    out = fused_forward(tensors, scalars, opts, masks, variant)
    r32 = out["rows32"]
    parts = [out[name] for name in ("stats", "c", "u", "out", "aux")]
    assert r32.dtype == torch.float32 and r32.shape == (*out["stats"].shape[:3], sum(x.shape[-1] for x in parts))
    at = 0
    for want in parts:
        got = r32[..., at:at + want.shape[-1]]
        at += want.shape[-1]
        torch.testing.assert_close(got.to(dtype), want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_attn_bias_alibi_and_decode_gradients_match_cpu(variant):
    """Broadcast attn_bias (its gradient too), ALiBi and decode rows (Nq < N) with causal masking:
    CUDA and CPU kernels in float64."""
    tensors, scalars, opts, masks = _problem(variant, "none", 41, Nq=13)
    bias = torch.randn(1, 2, 13, 41, dtype=torch.float64, device="cuda")
    extra = dict(attn_bias=bias, alibi_slopes=torch.tensor([0.1, 0.03], dtype=torch.float64), is_causal=True)

    def run(device):
        t, s, m = _as(tensors, device=device), _as(scalars, device=device), _as(masks, device=device)
        e = _as(extra, device=device)
        e["attn_bias"] = e["attn_bias"].detach().clone().requires_grad_()
        up = torch.linspace(-1, 1, 13 * 5, dtype=torch.float64, device=device).reshape(1, 1, 13, 5)
        y, g = _grads(lambda *a, **k: ascender_attention(*a, **k, **e), t, s, opts, m, up)
        return [y] + g + [e["attn_bias"].grad]

    for a, b in zip(run("cuda"), run("cpu")):
        assert rel_err(a.cpu(), b) <= 1e-10


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_fused_call_never_waits_for_the_device(variant, dtype):
    """Forward and backward of the fused op with every scalar a Python number (the defaults), ALiBi slopes
    as a list, causal masking and dropout: nothing synchronizes the host with the device (torch's sync debug
    mode makes a synchronizing call an error). Each learnable scalar was a host-to-device copy that
    synchronized the stream, twelve per call (found on the H200, 2026-11-29)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, 2, 70, 16, device="cuda", generator=g).to(dtype).requires_grad_() for _ in range(3))
    z, h = (torch.randn(2, 2, 70, 8, device="cuda", generator=g).to(dtype).requires_grad_() for _ in range(2))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = ascender_attention(q, k, v, z, h, variant=variant, k_neighbors=4, is_causal=True,
                               alibi_slopes=[0.1, 0.05], dropout_p=0.1)
        y.float().square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v, z, h))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["none", "causal", "all"])
def test_float32_cuda_and_cpu_kernels_agree(variant, mode):
    tensors, scalars, opts, masks = _problem(variant, mode, 150, d=16, dtype=torch.float32)
    rows = resolvable_rows(tensors, scalars, opts, masks, opts["variant"], rel=1e-2, floor=1e-7).unsqueeze(-1).float()
    up = torch.randn(tensors[2].shape[:3] + (5,), device="cuda") * rows
    y, g = _grads(ascender_attention, tensors, scalars, opts, masks, up)
    cpu = lambda x: _as(x, device="cpu")  # noqa: E731
    y_c, g_c = _grads(ascender_attention, cpu(tensors), cpu(scalars), opts, cpu(masks), up.cpu())
    assert rel_err((y * rows).cpu(), y_c * rows.cpu()) <= 1e-4
    for name, a, b in zip(("q", "k", "v", "z", "h") + SCALAR_NAMES, g, g_c):
        assert rel_err(a.cpu(), b) <= TOL_GRAD[torch.float32], name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["none", "causal", "key_padding"])
def test_half_precision_against_float64(dtype, variant, mode):
    """float16 / bfloat16 inputs, computed in float32 inside the kernel, against float64 on the
    same rounded inputs: forward within TOL_FWD, gradients within TOL_GRAD (norm-wise)."""
    tensors, scalars, opts, masks = _problem(variant, mode, 130, d=32, dtype=dtype)
    rows = resolvable_rows(tensors, scalars, opts, masks, opts["variant"], rel=1e-2, floor=1e-7).unsqueeze(-1)
    up = torch.randn(tensors[2].shape[:3] + (5,), dtype=torch.float64, device="cuda") * rows
    y, g = _grads(ascender_attention, tensors, scalars, opts, masks, up)
    as64 = lambda x: _as(x, dtype=torch.float64)  # noqa: E731
    y_ref, g_ref = _grads(ascender_attention_reference, as64(tensors), as64(scalars), opts, masks, up)
    assert y.dtype == dtype and all(t.dtype == dtype for t in g)
    assert rel_err(y * rows, y_ref * rows) <= TOL_FWD[dtype]
    for name, a, b in zip(("q", "k", "v", "z", "h") + SCALAR_NAMES, g, g_ref):
        assert torch.isfinite(a).all(), name
        assert _near(a, b, TOL_GRAD[dtype]), name


def _decode_errors(variant, dtype, Nq, device):
    """A causal call of Nq rows that nothing differentiates (the decode kernels on CUDA) at d = dv = 64,
    dz = da = 32 in dtype: its norm-wise error against float64 on the same rounded inputs, and its difference
    from the same call with h scaled by 2^70 (exact; the squares of its rows pass float's range), on the rows
    the dtype resolves."""
    tensors, scalars, opts, masks = _problem(variant, "causal", 700, d=64, B=1, H=2, dtype=dtype, device=device,
                                             Nq=Nq, dv=64, dz=32, da=32)
    rows = resolvable_rows(tensors, scalars, opts, masks, opts["variant"], rel=1e-2, floor=1e-7).unsqueeze(-1)
    rows = rows.to(device)
    as64 = lambda x: _as(x, dtype=torch.float64)  # noqa: E731
    with torch.no_grad():
        y = ascender_attention(*tensors, **scalars, **opts, **masks)
        y_big = ascender_attention(*tensors[:4], tensors[4] * 2.0 ** 70, **scalars, **opts, **masks)
        y_ref = ascender_attention_reference(*as64(tensors), **as64(scalars), **opts, **masks)
    return rel_err(y * rows, y_ref * rows), rel_err(y_big * rows, y * rows)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("Nq", [1, 3])
def test_decode_at_the_benchmark_widths(dtype, variant, Nq):
    """The decode kernels where the 16-bit types take their fast paths (csrc/cuda/decode_sweeps.cuh: 16-byte reads
    of the key rows and of the row operands, a key's sums in float, two output features per lane): within TOL_FWD
    of float64 on the same rounded inputs; with h scaled by 2^70 (float16: its rows overflow to inf, left out) the
    same output to the dtype's rounding (bfloat16: the key sums fall back to double; the affinity does not depend
    on h's scale)."""
    err, scaled = _decode_errors(variant, dtype, Nq, "cuda")
    assert err <= TOL_FWD[dtype]
    if dtype == torch.bfloat16:
        assert scaled <= TOL_FWD[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("variant", VARIANTS)
def test_empty_rows_and_single_token_are_finite(dtype, variant):
    """A batch element whose keys are all padding, a query row that sees nothing, and N = 1:
    finite outputs and gradients, zero output and zero dq on the empty rows."""
    for N, mode in ((1, "none"), (1, "causal"), (37, "key_padding"), (37, "attn_mask_stats")):
        tensors, scalars, opts, masks = _problem(variant, mode, N, dtype=dtype)
        up = torch.ones(tensors[2].shape[:3] + (5,), device="cuda", dtype=dtype)
        y, g = _grads(ascender_attention, tensors, scalars, opts, masks, up)
        assert torch.isfinite(y).all() and all(torch.isfinite(t).all() for t in g), (N, mode)
        if mode == "key_padding":  # make_masks pads every key of the last batch element
            assert (y[-1] == 0).all() and (g[0][-1] == 0).all()
        if mode == "attn_mask_stats":  # and lets query 0 see nothing
            assert (y[:, :, 0] == 0).all() and (g[0][:, :, 0] == 0).all()


def test_tile_boundaries_and_long_rows():
    """N around multiples of the tile (32 keys) and of the row block (4 rows), paper variant with
    k larger than a tile, float64 against the reference."""
    for N in (31, 32, 33, 127, 129):
        tensors, scalars, opts, masks = _problem("paper", "causal", N, d=16)
        opts["k_neighbors"] = 40
        y = ascender_attention(*tensors, **scalars, **opts, **masks)
        y_ref = ascender_attention_reference(*tensors, **scalars, **opts, **masks)
        assert rel_err(y, y_ref) <= 1e-10, N


def _many_heads_case(variant, dtype, Nq, device, batch=None):
    """Output and every gradient of a causal call with B H = 65537 (one more than a grid's y held before the fold of
    csrc/cuda/common.cuh, grid_fold) on `device` in dtype, or of its batch entries `batch` alone; Nq = 1 without
    gradients (the decode kernels)."""
    tensors, scalars, opts, masks = _problem(variant, "causal", 6, d=4, B=65537, H=1, dtype=torch.float64,
                                             device="cpu", seed=5, Nq=Nq, dv=3, dz=2, da=2)
    pick = (lambda x: x) if batch is None else (lambda x: x[batch])  # noqa: E731
    t = [pick(x).to(device, dtype).requires_grad_(Nq > 1) for x in tensors]
    s = {n: x.to(device, dtype) for n, x in scalars.items()}
    m = {n: pick(x) if isinstance(x, torch.Tensor) and x.shape[0] == 65537 else x for n, x in _as(masks, device=device).items()}
    if Nq == 1:
        with torch.no_grad():
            return [ascender_attention(*t, **s, **opts, **m)]
    y = ascender_attention(*t, **s, **opts, **m)
    return [y] + list(torch.autograd.grad(y.double().square().sum(), t))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("Nq", [6, 1])
def test_more_than_65535_heads_in_a_call(variant, Nq):
    """B H = 65537 (a batch of short sequences): the kernels' grids fold their y over y and z (65535 each) where a
    launch failed before. float64 (the row-per-warp kernels; decode's at Nq = 1) equal to the CPU kernels on every
    (b, h); bfloat16 (the tiled kernels) on the first, middle and last batch entries equal to a call on those
    entries alone, whose grids do not fold (the whole batch against float64 would meet near-ties of the paper
    variant's top-k among its 65537 heads)."""
    for got, want in zip(_many_heads_case(variant, torch.float64, Nq, "cuda"),
                         _many_heads_case(variant, torch.float64, Nq, "cpu")):
        assert rel_err(got.cpu(), want) <= 1e-10
    batch = torch.tensor([0, 1, 32768, 65535, 65536])
    folded = _many_heads_case(variant, torch.bfloat16, Nq, "cuda")
    alone = _many_heads_case(variant, torch.bfloat16, Nq, "cuda", batch=batch)
    for k, (a, b) in enumerate(zip(folded, alone)):
        assert rel_err(a[batch.cuda()].double(), b.double()) <= (TOL_FWD if k == 0 else TOL_GRAD)[torch.bfloat16], k


@pytest.mark.parametrize("dtype,d,dz", [(torch.float64, 128, 128), (torch.bfloat16, 256, 64)])
def test_rows_too_wide_for_shared_memory_run_blockwise(dtype, d, dz):
    """A call whose backward outgrows a block's shared memory on an A100, H100 or H200 (csrc/cuda/ascender_cuda.h,
    ascender_cuda_fits: float64 at d = dv = dz = da = 128 needs 359 KB, bfloat16 at d = dv = 256, dz = da = 64
    236 KB row-per-warp, and the paper variant's B2c 244 KB even in its 16-key blocks) goes to the block-wise
    backend with a warning naming its sizes, and its values and gradients are the CPU kernels'; forcing the fused
    kernels on it is an error that says why, not a failed launch."""
    from ascender_torch.backends import _State, attention_backend
    tensors, scalars, opts, masks = _problem("paper", "causal", 19, d=d, dtype=dtype, dv=d, dz=dz, da=dz)
    _State.warned.clear()
    ts = [t.detach().requires_grad_() for t in tensors]
    with pytest.warns(RuntimeWarning, match=rf"more shared memory per block than cuda:\d+ has .*d = {d}, .*backward"):
        y = ascender_attention(*ts, **scalars, **opts, **masks)
    g = torch.autograd.grad(y.double().square().sum(), ts)  # the CPU side's loss, in float64 as there
    cpu = [t.detach().cpu().double().requires_grad_() for t in tensors]
    y_cpu = ascender_attention(*cpu, **_as(scalars, device="cpu", dtype=torch.float64), **opts, **_as(masks, device="cpu"))
    g_cpu = torch.autograd.grad(y_cpu.square().sum(), cpu)
    tol_f, tol_g = TOL_FWD[dtype], TOL_GRAD[dtype]
    assert rel_err(y.double().cpu(), y_cpu) <= tol_f
    for a, b in zip(g, g_cpu):
        assert rel_err(a.double().cpu(), b) <= tol_g
    with attention_backend("fused"), pytest.raises(RuntimeError, match="none of the allowed backends"):
        ascender_attention(*ts, **scalars, **opts, **masks)


MEMCHECK_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from ascender_torch import ascender_attention
    from cases import make_masks, make_problem
    for variant in ("seed", "paper"):
        for mode, dtype in (("all", torch.float32), ("attn_mask_seed", torch.float64), ("key_padding", torch.bfloat16)):
            (q, k, v, z, h), sc, opts = make_problem(B=2, H=2, N=37, d=8, dv=5)
            masks = {{n: m.cuda() if isinstance(m, torch.Tensor) else m for n, m in make_masks(mode, 2, 2, 37).items()}}
            ts = [t.cuda().to(dtype).requires_grad_() for t in (q, k, v, z, h)]
            scs = {{n: s.cuda().to(dtype).requires_grad_() for n, s in sc.items()}}
            y, maps = ascender_attention(*ts, **scs, **opts, **masks, variant=variant, return_maps=True)
            y.sum().backward()
    torch.cuda.synchronize()
    print("memcheck-script-done")
""")


def _compute_sanitizer():
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    path = os.path.join(home, "bin", "compute-sanitizer")
    return path if os.path.exists(path) else None


@pytest.mark.skipif(_compute_sanitizer() is None, reason="compute-sanitizer not found")
def test_compute_sanitizer_memcheck():
    script = MEMCHECK_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([_compute_sanitizer(), "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-c",
                           script], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "memcheck-script-done" in proc.stdout
    assert "ERROR SUMMARY: 0 errors" in proc.stdout + proc.stderr


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
def test_aux_terms_and_their_gradients_match_cpu(variant, mode):
    """return_aux on the GPU (float64): the per-row aux terms and the gradients of a loss on all
    of them and on y equal the CPU kernels'."""
    tensors, scalars, opts, masks = _problem(variant, mode, 40)

    def run(fn, t, s, m):
        inputs = [x.detach().clone().requires_grad_() for x in t]
        sc = {n: v.detach().clone().requires_grad_() for n, v in s.items()}
        y, aux = fn(*inputs, **sc, **opts, **m, return_aux=True)
        loss = y.square().mean() + sum(w * aux[n].mean() for w, n in zip((0.3, 0.5, 0.7), ("coh", "sep", "align"))
                                       if n in aux)
        return aux, torch.autograd.grad(loss, inputs + [sc[n] for n in SCALAR_NAMES])

    gpu_aux, gpu_grads = run(ascender_attention, tensors, scalars, masks)
    on_cpu = _as(tensors, device="cpu"), _as(scalars, device="cpu"), _as(masks, device="cpu")
    cpu_aux, cpu_grads = run(ascender_attention, *on_cpu)
    _, twin_grads = run(ascender_attention_reference, *on_cpu)
    assert set(gpu_aux) == set(cpu_aux)
    for name in cpu_aux:
        assert rel_err(gpu_aux[name].cpu(), cpu_aux[name]) <= 1e-10, name
    for name, g, c, t in zip(("q", "k", "v", "z", "h") + SCALAR_NAMES, gpu_grads, cpu_grads, twin_grads):
        assert rel_err(g.cpu(), c) <= _conditioned(1e-9, c, t), name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("pad", [False, True])
def test_magnitude_attention_matches_the_cpu_kernels(dtype, pad):
    """magnitude_attention on CUDA (csrc/cuda/magnitude.cu) against the CPU kernels in float64 on the
    same rounded inputs: y, mu and every gradient."""
    from ascender_torch import magnitude_attention

    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 2, 37, 8, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))
    kpm = (torch.rand(2, 37, generator=g) < 0.3) if pad else None
    params = dict(t_raw=torch.tensor([0.2, -0.4]), beta=torch.tensor([1.5, 0.7]), gamma=torch.tensor([0.1, -0.3]))

    def run(fn, device, as_dtype):
        inputs = [t.to(device, as_dtype, copy=True).requires_grad_() for t in (q, k, v)]
        ps = {n: p.to(device, as_dtype, copy=True).requires_grad_() for n, p in params.items()}
        y, mu = fn(*inputs, **ps, key_padding_mask=None if kpm is None else kpm.to(device), n_iter=6, return_mu=True)
        (y.double().square().sum() + mu.double().sum()).backward()
        return [y, mu] + [t.grad for t in inputs] + [ps[n].grad for n in params]

    tol = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    twin = run(magnitude_attention_reference, "cpu", torch.float64)
    names = ("y", "mu", "q", "k", "v") + tuple(params)
    for name, got, want, t in zip(names, run(magnitude_attention, "cuda", dtype),
                                  run(magnitude_attention, "cpu", torch.float64), twin):
        assert got.dtype == dtype
        assert rel_err(got.cpu(), want) <= _conditioned(tol, want, t), name
