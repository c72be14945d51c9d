"""Structured visibility (SPEC section 8): window_size, global tokens, packed documents and the
scores neighbourhood. Every result must equal the dense computation with the equivalent boolean
attn_mask (built here, independently, from the definitions) and mask_stats=True."""

from __future__ import annotations

import warnings

import pytest
import torch

from ascender_torch import ascender_attention
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.backends import attention_backend
from ascender_torch.reference import ascender_attention_reference

from cases import VARIANTS, LargestTensor, full_scalars, make_problem, rel_err, resolvable_rows


@pytest.fixture(autouse=True)
def _quiet_backend_notes():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "ascender_torch: ", RuntimeWarning)
        yield


def equivalent_mask(B, N, window=None, n_global=0, global_mask=None, documents=None):
    """[B, 1, N, N] bool from SPEC section 8, one (t, j) at a time."""
    m = torch.zeros(B, 1, N, N, dtype=torch.bool)
    for b in range(B):
        for t in range(N):
            for j in range(N):
                left, right = window if window is not None else (-1, -1)
                in_window = (left < 0 or j >= t - left) and (right < 0 or j <= t + right)
                is_global = j < n_global or t < n_global or (global_mask is not None and
                                                            bool(global_mask[b, j] or global_mask[b, t]))
                same = documents is None or bool(documents[b, t] == documents[b, j])
                m[b, 0, t, j] = (in_window or is_global) and same
    return m


CASES = {
    "window": dict(window=(2, 1)),
    "causal-window": dict(window=(3, 0), causal=True),
    "left-unbounded": dict(window=(-1, 1)),
    "globals": dict(window=(1, 1), n_global=2),
    "global-mask": dict(window=(1, 0), global_mask=True, causal=True),
    "documents": dict(documents=True),
    "documents-window-causal": dict(documents=True, window=(2, 0), causal=True, n_global=1),
    "padding-window": dict(window=(2, 2), padding=True),
}


def _case(c, N=13, B=2, seed=0):
    """The structured arguments of case `c`, the equivalent dense arguments, and the shared ones."""
    g = torch.Generator().manual_seed(seed)
    kw, mask_kw = {}, {}
    if "window" in c:
        kw["window_size"] = mask_kw["window"] = c["window"]
    if c.get("n_global"):
        kw["global_tokens"] = mask_kw["n_global"] = c["n_global"]
    if c.get("global_mask"):
        kw["global_mask"] = mask_kw["global_mask"] = torch.rand(B, N, generator=g) < 0.15
    if c.get("documents"):
        lengths = torch.tensor(c["documents"] if isinstance(c["documents"], tuple) else (4, 6, 3))
        ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)[:N]
        kw["document_ids"] = mask_kw["documents"] = ids.expand(B, N)
    extra = dict(is_causal=c.get("causal", False))
    if c.get("padding"):
        extra["key_padding_mask"] = torch.rand(B, N, generator=g) < 0.2
    return kw, dict(attn_mask=equivalent_mask(B, N, **mask_kw), **extra), extra


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("neighbours", ["semantic", "scores"])
def test_equals_the_equivalent_mask(variant, name, neighbours):
    tensors, scalars, opts = make_problem(N=13, seed=5)
    kw, dense, extra = _case(CASES[name])
    opts = dict(opts, variant=variant, neighbours=neighbours)
    want = ascender_attention_reference(*tensors, **scalars, **opts, **dense)
    got_twin = ascender_attention_reference(*tensors, **scalars, **opts, **kw, **extra)
    assert rel_err(got_twin, want) <= 1e-12
    for rows in (1, 3, 13):
        with attention_backend("blockwise", block_rows=rows):
            got = ascender_attention(*tensors, **scalars, **opts, **kw, **extra)
        assert rel_err(got, want) <= 1e-10


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["causal-window", "documents-window-causal", "global-mask"])
def test_gradients_equal_the_equivalent_mask(variant, name):
    tensors, scalars, opts = make_problem(N=13, seed=6)
    scalars = full_scalars(scalars, 2, torch.float64)
    kw, dense, extra = _case(CASES[name], seed=1)
    keep = resolvable_rows(tensors, scalars, opts, dense, variant).unsqueeze(-1)
    up = torch.randn(2, 2, 13, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * keep

    def grads(fn, **more):
        inputs = [t.clone().requires_grad_() for t in tensors]
        sc = {n: s.clone().requires_grad_() for n, s in scalars.items()}
        y = fn(*inputs, **sc, **opts, variant=variant, **more)
        return torch.autograd.grad((y * up).sum(), inputs + [sc[n] for n in SCALAR_NAMES])

    want = grads(ascender_attention_reference, **dense)
    with attention_backend("blockwise", block_rows=4):
        got = grads(ascender_attention, **kw, **extra)
    for a, b in zip(got[:5], want[:5]):
        assert rel_err(a, b) <= 1e-10
    assert rel_err(torch.stack(got[5:]), torch.stack(want[5:])) <= 1e-10


# Long rows for the fused CPU kernels: several query blocks (32 rows) and key tiles (64 keys), so
# that tiles outside every window are skipped, tiles inside all of them run unmasked, and the
# others are masked per pair
LONG_CASES = {
    "window": dict(window=(5, 3)),
    "wide-causal-window": dict(window=(90, 0), causal=True),
    "globals": dict(window=(8, 8), n_global=3),
    "global-mask": dict(window=(4, 0), global_mask=True, causal=True),
    "documents": dict(documents=(50, 70, 30)),
    "documents-window-causal": dict(documents=(64, 40, 46), window=(20, 0), causal=True, n_global=1),
    "padding-window": dict(window=(40, 40), padding=True),
}


@pytest.mark.parametrize("variant,neighbours", [("seed", "semantic"), ("paper", "semantic"), ("paper", "scores")])
@pytest.mark.parametrize("name", LONG_CASES)
def test_fused_equals_the_equivalent_mask(variant, neighbours, name):
    N = 150
    tensors, scalars, opts = make_problem(B=1, N=N, seed=7)
    scalars = full_scalars(scalars, 2, torch.float64)
    kw, dense, extra = _case(LONG_CASES[name], N=N, B=1, seed=3)
    opts = dict(opts, variant=variant, neighbours=neighbours)
    keep = resolvable_rows(tensors, scalars, opts, dense, variant).unsqueeze(-1)
    up = torch.randn(1, 2, N, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * keep

    def run(fn, **more):
        inputs = [t.clone().requires_grad_() for t in tensors]
        sc = {n: s.clone().requires_grad_() for n, s in scalars.items()}
        y = fn(*inputs, **sc, **opts, **more)
        return (y, *torch.autograd.grad((y * up).sum(), inputs + [sc[n] for n in SCALAR_NAMES]))

    want = run(ascender_attention_reference, **dense)
    with attention_backend("fused"):
        got = run(ascender_attention, **kw, **extra)
    assert rel_err(got[0] * keep, want[0] * keep) <= 1e-10
    for a, b in zip(got[1:6], want[1:6]):
        assert rel_err(a, b) <= 1e-9
    assert rel_err(torch.stack(got[6:]), torch.stack(want[6:])) <= 1e-9
    # the inspection maps and the auxiliary losses, tiles skipped by the window included
    with torch.no_grad():
        _, want_maps, want_aux = ascender_attention_reference(*tensors, **scalars, **opts, **dense,
                                                              return_maps=True, return_aux=True)
        with attention_backend("fused"):
            _, maps, aux = ascender_attention(*tensors, **scalars, **opts, **kw, **extra, return_maps=True,
                                              return_aux=True)
    rows = keep.squeeze(-1)
    for name in want_maps:
        assert rel_err(maps[name][rows], want_maps[name][rows]) <= 1e-9, name
    for name in want_aux:
        assert rel_err(aux[name], want_aux[name]) <= 1e-9, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_window_jumps_over_tiles(variant):
    """Rows far apart (N = 450: 15 blocks, 8 key tiles): the sweeps jump from a block's window to the
    next tile with a global key (global_mask tokens 3, 200, 333) and back; outputs and gradients equal
    the twin with the equivalent mask."""
    N = 450
    tensors, scalars, opts = make_problem(B=1, H=1, N=N, d=4, dv=3, dz=2, da=2, seed=8)
    gm = torch.zeros(1, N, dtype=torch.bool)
    gm[0, [3, 200, 333]] = True
    kw = dict(window_size=(20, 5), global_mask=gm, is_causal=True)
    dense = dict(attn_mask=equivalent_mask(1, N, window=(20, 5), global_mask=gm), is_causal=True)
    up = torch.randn(1, 1, N, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def run(fn, **more):
        inputs = [t.clone().requires_grad_() for t in tensors]
        y = fn(*inputs, **scalars, **dict(opts, variant=variant), **more)
        return (y, *torch.autograd.grad((y * up).sum(), inputs))

    want = run(ascender_attention_reference, **dense)
    with attention_backend("fused"):
        got = run(ascender_attention, **kw)
    for a, b in zip(got, want):
        assert rel_err(a, b) <= 1e-9


def test_block_wise_window_reads_only_the_window():
    """A windowed block-wise call touches O(block x (block + window + globals)) pairs: no tensor
    grows with N x N."""
    N, rows = 256, 8

    (q, k, v, z, h), scalars, opts = make_problem(B=1, H=1, N=N, d=4, dv=4)
    inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h)]
    with attention_backend("blockwise", block_rows=rows), LargestTensor() as mode:
        y = ascender_attention(*inputs, **scalars, **opts, variant="paper", window_size=(16, 0), is_causal=True,
                               global_tokens=4)
        y.sum().backward()
    assert mode.largest <= max(rows * (rows + 16 + 4) * 4, N * 4)  # a pair tile (x the gather) or an input


@pytest.mark.parametrize("kw,pattern", [
    (dict(window_size=(-2, 1)), r"window_size must be \(left, right\) with each >= -1 \(-1: unbounded\), got \[-2, 1\]"),
    (dict(window_size=(1, 2, 3)), r"window_size must be \(left, right\)"),
    (dict(window_size=3), r"window_size must be a tuple of ints, got int 3"),
    (dict(global_tokens=8), r"global_tokens must be in \[0, N\] = \[0, 7\], got 8"),
    (dict(global_tokens=-1), r"global_tokens must be in \[0, N\] = \[0, 7\], got -1"),
    (dict(document_ids=torch.zeros(2, 6, dtype=torch.long)), r"document_ids must be an integer tensor \[B, N\] = \[2, 7\]"),
    (dict(document_ids=torch.zeros(2, 7)), r"document_ids must be an integer tensor .* got Float"),
    (dict(global_mask=torch.zeros(2, 7, dtype=torch.long)), r"global_mask must be a bool tensor \[B, N\]"),
    (dict(neighbours="keys"), r"neighbours must be 'semantic' or 'scores', got 'keys'"),
    (dict(window_size=(1, 1), mask_stats=False), r"window_size, global_tokens, global_mask and document_ids .* "
                                                  r"need mask_stats=True"),
])
def test_bad_structured_arguments(kw, pattern):
    tensors, _, opts = make_problem()
    with pytest.raises((RuntimeError, TypeError), match=pattern):
        ascender_attention(*tensors, **dict(opts, **kw))


def test_unsorted_documents_are_still_exact():
    """document_ids need not be sorted (the block-wise path then reads every key)."""
    tensors, scalars, opts = make_problem(N=9, seed=3)
    ids = torch.tensor([[0, 1, 0, 2, 1, 1, 0, 2, 2]] * 2)
    dense = ids.unsqueeze(-1) == ids.unsqueeze(-2)
    want = ascender_attention_reference(*tensors, **scalars, **opts, attn_mask=dense.unsqueeze(1))
    with attention_backend("blockwise", block_rows=2):
        got = ascender_attention(*tensors, **scalars, **opts, document_ids=ids)
    assert rel_err(got, want) <= 1e-10


ID_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64, torch.uint64)


@pytest.mark.parametrize("dtype", ID_DTYPES, ids=str)
def test_document_ids_of_every_integer_dtype_and_range(dtype):
    """document_ids of any integer dtype, with values at both ends of its range, give every backend
    the documents of the equivalent mask. Batch 0 is not sorted, but its differences in the ids' own
    dtype (max -> min wraps around to 1) are all >= 0: the block-wise path took such ids (uint8
    [[1, 1, 0, 0]] too) for sorted and read the keys of a wrong range; batch 1 is sorted, at the top
    of the range."""
    lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    ids = torch.tensor([[hi, hi, hi, lo, lo, lo + 1, lo + 1, lo + 1, lo + 1],
                        [hi - 2, hi - 2, hi - 1, hi - 1, hi - 1, hi, hi, hi, hi]], dtype=dtype)
    same = torch.stack([torch.tensor([[int(a) == int(b) for b in row] for a in row]) for row in ids.tolist()])
    tensors, scalars, opts = make_problem(N=9, seed=4)
    for variant in VARIANTS:
        want = ascender_attention_reference(*tensors, **scalars, **opts, variant=variant, attn_mask=same.unsqueeze(1))
        for backend in ("fused", "blockwise", "dense"):
            with attention_backend(backend, block_rows=2):
                got = ascender_attention(*tensors, **scalars, **opts, variant=variant, document_ids=ids)
            assert rel_err(got, want) <= 1e-10, (variant, backend)


@pytest.mark.parametrize("backend", ["fused", "blockwise", "dense"])
@pytest.mark.parametrize("B, N", [(0, 5), (2, 0), (0, 0)])
def test_empty_batch_or_sequence_with_structured_visibility(backend, B, N):
    """Zero batch or zero tokens with a window, a global mask and documents: an empty result and
    gradients, not an internal error (the block-wise path reduced document_ids of no batch, the twin
    reshaped an empty global mask; found by the fuzzer)."""
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(B, 2, N, f, generator=g, dtype=torch.float64, requires_grad=True) for f in (4, 4, 3, 2, 2)]
    kw = dict(window_size=(1, 2), global_tokens=0, global_mask=torch.zeros(B, N, dtype=torch.bool),
              document_ids=torch.zeros(B, N, dtype=torch.long), is_causal=True)
    with attention_backend(backend):
        y = ascender_attention(*tensors, variant="paper", **kw)
    assert y.shape == (B, 2, N, 3)
    y.sum().backward()
    assert all(t.grad.shape == t.shape for t in tensors)
