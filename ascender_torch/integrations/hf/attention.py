"""The ``"ascender"`` entry of transformers' AttentionInterface: the latents of the keys, the
model's masks, biases and windows turned into the op's arguments, cross-attention kept on sdpa;
and the registration with transformers."""

from __future__ import annotations

import re
import weakref

import torch

from ... import _spec as spec
from ...functional import ascender_attention
from .latents import NAME, ASCenderUnsupportedError
from .masks import _mask

# Attention-function arguments that change the attention's result and that the op does not
# implement. The probe in convert() refuses a model that passes one of them.
UNSUPPORTED_ARGUMENTS = {
    "block_indices": "block-sparse attention (block_indices) is not supported",
}
# Attention-function arguments that carry attention sinks (GPT-OSS and others pass the module's
# per-head sink logits as s_aux; Inkling 2 one per query, [B, H, Nq, 1], from the hidden states): the
# op's sinks (SPEC section 12; per row: docs/backward.md)
SINK_ARGUMENTS = ("s_aux", "sinks")


def _repeat_heads(x, n_heads):
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _window_arguments(module, kwargs):
    """The op's window for a sliding-window layer of a causal model: transformers passes the window
    as ``sliding_window=w`` (token t sees keys t-w+1..t), as it does for flash attention, which
    gets no mask either. The op gets ``window_size=(w - 1, 0)``, and the kernels skip the key tiles
    outside every window (O(N w) work). The mask function (_mask) leaves the window out of the mask
    where that is exact (_sliding_window_alone), so no N x N mask is built for the window; where it
    keeps it, mask and window agree. On CUDA tensors with the CUDA kernels built, such a layer runs
    block-wise (the CUDA kernels lack window_size)."""
    w = kwargs.get("sliding_window")
    if not isinstance(w, int) or w <= 0 or not getattr(module, "is_causal", False):
        return {}
    return dict(window_size=(w - 1, 0))


def _mask_and_bias(attention_mask, n_keys, dtype):
    """transformers' attention mask -> the op's boolean attn_mask (True = may attend) and a float
    attn_bias (the finite part of an additive float mask)."""
    if attention_mask is None:
        return None, None
    mask = attention_mask[..., :n_keys]
    if mask.dtype == torch.bool:
        return mask, None
    visible = mask > torch.finfo(mask.dtype).min / 2  # -inf / dtype-min entries block, the rest is a bias
    return visible, torch.where(visible, mask, torch.zeros_like(mask)).to(dtype)


_KEY_LATENTS = {}  # id(key tensor) -> (weak reference to it, ASCenderLatents, (z, h), valid keys)


def _latents_of_keys(key, asc, own):
    """(z, h, number of valid keys) for ``key``: the module's own, unless the very same key tensor was
    computed by another converted module (KV sharing across layers, as in Gemma 3n and Gemma 4:
    shared keys share their latents, so that cached generation equals recomputation)."""
    entry = _KEY_LATENTS.get(id(key))
    if entry is not None and entry[0]() is key and entry[1] is not asc:
        asc.latents_from = entry[1]._where  # its own U, P are then unused
        return (*entry[2], entry[3])
    ident = id(key)
    _KEY_LATENTS[ident] = (weakref.ref(key, lambda _, ident=ident: _KEY_LATENTS.pop(ident, None)), asc, own,
                           asc._n_valid)
    return (*own, asc._n_valid)


def _selected_keys(indices, query, key_len, n_keys):
    """Sparse attention with an indexer (DeepSeek V3.2 style): ``indices`` [B, Nq, topk] holds the keys
    each query attends to (negative = none), which eager and sdpa receive folded into the mask."""
    if indices is None:
        return None
    B, q_len = query.shape[0], query.shape[2]
    if indices.dim() != 3 or indices.shape[0] not in (1, B) or indices.shape[1] != q_len:
        raise ASCenderUnsupportedError(f"ascender: sparse attention indices of shape {tuple(indices.shape)}; expected "
                                       f"[B, Nq, topk] = [{B}, {q_len}, topk]")
    indices = indices.long()
    indices = torch.where(indices >= 0, indices, key_len)  # "none" goes to a spare column
    chosen = torch.zeros(*indices.shape[:2], key_len + 1, dtype=torch.bool, device=indices.device)
    chosen.scatter_(-1, indices, True)
    return chosen[..., :n_keys].unsqueeze(1)


def ascender_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                               is_causal=None, position_bias=None, **kwargs):
    """The ``"ascender"`` entry of transformers' AttentionInterface (sdpa's conventions)."""
    asc = getattr(module, "ascender", None)
    if asc is None:
        raise RuntimeError("ascender: this attention module was not converted; call "
                           "ascender_torch.integrations.hf.convert(model) first")
    for name, reason in UNSUPPORTED_ARGUMENTS.items():
        if kwargs.get(name) is not None:
            raise ASCenderUnsupportedError(f"ascender: {asc._where} ({type(module).__name__}): {reason}; "
                                           f"the attention argument {name!r} is not supported")
    z, h, n_valid = _latents_of_keys(key, asc, asc.take())
    n_heads, q_len = query.shape[1], query.shape[2]
    if n_heads != asc.n_heads:  # (while probing: resized, and this call runs with zero latents)
        asc._resize(n_heads=n_heads)
        z = z.new_zeros(z.shape[0], n_heads, *z.shape[2:])
        h = h.new_zeros(h.shape[0], n_heads, *h.shape[2:])
    key, value = _repeat_heads(key, n_heads), _repeat_heads(value, n_heads)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(is_causal and attention_mask is None and q_len > 1)
    key_len = key.shape[2]
    if is_causal and key.shape[2] > q_len:  # prefill into an empty static cache, as sdpa does
        n_valid = q_len
    if n_valid is not None and n_valid < key.shape[2]:  # a static cache's unused slots
        key, value, z, h = key[:, :, :n_valid], value[:, :, :n_valid], z[:, :, :n_valid], h[:, :, :n_valid]
    n_keys = key.shape[2]
    if z.shape[2] != n_keys and asc._cache is None:  # (no KV cache: the keys are not the module's tokens)
        raise ASCenderUnsupportedError(
            f"ascender: {asc._where} ({type(module).__name__}) attends over {n_keys} keys for {z.shape[2]} tokens: "
            "keys that are not tokens (compressed or convolved entries, as in DeepSeek V4) have no latent "
            "coordinates")
    if z.shape[2] != n_keys:
        raise RuntimeError(
            f"ascender: {asc._where} got {n_keys} keys but latents for {z.shape[2]} tokens ({z.shape[2] - q_len} "
            f"past, {q_len} new): the KV cache returned keys that its latent cache does not line up with")
    attn_mask, attn_bias = _mask_and_bias(attention_mask, n_keys, query.dtype)
    selected = _selected_keys(kwargs.get("indices"), query, key_len, n_keys)
    if selected is not None:
        attn_mask = selected if attn_mask is None else attn_mask & selected
    if position_bias is not None:  # T5-style relative position bias: beta^(other)
        bias = position_bias[..., :n_keys].to(query.dtype)
        attn_bias = bias if attn_bias is None else attn_bias + bias
    sinks = next((kwargs[name] for name in SINK_ARGUMENTS if kwargs.get(name) is not None), None)
    if sinks is not None and sinks.dim() == 4 and sinks.shape[-1] == 1:  # one extra logit per query row
        sinks = sinks[..., 0]
    if sinks is not None and sinks.dim() not in (0, 1, 3):
        raise ASCenderUnsupportedError(
            f"ascender: {asc._where} ({type(module).__name__}): attention sinks of shape {tuple(sinks.shape)}; the "
            "op's sinks are one logit per head ([H]) or per query row ([B, H, Nq, 1] or [B, H, Nq]), SPEC section 12")
    y = ascender_attention(
        query, key, value, z.to(query.dtype), h.to(query.dtype),
        **{name: getattr(asc, name) for name in spec.SCALAR_NAMES},
        k_neighbors=asc.k, tau_sep=asc.tau_sep, tau_coh=asc.tau_coh, alpha_align=asc.alpha_align,
        alpha_coh=asc.alpha_coh, scale=scaling, variant=asc.variant, is_causal=is_causal,
        attn_mask=attn_mask, attn_bias=attn_bias, mask_stats=True,
        **_window_arguments(module, kwargs),
        softcap=kwargs.get("softcap"), sinks=sinks,
        dropout_p=float(dropout) if module.training else 0.0,  # the model's attention dropout (SPEC section 9b)
    )
    additive = attention_mask is not None and (attention_mask.dtype != torch.bool or position_bias is not None)
    if attn_mask is not None and sinks is None and (asc.fully_masked == "mean" or additive):
        # a row that sees no key: eager attention, and sdpa with an additive float mask (also the one it
        # builds from a position bias), add the dtype's minimum (not -inf) to every score of the row, so
        # its softmax is uniform over all the keys (with a sink, the sink takes all the weight: 0, as the op)
        blind = ~attn_mask.any(-1, keepdim=True)
        if bool(blind.any()):
            y = torch.where(blind, value.mean(2, keepdim=True).to(y.dtype), y)
    return y.transpose(1, 2).contiguous(), None


def _sdpa_for_cross_attention(module, *args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, *args, **kwargs)


def _dispatch(module, *args, **kwargs):
    """Self-attention goes to ASCender; modules marked as cross-attention keep sdpa."""
    if getattr(module, "_ascender_cross_attention", False):
        return _sdpa_for_cross_attention(module, *args, **kwargs)
    return ascender_attention_forward(module, *args, **kwargs)


MIN_TRANSFORMERS = (5, 20)  # the oldest release tests/test_hf.py passes with


def _require_transformers() -> None:
    """A clear error for a transformers release older than MIN_TRANSFORMERS (its cache layers, mask
    keywords and model classes differ: older releases fail in the middle of a forward, or convert a
    model without its gradients reaching every converted module)."""
    import transformers

    found = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    if found < MIN_TRANSFORMERS:
        want = ".".join(map(str, MIN_TRANSFORMERS))
        raise ImportError(f"ascender_torch.integrations.hf needs transformers >= {want}, found "
                          f"{transformers.__version__} (pip install 'transformers>={want}')")


def register() -> None:
    """Registers ``"ascender"`` with transformers' AttentionInterface and mask interface."""
    _require_transformers()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, _dispatch)
    AttentionMaskInterface.register(NAME, _mask)
