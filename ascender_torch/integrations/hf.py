"""Hugging Face transformers integration (imported only when used; needs transformers >= 5.20:
tests/test_hf.py passes with 5.20.2, 5.22.2 and 5.23.0, fails one T5 test with 5.17 to 5.19 and
several with 5.10, 5.0 and 4.57).

Two lines put ASCender into a model whose attention goes through ``AttentionInterface``
(Llama, Mistral, Qwen, Gemma, GPT-2, GPT-NeoX, BERT, T5, ViT and most current architectures)::

    from ascender_torch.integrations import hf
    model = hf.convert(model, variant="paper", omega_init=0.0)

``convert`` registers the attention function ``"ascender"`` (and its mask function) with
transformers, gives every self-attention module per-head latent and semantic projections
``U``, ``P`` and per-head learnable scalars (a submodule named ``ascender``), selects
``attn_implementation="ascender"`` and checks with a tiny forward (the probe) that every
converted module really runs ASCender. With ``omega_init=0`` the biases are off and the model's
outputs equal the original ones (the score temperature starts so that score_temp + 1e-6 = 1).
A model that ASCender cannot serve raises :class:`ASCenderUnsupportedError` at convert time,
naming the model class and the reason: its attention does not dispatch to the interface
(Falcon, BLOOM, GPT-J, ...), or it needs something the op lacks (attention sinks).

Save and reload: ``model.save_pretrained(path)`` writes the conversion into ``config.json``
(entry ``"ascender"``) and the ASCender weights with the others (safetensors);
``hf.from_pretrained(AutoModelForCausalLM, path)`` (or the model class) restores the converted
model exactly. A plain ``from_pretrained`` would drop the ASCender weights.

Hidden states. The attention function receives q, k, v but not the hidden states that the
latent coordinates z = x U and h = x P are computed from, so a forward pre-hook on each
attention module computes them from its input. A forward hook checks afterwards that the
module did call the "ascender" attention function (a module that bypasses it raises).

Generation with a KV cache. The latents of past tokens live next to the KV cache, inside the
cache object: per converted layer, a cache layer of the same class as that layer's KV cache
layer (dynamic, sliding-window, static, static sliding-window, ...) receives (z, h) where the KV
layer receives (k, v), so it keeps, drops, rolls and pads exactly the tokens the KV layer does
and returns latents aligned with the keys the attention gets. The cache's batch operations
(beam-search reordering, crop, batch selection and repetition, reset) are applied to the latent
layers as well. A cache that already holds tokens the converted model did not see (e.g. one
filled by the original model) raises, as does any disagreement between the KV and latent caches.

Grouped-query attention: key and value heads are repeated to the query heads; the latent
projections are per query head. Cross-attention modules (encoder-decoder models) keep sdpa. A
T5-style ``position_bias`` and additive float masks (ALiBi and the like) are added as
beta^(other). A causal model's sliding window reaches the op as window_size, and leaves the mask
where that is exact (``_window_arguments``, ``_sliding_window_alone``). Query rows that see no key
at all (padding positions under left padding) return what the model's original attention returned there: zero for sdpa and flash
kernels, the mean of the values for eager attention (its -inf-free additive mask makes such a
row uniform). Dropout on attention weights is the model's (its ``dropout`` argument, in training mode).
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import types
import weakref

import torch
from torch import nn

from .. import _spec as spec
from ..functional import ascender_attention

NAME = "ascender"
CONFIG_KEY = "ascender"  # the entry of config.json that records a conversion
FORMAT_VERSION = 1


class ASCenderUnsupportedError(NotImplementedError):
    """The model (or one of its attention modules) needs something ASCender cannot do."""


# Attention-function arguments that change the attention's result and that the op does not
# implement. The probe in convert() refuses a model that passes one of them.
UNSUPPORTED_ARGUMENTS = {
    "s_aux": "attention sinks (s_aux) are not supported",
    "sinks": "attention sinks are not supported",
    "block_indices": "block-sparse attention (block_indices) is not supported",
}
# config attributes (at any depth of the config) that mean the same, found before any forward
CONFIG_REFUSALS = {}
# attributes or parameters of an attention module that mean the same
MODULE_REFUSALS = {
    "sinks": "attention sinks (a 'sinks' parameter) are not supported",
    "s_aux": "attention sinks (an 's_aux' parameter) are not supported",
}

# names under which attention modules keep their sizes (first match wins)
HEAD_DIM_NAMES = ("head_dim", "head_size", "attention_head_size", "key_value_proj_dim", "d_kv", "qk_head_dim",
                  "attn_head_size", "dim_head", "kv_channels")
N_HEADS_NAMES = ("num_heads", "num_attention_heads", "n_heads", "n_head", "num_q_heads", "heads")
HIDDEN_NAMES = ("hidden_size", "embed_dim", "d_model")
CROSS_ATTENTION_NAMES = ("encoder_attn", "crossattention", "cross_attn", "encdecattention")
CACHE_ARGUMENT_NAMES = ("past_key_values", "past_key_value", "layer_past", "cache")
# the cache methods that change which tokens or batch rows the cache holds; the latent layers follow them
CACHE_OPERATIONS = ("reset", "reorder_cache", "crop", "batch_repeat_interleave", "batch_select_indices",
                    "activate_past_recording")


class ASCenderLatents(nn.Module):
    """The per-layer ASCender state of a converted attention module: projections U, P
    (Linear(hidden, n_heads * d_latent), no bias), per-head scalars and the options. At run time
    it also holds the latents of the current call, handed from the pre-hook to the attention
    function."""

    scalar_attributes = {name: name for name in spec.SCALAR_NAMES}  # the op's scalars, same names here

    def __init__(self, hidden_size, n_heads, d_latent, *, variant="paper", omega_init=0.0, k=16,
                 tau_sep=1.0, tau_coh=1.0, alpha_align=-1.0, alpha_coh=-1.0, fully_masked="zero"):
        super().__init__()
        self.hidden_size, self.n_heads, self.d_latent = hidden_size, n_heads, d_latent
        self.variant, self.k = variant, k
        self.tau_sep, self.tau_coh, self.alpha_align, self.alpha_coh = tau_sep, tau_coh, alpha_align, alpha_coh
        self.fully_masked = fully_masked
        self._omega_init = omega_init
        self._build(hidden_size, n_heads)
        self._probing = False  # during convert's probe, sizes the module turns out to have replace the guesses
        self._latents = None  # (z, h) aligned with the keys of the module's current forward
        self._ran = False  # whether the current forward called the attention function
        self._cache = None  # the KV cache object of the current forward
        self._n_valid = None  # how many of the keys the KV cache returned hold tokens (static caches)
        self._where = ""  # the module's name in the model, for error messages
        self.latents_from = None  # the module whose keys (and latents) this one reuses (KV sharing), if any
        self._config = None  # the config whose attention implementation the module follows

    def _build(self, hidden_size, n_heads, like=None):
        self.hidden_size, self.n_heads = hidden_size, n_heads
        self.U = nn.Linear(hidden_size, n_heads * self.d_latent, bias=False)
        self.P = nn.Linear(hidden_size, n_heads * self.d_latent, bias=False)
        omega = self._omega_init
        initial = dict(spec.SCALAR_DEFAULTS, omega_align=omega, omega_sep=omega, omega_coh=omega,
                       score_temp=1.0 - spec.EPS_TAU)
        for name in spec.SCALAR_NAMES:
            setattr(self, name, nn.Parameter(torch.full((n_heads,), float(initial[name]))))
        if like is not None:
            self.to(like.device, like.dtype)

    def _resize(self, hidden_size=None, n_heads=None):
        """Rebuilds the projections and scalars for the sizes the probe found (convert time only)."""
        if not self._probing:
            raise ASCenderUnsupportedError(
                f"ascender: {self._where} gets hidden states of width {hidden_size or self.hidden_size} and "
                f"{n_heads or self.n_heads} query heads, but its projections were built for {self.hidden_size} "
                f"and {self.n_heads}")
        self._build(hidden_size or self.hidden_size, n_heads or self.n_heads, like=self.U.weight)
        self._resized = True

    def active(self):
        """Whether the module's model currently runs the "ascender" attention implementation."""
        return self._config is None or getattr(self._config, "_attn_implementation", NAME) == NAME

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_latent={self.d_latent}, variant={self.variant!r}, k={self.k}"

    def project(self, x):
        """z, h [B, H, n, d_latent] of hidden states x [B, n, hidden]."""
        if x.shape[-1] != self.hidden_size:
            self._resize(hidden_size=x.shape[-1])
        B, n = x.shape[0], x.shape[1]
        return tuple(p(x).reshape(B, n, self.n_heads, -1).transpose(1, 2) for p in (self.U, self.P))

    def take(self):
        """The latents of the module's current forward (several attention calls may share them, as in
        differential attention)."""
        latents = self._latents
        if latents is None:
            raise RuntimeError(
                f"ascender: the hidden states of {self._where or 'this attention module'} were not captured before "
                "its attention ran; convert the model with ascender_torch.integrations.hf.convert (which installs the "
                "hook that captures them)")
        self._ran = True
        return latents


# ----------------------------------------------------------------------------------------------
# the latent cache: a cache layer of the KV layer's own class per converted layer, in the cache object


def _copy_state(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copy_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_copy_state(v) for v in value)
    return copy.deepcopy(value)


def _fresh_layer(layer):
    """An empty cache layer configured like the empty ``layer`` (same class, window, capacity): its
    attributes copied (tensors detached), without key and value tensors."""
    fresh = object.__new__(type(layer))
    for name, value in vars(layer).items():
        setattr(fresh, name, None if name in ("keys", "values") else _copy_state(value))
    fresh.is_initialized = False
    return fresh


def _seq_length(layer):
    return 0 if layer is None else int(layer.get_seq_length())


def _follow_operation(name):
    def operation(self, *args, **kwargs):
        result = getattr(type(self), name)(self, *args, **kwargs)
        for latent_layer in self._ascender_latents.values():
            if hasattr(latent_layer, name):
                getattr(latent_layer, name)(*args, **kwargs)
        return result

    operation.__name__ = name
    return operation


def _update(self, key_states, value_states, *args, **kwargs):
    """The cache's update, followed by the same update of the latent layer of the same index with
    the latents of the module whose forward is running (if a converted module is)."""
    asc = self.__dict__.get("_ascender_pending")
    if asc is None:
        return type(self).update(self, key_states, value_states, *args, **kwargs)
    self._ascender_pending = None
    idx = args[0] if args else kwargs.get("layer_idx")
    layers = self.layers
    kv_layer = layers[idx] if isinstance(idx, int) and idx < len(layers) else None
    past = _seq_length(kv_layer)
    latent_layer = self._ascender_latents.get(idx)
    if latent_layer is None:
        if past > 0:
            raise RuntimeError(
                f"ascender: {asc._where}: layer {idx} of the KV cache already holds {past} tokens that the converted "
                "model did not process (the cache was filled before the conversion or by another model), so their "
                "latents are unknown; start from an empty cache")
        latent_layer = _fresh_layer(kv_layer) if kv_layer is not None else None
    elif _seq_length(latent_layer) != past:
        raise RuntimeError(
            f"ascender: {asc._where}: layer {idx} of the KV cache holds {past} past tokens but its latent cache "
            f"{_seq_length(latent_layer)}: the cache ({type(self).__name__}) was changed by something other than the "
            f"model's forward and the cache operations the latent cache follows ({', '.join(CACHE_OPERATIONS)})")
    result = type(self).update(self, key_states, value_states, *args, **kwargs)
    if latent_layer is None:  # the KV layer was created by this update
        replicate = getattr(self, "layer_class_to_replicate", None)
        if replicate is None:
            raise ASCenderUnsupportedError(
                f"ascender: {asc._where}: the cache {type(self).__name__} created layer {idx} in a way the latent "
                "cache cannot copy; generate with use_cache=False or a cache built with the model's config")
        latent_layer = replicate()
    self._ascender_latents[idx] = latent_layer
    z, h = asc._latents
    if latent_layer.keys is not None and past > 0 and latent_layer.keys.shape[0] != z.shape[0]:
        raise RuntimeError(
            f"ascender: {asc._where}: layer {idx}'s latent cache holds {latent_layer.keys.shape[0]} batch rows but "
            f"the new tokens come in {z.shape[0]}")
    asc._latents = latent_layer.update(z, h)
    # A static layer returns its whole buffer: the valid tokens first (the new ones last among them),
    # unused slots after. The op puts the queries at the end of the keys (decode alignment), so the
    # attention gets only the valid prefix; dynamic and sliding layers return no more than that.
    asc._n_valid = min(asc._latents[0].shape[2], past + key_states.shape[-2])
    return result


def _self_attention_cache(cache):
    inner = getattr(cache, "self_attention_cache", None)  # EncoderDecoderCache
    return cache if inner is None else inner


def _follow(cache, asc):
    """Makes the latent cache follow ``cache`` (instance attributes; its class is unchanged): on
    first use, its update and its batch and length operations are wrapped so that they apply to a
    latent layer per cache layer too; then the module ``asc`` belongs to is marked as the one whose
    forward is running, so that the next update carries its latents."""
    cache = _self_attention_cache(cache)
    if not isinstance(getattr(cache, "layers", None), list) or not callable(getattr(cache, "update", None)):
        raise ASCenderUnsupportedError(
            f"ascender: {asc._where}: the cache class {type(cache).__name__} is not a transformers Cache with "
            "per-layer cache layers (.layers), so the latent cache cannot follow it; generate with use_cache=False "
            "or a transformers Cache (DynamicCache, StaticCache, ...)")
    if "_ascender_latents" not in cache.__dict__:
        cache._ascender_latents = {}  # cache layer index -> latent layer
        cache.update = types.MethodType(_update, cache)
        for name in CACHE_OPERATIONS:
            if callable(getattr(type(cache), name, None)):
                setattr(cache, name, types.MethodType(_follow_operation(name), cache))
    cache._ascender_pending = asc
    return cache


# ----------------------------------------------------------------------------------------------
# hooks


@functools.lru_cache(maxsize=None)
def _forward_parameters(cls):
    try:
        return tuple(inspect.signature(cls.forward).parameters)[1:]  # without self
    except (TypeError, ValueError):
        return ()


def _argument(module, args, kwargs, names):
    for name in names:
        if name in kwargs:
            return kwargs[name]
    params = _forward_parameters(type(module))
    for name in names:
        if name in params and params.index(name) < len(args):
            return args[params.index(name)]
    return None


def _before_attention(module, args, kwargs):
    """Forward pre-hook: the latents of the module's input tokens, aligned with the keys its
    attention will get (the KV cache's past tokens first)."""
    asc = module.ascender
    if not asc.active():
        return
    hidden = _argument(module, args, kwargs, ("hidden_states",))
    if hidden is None and args:
        hidden = args[0]
    if not isinstance(hidden, torch.Tensor):
        raise ASCenderUnsupportedError(f"ascender: {asc._where} ({type(module).__name__}) was called without "
                                       "hidden states as its first argument")
    asc._latents, asc._ran, asc._cache, asc._n_valid = asc.project(hidden), False, None, None
    cache = _argument(module, args, kwargs, CACHE_ARGUMENT_NAMES)
    if cache is not None and not isinstance(cache, (tuple, list, torch.Tensor)):
        asc._cache = _follow(cache, asc)  # the module's KV update will align the latents with the keys


def _after_attention(module, args, kwargs, output):
    """Forward hook: the module must have called the "ascender" attention function."""
    asc = module.ascender
    if asc._cache is not None:
        if asc._cache.__dict__.get("_ascender_pending") is asc:  # the module did not update the KV cache
            asc._cache._ascender_pending = None
        asc._cache = None
    if asc._latents is None:
        return output
    asc._latents = None
    if not asc._ran and asc.active():
        raise ASCenderUnsupportedError(
            f"ascender: {asc._where} ({type(module).__name__}) ran without calling the 'ascender' attention "
            "function (it does not dispatch to transformers' AttentionInterface here)")
    return output


# ----------------------------------------------------------------------------------------------
# the attention function


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
    y = ascender_attention(
        query, key, value, z.to(query.dtype), h.to(query.dtype),
        **{name: getattr(asc, name) for name in spec.SCALAR_NAMES},
        k_neighbors=asc.k, tau_sep=asc.tau_sep, tau_coh=asc.tau_coh, alpha_align=asc.alpha_align,
        alpha_coh=asc.alpha_coh, scale=scaling, variant=asc.variant, is_causal=is_causal,
        attn_mask=attn_mask, attn_bias=attn_bias, mask_stats=True,
        **_window_arguments(module, kwargs),
        softcap=kwargs.get("softcap"),
        dropout_p=float(dropout) if module.training else 0.0,  # the model's attention dropout (SPEC section 9b)
    )
    additive = attention_mask is not None and (attention_mask.dtype != torch.bool or position_bias is not None)
    if attn_mask is not None and (asc.fully_masked == "mean" or additive):
        # a row that sees no key: eager attention, and sdpa with an additive float mask (also the one it
        # builds from a position bias), add the dtype's minimum (not -inf) to every score of the row, so
        # its softmax is uniform over all the keys
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


_SDPA_CONFIGS = {}  # id(config) -> whether the converted (sub)model owning that config supports sdpa


def _note_sdpa_support(model):
    """Records, for the config of the model and of each submodel, whether that (sub)model supports sdpa
    (read by the mask function, which receives only the config)."""
    for m in model.modules():
        config = getattr(m, "config", None)
        if hasattr(m, "_supports_sdpa") and config is not None and id(config) not in _SDPA_CONFIGS:
            _SDPA_CONFIGS[id(config)] = bool(m._supports_sdpa)
            weakref.finalize(config, _SDPA_CONFIGS.pop, id(config), None)


@functools.lru_cache(maxsize=None)
def _config_class_supports_sdpa(config_class):
    try:
        from transformers import MODEL_MAPPING

        return bool(MODEL_MAPPING[config_class]._supports_sdpa)
    except Exception:  # noqa: BLE001 (no base model class known for this config class)
        return False


def _relies_on_is_causal(config):
    """Whether the model of this config supports sdpa: then transformers guarantees that a causal
    mask it skips (None) is restored by the attention modules' ``is_causal``. Models without sdpa
    only ever got materialized masks, and some of them mark causal attention is_causal=False."""
    known = _SDPA_CONFIGS.get(id(config))
    return known if known is not None else _config_class_supports_sdpa(type(config))


def _sliding_window_alone(kwargs) -> bool:
    """Whether the mask transformers asks for (sdpa_mask's keywords) is a causal sliding window and
    nothing else, over keys that are the contiguous positions ending at the last query: a
    sliding-window layer's usual mask, prefill or decoding with a dynamic cache. Then the window can
    reach the op as window_size alone (_window_arguments). Not for chunked attention (local_size is
    then the chunk), bidirectional windows, packed sequences, or/and overlays, or a static cache's
    buffer (decoding with it disallows the causal skip, and its keys need not end at the query).
    False with transformers releases whose sdpa_mask takes other keywords (the window then stays in
    the mask, as before)."""
    w, fn = kwargs.get("local_size"), kwargs.get("mask_function")
    if not isinstance(w, int) or w <= 0 or fn is None or not kwargs.get("allow_is_causal_skip") or kwargs.get("use_vmap"):
        return False
    q_len, kv_len = kwargs.get("q_length"), kwargs.get("kv_length")
    if not isinstance(q_len, int) or not isinstance(kv_len, int):
        return False
    if kwargs.get("kv_offset", 0) + kv_len != kwargs.get("q_offset", 0) + q_len:
        return False
    try:
        from transformers.masking_utils import sliding_window_causal_mask_function
    except ImportError:
        return False
    i, j, b = torch.arange(3 * w).view(-1, 1), torch.arange(3 * w).view(1, -1), torch.zeros((), dtype=torch.long)
    return torch.equal(torch.as_tensor(fn(b, b, i, j)), sliding_window_causal_mask_function(w)(b, b, i, j))


def _mask(*args, config=None, **kwargs):
    """The mask function of "ascender": sdpa's boolean masks (True = attend) for models that support
    sdpa, without the sliding window where it is alone (_sliding_window_alone: the op gets it as
    window_size, so a window builds no N x N mask and, without padding, no mask at all); for the
    others, the additive float masks of eager attention, always materialized (modules of such a
    model that bypass the interface expect them, and some mark causal attention is_causal=False;
    see _relies_on_is_causal)."""
    from transformers.masking_utils import causal_mask_function, eager_mask, sdpa_mask

    if config is not None and _relies_on_is_causal(config):
        if _sliding_window_alone(kwargs):
            kwargs.update(mask_function=causal_mask_function, local_size=None)
        return sdpa_mask(*args, config=config, **kwargs)
    kwargs.pop("allow_is_causal_skip", None)
    return eager_mask(*args, config=config, **kwargs)


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


# ----------------------------------------------------------------------------------------------
# finding the attention modules


def _bypasses_attention_interface(module):
    """Whether the module is a token self-attention that computes softmax attention itself instead
    of dispatching to the attention interface: an *Attention* class with projections (Linear or
    Conv1D children: queries and keys from the tokens; a learned query, as in pooling heads or
    depth-wise block attention, is not token self-attention) whose forward has a softmax or calls
    sdpa, and no dispatch."""
    projections = sum(type(c).__name__ in ("Linear", "Conv1D") for c in module.children())
    return projections >= 2 and _computes_attention_itself(type(module))


@functools.lru_cache(maxsize=None)
def _computes_attention_itself(cls):
    if "Attention" not in cls.__name__ and "Attn" not in cls.__name__:
        return False
    if cls.__module__.startswith("torch."):  # nn.MultiheadAttention: pooling heads (learned queries)
        return False
    if hasattr(cls, "_can_set_attn_implementation") or _calls_attention_interface(cls):
        return False
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "softmax" in source or "scaled_dot_product_attention" in source


def _calls_attention_interface(cls):
    """Whether the module class (or a class it inherits from) dispatches through transformers'
    AttentionInterface."""
    if hasattr(cls, "_can_set_attn_implementation"):  # a PreTrainedModel, not an attention module
        return False
    return any(_source_mentions(c) for c in cls.__mro__ if c not in (nn.Module, object))


@functools.lru_cache(maxsize=None)
def _source_mentions(cls):
    try:
        return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(cls)
    except (OSError, TypeError):
        return False


def _int_attribute(objects, names):
    for obj in objects:
        if obj is None:
            continue
        for name in names:
            try:
                value = getattr(obj, name, None)
            except Exception:  # noqa: BLE001 (per-layer config attributes raise on the global config)
                continue
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _owner_configs(model):
    """module name -> config of its nearest enclosing PreTrainedModel (towers of multimodal models
    have their own)."""
    owners = {}
    for name, m in model.named_modules():
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "to_dict") and hasattr(m, "_can_set_attn_implementation"):
            owners[name] = config
    return owners


def _config_of(name, owners, default):
    while True:
        if name in owners:
            return owners[name]
        if not name:
            return default
        name = name.rpartition(".")[0]


def _sizes(module, config):
    """(hidden size, query heads, head dim) of an attention module, from its attributes, else from its
    config; None where not found."""
    own_config = getattr(module, "config", None)
    n_heads = _int_attribute((module, own_config, config), N_HEADS_NAMES)
    hidden = _int_attribute((module, own_config, config), HIDDEN_NAMES)
    head_dim = _int_attribute((module, own_config, config), HEAD_DIM_NAMES)
    if head_dim is None and hidden and n_heads:
        head_dim = hidden // n_heads
    return hidden, n_heads, head_dim


def _attention_modules(model):
    """(name, module, is_cross_attention) of the modules whose forward dispatches through the
    attention interface, innermost only."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, ASCenderLatents) or not _calls_attention_interface(type(m)):
            continue
        cross = getattr(m, "is_cross_attention", False) or any(c in name.lower() for c in CROSS_ATTENTION_NAMES)
        found.append((name, m, bool(cross)))
    names = [n for n, _, _ in found]
    return [(n, m, c) for n, m, c in found if not any(o.startswith(n + ".") for o in names)]


def _named_configs(config, prefix="config"):
    yield prefix, config
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            yield from _named_configs(sub, f"{prefix}.{key}")


def _refusals(model, modules):
    """Reasons why ASCender cannot reproduce this model's attention, found before any forward."""
    reasons = {}  # reason -> where
    for where, config in _named_configs(model.config):
        for attr, reason in CONFIG_REFUSALS.items():
            value = getattr(config, attr, None)
            if value is not None:
                reasons.setdefault(reason.format(value).replace("config.", where + ".", 1), [])
    if reasons:  # the config says it for every layer
        return list(reasons)
    for name, m, cross in modules:
        if cross:
            continue
        for attr, reason in MODULE_REFUSALS.items():
            value = getattr(m, attr, None)
            if value is not None and not callable(value):
                reasons.setdefault(reason.format(value), []).append(name)
                break
    return [f"{reason} ({where[0]}{f' and {len(where) - 1} more' if len(where) > 1 else ''})"
            for reason, where in reasons.items()]


def _fail(model, reason):
    raise ASCenderUnsupportedError(f"ascender: cannot convert {type(model).__name__}: {reason}")


# ----------------------------------------------------------------------------------------------
# convert, the probe, save and reload


OPTION_NAMES = ("variant", "k", "tau_sep", "tau_coh", "alpha_align", "alpha_coh", "d_latent", "fully_masked")


def _attach(model, *, variant, omega_init, d_latent, k, tau_sep, tau_coh, alpha_align, alpha_coh, fully_masked,
            saved=None):
    """Adds the ASCender modules and hooks (no forward, no change of attention implementation);
    returns the names of the converted modules. ``saved``: the recorded modules and sizes of a
    saved conversion (name -> [hidden, heads, d_latent]), which must be this model's."""
    cls = type(model)
    if hasattr(cls, "_can_set_attn_implementation") and not cls._can_set_attn_implementation():
        _fail(model, "its attention modules do not dispatch to transformers' AttentionInterface, so the "
                     "attention implementation cannot be swapped (it would silently keep its own attention)")
    bypass = sorted({type(m).__name__ for m in model.modules() if _bypasses_attention_interface(m)})
    if bypass:
        _fail(model, f"its attention modules {bypass} compute attention themselves instead of dispatching to "
                     "transformers' AttentionInterface, so they would silently keep their own attention")
    modules = _attention_modules(model)
    if not any(not cross for _, _, cross in modules):
        _fail(model, "no self-attention module found: looked for modules whose forward calls transformers' "
                     "AttentionInterface (ALL_ATTENTION_FUNCTIONS), with sizes in the attributes "
                     f"{HEAD_DIM_NAMES} / {N_HEADS_NAMES} or in the config")
    reasons = _refusals(model, modules)
    if reasons:
        _fail(model, "; ".join(reasons))
    owners = _owner_configs(model)
    converted = []
    for name, m, cross in modules:
        if cross:  # cross-attention keeps sdpa
            m._ascender_cross_attention = True
            continue
        converted.append(name)
        if hasattr(m, "ascender"):
            continue
        config = _config_of(name, owners, model.config)
        hidden, n_heads, head_dim = _sizes(m, config)
        latent = d_latent or (max(head_dim // 2, 1) if head_dim else None)
        if saved is not None and name in saved:
            hidden, n_heads, latent = saved[name]
        if not (hidden and n_heads and latent):
            _fail(model, f"{name} ({type(m).__name__}): sizes not found (hidden {hidden}, heads {n_heads}, head dim "
                         f"{head_dim}); looked for the attributes {HIDDEN_NAMES}, {N_HEADS_NAMES} and "
                         f"{HEAD_DIM_NAMES} on the module and its config")
        _install(m, name, config, hidden, n_heads, latent,
                 dict(variant=variant, omega_init=omega_init, k=k, tau_sep=tau_sep, tau_coh=tau_coh,
                      alpha_align=alpha_align, alpha_coh=alpha_coh, fully_masked=fully_masked))
    if saved is not None and sorted(saved) != sorted(converted):
        _fail(model, f"the saved conversion has the modules {sorted(saved)}, this model {sorted(converted)}")
    return converted


def _install(m, name, config, hidden, n_heads, d_latent, options):
    ref = next(m.parameters(), None)
    asc = ASCenderLatents(hidden, n_heads, d_latent, **options)
    if ref is not None:  # the module's device and dtype (only the dtype while a loader builds the model on "meta")
        meta = asc.U.weight.is_meta or ref.is_meta
        asc = asc.to(dtype=ref.dtype) if meta else asc.to(ref.device, ref.dtype)
    asc._where, asc._config = name, getattr(m, "config", None) or config
    m.ascender = asc
    if not getattr(m, "_ascender_hooks", None):
        m._ascender_hooks = (m.register_forward_pre_hook(_before_attention, with_kwargs=True),
                             m.register_forward_hook(_after_attention, with_kwargs=True))


def _uninstall(m):
    del m.ascender
    for handle in getattr(m, "_ascender_hooks", ()):
        handle.remove()
    m._ascender_hooks = None


def _original_implementation(model):
    impl = getattr(model.config, "_attn_implementation", None)
    return impl if isinstance(impl, str) else "sdpa"


def _probe_inputs(model):
    """Tiny inputs for one forward, or None when the model's main input is not one built here."""
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    if main == "input_ids":
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None) or 2
        ids = torch.arange(3, 8).remainder(vocab).unsqueeze(0)
        inputs = {"input_ids": ids}
        if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
            inputs["decoder_input_ids"] = ids[:, :3]
    elif main == "pixel_values":
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", None)
        size = size if isinstance(size, int) else (size or [None])[0]
        channels = getattr(vision, "num_channels", 3)
        if not isinstance(size, int):
            return None
        inputs = {"pixel_values": torch.linspace(-1, 1, channels * size * size).reshape(1, channels, size, size)}
    else:
        return None
    if "use_cache" in params:
        inputs["use_cache"] = False
    device = next(model.parameters()).device
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _raised_by_ascender(error):
    """Whether the error comes from the converted attention (the hooks, the attention function or
    the op), not from the model's own code."""
    ours = {f.__code__ for f in (ascender_attention_forward, _before_attention, _after_attention, _update,
                                 ascender_attention)}
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in ours:
            return True
        tb = tb.tb_next
    return False


def _probe(model, converted):
    """One tiny forward: every converted module it reaches must run ASCender (the hooks raise
    otherwise); an error that is not ours means the probe's inputs do not suit the model, and the
    checks then happen at the model's first forward instead."""
    inputs = _probe_inputs(model)
    if inputs is None:
        return False
    training = model.training
    model.eval()
    latents = [m for m in model.modules() if isinstance(m, ASCenderLatents)]
    try:
        for m in latents:
            m._probing, m._resized = True, False
        with torch.no_grad():
            model(**inputs)
        if any(m._resized for m in latents):  # sizes corrected: check again with the final modules
            for m in latents:
                m._probing = False
            with torch.no_grad():
                model(**inputs)
    except ASCenderUnsupportedError as e:
        _fail(model, str(e).removeprefix("ascender: "))
    except Exception as e:  # noqa: BLE001
        if not _raised_by_ascender(e):  # inputs the model does not accept
            return False
        raise ASCenderUnsupportedError(f"ascender: cannot convert {type(model).__name__}: its attention fails "
                                       f"under ASCender: {type(e).__name__}: {e}") from e
    finally:
        model.train(training)
        for m in latents:
            m._latents, m._probing = None, False
    return True


def convert(model, variant="paper", omega_init=0.0, d_latent=None, k=16, tau_sep=1.0, tau_coh=1.0,
            alpha_align=-1.0, alpha_coh=-1.0, *, verify=True):
    """Adds ASCender to every self-attention module of a transformers model (in place), selects
    ``attn_implementation="ascender"`` and records the conversion in ``model.config`` (so that
    ``save_pretrained`` / :func:`from_pretrained` round-trip it). With ``verify`` (default) a tiny
    forward checks that every converted module runs ASCender. Raises :class:`ASCenderUnsupportedError`
    naming the model class and the reason when the model cannot be served. Returns the model."""
    register()
    recorded = getattr(model.config, CONFIG_KEY, None)
    options = dict(variant=variant, d_latent=d_latent, k=k, tau_sep=tau_sep, tau_coh=tau_coh, alpha_align=alpha_align,
                   alpha_coh=alpha_coh)
    if isinstance(recorded, dict) and any(isinstance(m, ASCenderLatents) for m in model.modules()):
        options = {name: recorded[name] for name in OPTION_NAMES}  # converted before: it keeps its options
    else:
        options["fully_masked"] = "mean" if _original_implementation(model) == "eager" else "zero"
    previous = model.config._attn_implementation
    had = {id(m) for m in model.modules() if hasattr(m, "ascender")}
    try:
        converted = _attach(model, omega_init=omega_init, **options)
        _finish(model, converted, options, verify)
    except Exception:  # leave the model as it was
        for m in model.modules():
            if isinstance(getattr(m, "ascender", None), ASCenderLatents) and id(m) not in had:
                _uninstall(m)
            if not had and getattr(m, "_ascender_cross_attention", False):
                del m._ascender_cross_attention
        if model.config._attn_implementation != previous:
            model.set_attn_implementation(previous)
        if recorded is None:
            model.config.__dict__.pop(CONFIG_KEY, None)
        else:
            setattr(model.config, CONFIG_KEY, recorded)
        raise
    return model


def _finish(model, converted, options, verify):
    _note_sdpa_support(model)
    model.set_attn_implementation(NAME)
    if model.config._attn_implementation != NAME:
        _fail(model, "transformers did not switch it to the 'ascender' attention implementation")
    if verify:
        _probe(model, converted)
    sizes = {name: [m.ascender.hidden_size, m.ascender.n_heads, m.ascender.d_latent]
             for name, m in model.named_modules() if name in converted}
    setattr(model.config, CONFIG_KEY, dict(version=FORMAT_VERSION, **options, modules=sizes))


def _model_class(model_class, config):
    """The model class an Auto class builds for ``config`` (the saved architecture when the Auto
    class has no entry for this config class)."""
    import transformers

    if not hasattr(model_class, "_model_mapping"):
        return model_class
    if type(config) in model_class._model_mapping:
        from transformers.models.auto.auto_factory import _get_model_class

        return _get_model_class(config, model_class._model_mapping)
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise ValueError(f"ascender: {model_class.__name__} has no model class for {type(config).__name__}; pass the "
                     "model class itself")


def from_pretrained(model_class, path, *args, **kwargs):
    """Loads a model saved with ``save_pretrained`` after :func:`convert`, converted, with its
    ASCender weights: ``hf.from_pretrained(AutoModelForCausalLM, path)`` (an Auto class or a model
    class; further arguments go to its ``from_pretrained``). The logits equal the saved model's."""
    import transformers

    config = kwargs.pop("config", None)
    if config is None:
        hub = {key: kwargs[key] for key in ("revision", "token", "cache_dir", "local_files_only",
                                            "trust_remote_code", "subfolder") if key in kwargs}
        config = transformers.AutoConfig.from_pretrained(path, **hub)
    recorded = getattr(config, CONFIG_KEY, None)
    if not isinstance(recorded, dict):
        raise ValueError(f"ascender: {path} holds no ASCender conversion (no '{CONFIG_KEY}' entry in its config); "
                         "load it normally and call hf.convert")
    if recorded.get("version", 1) > FORMAT_VERSION:
        raise ValueError(f"ascender: {path} was saved by a newer ascender_torch (format {recorded['version']})")
    options = {name: recorded[name] for name in OPTION_NAMES}
    cls = _model_class(model_class, config)

    def __init__(self, config, *a, **kw):  # noqa: N807 (the model is built with its ASCender modules)
        cls.__init__(self, config, *a, **kw)
        _attach(self, omega_init=0.0, saved=recorded["modules"], **options)

    loading = type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
    register()
    model, info = loading.from_pretrained(path, *args, config=config, output_loading_info=True, **kwargs)
    model.__class__ = cls
    missing = [key for key in info.get("missing_keys", ()) if ".ascender." in f".{key}"]
    if missing:
        more = " ..." if len(missing) > 4 else ""
        raise ValueError(f"ascender: {path} lacks the ASCender weights {missing[:4]}{more}")
    _finish(model, list(recorded["modules"]), options, verify=False)
    return model
