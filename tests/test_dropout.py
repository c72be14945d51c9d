"""Attention dropout (SPEC section 9b, docs/dropout.md): the Philox generator against its known
answers, every backend's mask against ascender_torch.dropout's bit for bit, the mask's statistics,
exact gradients at a fixed seed, reproducibility from torch's generators, and no dropout in eval."""

from __future__ import annotations

import math

import pytest
import torch

from ascender_torch import ASCenderAttention, ascender_attention, dropout
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.backends import attention_backend
from ascender_torch.reference import ascender_attention_reference

from cases import make_problem, on, op_arguments

# Random123's tests/kat_vectors, the "philox4x32 10" lines: counter (4 words), key (2), output (4)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,want", KNOWN_ANSWERS)
def test_philox_known_answers(counter, key, want):
    got = dropout.philox4x32_10(*(torch.tensor(c) for c in counter), *(torch.tensor(k) for k in key))
    assert tuple(int(w) for w in got) == want


def _seed(seed, offset, token_offset=None):
    return torch.tensor([seed, offset] + ([] if token_offset is None else [token_offset]), dtype=torch.int64)


def _identity_problem(B, H, Nq, N, device, dtype=torch.float64):
    """A problem whose values are the unit vectors (v = I, dv = N): y_i = sum_j A_ij m_ij v_j / (1 - p)
    has the mask itself in its entries."""
    (q, k, _, z, h), scalars, opts = make_problem(B=B, H=H, N=N, d=6, dz=3, da=3, dtype=dtype, seed=3)
    v = torch.eye(N, dtype=dtype).expand(B, H, N, N).contiguous()
    return on(device, ((q[:, :, N - Nq:], k, v, z, h), scalars, opts))


def _kernel_mask(y, A, p):
    """The mask a call applied, from its output y (v = I) and its weights A (return_maps)."""
    seen = A > 0
    return seen, torch.where(seen, y * (1 - p) / torch.where(seen, A, torch.ones_like(A)), torch.zeros_like(A))


@pytest.mark.parametrize("Nq,causal,token_offset", [(70, False, None), (70, True, None), (5, False, None),
                                                    (70, True, 5), (5, False, -3)])
def test_every_backend_draws_the_python_mask(target, Nq, causal, token_offset):
    """The mask read back from a call equals dropout.keep_mask bit for bit, over two 64-key tiles with
    a tail (70 keys), groups of four keys cut by the tile edges and Nq < N (the rows' tokens); with a
    token offset (a stream of three numbers) that puts the tiles across Philox's groups of four, and
    a negative one (mod 2^34: the tokens' 32-bit words wrap)."""
    B, H, N, p = 2, 3, 70, 0.4
    tensors, scalars, opts = _identity_problem(B, H, Nq, N, target.device)
    seed = _seed(-0x0123456789ABCDEF, 2 ** 63 - 5, token_offset).to(target.device)  # offset + b H + h wraps 2^64
    y, maps = ascender_attention(*tensors, **scalars, **opts, is_causal=causal, dropout_p=p, dropout_seed=seed,
                                 return_maps=True)
    seen, m = _kernel_mask(y, maps["A"], p)
    want = dropout.keep_mask(seed, p, B, H, torch.arange(N - Nq, N, device=target.device),
                             torch.arange(N, device=target.device), inspect_keys=target.device == "cpu")
    assert int(seen.sum()) > 0.9 * (B * H * Nq * (N + 1) / 2 if causal else B * H * Nq * N)
    torch.testing.assert_close(m[seen], want[seen].to(m.dtype), rtol=0, atol=1e-9)
    assert 0.5 < float(want.double().mean()) < 0.7


def test_the_dense_twin_draws_the_python_mask():
    B, H, N, p = 1, 2, 9, 0.5
    tensors, scalars, opts = _identity_problem(B, H, N, N, "cpu")
    seed = _seed(7, 11)
    y, maps = ascender_attention_reference(*tensors, **scalars, **opts, dropout_p=p, dropout_seed=seed,
                                           return_maps=True)
    seen, m = _kernel_mask(y, maps["A"], p)
    want = dropout.keep_mask(seed, p, B, H, torch.arange(N), torch.arange(N))
    assert bool(seen.all())
    torch.testing.assert_close(m, want.double(), rtol=0, atol=1e-12)


def test_the_mask_of_any_key_set_is_the_mask_of_the_range():
    """keep_mask's two ways (a range four keys a call; any keys each its own call) give the same bits."""
    seed = _seed(123456789, -42)
    tokens, keys = torch.arange(3, 40), torch.arange(0, 90)
    whole = dropout.keep_mask(seed, 0.3, 2, 2, tokens, keys, inspect_keys=True)
    assert torch.equal(whole, dropout.keep_mask(seed, 0.3, 2, 2, tokens, keys, inspect_keys=False))
    some = torch.tensor([0, 5, 6, 7, 8, 33, 89])
    assert torch.equal(whole[..., some], dropout.keep_mask(seed, 0.3, 2, 2, tokens, some, inspect_keys=True))
    assert torch.equal(whole[..., 6:30], dropout.keep_mask(seed, 0.3, 2, 2, tokens, keys[6:30], inspect_keys=True))


@pytest.mark.parametrize("inspect_keys", [True, False])
def test_a_token_offset_draws_the_longer_sequences_pairs(inspect_keys):
    """A stream (seed, offset, o) gives the call's pair (t, j) the mask of the pair (t + o, j + o) of the
    stream (seed, offset): a call over tokens [o, o + n) of a sequence draws the sequence's mask."""
    seed = _seed(987654321, 17)
    whole = dropout.keep_mask(seed, 0.4, 2, 3, torch.arange(0, 60), torch.arange(0, 60), inspect_keys=True)
    for o in (1, 6, 23):
        part = dropout.keep_mask(_seed(987654321, 17, o), 0.4, 2, 3, torch.arange(0, 60 - o), torch.arange(0, 60 - o),
                                 inspect_keys=inspect_keys)
        assert torch.equal(part, whole[..., o:, o:])
        assert torch.equal(part, dropout.keep_mask(_seed(987654321, 17, o - 2 ** 34), 0.4, 2, 3, torch.arange(0, 60 - o),
                                                   torch.arange(0, 60 - o), inspect_keys=inspect_keys))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_independence(p):
    """Over 2 x 4 x 64 x 256 pairs: the keep rate is 1 - p, and pairs that share a Philox call (keys j,
    j + 1), neighbouring groups (j, j + 4), rows, heads, batches and two offsets are kept together at
    the rate (1 - p)^2 of independent draws; every bound 6 standard deviations."""
    B, H, Nq, N = 2, 4, 64, 256
    keep = dropout.keep_mask(_seed(2024, 0), p, B, H, torch.arange(Nq), torch.arange(N), inspect_keys=True)
    q = 1 - p
    rate = keep.double().mean().item()
    assert abs(rate - q) < 6 * math.sqrt(p * q / keep.numel())
    other = dropout.keep_mask(_seed(2024, B * H), p, B, H, torch.arange(Nq), torch.arange(N), inspect_keys=True)
    pairs = {"key j, j + 1": (keep[..., :-1], keep[..., 1:]), "key j, j + 4": (keep[..., :-4], keep[..., 4:]),
             "row": (keep[:, :, :-1], keep[:, :, 1:]), "head": (keep[:, :-1], keep[:, 1:]),
             "batch": (keep[:-1], keep[1:]), "next offset": (keep, other)}
    for name, (a, b) in pairs.items():
        both = (a & b).double().mean().item()
        assert abs(both - q * q) < 6 * math.sqrt(q * q * (1 - q * q) / a.numel()), name
    assert not torch.equal(keep, other)


def test_same_mask_on_every_backend_and_thread_count():
    """One generator state: the fused kernels on 1 and 2 threads (bitwise), the block-wise path (blocks
    of 3 rows) and the dense twin give the same output and gradients."""
    (q, k, v, z, h), scalars, opts = make_problem(N=40, seed=5)
    kw = dict(**scalars, **opts, variant="paper", is_causal=True, dropout_p=0.3)
    upstream = torch.randn(2, 2, 40, 6, dtype=torch.float64)
    results = {}
    threads = torch.get_num_threads()
    for name, backend, n_threads in (("fused-1", "fused", 1), ("fused-2", "fused", 2), ("blockwise", "blockwise", 2),
                                     ("dense", "dense", 2)):
        torch.set_num_threads(n_threads)
        inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h)]
        torch.manual_seed(99)
        try:
            with attention_backend(backend, block_rows=3):
                y = ascender_attention(*inputs, **kw)
                results[name] = (y, *torch.autograd.grad(y, inputs, upstream))
        finally:
            torch.set_num_threads(threads)
    for a, b in zip(results["fused-1"], results["fused-2"]):
        assert torch.equal(a, b)
    for name in ("blockwise", "dense"):
        for a, b in zip(results["fused-1"], results[name]):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)
    no_dropout = ascender_attention(q, k, v, z, h, **dict(kw, dropout_p=0.0))
    assert (results["fused-1"][0] - no_dropout).abs().max() > 0.1


@pytest.mark.parametrize("variant", ["seed", "paper"])
def test_gradcheck_at_a_fixed_seed(variant):
    """The fused kernels' gradients (the block-wise path's: against the twin's autograd, below)."""
    (q, k, v, z, h), scalars, opts = make_problem(B=1, N=6, d=4, dv=3, dz=3, da=3, seed=8)
    inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h)]
    inputs += [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]
    seed = _seed(31337, 5)

    def f(*args):
        y, aux = ascender_attention(*args[:5], **dict(zip(SCALAR_NAMES, args[5:])), **opts, variant=variant,
                                    is_causal=True, dropout_p=0.4, dropout_seed=seed, return_aux=True)
        return y, aux["coh"], aux["sep"]  # (the aux terms see A without the mask)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


@pytest.mark.parametrize("sinks", [False, True])
def test_gradients_equal_the_twins_autograd(target, sinks):
    """With attention sinks (SPEC section 12) too: the sink has no value, so nothing is dropped there, and
    its gradient -a_sink P takes the dropped output's P."""
    (q, k, v, z, h), scalars, opts = on(target.device, make_problem(N=11, seed=9))
    upstream = torch.randn(2, 2, 11, 6, dtype=torch.float64, device=target.device)
    padding = torch.tensor([[False] * 10 + [True]] * 2, device=target.device)
    sink = torch.tensor([0.7, -0.4], dtype=torch.float64, device=target.device) if sinks else None
    grads = []
    for fn in (ascender_attention, ascender_attention_reference):
        inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h)]
        sc = [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]
        extra = [sink.clone().requires_grad_()] if sinks else []
        y = fn(*inputs, **dict(zip(SCALAR_NAMES, sc)), **opts, variant="paper", dropout_p=0.25,
               dropout_seed=_seed(1, 2).to(target.device), key_padding_mask=padding,
               sinks=extra[0] if sinks else None)
        grads.append(torch.autograd.grad(y, inputs + sc + extra, upstream))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10 * max(b.abs().max().item(), 1.0))


def test_rows_at_a_query_offset_draw_the_full_calls_mask(target):
    """The mask is a function of the query's token: rows 5 .. 8 asked for with query_offset (a context-
    parallel rank's rows) equal those rows of the full call, with the same stream."""
    (q, k, v, z, h), scalars, opts = on(target.device, make_problem(N=12, seed=4))
    kw = dict(**scalars, **opts, variant="paper", is_causal=True, dropout_p=0.4,
              dropout_seed=_seed(77, 3).to(target.device))
    full = ascender_attention(q, k, v, z, h, **kw)
    rows = ascender_attention(q[:, :, 5:9], k, v, z, h, **kw, query_offset=5)
    torch.testing.assert_close(rows, full[:, :, 5:9], rtol=1e-12, atol=1e-13)
    assert (full - ascender_attention(q, k, v, z, h, **dict(kw, dropout_p=0.0))).abs().max() > 0.1


def test_torch_generators_reproduce_the_mask():
    (q, k, v, z, h), scalars, opts = make_problem(N=12, seed=10)
    kw = dict(**scalars, **opts, dropout_p=0.5)
    torch.manual_seed(5)
    first, second = ascender_attention(q, k, v, z, h, **kw), ascender_attention(q, k, v, z, h, **kw)
    torch.manual_seed(5)
    assert torch.equal(ascender_attention(q, k, v, z, h, **kw), first)
    assert not torch.equal(first, second)  # every call draws a new stream
    g = torch.Generator().manual_seed(17)
    with_g = ascender_attention(q, k, v, z, h, **kw, generator=g)
    g.manual_seed(17)
    assert torch.equal(ascender_attention(q, k, v, z, h, **kw, generator=g), with_g)
    g.manual_seed(17)  # the twin draws the same stream from the same generator state
    torch.testing.assert_close(ascender_attention_reference(q, k, v, z, h, **kw, generator=g), with_g, rtol=1e-9,
                               atol=1e-11)


def test_module_drops_in_training_mode_only():
    torch.manual_seed(0)
    m = ASCenderAttention(16, 2, k=3, dropout=0.5).double()
    plain = ASCenderAttention(16, 2, k=3).double()
    plain.load_state_dict(m.state_dict())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    m.eval()
    torch.testing.assert_close(m(x, is_causal=True)[0], plain(x, is_causal=True)[0], rtol=0, atol=0)
    m.train()
    a, b = m(x, is_causal=True)[0], m(x, is_causal=True)[0]
    assert not torch.allclose(a, b) and not torch.allclose(a, plain(x, is_causal=True)[0])
    assert "dropout=0.5" in repr(m)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        ASCenderAttention(16, 2, dropout=1.0)


@pytest.mark.parametrize("extra,pattern", [
    (dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\), got 1"),
    (dict(dropout_p=-0.1), r"dropout_p must be in \[0, 1\), got -0.1"),
    (dict(dropout_p=float("nan")), r"dropout_p must be in \[0, 1\), got nan"),
    (dict(dropout_p=0.1), r"dropout_p = 0.1 > 0 needs dropout_seed"),
    (dict(dropout_p=0.1, dropout_seed=torch.zeros(2, dtype=torch.int32)),
     r"dropout_seed must be an int64 tensor \[2\] \(seed, offset\) or \[3\] \(seed, offset, token offset\) on "
     r"cpu, got Int \[2\]"),
    (dict(dropout_p=0.1, dropout_seed=torch.zeros(4, dtype=torch.int64)),
     r"dropout_seed must be an int64 tensor \[2\] \(seed, offset\) or \[3\] \(seed, offset, token offset\) on "
     r"cpu, got Long \[4\]"),
])
def test_bad_dropout_arguments(extra, pattern):
    (q, k, v, z, h), _, opts = make_problem(N=7)
    with pytest.raises(RuntimeError, match=pattern):  # the op itself: the functional draws a missing seed
        torch.ops.ascender.ascender_fwd(**op_arguments((q, k, v, z, h), {}, opts, {}, "paper", **extra))


def test_opcheck_with_dropout():
    """The seed is an input tensor: the schema, the fake kernel and the autograd rule (which saves it for
    the backward) handle it like any other."""
    tensors, scalars, opts = make_problem(N=7)
    args = op_arguments(tuple(t.clone().requires_grad_() for t in tensors), scalars, opts, dict(is_causal=True),
                        "paper", dropout_p=0.2, dropout_seed=_seed(3, 4))
    torch.library.opcheck(torch.ops.ascender.ascender_fwd.default, (), args)  # the four default utilities
