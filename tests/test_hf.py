"""Hugging Face integration over a table of architectures, each a tiny random-weight model built
from ``AutoConfig.for_model`` (tests/hf_models.py; no downloads). For every architecture:
convert; with omega 0 the outputs equal the original's (also with left padding, padded rows
included) and so do greedy and beam generation; with the biases on, cached generation equals
generation without cache (the latent cache follows the KV cache: sliding windows, static caches,
beam reordering, left padding); training gradients are finite; save_pretrained / from_pretrained
gives the same outputs. Models ASCender cannot serve are refused at convert time.
tests/hf_sweep.py runs the same checks over every causal-LM architecture of the installed
transformers (not part of the suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("ascender_torch.integrations.hf")

from hf_models import VOCAB, tiny_model  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)
VISION = dict(image_size=32, patch_size=8)

# name: (model type, Auto class, config overrides). Sliding windows are 5 tokens (hf_models.SMALL),
# shorter than the prompts, so that the windows matter in prefill and in decoding.
DECODERS = {
    "llama": ("llama", {}),
    "gpt2": ("gpt2", {}),
    "qwen2": ("qwen2", {}),
    "qwen2_sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=5, max_window_layers=1)),
    "qwen3": ("qwen3", {}),
    "phi3": ("phi3", {}),
    "opt": ("opt", {}),
    "mixtral": ("mixtral", {}),
    "qwen2_moe": ("qwen2_moe", {}),
    "mistral": ("mistral", {}),  # sliding window on every layer
    "gemma2": ("gemma2", {}),  # attention logit softcapping 50, eager by default, alternating windows
    "gemma2_no_softcap": ("gemma2", dict(attn_logit_softcapping=None)),
    "gemma3_text": ("gemma3_text", {}),
    "gemma4_text": ("gemma4_text", {}),  # KV sharing across layers, per-layer head sizes
    "gpt_neox": ("gpt_neox", {}),  # head size in `head_size`
    "zamba2": ("zamba2", {}),  # Mamba 2 + a shared attention block fed 2 x hidden (sizes found by the probe)
    "gpt_oss": ("gpt_oss", {}),  # attention sinks (s_aux, SPEC section 12), alternating windows, eager by default
    "inkling2_text": ("inkling2_text", {}),  # sinks per query from the hidden states ([B, H, Nq, 1]: per-row sinks)
    "inkling2_loop_text": ("inkling2_loop_text", {}),  # Inkling 2's loop variant, the same sinks
}
OTHERS = {
    "bert": ("bert", "AutoModelForMaskedLM", {}),
    "t5": ("t5", "AutoModelForSeq2SeqLM", dict(decoder_start_token_id=0)),
    "vit": ("vit", "AutoModelForImageClassification", VISION),
    "clip_vision_model": ("clip_vision_model", "AutoModel", VISION),
}
ARCHS = {name: (mt, "AutoModelForCausalLM", over) for name, (mt, over) in DECODERS.items()} | OTHERS


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: the op's OpenMP threads cost more than they bring (on a loaded
    two-core machine a two-thread call of this size waits ~0.2 s on the other thread, one thread
    takes ~2 ms), so the integration tests run single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(name, **overrides):
    model_type, auto, over = ARCHS[name]
    return tiny_model(model_type, auto, **{**over, **overrides})


def _inputs(name, padded=True, batch=2, n=10):
    """Model inputs: token ids with the second row left-padded by 3, or images."""
    model_type, auto, over = ARCHS[name]
    g = torch.Generator().manual_seed(1)
    if "image_size" in over:
        return dict(pixel_values=torch.randn(batch, 3, over["image_size"], over["image_size"], generator=g))
    ids = torch.randint(3, VOCAB, (batch, n), generator=g)
    mask = torch.ones(batch, n, dtype=torch.long)
    if padded:
        mask[1, :3] = 0
    inputs = dict(input_ids=ids, attention_mask=mask)
    if auto == "AutoModelForSeq2SeqLM":
        inputs["decoder_input_ids"] = torch.randint(3, VOCAB, (batch, 5), generator=g)
    return inputs


def _output(model, inputs):
    with torch.no_grad():
        out = model(**inputs, **({"use_cache": False} if "input_ids" in inputs else {}))
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _generate(model, inputs, **kw):
    kw = dict(max_new_tokens=7, min_new_tokens=7, do_sample=False, pad_token_id=0, **kw)
    with torch.no_grad():
        return model.generate(**{k: v for k, v in inputs.items() if k != "decoder_input_ids"}, **kw)


def _set_omega(model, value):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, hf.ASCenderLatents):
                for name in ("omega_align", "omega_sep", "omega_coh"):
                    getattr(m, name).fill_(value)


def _can_generate(name):
    return ARCHS[name][1] in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM")


# ---------------------------------------------------------------------------------------------
# the table


@pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])
@pytest.mark.parametrize("name", ARCHS)
def test_zero_omega_keeps_the_outputs(name, padded):
    """Every position, padded ones included: rows that see no key return what the original
    attention returns there (zero for sdpa, the mean of the values for eager attention)."""
    model = _model(name)
    inputs = _inputs(name, padded)
    want = _output(model, inputs)
    hf.convert(model, omega_init=0.0)
    assert model.config._attn_implementation == "ascender"
    assert any(isinstance(m, hf.ASCenderLatents) for m in model.modules())
    torch.testing.assert_close(_output(model, inputs), want, **TOL)


@pytest.mark.parametrize("name", [n for n in ARCHS if _can_generate(n)])
def test_zero_omega_generates_like_the_original(name):
    """Greedy on a left-padded batch, and beam search, with the model's default cache (sliding
    windows exceeded: prompt 10 tokens, window 5)."""
    model = _model(name)
    inputs = _inputs(name)
    want = [_generate(model, inputs), _generate(model, inputs, num_beams=3)]
    hf.convert(model, omega_init=0.0)
    got = [_generate(model, inputs), _generate(model, inputs, num_beams=3)]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("name", [n for n in ARCHS if _can_generate(n)])
def test_latent_cache_follows_the_kv_cache(name):
    """Biases on: cached generation (greedy, left-padded; beam search, which reorders the cache)
    equals generation that recomputes everything."""
    model = hf.convert(_model(name), omega_init=0.5)
    inputs = _inputs(name)
    for kw in ({}, dict(num_beams=3)):
        assert torch.equal(_generate(model, inputs, use_cache=True, **kw),
                           _generate(model, inputs, use_cache=False, **kw)), kw


@pytest.mark.parametrize("name", ARCHS)
def test_training_gradients_are_finite(name):
    model = hf.convert(_model(name), omega_init=0.1).train()
    inputs = _inputs(name)
    out = model(**inputs)
    loss = out.logits.float().square().mean() if getattr(out, "logits", None) is not None else \
        out.last_hidden_state.square().mean()
    loss.backward()
    ascender = [(n, p) for n, p in model.named_parameters() if ".ascender." in n]
    assert ascender
    for n, p in model.named_parameters():
        assert p.grad is None or bool(torch.isfinite(p.grad).all()), n
    # every converted module gets gradients, except those reusing another layer's keys and latents
    users = [m for m in model.modules() if isinstance(m, hf.ASCenderLatents) and not m.latents_from]
    assert users and all(p.grad is not None for m in users for p in m.parameters())


def test_attention_dropout_of_the_model_in_training_mode():
    """GPT-2's attn_pdrop reaches the op (SPEC section 9b) in training mode only, drawn from torch's
    generator; the model's other dropouts are off, so the attention's is all that varies."""
    model = hf.convert(_model("gpt2", attn_pdrop=0.5, resid_pdrop=0.0, embd_pdrop=0.0), omega_init=0.1)
    inputs = _inputs("gpt2")
    want = _output(model.eval(), inputs)
    model.train()
    torch.manual_seed(3)
    a, b = _output(model, inputs), _output(model, inputs)
    assert not torch.allclose(a, want) and not torch.allclose(a, b)
    torch.manual_seed(3)
    assert torch.equal(_output(model, inputs), a)
    for m in model.modules():  # the attention's dropout off: training mode gives the eval outputs
        if isinstance(getattr(m, "attn_dropout", None), torch.nn.Dropout):
            m.attn_dropout.p = 0.0
    torch.testing.assert_close(_output(model, inputs), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ARCHS)
def test_save_and_reload(name, tmp_path):
    model = hf.convert(_model(name), omega_init=0.3)
    inputs = _inputs(name)
    with torch.no_grad():
        for m in model.modules():  # trained-looking values, so that a lost weight shows
            if isinstance(m, hf.ASCenderLatents):
                m.lambda_sep.add_(torch.rand_like(m.lambda_sep))
    want = _output(model, inputs)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    auto = getattr(transformers, ARCHS[name][1])
    again = hf.from_pretrained(auto, tmp_path).eval()
    assert type(again) is type(model) and again.config._attn_implementation == "ascender"
    torch.testing.assert_close(_output(again, inputs), want, rtol=0, atol=0)
    assert again.config.ascender == model.config.ascender


# ---------------------------------------------------------------------------------------------
# caches


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3_text", "gemma2_no_softcap", "gemma4_text", "zamba2",
                                  "gpt_oss"])
def test_static_cache(name):
    """Static caches (static sliding-window layers too) return their whole buffer; the attention
    gets the valid prefix."""
    model = _model(name)
    inputs = _inputs(name)
    want = _generate(model, inputs, cache_implementation="static")
    hf.convert(model, omega_init=0.0)
    assert torch.equal(_generate(model, inputs, cache_implementation="static"), want)
    _set_omega(model, 0.5)
    assert torch.equal(_generate(model, inputs, cache_implementation="static"),
                       _generate(model, inputs, use_cache=False))


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_cache_operations_are_followed(name):
    """crop (with past recording on a sliding-window cache) and batch selection reach the latent
    cache; continuing after them equals recomputation."""
    model = hf.convert(_model(name), omega_init=0.5)
    inputs = _inputs(name)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    cache = transformers.DynamicCache(config=model.config)
    cache.activate_past_recording()
    with torch.no_grad():
        model(**inputs, past_key_values=cache)
        cache.crop(-2)  # drop the last two tokens
        cache.batch_select_indices(torch.tensor([1]))
        step = model(input_ids=ids[1:, 8:], attention_mask=mask[1:], past_key_values=cache).logits[:, -1]
        full = model(input_ids=ids[1:], attention_mask=mask[1:], use_cache=False).logits[:, -1]
    torch.testing.assert_close(step, full, **TOL)


def test_cache_filled_by_another_model_is_refused():
    model = _model("llama")
    inputs = _inputs("llama")
    with torch.no_grad():
        cache = model(**inputs, use_cache=True).past_key_values  # filled by the original model
        hf.convert(model)
        nxt = dict(input_ids=inputs["input_ids"][:, :1], attention_mask=torch.ones(2, 11, dtype=torch.long))
        with pytest.raises(RuntimeError, match="already holds 10 tokens that the converted model did not process"):
            model(**nxt, past_key_values=cache)


def test_cache_changed_behind_the_latent_cache_is_named():
    model = hf.convert(_model("llama"), omega_init=0.5)
    inputs = _inputs("llama")
    with torch.no_grad():
        cache = model(**inputs, use_cache=True).past_key_values
        cache.layers[0].crop(-1)  # a layer changed directly, not through the cache
        nxt = dict(input_ids=inputs["input_ids"][:, :1], attention_mask=torch.ones(2, 10, dtype=torch.long))
        with pytest.raises(RuntimeError, match="holds 9 past tokens but its latent cache 10"):
            model(**nxt, past_key_values=cache)


# ---------------------------------------------------------------------------------------------
# what convert refuses, and its messages


@pytest.mark.parametrize("model_type, reason", [
    ("falcon", "do not dispatch to transformers' AttentionInterface"),
    ("deepseek_v4", "attends over 6 keys for 5 tokens: keys that are not tokens"),
])
def test_convert_refuses_what_it_cannot_serve(model_type, reason):
    model = tiny_model(model_type)
    with pytest.raises(hf.ASCenderUnsupportedError, match=f"cannot convert {type(model).__name__}: .*{reason}"):
        hf.convert(model)
    assert model.config._attn_implementation != "ascender"


@pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])
@pytest.mark.parametrize("name", ["mistral", "qwen2_sliding", "gemma3_text"])
def test_sliding_windows_reach_the_op_as_window_size_not_as_a_mask(name, padded, monkeypatch):
    """Issue 16 item 2: a sliding-window layer's window (5 tokens, prompts of 10) reaches the op as
    window_size, and its mask leaves the window out: no mask at all without padding, the causal
    padding mask with left padding (the last query of the unpadded row still sees key 0, 9 tokens
    back). The outputs equal the original model's (omega 0)."""
    calls, op = [], hf.attention.ascender_attention

    def recording(*args, **kwargs):
        calls.append((kwargs.get("window_size"), kwargs.get("attn_mask")))
        return op(*args, **kwargs)

    model = _model(name)
    inputs = _inputs(name, padded)
    want = _output(model, inputs)
    hf.convert(model, omega_init=0.0)
    monkeypatch.setattr(hf.attention, "ascender_attention", recording)
    torch.testing.assert_close(_output(model, inputs), want, **TOL)
    windowed = [mask for window, mask in calls if window is not None]
    assert windowed and all(window == (4, 0) for window, _ in calls if window is not None)
    for mask in windowed:
        if padded:
            assert mask is not None and bool(mask[0, ..., -1, 0].all())
        else:
            assert mask is None


@pytest.mark.parametrize("version, ok", [("5.19.2", False), ("4.57.6", False), ("5.20.0", True), ("6.0.0.dev0", True)])
def test_transformers_older_than_the_floor_is_refused(version, ok, monkeypatch):
    """tests/test_hf.py fails with transformers 5.17 to 5.19 (a T5 test) and more with 5.10, 5.0 and
    4.57 (measured 2026-11-23): those releases get an ImportError naming the floor, not a failure
    in the middle of a forward."""
    monkeypatch.setattr("transformers.__version__", version)
    if ok:
        hf.register()
    else:
        with pytest.raises(ImportError, match=r"needs transformers >= 5\.20, found " + version.replace(".", r"\.")):
            hf.register()


def test_gemma2_attention_softcapping():
    """Gemma 2's default attn_logit_softcapping=50 reaches the op as softcap (shared/SPEC.md section
    9): its omega-0 outputs equal the original's."""
    model = tiny_model("gemma2")
    assert model.config.attn_logit_softcapping == 50.0
    inputs = _inputs("gemma2_no_softcap")
    want = _output(model, inputs)
    hf.convert(model, omega_init=0.0)
    torch.testing.assert_close(_output(model, inputs), want, **TOL)


def test_no_attention_module_says_what_was_looked_for():
    model = transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1))
    with pytest.raises(hf.ASCenderUnsupportedError, match="MambaForCausalLM: no self-attention module found: looked"):
        hf.convert(model)


def test_module_that_bypasses_the_interface_is_caught():
    """A converted module whose forward does not reach the "ascender" attention function raises
    (the probe at convert time; the forward hook at every later forward)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = hf.convert(_model("llama"))
    attn = model.model.layers[1].self_attn
    original = attn.forward

    def forward(*args, **kwargs):  # the module's own code, with sdpa called directly
        transformers.AttentionInterface.register("ascender", sdpa_attention_forward)
        try:
            return original(*args, **kwargs)
        finally:
            hf.register()

    attn.forward = forward
    with pytest.raises(hf.ASCenderUnsupportedError, match=r"model.layers.1.self_attn \(LlamaAttention\) ran without"):
        _output(model, _inputs("llama"))


def test_checkpoint_of_format_1_still_loads(tmp_path):
    """A checkpoint written by transformers' own save_pretrained (format 1: the model's own model_type,
    no auto_map, no loader module) loads with hf.from_pretrained as before."""
    model = hf.convert(_model("llama"), omega_init=0.3)
    inputs = _inputs("llama")
    type(model).save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama"
    again = hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path).eval()
    torch.testing.assert_close(_output(again, inputs), _output(model, inputs), rtol=0, atol=0)


def test_save_pretrained_with_push_to_hub_is_refused(tmp_path):
    """It would upload before config.json and modeling_ascender.py are written; model.push_to_hub saves
    through the converted save_pretrained first."""
    model = hf.convert(_model("llama"))
    with pytest.raises(ValueError, match=r"call model.push_to_hub\(repo_id\)"):
        model.save_pretrained(tmp_path, push_to_hub=True)
    assert not (tmp_path / "config.json").exists()


def test_from_pretrained_needs_a_converted_checkpoint(tmp_path):
    _model("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds no ASCender conversion"):
        hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)


def test_bf16_model():
    """bf16 on the CPU (the block-wise backend computes it in float32): the omega-0 outputs match the
    original within bf16 tolerance."""
    model = _model("llama").to(torch.bfloat16)
    inputs = _inputs("llama")
    want = _output(model, inputs).float()
    hf.convert(model, omega_init=0.0)
    with warnings.catch_warnings():  # the one-time note that bf16 runs block-wise (test_blockwise checks it)
        warnings.simplefilter("ignore", RuntimeWarning)
        got = _output(model, inputs).float()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_unsupported_attention_arguments_raise():
    model = hf.convert(_model("llama"))
    attn = next(m for m in model.modules() if hasattr(m, "ascender"))
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(NotImplementedError, match="'block_indices' is not supported"):
        hf.ascender_attention_forward(attn, q, q[:, :2], q[:, :2], None, block_indices=torch.zeros(1, 3, 2))


def test_unconverted_module_gives_a_clear_error():
    hf.register()
    model = _model("llama")
    model.set_attn_implementation("ascender")
    with pytest.raises(RuntimeError, match="was not converted"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))


def test_set_attn_implementation_selects_ascender_after_conversion():
    model = hf.convert(_model("llama"), omega_init=0.3)
    inputs = _inputs("llama")
    asc = _output(model, inputs)
    model.set_attn_implementation("sdpa")
    sdpa = _output(model, inputs)
    model.set_attn_implementation("ascender")
    assert not torch.allclose(asc, sdpa)
    torch.testing.assert_close(_output(model, inputs), asc, rtol=0, atol=0)


def test_biases_change_the_outputs():
    """The equalities above are not vacuous: with omega != 0 the outputs move."""
    model = hf.convert(_model("mistral"), omega_init=0.0)
    inputs = _inputs("mistral")
    off = _output(model, inputs)
    _set_omega(model, 0.5)
    assert (_output(model, inputs) - off).abs().max() > 1e-3


def _bart():
    cfg = transformers.BartConfig(vocab_size=50, d_model=32, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64)
    return transformers.BartForConditionalGeneration(cfg)


def test_encoder_decoder_cross_attention_keeps_sdpa():
    """Self-attention is converted, cross-attention keeps sdpa; converting twice keeps the modules."""
    model = _bart().eval()
    src = torch.randint(3, 50, (2, 9), generator=torch.Generator().manual_seed(6))
    tgt = torch.randint(3, 50, (2, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(input_ids=src, decoder_input_ids=tgt).logits
        hf.convert(model, omega_init=0.0)
        got = model(input_ids=src, decoder_input_ids=tgt).logits
    converted = [n for n, m in model.named_modules() if hasattr(m, "ascender")]
    assert converted and not any("encoder_attn" in n for n in converted)
    torch.testing.assert_close(got, want, **TOL)
    before = {n: p for n, p in model.named_parameters() if ".ascender." in n}
    hf.convert(model, omega_init=0.5)
    after = {n: p for n, p in model.named_parameters() if ".ascender." in n}
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)


# ---------------------------------------------------------------------------------------------
# attention sinks (GPT-OSS): the table above covers outputs, generation, caches, training, reload


def _train_recording_sinks(name, monkeypatch):
    """Model `name` converted (omega 0.1), one training step, recording the sinks each op call got."""
    calls, op = [], hf.attention.ascender_attention

    def recording(*args, **kwargs):
        calls.append(kwargs.get("sinks"))
        return op(*args, **kwargs)

    model = hf.convert(_model(name), omega_init=0.1).train()
    monkeypatch.setattr(hf.attention, "ascender_attention", recording)
    inputs = _inputs(name)
    model(**inputs).logits.square().mean().backward()
    return model, inputs, calls


def test_gpt_oss_sinks_reach_the_op_and_get_gradients(monkeypatch):
    """GPT-OSS passes its per-head sinks as s_aux: they reach the op's sinks (so omega-0 outputs equal
    the original's, test_zero_omega_keeps_the_outputs), and training gives them a gradient."""
    model, _, calls = _train_recording_sinks("gpt_oss", monkeypatch)
    sinks = [m.sinks for m in model.modules() if hasattr(m, "ascender")]
    assert len(calls) == len(sinks) and all(c is s for c, s in zip(calls, sinks))
    assert all(s.grad is not None and bool(s.grad.abs().min() > 0) for s in sinks)


def test_inkling2_sinks_per_query_reach_the_op_and_get_gradients(monkeypatch):
    """Inkling 2 computes one sink per query row from the hidden states ([B, H, Nq, 1]): the op gets them
    as per-row sinks [B, H, Nq] (docs/backward.md; omega-0 outputs equal the original's: the table above),
    and training gives the projection that makes them a gradient through the op."""
    model, inputs, calls = _train_recording_sinks("inkling2_text", monkeypatch)
    projections = [m.sink_proj for m in model.modules() if hasattr(m, "ascender")]
    assert calls and len(calls) == len(projections)
    assert all(c.shape == (2, p.out_features, inputs["input_ids"].shape[1]) for c, p in zip(calls, projections))
    assert all(p.weight.grad is not None and bool(p.weight.grad.abs().max() > 0) for p in projections)


# ---------------------------------------------------------------------------------------------
# loading the HF way: AutoModel...from_pretrained(path, trust_remote_code=True), in a fresh interpreter


def _fresh_python(code, tmp_path):
    """Runs code in a new interpreter that finds this checkout's ascender_torch (the code imports it
    only through the checkpoint's module), transformers' module cache in tmp_path, no stdin (so
    transformers cannot ask whether to trust remote code)."""
    import ascender_torch

    root = os.path.dirname(os.path.dirname(os.path.abspath(ascender_torch.__file__)))
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)


def _saved_llama(tmp_path):
    """A converted tiny Llama with trained-looking ASCender weights, saved; its outputs on _inputs."""
    model = hf.convert(_model("llama"), omega_init=0.3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, hf.ASCenderLatents):
                m.lambda_sep.add_(torch.rand_like(m.lambda_sep))
    inputs = _inputs("llama")
    model.save_pretrained(tmp_path / "ckpt")
    torch.save(inputs, tmp_path / "inputs.pt")
    return model, _output(model, inputs)


def test_auto_class_with_trust_remote_code_returns_the_converted_model(tmp_path):
    """Issue 28 item 3: save_pretrained writes model_type "ascender", an auto_map and
    modeling_ascender.py; AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True) in a fresh
    interpreter returns the model's own class, converted, with logits bit-identical to the saved model's."""
    model, want = _saved_llama(tmp_path)
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["model_type"] == "ascender" and saved["ascender"]["original_model_type"] == "llama"
    assert saved["auto_map"]["AutoModelForCausalLM"] == "modeling_ascender.AutoModelForCausalLM"
    assert (tmp_path / "ckpt" / "modeling_ascender.py").exists()
    run = _fresh_python(f"""
import torch, transformers
torch.set_num_threads(1)
model = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / "ckpt")!r}, trust_remote_code=True).eval()
with torch.no_grad():
    logits = model(**torch.load({str(tmp_path / "inputs.pt")!r}), use_cache=False).logits
torch.save(dict(logits=logits, cls=type(model).__name__, impl=model.config._attn_implementation,
                converted=sum(hasattr(m, "ascender") for m in model.modules()),
                auto_map=hasattr(model.config, "auto_map")), {str(tmp_path / "got.pt")!r})
""", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    got = torch.load(tmp_path / "got.pt")
    assert got["cls"] == type(model).__name__ and got["impl"] == "ascender" and not got["auto_map"]
    assert got["converted"] == sum(hasattr(m, "ascender") for m in model.modules())
    torch.testing.assert_close(got["logits"], want, rtol=0, atol=0)


def test_auto_class_without_trust_remote_code_refuses_the_checkpoint(tmp_path):
    """Without trust_remote_code (not given, or False) the Auto class raises an error asking for it,
    instead of building the original model without its ASCender weights (fresh interpreter)."""
    _saved_llama(tmp_path)
    run = _fresh_python(f"""
import transformers
for kwargs in ({{}}, dict(trust_remote_code=False)):
    try:
        transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / "ckpt")!r}, **kwargs)
        print("LOADED")
    except ValueError as e:
        print("REFUSED", str(e).replace(chr(10), " "))
""", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    # (before refusing a call without trust_remote_code, transformers prints its question to stdout)
    refused = run.stdout.split("REFUSED ")[1:]
    assert "LOADED" not in run.stdout and len(refused) == 2
    assert all("trust_remote_code=True" in message for message in refused)
