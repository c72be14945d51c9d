"""Tiny random-weight transformers models for the Hugging Face tests and the architecture sweep
(tests/hf_sweep.py): a model type's default config from ``AutoConfig.for_model`` with every size
it has made small. No downloads."""

from __future__ import annotations

import contextlib
import io
import warnings

import torch

VOCAB = 96

# size attributes and their tiny values; only those a config already has are set
SMALL = {
    # widths
    "hidden_size": 32, "n_embd": 32, "d_model": 32, "embed_dim": 32, "dim": 32, "n_embed": 32,
    "word_embed_proj_dim": 32, "embedding_size": 32, "hidden_dim": 32, "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": 96,
    "intermediate_size": 64, "n_inner": 64, "ffn_dim": 64, "decoder_ffn_dim": 64, "encoder_ffn_dim": 64,
    "ffn_hidden_size": 64, "d_ff": 64, "dim_ff": 64, "dff": 64, "intermediate_size_mlp": 64,
    "dense_intermediate_size": 64, "feed_forward_size": 64,
    # heads
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4, "num_key_value_heads": 2, "num_kv_heads": 2, "head_dim": 8, "kv_channels": 8,
    "d_kv": 8, "attention_head_dim": 8, "attention_head_size": 8, "dim_head": 8,
    "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 8,
    # multi-head latent attention (DeepSeek style)
    "qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "qk_head_dim": 8, "v_head_dim": 8, "kv_lora_rank": 16,
    "q_lora_rank": 16, "o_lora_rank": 16,
    # layers
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2,
    "encoder_layers": 2, "num_decoder_layers": 2, "num_encoder_layers": 2,
    # positions and windows (a window smaller than the test sequences, so that it matters)
    "max_position_embeddings": 128, "n_positions": 128, "n_ctx": 128, "max_seq_len": 128,
    "max_source_positions": 128, "max_target_positions": 128, "sliding_window": 5,
    "attention_chunk_size": 5, "sliding_window_size": 5,
    # mixture of experts
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "shared_intermediate_size": 32,
    "expert_ffn_hidden_size": 32, "moe_shared_expert_intermediate_size": 32, "shared_experts_intermediate_size": 32,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "moe_k": 2, "num_experts_per_token": 2, "n_group": 1, "topk_group": 1,
    "rotary_dim": 4,
    # sparse-attention indexers
    "index_head_dim": 8, "index_n_heads": 2, "index_topk": 4,
    # state-space and linear-attention layers of hybrid models
    "mamba_d_state": 8, "mamba_n_heads": 4, "mamba_d_head": 8, "mamba_head_dim": 8, "mamba_num_heads": 4,
    "mamba_d_ssm": 32, "state_size": 8, "ssm_state_size": 8, "mamba_dt_rank": 4, "time_step_rank": 4,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_head_dim": 8, "linear_num_heads": 4, "mamba_chunk_size": 8, "chunk_size": 8,
}
# sizes set even where the default config leaves them None (the model would otherwise derive them from
# the large defaults)
SET_IF_NONE = ("head_dim", "num_key_value_heads", "num_experts_per_tok")
# per model type: settings without which the tiny model has no attention layer or does not build
PER_TYPE = {
    "jamba": dict(attn_layer_offset=1, attn_layer_period=2),
    "zaya": dict(num_experts_per_tok=1),
    "kimi_linear": dict(mlp_layer_types=["dense", "sparse"]),
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=4,
                           indexer_compress_ratio=2),
    "dots1": dict(n_routed_experts=4, n_shared_experts=1),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    "gpt_neo": dict(attention_layers=["global", "local"], window_size=5),
    # hybrids of state-space and attention layers: one of each
    "zamba2": dict(layers_block_type=["linear_attention", "hybrid"], hybrid_layer_ids=[1], mamba_headdim=8,
                   n_mamba_heads=8),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16),
    "granitemoehybrid": dict(layer_types=["linear_attention", "attention"], mamba_n_heads=4, mamba_d_head=16),
    "nemotron_h": dict(layers_block_type=["linear_attention", "full_attention"], mamba_num_heads=4,
                       mamba_head_dim=16, n_groups=1),
    # Gemma 3n / 4: four layers, the last two reusing the first two's KV cache; Gemma 4's full-attention
    # layers with a larger head (as in the real configs)
    "gemma4_text": dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                        num_kv_shared_layers=2, per_layer_config={"1": {"head_dim": 16}, "3": {"head_dim": 16}}),
    # Inkling 2: the LM head's rows are unpadded_vocab_size, not vocab_size
    "inkling2_text": dict(unpadded_vocab_size=VOCAB),
    "inkling2_loop_text": dict(unpadded_vocab_size=VOCAB),
    "gemma3n_text": dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                         num_kv_shared_layers=2, intermediate_size=[64] * 4, activation_sparsity_pattern=[0.0] * 4),
}
TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 0,
             "sep_token_id": 2, "cls_token_id": 1}


def _small_kwargs(config, overrides):
    """kwargs that make ``config`` tiny: the SMALL entries it has, token ids inside the vocabulary,
    a shortened layer_types list that keeps every kind of layer, sub-configs likewise."""
    d = config.to_dict()
    kw = {k: v for k, v in SMALL.items() if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)}
    kw.update({k: SMALL[k] for k in SET_IF_NONE if k in d and d[k] is None})
    if "qk_rope_head_dim" in kw:  # multi-head latent attention: RoPE on qk_rope_head_dim, no grouped heads
        if "head_dim" in kw:
            kw["head_dim"] = kw["qk_rope_head_dim"]
        if "num_key_value_heads" in kw:
            kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)
    if "vocab_size" in d:
        kw["vocab_size"] = VOCAB
    for k, v in TOKEN_IDS.items():
        if k in d and d[k] is not None:
            kw[k] = v
    n_layers = next((kw[k] for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers") if k in kw), None)
    if isinstance(d.get("layer_types"), list) and len(set(d["layer_types"])) > 1 and n_layers is not None:
        kinds = list(dict.fromkeys(d["layer_types"]))
        if len(kinds) > n_layers:
            n_layers = len(kinds)
            for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
                if k in kw:
                    kw[k] = n_layers
        kw["layer_types"] = [kinds[i % len(kinds)] for i in range(n_layers)]
    for k, v in d.items():
        try:
            sub = getattr(config, k, None)
        except Exception:  # noqa: BLE001 (per-layer attributes of heterogeneous configs)
            continue
        if isinstance(v, dict) and hasattr(sub, "to_dict") and k not in overrides:
            kw[k] = {**sub.to_dict(), **_small_kwargs(sub, {})}
    kw.update(PER_TYPE.get(getattr(config, "model_type", None), {}))
    kw.update(overrides)
    return kw


def tiny_config(model_type, **overrides):
    """A tiny config of ``model_type`` (AutoConfig.for_model with the SMALL sizes), float32."""
    from transformers import AutoConfig

    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        default = AutoConfig.for_model(model_type)
        return AutoConfig.for_model(model_type, **_small_kwargs(default, overrides))


def tiny_model(model_type, auto="AutoModelForCausalLM", seed=0, **overrides):
    """A tiny random-weight model of ``model_type`` built through the given Auto class, in eval mode."""
    import transformers

    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        model = getattr(transformers, auto).from_config(config)
    return model.eval()
