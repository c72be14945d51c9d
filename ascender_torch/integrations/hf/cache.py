"""The latent cache: per converted layer, a cache layer of the KV cache layer's own class inside the
cache object, which receives (z, h) where the KV layer receives (k, v) and follows the cache's
batch and length operations."""

from __future__ import annotations

import copy
import types

import torch

from .latents import ASCenderUnsupportedError

# the cache methods that change which tokens or batch rows the cache holds; the latent layers follow them
CACHE_OPERATIONS = ("reset", "reorder_cache", "crop", "batch_repeat_interleave", "batch_select_indices",
                    "activate_past_recording")


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
