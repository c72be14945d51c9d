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
(Falcon, BLOOM, MPT, ...), its attention gets keys that are not tokens (DeepSeek V4), or it needs
something the op lacks (block-sparse attention).
Attention sinks (GPT-OSS's per-head ``sinks``, passed to the interface as ``s_aux``; Inkling 2's
one per query, ``[B, H, Nq, 1]`` from the hidden states) reach the op's ``sinks`` (shared/SPEC.md
section 12, per row as docs/backward.md extends it).

Save and reload: ``model.save_pretrained(path)`` writes the conversion into ``config.json``
(entry ``"ascender"``) and the ASCender weights with the others (safetensors), and makes the
checkpoint loadable the Hugging Face way for custom architectures (save.py): config.json's
``model_type`` "ascender", an ``auto_map`` and a small ``modeling_ascender.py`` beside the weights
that imports the loaders of load.py. ``AutoModelForCausalLM.from_pretrained(path,
trust_remote_code=True)`` (or the model's other Auto classes), and ``hf.from_pretrained(cls, path)``
with an Auto class or the model class, return the converted model bit-identical to the saved one;
without ``trust_remote_code`` the Auto classes refuse the checkpoint (transformers asks for it).

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

Files: ``latents.py`` (the per-layer state ASCenderLatents), ``hooks.py`` (capturing the hidden
states), ``cache.py`` (the latent cache), ``attention.py`` (the attention function and the
registration), ``masks.py`` (the mask function), ``discovery.py`` (finding the attention modules
and the refusals), ``convert.py`` (convert and its probe), ``save.py`` and ``load.py`` (saving and
reloading a conversion).
"""

from __future__ import annotations

from .attention import UNSUPPORTED_ARGUMENTS, ascender_attention_forward, register
from .convert import OPTION_NAMES, convert
from .discovery import CONFIG_REFUSALS, MODULE_REFUSALS
from .latents import NAME, ASCenderLatents, ASCenderUnsupportedError
from .load import from_pretrained
from .save import CONFIG_KEY, FORMAT_VERSION

__all__ = ["ASCenderLatents", "ASCenderUnsupportedError", "CONFIG_KEY", "CONFIG_REFUSALS", "FORMAT_VERSION",
           "MODULE_REFUSALS", "NAME", "OPTION_NAMES", "UNSUPPORTED_ARGUMENTS", "ascender_attention_forward", "convert",
           "from_pretrained", "register"]
