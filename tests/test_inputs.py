"""Bad inputs get an error that names the argument and what was expected; odd inputs get a
defined result. Nothing crashes the process."""

from __future__ import annotations

import pytest
import torch

from ascender_torch import ascender_attention

from cases import VARIANTS, make_problem


def _problem(**kw):
    tensors, scalars, opts = make_problem(**kw)
    return list(tensors), scalars, opts


NAMES = ("q", "k", "v", "z", "h")


@pytest.mark.parametrize("which", range(1, 5))
def test_wrong_dtype(which):
    tensors, scalars, opts = _problem()
    tensors[which] = tensors[which].float()
    with pytest.raises(RuntimeError, match=rf"{NAMES[which]} must have the dtype of q \(Double\), got Float"):
        ascender_attention(*tensors, **scalars, **opts)


def test_integer_inputs():
    tensors, _, opts = _problem()
    with pytest.raises(RuntimeError, match="q must be float32, float64, float16 or bfloat16, got Long"):
        ascender_attention(*(t.long() for t in tensors), **opts)


@pytest.mark.parametrize("which,shape,pattern", [
    (0, (2, 2, 7), r"q must be a 4-D tensor \[B, H, Nq, d\], got shape \[2, 2, 7\]"),
    (1, (2, 2, 7, 9), r"k must have shape \[B, H, N, d\] with the B, H, d of q \[2, 2, 7, 8\] and N >= Nq = 7, "
                      r"got \[2, 2, 7, 9\]"),
    (1, (2, 2, 6, 8), r"k must have shape .* and N >= Nq = 7, got \[2, 2, 6, 8\]"),
    (2, (2, 2, 6, 6), r"v must have shape \[B, H, N, dv\] = \[2, 2, 7, dv\], got \[2, 2, 6, 6\]"),
    (3, (2, 1, 7, 4), r"z must have shape \[B, H, N, dz\] = \[2, 2, 7, dz\], got \[2, 1, 7, 4\]"),
    (4, (3, 2, 7, 4), r"h must have shape \[B, H, N, da\] = \[2, 2, 7, da\], got \[3, 2, 7, 4\]"),
])
def test_mismatched_shapes(which, shape, pattern):
    tensors, _, opts = _problem()
    tensors[which] = torch.randn(*shape, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=pattern):
        ascender_attention(*tensors, **opts)


def test_scalar_shape_and_dtype():
    tensors, _, opts = _problem(H=2)
    with pytest.raises(RuntimeError, match=r"kappa must be a 0-dim tensor or have shape \[H\] = \[2\], got shape \[3\]"):
        ascender_attention(*tensors, **opts, kappa=torch.ones(3, dtype=torch.float64))
    # a float32 parameter with float64 inputs is cast (as nn.Module parameters would be)
    y32 = ascender_attention(*tensors, **opts, omega_sep=torch.tensor(0.5))
    y64 = ascender_attention(*tensors, **opts, omega_sep=0.5)
    assert torch.equal(y32, y64)


@pytest.mark.parametrize("mask,pattern", [
    (torch.zeros(2, 6, dtype=torch.bool), r"key_padding_mask must have shape \[B, N\] = \[2, 7\], got shape \[2, 6\]"),
    (torch.zeros(2, 7, dtype=torch.uint8), r"key_padding_mask must be a bool tensor \(True = padding\), got Byte"),
])
def test_bad_key_padding_mask(mask, pattern):
    tensors, _, opts = _problem()
    with pytest.raises(RuntimeError, match=pattern):
        ascender_attention(*tensors, **opts, key_padding_mask=mask)


@pytest.mark.parametrize("mask,pattern", [
    (torch.ones(7, 6, dtype=torch.bool), r"attn_mask must be broadcastable to \[B, H, Nq, N\] = \[2, 2, 7, 7\], got shape \[7, 6\]"),
    (torch.ones(3, 2, 7, 7, dtype=torch.bool), r"attn_mask must be broadcastable .* got shape \[3, 2, 7, 7\]"),
    (torch.ones(1, 2, 2, 7, 7, dtype=torch.bool), r"attn_mask must be broadcastable .* got shape \[1, 2, 2, 7, 7\]"),
    (torch.ones(7, 7), r"attn_mask must be a bool tensor \(True = may attend\), got Float"),
])
def test_bad_attn_mask(mask, pattern):
    tensors, _, opts = _problem()
    with pytest.raises(RuntimeError, match=pattern):
        ascender_attention(*tensors, **opts, attn_mask=mask)


@pytest.mark.parametrize("kw,pattern", [
    (dict(variant="flash"), r"variant must be 'seed' \(or its alias 'reference'\) or 'paper', got 'flash'"),
    (dict(k_neighbors=-1), r"k_neighbors must be >= 0, got -1"),
    (dict(tau_sep=0.0), r"tau_sep must be a finite number > 0, got 0"),
    (dict(tau_coh=float("nan")), r"tau_coh must be a finite number > 0, got nan"),
    (dict(scale=float("inf")), r"scale must be finite, got inf"),
])
def test_bad_hyper_parameters(kw, pattern):
    tensors, _, opts = _problem()
    opts.update(kw)
    with pytest.raises(RuntimeError, match=pattern):
        ascender_attention(*tensors, **opts)


def test_not_a_tensor():
    tensors, _, opts = _problem()
    with pytest.raises(TypeError, match="v must be a torch.Tensor, got list"):
        ascender_attention(tensors[0], tensors[1], [1.0], tensors[3], tensors[4], **opts)


def test_non_contiguous_inputs_give_the_contiguous_result():
    tensors, scalars, opts = _problem(B=2, H=2, N=9)
    want = ascender_attention(*tensors, **scalars, **opts, variant="paper")
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors]
    assert not strided[0].is_contiguous()
    kpm = torch.zeros(9, 2, dtype=torch.bool).t()  # non-contiguous mask
    am = torch.ones(9, 9, dtype=torch.bool).t()
    got = ascender_attention(*strided, **scalars, **opts, variant="paper", key_padding_mask=kpm, attn_mask=am)
    assert torch.equal(got, want)


@pytest.mark.parametrize("variant", VARIANTS)
def test_nan_inputs_propagate(variant):
    """NaN in one key: a defined result (NaN where that key is visible, nothing crashes)."""
    tensors, scalars, opts = _problem(N=6)
    tensors[1][0, 0, 3, 0] = float("nan")
    y = ascender_attention(*tensors, **scalars, **opts, variant=variant)
    assert torch.isnan(y[0, 0]).all()
    assert torch.isfinite(y[1]).all() and torch.isfinite(y[0, 1]).all()
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, 3] = True  # hide the bad key: finite again
    y = ascender_attention(*tensors, **scalars, **opts, variant=variant, key_padding_mask=kpm)
    if variant == "seed":  # query 3's own key still enters its alignment row k^_3.k^_j
        assert torch.isnan(y[0, 0, 3]).all()
        y = y[:, :, [0, 1, 2, 4, 5]]
    assert torch.isfinite(y).all()


def test_empty_sizes():
    for shape in ((0, 2, 5, 4), (2, 0, 5, 4), (2, 2, 0, 4)):
        q = torch.randn(*shape, dtype=torch.float64)
        y = ascender_attention(q, q, q, q, q)
        assert y.shape == shape


def test_devices_without_fused_kernels_run_block_wise_with_a_warning(monkeypatch):
    """Without a fused kernel for the device, ascender_attention runs the block-wise backend after one
    warning that names it (checked on the 'meta' device, which exercises the same routing without a
    GPU: the block-wise path is device-agnostic PyTorch ops)."""
    from ascender_torch import backends

    monkeypatch.setattr(backends._State, "warned", set())
    tensors, _, opts = _problem()
    meta = [t.to("meta") for t in tensors]
    with pytest.warns(RuntimeWarning, match="no fused kernel for meta tensors; using the blockwise backend"):
        y = ascender_attention(*meta, **opts)
    assert y.shape == (2, 2, 7, 6) and y.device.type == "meta"
