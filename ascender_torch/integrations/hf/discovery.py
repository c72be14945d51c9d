"""Finding a model's attention modules, their sizes, and the reasons, known before any forward,
why ASCender cannot serve the model."""

from __future__ import annotations

import functools
import inspect

from torch import nn

from .latents import ASCenderLatents

# What the op does not implement, found before any forward (attention.UNSUPPORTED_ARGUMENTS finds it
# at the probe): config attributes (at any depth of the config) and attributes or parameters of an
# attention module, each with the reason convert gives. None today: attention sinks ('sinks', 's_aux'),
# refused here until the op had them (SPEC section 12), now reach the op.
CONFIG_REFUSALS = {}
MODULE_REFUSALS = {}

# names under which attention modules keep their sizes (first match wins)
HEAD_DIM_NAMES = ("head_dim", "head_size", "attention_head_size", "key_value_proj_dim", "d_kv", "qk_head_dim",
                  "attn_head_size", "dim_head", "kv_channels")
N_HEADS_NAMES = ("num_heads", "num_attention_heads", "n_heads", "n_head", "num_q_heads", "heads")
HIDDEN_NAMES = ("hidden_size", "embed_dim", "d_model")
CROSS_ATTENTION_NAMES = ("encoder_attn", "crossattention", "cross_attn", "encdecattention")


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
    attention interface, innermost only. A module whose parameters are all its own (a learned query,
    no child projecting the tokens: Inkling 2's depth-wise attention residuals over its layers' block
    states) is not token self-attention either: it keeps sdpa, as cross-attention does."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, ASCenderLatents) or not _calls_attention_interface(type(m)):
            continue
        cross = getattr(m, "is_cross_attention", False) or any(c in name.lower() for c in CROSS_ATTENTION_NAMES)
        learned = not any(next(c.parameters(), None) is not None for c in m.children())
        found.append((name, m, bool(cross or learned)))
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
