"""The mask function of "ascender": sdpa's boolean masks for models that support sdpa (without a
sliding window the op takes as window_size), eager attention's additive masks for the others."""

from __future__ import annotations

import functools
import weakref

import torch

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
