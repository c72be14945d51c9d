"""The block-wise backend and the backend selection (the shared grid runs the block-wise path on
every fused-vs-twin and gradcheck case through the `target` fixture; these are what is specific
to it): no N x N tensor, every floating dtype, torch.compile, double backward, the same input
checks as the fused op, and how a backend is chosen."""

from __future__ import annotations

import warnings

import pytest
import torch

from ascender_torch import ascender_attention, backends
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.backends import Backend, attention_backend
from ascender_torch.reference import ascender_attention_reference

from cases import MASK_MODES, VARIANTS, LargestTensor, full_scalars, make_masks, make_problem, rel_err, resolvable_rows


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_no_tensor_grows_with_the_square_of_N(variant, causal):
    """Forward and backward with 4-row blocks: no tensor is larger than [B, H, 4, N] pairs (or an
    [N, d] input), while the dense twin's largest is [B, H, N, N, dz]."""
    B, H, N, rows = 1, 2, 64, 4
    (q, k, v, z, h), scalars, opts = make_problem(B=B, H=H, N=N, d=8, dv=6, dz=4, da=4)
    inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h)]
    mode = LargestTensor()
    with attention_backend("blockwise", block_rows=rows), mode:
        y = ascender_attention(*inputs, **scalars, **opts, variant=variant, is_causal=causal)
        y.square().sum().backward()
    assert mode.largest <= max(B * H * rows * N, B * H * N * 8)  # a [B, H, rows, N] tile or an input's size
    assert mode.largest < N * N
    dense = LargestTensor()
    with dense:
        ascender_attention_reference(q, k, v, z, h, **scalars, **opts, variant=variant, is_causal=causal)
    assert dense.largest >= B * H * N * N * 4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("window", [None, (8, 0)])
def test_what_is_alive_at_once_is_linear_in_N(variant, window):
    """Forward and backward with 4-row blocks (N / 4 = 64 of them): at no moment are more elements
    alive than the blocks' own bound (LIVE_PAIR_TENSORS [B, H, rows, N] tensors) plus a few copies of
    the inputs; a copy of the keys kept per block (as an input of its checkpointed recomputation)
    would hold N / rows times the inputs, and per-block pair tensors left alive O(N^2)."""
    from ascender_torch.backends.blockwise import LIVE_PAIR_TENSORS

    B, H, N, rows = 1, 2, 256, 4
    (q, k, v, z, h), scalars, opts = make_problem(B=B, H=H, N=N, d=8, dv=6, dz=4, da=4, seed=2)
    inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h)]
    mode = LargestTensor()
    with attention_backend("blockwise", block_rows=rows), mode:
        y = ascender_attention(*inputs, **scalars, **opts, variant=variant, window_size=window,
                               global_tokens=0 if window is None else 2, is_causal=window is not None)
        y.square().sum().backward()
    input_elements = sum(t.numel() for t in inputs)
    assert mode.peak <= LIVE_PAIR_TENSORS * B * H * rows * N + 8 * input_elements
    assert mode.peak < 2 * B * H * N * N


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
def test_gradients_equal_the_fused_ops(variant, mode):
    """float64: output and every gradient of the block-wise path (5-row blocks) equal the fused CPU
    op's to 1e-10 (norm-wise relative), the aux terms included."""
    tensors, scalars, opts = make_problem(N=23, seed=6)
    scalars = full_scalars(scalars, 2, torch.float64)
    masks = make_masks(mode, 2, 2, 23, seed=6)
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).unsqueeze(-1)
    up = torch.randn(2, 2, 23, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * keep

    def run(backend):
        inputs = [t.clone().requires_grad_() for t in tensors]
        sc = {n: s.clone().requires_grad_() for n, s in scalars.items()}
        with attention_backend(backend, block_rows=5):
            y, aux = ascender_attention(*inputs, **sc, **opts, **masks, variant=variant, return_aux=True)
        loss = (y * up).sum() + sum((w * aux[n] * keep[..., 0]).sum() for w, n in zip((0.3, 0.5, 0.7),
                                                                                    ("coh", "sep", "align"))
                                    if n in aux)
        return [y] + [aux[n] for n in sorted(aux)] + list(torch.autograd.grad(loss, inputs + [sc[n] for n in
                                                                                              SCALAR_NAMES]))

    got, want = run("blockwise"), run("fused")
    for a, b in zip(got[:-9], want[:-9]):  # y, the aux terms, dq .. dh
        assert rel_err(a, b) <= 1e-10
    # the nine scalar gradients as one vector: a lambda's is O(1e-6) of the others by the scale invariance
    # of the row normalization, and autograd forms it by cancellation (the kernel without)
    assert rel_err(torch.stack(got[-9:]), torch.stack(want[-9:])) <= 1e-10


WRITTEN_BACKWARD_CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "stats-all-keys": dict(is_causal=True, mask_stats=False),
    "softcap": dict(softcap=1.5),
    "tau-coh": dict(tau_coh=0.6),
    "lambda-zero": dict(lambda_align=0.0, lambda_sep=0.0, lambda_coh=0.0),
    "scores": dict(neighbours="scores"),
    "sinks": dict(sinks=torch.tensor([0.6, -0.9], dtype=torch.float64), is_causal=True),  # SPEC section 12
    # per-row sinks (docs/backward.md), split by the blocks of 6 rows: [B, H, Nq] and [1, H, Nq]
    "row-sinks": dict(sinks=torch.linspace(-1.5, 1.5, 2 * 2 * 19, dtype=torch.float64).reshape(2, 2, 19),
                      is_causal=True),
    "query-sinks": dict(sinks=torch.linspace(1.0, -2.0, 2 * 19, dtype=torch.float64).reshape(1, 2, 19)),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", list(WRITTEN_BACKWARD_CASES))
def test_written_backward_equals_the_fused_backward(variant, case):
    """The block-wise backward written out (backends/block_grad.py) against the fused CPU backward,
    float64: each input's and each scalar's gradient to 1e-10 (norm-wise relative), the lambdas'
    one by one, since both form the per-row factors in the exact form of docs/backward.md (where
    the factor is 0, lambda = 0 or a causal paper row with eta = 0, the literal sum), with an
    upstream gradient on the aux terms and the headings (and the sinks' gradient); and the blocks are that
    Function."""
    if case == "scores" and variant == "seed":
        pytest.skip("neighbours='scores' chooses the paper variant's neighbours")
    tensors, scalars, opts = make_problem(N=19, seed=8)
    scalars = full_scalars(scalars, 2, torch.float64)
    extra = dict(WRITTEN_BACKWARD_CASES[case])
    scalars.update({n: torch.full((2,), extra.pop(n), dtype=torch.float64) for n in list(extra) if n in scalars})
    up = torch.randn(2, 2, 19, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def run(backend):
        inputs = [t.clone().requires_grad_() for t in tensors]
        sc = {n: s.clone().requires_grad_() for n, s in scalars.items()}
        sinks = [extra["sinks"].clone().requires_grad_()] if "sinks" in extra else []
        with attention_backend(backend, block_rows=6):
            y, aux = ascender_attention(*inputs, **sc, **opts, **dict(extra, sinks=sinks[0] if sinks else None),
                                        variant=variant, return_aux=True)
        loss = (y * up).sum() + sum(w * aux[n].sum() for w, n in zip((0.3, 0.5, 0.7), ("coh", "sep", "align"))
                                    if n in aux)
        return y, torch.autograd.grad(loss, inputs + [sc[n] for n in SCALAR_NAMES] + sinks)

    (y, got), (_, want) = run("blockwise"), run("fused")
    for name, a, b in zip(["q", "k", "v", "z", "h", *SCALAR_NAMES, "sinks"], got, want):
        assert rel_err(a, b) <= 1e-10, name
    seen, todo = set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(f for f, _ in node.next_functions)
    assert any(type(node).__name__ == "BlockAttentionBackward" for node in seen)


@pytest.mark.parametrize("backend", ["fused", "blockwise", "dense"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["none", "causal", "key_padding"])
def test_half_precision_against_float64(backend, dtype, variant, mode):
    """float16 / bfloat16 inputs (computed in float32) against the float64 twin on the same rounded
    inputs, forward and gradients, on the rows whose bias rows float32 can resolve. Bounds: the
    output's own rounding (2^-8 bf16, 2^-11 f16) and float32 arithmetic on O(1) scores."""
    tol = {torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    tensors, scalars, opts = make_problem(N=40, d=16, dv=8, dtype=dtype, seed=5)
    scalars = full_scalars(scalars, 2, dtype)
    masks = make_masks(mode, 2, 2, 40)
    rows = resolvable_rows(tensors, scalars, opts, masks, variant, rel=1e-2, floor=1e-7).unsqueeze(-1)
    up = torch.randn(2, 2, 40, 8, dtype=torch.float64) * rows

    def grads(fn, ts, sc):
        inputs = [t.detach().clone().requires_grad_() for t in ts]
        s = {n: x.detach().clone().requires_grad_() for n, x in sc.items()}
        y = fn(*inputs, **s, **opts, **masks, variant=variant)
        (y.double() * up).sum().backward()
        return y, [x.grad for x in inputs] + [s[n].grad for n in SCALAR_NAMES]

    with attention_backend(backend, block_rows=7):
        y, g = grads(ascender_attention, tensors, scalars)
    as64 = lambda t: t.double()  # noqa: E731
    y_ref, g_ref = grads(ascender_attention_reference, map(as64, tensors), {n: as64(s) for n, s in scalars.items()})
    assert y.dtype == dtype and all(t.dtype == dtype for t in g)
    assert rel_err(y.double() * rows, y_ref * rows) <= tol
    for name, a, b in zip(("q", "k", "v", "z", "h"), g, g_ref):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b) <= 10 * tol, name
    # the nine scalar gradients as one vector (a lambda's is ~0 by the scale invariance of the row
    # normalization: cancellation noise at this precision, judged against the others' scale)
    assert rel_err(torch.stack(g[5:]), torch.stack(g_ref[5:])) <= 10 * tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_half_types_on_the_cpu_run_the_float32_kernels(dtype):
    """A half-type CPU call is the float32 kernel on the widened inputs, its results rounded: bitwise,
    forward and gradients, with no backend warning; a wrong dtype is still named as given."""
    tensors, scalars, opts = make_problem(N=40, dtype=dtype, seed=3)
    scalars = full_scalars(scalars, 2, dtype)

    def run(ts, sc):
        inputs = [t.detach().clone().requires_grad_() for t in ts]
        s = {n: x.detach().clone().requires_grad_() for n, x in sc.items()}
        y, _, aux = ascender_attention(*inputs, **s, **opts, variant="paper", return_maps=True, return_aux=True)
        (y.float().sum() + aux["coh"].float().sum()).backward()
        return y, aux["coh"], [x.grad for x in inputs] + [s[n].grad for n in SCALAR_NAMES]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with attention_backend("fused"):
            y, coh, g = run(tensors, scalars)
    with attention_backend("fused"):
        y32, coh32, g32 = run([t.float() for t in tensors], {n: x.float() for n, x in scalars.items()})
    assert y.dtype == dtype and torch.equal(y, y32.to(dtype)) and torch.equal(coh, coh32.to(dtype))
    for a, b in zip(g, g32):
        assert a.dtype == dtype and torch.equal(a, b.to(dtype))
    with pytest.raises(RuntimeError, match=r"k must have the dtype of q"):
        ascender_attention(tensors[0], tensors[1].float(), *tensors[2:], **opts)


def test_backend_choice():
    tensors, scalars, opts = make_problem(N=8)
    assert backends.choose(tensors[0]) is Backend.FUSED
    with attention_backend(["blockwise", "fused"]):
        assert backends.choose(tensors[0]) is Backend.BLOCKWISE
        with attention_backend(Backend.DENSE):
            assert backends.choose(tensors[0]) is Backend.DENSE
        assert backends.choose(tensors[0]) is Backend.BLOCKWISE
    assert backends.choose(tensors[0]) is Backend.FUSED
    with attention_backend("fused"), pytest.raises(RuntimeError, match=r"none of the allowed backends \(fused\) "
                                                                         r"runs this call: no fused kernel for meta "
                                                                         r"tensors"):
        ascender_attention(*(t.to("meta") for t in tensors), **opts)
    with pytest.raises(ValueError, match="'flash' is not a valid Backend"):
        with attention_backend("flash"):
            pass
    with pytest.raises(ValueError, match="block_rows must be a positive int, got 0"):
        with attention_backend("blockwise", block_rows=0):
            pass


@pytest.mark.parametrize("backend", ["blockwise", "dense"])
@pytest.mark.parametrize("kw,pattern", [
    (dict(tau_sep=0.0), r"ascender: tau_sep must be a finite number > 0, got 0"),
    (dict(variant="flash"), r"ascender: variant must be 'seed' \(or its alias 'reference'\) or 'paper', got 'flash'"),
    (dict(attn_mask=torch.ones(7, 6, dtype=torch.bool)), r"ascender: attn_mask must be broadcastable to "
                                                          r"\[B, H, Nq, N\] = \[2, 2, 7, 7\], got shape \[7, 6\]"),
    (dict(key_padding_mask=torch.zeros(2, 7)), r"ascender: key_padding_mask must be a bool tensor"),
    (dict(kappa=torch.ones(3, dtype=torch.float64)), r"ascender: kappa must be a 0-dim tensor or have shape \[H\]"),
])
def test_bad_inputs_get_the_fused_messages(backend, kw, pattern):
    tensors, _, opts = make_problem()
    opts.update(kw)
    with pytest.raises(RuntimeError, match=pattern):
        ascender_attention(*tensors, **opts)
    with attention_backend(backend), pytest.raises(RuntimeError, match=pattern):
        ascender_attention(*tensors, **opts)
    bad = list(tensors)
    bad[2] = bad[2][:, :, :6]
    with attention_backend(backend), pytest.raises(RuntimeError, match=r"ascender: v must have shape \[B, H, N, dv\]"):
        ascender_attention(*bad)


def test_cuda_blocks_are_sized_from_free_device_memory(monkeypatch):
    """On CUDA the automatic budget is a share of the device's free memory, asked once per device (no GPU
    needed: the device query is replaced); an explicit block_memory wins; the CPU keeps 256 MiB."""
    asked = []

    def mem_get_info(index):
        asked.append(index)
        return 40 * 2 ** 30, 80 * 2 ** 30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(backends._State, "cuda_budget", {})
    monkeypatch.setattr(backends._State, "block_memory", None)
    cuda = torch.device("cuda", 1)
    share = int(40 * 2 ** 30 * backends.CUDA_FREE_MEMORY_SHARE)
    assert backends.block_size(cuda) == dict(memory=share, rows=None, compiled=backends.CUDA_BLOCKWISE_COMPILED)
    assert backends.block_size(cuda)["memory"] == share and asked == [1]  # asked once
    assert backends.block_size(torch.device("cpu")) == dict(memory=backends.DEFAULT_BLOCK_MEMORY, rows=None,
                                                            compiled=False)
    with attention_backend("blockwise", block_memory=2 ** 20, block_compile=True):
        assert backends.block_size(cuda) == dict(memory=2 ** 20, rows=None, compiled=True)
    with pytest.raises(ValueError, match="block_compile must be a bool"):
        with attention_backend("blockwise", block_compile="yes"):
            pass


def test_cuda_calls_whose_rows_outgrow_shared_memory_go_blockwise(monkeypatch):
    """On CUDA the automatic choice asks the extension whether the kernels the call would get find their shared
    memory (a CUDA build's _C.cuda_fits, replaced here: no GPU needed) with the call's dtype, variant, k, sizes
    and whether a backward follows, once per shape; a call that does not fit goes block-wise, with a warning that
    names its sizes, and forcing the fused backend on it is an error that says why."""
    asked = []

    def cuda_fits(*sizes):
        asked.append(sizes)
        return sizes[4] < 128  # d: wide rows do not fit

    monkeypatch.setattr(backends._ops, "CUDA_BUILT", True)
    monkeypatch.setattr(backends._ops._C, "cuda_fits", cuda_fits, raising=False)
    monkeypatch.setattr(backends._State, "cuda_fits", {})
    monkeypatch.setattr(backends._State, "warned", set())

    class OnCuda:  # q as the choice sees it on cuda:1 (it reads the device, dtype and shape only)
        def __init__(self, t):
            self.t, self.device, self.dtype, self.shape = t, torch.device("cuda", 1), t.dtype, t.shape

        def dim(self):
            return self.t.dim()

        def is_floating_point(self):
            return True

    for d, fits in ((8, True), (128, False)):
        (q, k, v, z, h), _, opts = make_problem(N=7, d=d)
        for variant in ("paper", "seed"):
            call = dict(k=k, v=v, z=z, h=h, variant=variant, k_neighbors=opts["k_neighbors"])
            for grad in (False, True):
                tensors = [t.detach().requires_grad_(grad) for t in (q, k, v, z, h)]
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    for _ in range(2):  # the second call reads the cache and does not warn again
                        assert backends.choose(OnCuda(q), tensors, call) is (Backend.FUSED if fits else
                                                                              Backend.BLOCKWISE)
                assert asked[-1] == (1, "float64", variant == "paper", 3, d, 6, 4, 4, grad)
                assert len(asked) == len(set(asked))
                if fits:
                    assert caught == []
                else:
                    why = (f"the fused CUDA kernels need more shared memory per block than cuda:1 has for this "
                           f"float64 call (d = 128, dv = 6, dz = 4, da = 4"
                           f"{', k_neighbors = 3' if variant == 'paper' else ''}{', with its backward' if grad else ''})")
                    assert [str(w.message) for w in caught] == [f"ascender_torch: {why}; using the blockwise backend "
                                                                 f"(O(block x N) memory, ascender_torch.backends)"]
                    with attention_backend("fused"), pytest.raises(RuntimeError) as err:
                        backends.choose(OnCuda(q), tensors, call)
                    assert str(err.value).endswith(f"runs this call: {why}")
    assert len(asked) == 8
    # without the call's arguments (or on the CPU) nothing is asked
    assert backends.choose(OnCuda(q), [q]) is Backend.FUSED and backends.choose(q, [q], call) is Backend.FUSED
    assert len(asked) == 8


def test_block_compile_routes_the_call_through_the_compiled_path(monkeypatch):
    """block_compile=True calls the block-wise path through its torch.compile wrapper (replaced here by a
    recorder: that torch.compile traces the path is test_compile_fullgraph_matches_eager's), and only then;
    the result is the eager one."""
    tensors, scalars, opts = make_problem(N=6, dtype=torch.float64)
    calls = []

    def compiled(*args):
        calls.append(args[3:])  # memory, rows
        return backends.blockwise.attention(*args)

    monkeypatch.setattr(backends.blockwise, "_compiled_attention", compiled)
    outputs = {}
    for flag in (False, True):
        with attention_backend("blockwise", block_rows=4, block_compile=flag):
            outputs[flag] = ascender_attention(*tensors, **scalars, **opts)
    assert calls == [(backends.DEFAULT_BLOCK_MEMORY, 4)]
    torch.testing.assert_close(outputs[True], outputs[False], rtol=0, atol=0)


# inductor's CPU kernels scalar (cpp.simdlen = 1): the test compares the path's graph under compile with eager, not
# inductor's vectorizer, whose code generation for this graph was most of the test's time (88 -> 56 s, 2026-11-29)
@torch._inductor.config.patch({"cpp.simdlen": 1})
def test_compile_fullgraph_matches_eager(variant="paper"):
    """(The paper variant: its neighbour sort is the one op the seed variant lacks.)"""
    tensors, scalars, opts = make_problem(N=8, dtype=torch.float64)
    scalars = full_scalars(scalars, 2, torch.float64)

    def run(*inputs):
        with attention_backend("blockwise", block_rows=4):
            return ascender_attention(*inputs[:5], **dict(zip(SCALAR_NAMES, inputs[5:])), **opts, variant=variant,
                                      is_causal=True)

    def grads(fn):
        inputs = [t.clone().requires_grad_() for t in tensors] + [scalars[n].clone().requires_grad_()
                                                                   for n in SCALAR_NAMES]
        y = fn(*inputs)
        return [y] + list(torch.autograd.grad(y.square().sum(), inputs))

    eager, compiled = grads(run), grads(torch.compile(run, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("variant", VARIANTS)
def test_double_backward_works(variant):
    """The block-wise path is PyTorch ops under checkpointing: second derivatives exist."""
    tensors, scalars, opts = make_problem(B=1, N=5, d=3, dv=2, dz=2, da=2, seed=2)
    inputs = [t.clone().requires_grad_() for t in tensors[:3]]

    def f(q, k, v):
        with attention_backend("blockwise", block_rows=2):
            return ascender_attention(q, k, v, *tensors[3:], **scalars, **opts, variant=variant)

    assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_memory_budget_sets_the_block():
    assert backends.blockwise.rows_per_block(1, 1, 1000, 4, 2 ** 20) >= 5
    assert backends.blockwise.rows_per_block(8, 8, 2 ** 16, 4, 2 ** 20) == 1
    tensors, scalars, opts = make_problem(N=30)
    with attention_backend("blockwise", block_memory=1):
        small = ascender_attention(*tensors, **scalars, **opts)
    with attention_backend("blockwise", block_memory=2 ** 30):
        large = ascender_attention(*tensors, **scalars, **opts)
    torch.testing.assert_close(small, large, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("backend", ["blockwise", "fused"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_softcap(variant, backend):
    """SPEC section 9: with omega = 0, softcap c gives softmax(c tanh(s / c) / T) V, the twin and each
    backend alike; with the biases on, outputs and every gradient (scalars and attn_bias included)
    against the twin's autograd, and gradcheck."""
    (q, k, v, z, h), scalars, opts = make_problem(N=9, seed=3)
    zero = dict(omega_align=0.0, omega_sep=0.0, omega_coh=0.0, score_temp=0.8)
    use = lambda: attention_backend(backend, block_rows=4 if backend == "blockwise" else None)  # noqa: E731
    for c in (0.5, 3.0):
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        want = torch.softmax(c * torch.tanh(s / c) / (0.8 + 1e-6), -1) @ v
        torch.testing.assert_close(ascender_attention_reference(q, k, v, z, h, **zero, **opts, softcap=c), want)
        with use():
            torch.testing.assert_close(ascender_attention(q, k, v, z, h, **zero, **opts, softcap=c), want)
    scalars = full_scalars(scalars, 2, torch.float64)
    bias = torch.randn(2, 1, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    masks = make_masks("causal", 2, 2, 9)

    def grads(fn):
        inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h, bias)]
        sc = {n: x.clone().requires_grad_() for n, x in scalars.items()}
        y = fn(*inputs[:5], **sc, **opts, **masks, attn_bias=inputs[5], variant=variant, softcap=1.5)
        return (y, *torch.autograd.grad((y * y).sum(), inputs + [sc[n] for n in SCALAR_NAMES]))

    want = grads(ascender_attention_reference)
    with use():
        got = grads(ascender_attention)
    for a, b in zip(got[:7], want[:7]):  # y, dq .. dh, dattn_bias
        assert rel_err(a, b) <= 1e-10
    assert rel_err(torch.stack(got[7:]), torch.stack(want[7:])) <= 1e-10
    inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h)]

    def f(*x):
        with use():
            return ascender_attention(*x, **scalars, **opts, variant=variant, softcap=1.5, is_causal=True)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)
