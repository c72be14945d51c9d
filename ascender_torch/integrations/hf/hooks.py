"""The hooks of a converted attention module: a forward pre-hook that computes the latents of its
input tokens (and hands them to the latent cache), and a forward hook that checks that the module
called the "ascender" attention function."""

from __future__ import annotations

import functools
import inspect

import torch

from .cache import _follow
from .latents import ASCenderUnsupportedError

CACHE_ARGUMENT_NAMES = ("past_key_values", "past_key_value", "layer_past", "cache")


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
