"""Hugging Face integration on tiny random models built here (no downloads): Llama (with
grouped-query attention), GPT-2 and BERT."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("ascender_torch.integrations.hf")


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    return transformers.BertForMaskedLM(cfg)


MODELS = {"llama": _llama, "gpt2": _gpt2, "bert": _bert}


def _inputs(padded=False):
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 12, dtype=torch.long)
    if padded:
        mask[1, :3] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("arch", MODELS)
@pytest.mark.parametrize("padded", [False, True])
def test_zero_omega_keeps_the_logits(arch, padded):
    torch.manual_seed(0)
    model = MODELS[arch]().eval()
    ids, mask = _inputs(padded)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        hf.convert(model, omega_init=0.0)
        assert model.config._attn_implementation == "ascender"
        got = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()  # padded positions' outputs are not compared
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", MODELS)
def test_converted_model_trains(arch):
    torch.manual_seed(0)
    model = hf.convert(MODELS[arch](), omega_init=0.1)
    n_ascender = sum(p.numel() for n, p in model.named_parameters() if ".ascender." in n)
    assert n_ascender > 0
    ids, mask = _inputs()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None for n, p in model.named_parameters() if ".ascender." in n)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_generate_with_cache_equals_recompute(arch):
    torch.manual_seed(0)
    model = hf.convert(MODELS[arch](), omega_init=0.5).eval()  # biases on
    prompt = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(4))
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kw)
        recomputed = model.generate(prompt, use_cache=False, **kw)
    assert cached.shape == (1, 13)
    assert torch.equal(cached, recomputed)


def test_set_attn_implementation_selects_ascender_after_conversion():
    torch.manual_seed(0)
    model = hf.convert(_llama(), omega_init=0.3).eval()
    ids, mask = _inputs()
    with torch.no_grad():
        asc = model(input_ids=ids, attention_mask=mask).logits
        model.set_attn_implementation("sdpa")
        sdpa = model(input_ids=ids, attention_mask=mask).logits
        model.set_attn_implementation("ascender")
        again = model(input_ids=ids, attention_mask=mask).logits
    assert not torch.allclose(asc, sdpa)
    torch.testing.assert_close(again, asc, rtol=0, atol=0)


def test_unconverted_module_gives_a_clear_error():
    hf.register()
    model = _llama()
    model.set_attn_implementation("ascender")
    with pytest.raises(RuntimeError, match="was not converted"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))


def test_beam_search_with_cache_equals_recompute():
    """Beam search reorders the KV cache's rows; the latent cache must follow them."""
    torch.manual_seed(0)
    model = hf.convert(_llama(), omega_init=2.0).eval()
    prompt = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(5))
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=4, pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kw)
        recomputed = model.generate(prompt, use_cache=False, **kw)
    assert torch.equal(cached, recomputed)


def _bart():
    cfg = transformers.BartConfig(vocab_size=50, d_model=32, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64)
    return transformers.BartForConditionalGeneration(cfg)


def _t5():
    cfg = transformers.T5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
                                num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


@pytest.mark.parametrize("make", [_bart, _t5], ids=["bart", "t5"])
def test_encoder_decoder_cross_attention_keeps_sdpa(make):
    """Self-attention is converted, cross-attention keeps sdpa; T5's relative position bias
    reaches the op as beta^(other)."""
    torch.manual_seed(0)
    model = make().eval()
    src = torch.randint(3, 50, (2, 9), generator=torch.Generator().manual_seed(6))
    tgt = torch.randint(3, 50, (2, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(input_ids=src, decoder_input_ids=tgt).logits
        hf.convert(model, omega_init=0.0)
        got = model(input_ids=src, decoder_input_ids=tgt).logits
    converted = [n for n, m in model.named_modules() if hasattr(m, "ascender")]
    assert converted and not any("encoder_attn" in n or "EncDec" in n for n in converted)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    hf.convert(model, omega_init=0.5)  # idempotent: already converted modules are kept
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "ascender"):
                m.ascender.omega_coh.fill_(0.5)
        kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, num_beams=1)
        assert torch.equal(model.generate(src, use_cache=True, **kw), model.generate(src, use_cache=False, **kw))


def test_unsupported_attention_arguments_raise():
    torch.manual_seed(0)
    model = hf.convert(_llama())
    attn = next(m for m in model.modules() if hasattr(m, "ascender"))
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(NotImplementedError, match="'softcap' is not supported"):
        hf.ascender_attention_forward(attn, q, q[:, :2], q[:, :2], None, softcap=30.0)
