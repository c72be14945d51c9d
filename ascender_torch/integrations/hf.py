"""Hugging Face transformers integration (transformers >= 4.53; imported only when used).

Two lines put ASCender into a model whose attention goes through ``AttentionInterface``
(Llama, GPT-2, BERT and most current architectures)::

    from ascender_torch.integrations import hf
    model = hf.convert(model, variant="paper", omega_init=0.0)

``convert`` registers the attention function ``"ascender"`` (and its mask function) with
transformers, gives every self-attention module per-head latent and semantic projections
``U``, ``P`` and per-head learnable scalars (a submodule named ``ascender``), and selects
``attn_implementation="ascender"``. With ``omega_init=0`` the biases are off and the model's
outputs equal the original ones (the score temperature starts so that score_temp + 1e-6 = 1).

Hidden states. The attention function receives q, k, v but not the hidden states that the
latent coordinates z = x U and h = x P are computed from, so a forward pre-hook on each
attention module hands them over. Generation with a KV cache: the latent coordinates of past
tokens are kept next to the KV cache, per layer, in ``module.ascender``: a forward whose keys
are as many as its queries (prefill, or any call without cache) starts a new cache; a forward
with more keys than queries appends its tokens and must find exactly the missing past
(otherwise it raises). The cache holds detached tensors of the tokens seen by the last
generation (DynamicCache semantics; static caches are not supported); when generation
reorders the cache's batch rows (beam search), the latent cache follows, matching rows by
their past keys. Grouped-query attention: key and value heads are repeated to the query
heads, and the latent projections are per query head. Cross-attention modules (encoder-
decoder models) keep sdpa. A T5-style ``position_bias`` is added as beta^(other);
``softcap`` and attention sinks raise NotImplementedError. Dropout on attention weights is
not applied.
"""

from __future__ import annotations

import torch
from torch import nn

from ..functional import ascender_attention
from .. import _spec as spec

NAME = "ascender"


class ASCenderLatents(nn.Module):
    """The per-layer ASCender state of a converted attention module: projections U, P
    (Linear(hidden, n_heads * d_latent), no bias), per-head scalars, the options, the hidden
    states handed over by the pre-hook and the latent cache of past tokens."""

    scalar_attributes = {name: name for name in spec.SCALAR_NAMES}  # the op's scalars, same names here

    def __init__(self, hidden_size, n_heads, d_latent, *, variant="paper", omega_init=0.0, k=16,
                 tau_sep=1.0, tau_coh=1.0, alpha_align=-1.0, alpha_coh=-1.0):
        super().__init__()
        self.n_heads, self.d_latent = n_heads, d_latent
        self.variant, self.k = variant, k
        self.tau_sep, self.tau_coh, self.alpha_align, self.alpha_coh = tau_sep, tau_coh, alpha_align, alpha_coh
        self.U = nn.Linear(hidden_size, n_heads * d_latent, bias=False)
        self.P = nn.Linear(hidden_size, n_heads * d_latent, bias=False)
        initial = dict(spec.SCALAR_DEFAULTS, omega_align=omega_init, omega_sep=omega_init, omega_coh=omega_init,
                       score_temp=1.0 - spec.EPS_TAU)
        for name in spec.SCALAR_NAMES:
            self.register_parameter(name, nn.Parameter(torch.full((n_heads,), float(initial[name]))))
        self._hidden = None
        self._cache = None  # (z, h) of the tokens seen so far, [B, H, n, d_latent]

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_latent={self.d_latent}, variant={self.variant!r}, k={self.k}"

    def capture(self, hidden_states):
        self._hidden = hidden_states

    def latents(self, key):
        """z, h [B, H, N, d_latent] for the N keys of ``key``: the captured (newest) tokens after
        the cached past ones. The cache follows the KV cache's batch rows: when generation
        reorders them (beam search), the permutation is recovered from the past keys."""
        x = self._hidden
        self._hidden = None
        n_keys = key.shape[2]
        if x is None:
            raise RuntimeError("ascender: the attention module's hidden states were not captured; "
                               "convert the model with ascender_torch.integrations.hf.convert")
        B, n_new, _ = x.shape
        z, h = (p(x).reshape(B, n_new, self.n_heads, -1).transpose(1, 2) for p in (self.U, self.P))
        fingerprint = key.detach()[..., 0].transpose(1, 2)  # [B, N, H]: exact copies of cached entries
        if n_keys != n_new:
            past = self._cache
            n_past = n_keys - n_new
            if n_past < 0 or past is None or past[0].shape[2] != n_past:
                have = None if past is None else past[0].shape[2]
                raise RuntimeError(f"ascender: {n_keys} keys for {n_new} new tokens, but the latent cache holds "
                                   f"{have} past tokens; start generation with a prefill (no cache)")
            rows = self._match_rows(past[2], fingerprint[:, :n_past])
            z = torch.cat([past[0][rows], z], 2)
            h = torch.cat([past[1][rows], h], 2)
        self._cache = (z.detach(), h.detach(), fingerprint)
        return z, h

    @staticmethod
    def _match_rows(old, new):
        """For each row of new, a row of old with the same past-key fingerprint."""
        if old.shape == new.shape and torch.equal(old, new):
            return torch.arange(new.shape[0], device=new.device)
        same = (new.unsqueeze(1) == old.unsqueeze(0)).flatten(2).all(-1)  # [B_new, B_old]
        if not bool(same.any(1).all()):
            raise RuntimeError("ascender: the KV cache's rows changed in a way the latent cache cannot follow")
        return same.to(torch.int8).argmax(1)


def _capture_hidden_states(module, args, kwargs):
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    module.ascender.capture(hidden)


def _repeat_heads(x, n_heads):
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


UNSUPPORTED = ("softcap", "s_aux", "sinks")


def ascender_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                               is_causal=None, position_bias=None, **kwargs):
    """The ``"ascender"`` entry of transformers' AttentionInterface (sdpa's conventions)."""
    asc = getattr(module, "ascender", None)
    if asc is None:
        raise RuntimeError("ascender: this attention module was not converted; call "
                           "ascender_torch.integrations.hf.convert(model) first")
    for name in UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"ascender: the attention argument {name!r} is not supported")
    n_heads, q_len = query.shape[1], query.shape[2]
    key, value = _repeat_heads(key, n_heads), _repeat_heads(value, n_heads)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(is_causal and attention_mask is None and q_len > 1)
    if is_causal and key.shape[2] > q_len:  # prefill into an empty static cache, as sdpa does
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    n_keys = key.shape[2]
    attn_mask = attn_bias = None
    if attention_mask is not None:
        mask = attention_mask[..., :n_keys]
        if mask.dtype == torch.bool:
            attn_mask = mask
        else:  # an additive float mask: -inf / dtype-min entries block, the rest is a bias
            attn_mask = mask > torch.finfo(mask.dtype).min / 2
            attn_bias = torch.where(attn_mask, mask, torch.zeros_like(mask)).to(query.dtype)
    if position_bias is not None:  # T5-style relative position bias: beta^(other)
        bias = position_bias[..., :n_keys].to(query.dtype)
        attn_bias = bias if attn_bias is None else attn_bias + bias
    z, h = asc.latents(key)
    y = ascender_attention(
        query, key, value, z.to(query.dtype), h.to(query.dtype),
        **{name: getattr(asc, name) for name in spec.SCALAR_NAMES},
        k_neighbors=asc.k, tau_sep=asc.tau_sep, tau_coh=asc.tau_coh, alpha_align=asc.alpha_align,
        alpha_coh=asc.alpha_coh, scale=scaling, variant=asc.variant, is_causal=is_causal,
        attn_mask=attn_mask, attn_bias=attn_bias, mask_stats=True,
    )
    return y.transpose(1, 2).contiguous(), None


def _sdpa_for_cross_attention(module, *args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, *args, **kwargs)


def _dispatch(module, *args, **kwargs):
    """Self-attention goes to ASCender; modules marked as cross-attention keep sdpa."""
    if getattr(module, "_ascender_cross_attention", False):
        return _sdpa_for_cross_attention(module, *args, **kwargs)
    return ascender_attention_forward(module, *args, **kwargs)


def register() -> None:
    """Registers ``"ascender"`` with transformers' AttentionInterface and mask interface."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, _dispatch)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # bool, True = attend


def _head_dim(m):
    for name in ("head_dim", "attention_head_size", "key_value_proj_dim"):
        if isinstance(getattr(m, name, None), int):
            return getattr(m, name)
    return None


CROSS_ATTENTION_NAMES = ("encoder_attn", "crossattention", "cross_attn", "encdecattention")


def _attention_modules(model):
    """The innermost modules named *Attention that own a head dimension, each with a flag telling
    whether it is cross-attention (keys from another sequence: no latent geometry to share)."""
    found = []
    for name, m in model.named_modules():
        if "Attention" not in type(m).__name__:
            continue
        if _head_dim(m) is None:
            continue
        if any("Attention" in type(c).__name__ for c in m.children()):
            continue
        cross = getattr(m, "is_cross_attention", False) or any(c in name.lower() for c in CROSS_ATTENTION_NAMES)
        found.append((name, m, bool(cross)))
    return found


def convert(model, variant="paper", omega_init=0.0, d_latent=None, k=16, tau_sep=1.0, tau_coh=1.0,
            alpha_align=-1.0, alpha_coh=-1.0):
    """Adds ASCender to every self-attention module of a transformers model (in place) and
    selects ``attn_implementation="ascender"``. Returns the model."""
    register()
    config = model.config
    hidden = config.hidden_size
    n_heads = config.num_attention_heads
    modules = _attention_modules(model)
    if not any(not cross for _, _, cross in modules):
        raise ValueError(f"ascender: no self-attention module found in {type(model).__name__}")
    for _, m, cross in modules:
        if cross:  # cross-attention keeps sdpa
            m._ascender_cross_attention = True
            continue
        head_dim = _head_dim(m)
        if hasattr(m, "ascender"):
            continue
        ref = next(m.parameters())
        m.ascender = ASCenderLatents(hidden, n_heads, d_latent or max(head_dim // 2, 1), variant=variant,
                                     omega_init=omega_init, k=k, tau_sep=tau_sep, tau_coh=tau_coh,
                                     alpha_align=alpha_align, alpha_coh=alpha_coh).to(ref.device, ref.dtype)
        m.register_forward_pre_hook(_capture_hidden_states, with_kwargs=True)
    model.set_attn_implementation(NAME)
    return model
