"""Architecture sweep of the Hugging Face integration (a local tool, not part of the test suite):
every model type with a causal-LM class in the installed transformers, as a tiny random-weight
model (tests/hf_models.py), is converted and checked:

  logits     omega 0: logits equal to the original's, with and without left padding (max |diff|)
  greedy     omega 0: cached greedy generation (past the sliding window) equals the original's
  cache      omega 0.5 (biases on): cached greedy, left-padded, and beam generation equal
             generation without cache (the latent cache follows the KV cache)
  train      omega 0.1: one training step's gradients are finite, every ASCender parameter gets one
  reload     save_pretrained -> hf.from_pretrained gives the same logits

    python tests/hf_sweep.py [model_type ...] [--json out.json]

Prints one line per model type and a summary. Expect a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import traceback
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # tests/ and this checkout's ascender_torch

from hf_models import VOCAB, tiny_model  # noqa: E402

TOL = 1e-5


def _short(e):
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text[:220]


def _inputs(batch=2, n=10, pad=3):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (batch, n), generator=g)
    mask = torch.ones(batch, n, dtype=torch.long)
    mask[1, :pad] = 0
    return ids, mask


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()


def _generate(model, ids, mask, **kw):
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0, **kw)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, **kw)


def _cache_gap(model, ids, mask, **cache):
    """Largest difference between the scores of cached greedy generation (the default cache, or as
    given, e.g. cache_implementation="static") and those of generation without cache, over the steps
    where both chose the same tokens so far."""
    kw = dict(output_scores=True, return_dict_in_generate=True)
    cached = _generate(model, ids, mask, use_cache=True, **cache, **kw)
    recomputed = _generate(model, ids, mask, use_cache=False, **kw)
    gap = 0.0
    for step, (a, b) in enumerate(zip(cached.scores, recomputed.scores)):
        finite = torch.isfinite(a) & torch.isfinite(b)
        gap = max(gap, float((a[finite] - b[finite]).abs().max()))
        n = ids.shape[1] + step + 1
        if not torch.equal(cached.sequences[:, :n], recomputed.sequences[:, :n]):
            break
    return gap


def _set_omega(model, value):
    with torch.no_grad():
        for m in model.modules():
            if m.__class__.__name__ == "ASCenderLatents":
                for name in ("omega_align", "omega_sep", "omega_coh"):
                    getattr(m, name).fill_(value)


def check(model_type):
    from transformers import AutoModelForCausalLM

    from ascender_torch.integrations import hf

    row = {"model_type": model_type}
    try:
        model = tiny_model(model_type)
    except Exception as e:  # noqa: BLE001
        row["status"] = "no tiny config"
        row["error"] = _short(e)
        return row
    row["class"] = type(model).__name__
    row["interface"] = type(model)._can_set_attn_implementation()
    row["original"] = model.config._attn_implementation
    ids, mask = _inputs()
    full = torch.ones_like(mask)
    try:
        want_pad, want = _logits(model, ids, mask), _logits(model, ids, full)
    except Exception as e:  # noqa: BLE001
        row["status"] = "original fails"
        row["error"] = _short(e)
        return row
    try:
        want_gen = _generate(model, ids, mask)
        # a model whose own cached generation differs from recomputation (bidirectional models, some
        # window implementations) cannot show whether the latent cache follows the KV cache
        row["original_cache"] = _cache_gap(model, ids, mask)
    except Exception as e:  # noqa: BLE001
        want_gen = None
        row["original_generate"] = _short(e)
    try:
        row["original_static"] = _cache_gap(model, ids, mask, cache_implementation="static")
    except Exception as e:  # noqa: BLE001 (models without static caches)
        row["original_static_error"] = _short(e)
    try:
        hf.convert(model, omega_init=0.0)
    except hf.ASCenderUnsupportedError as e:
        row["status"] = "refused"
        row["error"] = _short(e)
        return row
    except Exception as e:  # noqa: BLE001
        row["status"] = "convert crashes"
        row["error"] = _short(e)
        row["trace"] = traceback.format_exc()[-1500:]
        return row
    if not row["interface"]:
        row["status"] = "BUG: converted a model without the interface"
        return row
    problems = []
    try:
        got_pad, got = _logits(model, ids, mask), _logits(model, ids, full)
        keep = mask.bool()
        row["logits"] = float((got - want).abs().max())
        row["logits_padded"] = float((got_pad[keep] - want_pad[keep]).abs().max())
        row["logits_pad_rows"] = float((got_pad - want_pad).abs().max())
        if max(row["logits"], row["logits_padded"]) > TOL:
            problems.append("logits")
        if row["logits_pad_rows"] > TOL:
            problems.append("pad rows")
    except Exception as e:  # noqa: BLE001
        problems.append("logits: " + _short(e))
        row["trace"] = traceback.format_exc()[-1500:]
    if want_gen is not None:
        try:
            row["greedy"] = bool(torch.equal(_generate(model, ids, mask), want_gen))
            if not row["greedy"]:
                problems.append("greedy")
        except Exception as e:  # noqa: BLE001
            problems.append("greedy: " + _short(e))
            row["trace"] = traceback.format_exc()[-1500:]
        try:
            _set_omega(model, 0.5)
            row["cache"] = _cache_gap(model, ids, mask)
            if row["cache"] > max(1e-4, 10 * row["original_cache"]):
                problems.append("cache")
            if "original_static" in row:
                row["static"] = _cache_gap(model, ids, mask, cache_implementation="static")
                if row["static"] > max(1e-4, 10 * row["original_static"]):
                    problems.append("static")
            if row["original_cache"] <= 1e-6:  # beam search turns near-ties of a noisier model into other tokens
                row["beam"] = bool(torch.equal(_generate(model, ids, mask, num_beams=2, use_cache=True),
                                               _generate(model, ids, mask, num_beams=2, use_cache=False)))
                if not row["beam"]:
                    problems.append("beam")
        except Exception as e:  # noqa: BLE001
            problems.append("cache: " + _short(e))
            row["trace"] = traceback.format_exc()[-1500:]
        finally:
            _set_omega(model, 0.0)
    try:
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            with contextlib.redirect_stderr(io.StringIO()):
                again = hf.from_pretrained(AutoModelForCausalLM, d).eval()
            row["reload"] = float((_logits(again, ids, mask) - got_pad).abs().max())
            if row["reload"] > 0:
                problems.append("reload")
    except Exception as e:  # noqa: BLE001
        problems.append("reload: " + _short(e))
        row["trace"] = traceback.format_exc()[-1500:]
    try:
        _set_omega(model, 0.1)
        model.train()
        labels = ids.masked_fill(mask == 0, -100)
        ran = set()
        handles = [m.U.register_forward_hook(lambda mod, *_: ran.add(mod)) for m in model.modules()
                   if m.__class__.__name__ == "ASCenderLatents"]
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        for handle in handles:
            handle.remove()
        # the modules this text input reaches (a multimodal model's vision tower does not run)
        # (and not those reusing another layer's keys and latents: KV sharing)
        grads = [(n, p.grad) for m in model.modules() if getattr(m, "U", None) in ran and not m.latents_from
                 for n, p in m.named_parameters()]
        row["train"] = bool(grads) and all(g is not None and bool(torch.isfinite(g).all()) for _, g in grads)
        if not row["train"]:
            problems.append("train")
    except Exception as e:  # noqa: BLE001
        problems.append("train: " + _short(e))
        row["trace"] = traceback.format_exc()[-1500:]
    row["status"] = "ok" if not problems else "FAIL"
    row["problems"] = problems
    return row


def main():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    parser = argparse.ArgumentParser()
    parser.add_argument("model_types", nargs="*")
    parser.add_argument("--json")
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)  # tiny models: the op's threads cost more than they bring (tests/test_hf.py)
    types_ = args.model_types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    rows = []
    for mt in types_:
        t = time.time()
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row = check(mt)
        row["seconds"] = round(time.time() - t, 1)
        rows.append(row)
        detail = row.get("problems") or row.get("error") or ""
        print(f"{mt:28s} {row['status']:16s} {row.get('logits', ''):<10.3g} {row['seconds']:5.1f}s {detail}"
              if isinstance(row.get("logits"), float) else f"{mt:28s} {row['status']:16s} {'':10s} "
              f"{row['seconds']:5.1f}s {detail}", flush=True)
        if args.trace and "trace" in row:
            print(row["trace"])
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("\nsummary:", json.dumps(counts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
