"""Generation speed: one decode step (one query row against a cache of N tokens) and greedy
generation with a Hugging Face model, ASCender against SDPA, one run.

Decode step: B = 1, H heads, d = dv = 64, dz = da = 32, float32, paper variant, causal, no grad;
median of --repeats; the query is the cache's last token (the decode shape Nq = 1). SDPA runs the
same q, k, v. Generation: a small Llama-style model with random weights (--layers, d_model 256,
8 heads of 32), a prompt of --prompt tokens and --new greedy tokens, converted with
hf.convert(variant="paper") against the same model with sdpa; tokens per second of the new
tokens (generate's time less a separate prefill), and the median time of one cached forward step of
the model (16 steps after the prefill). The table is meaningful only on a quiet machine: the op's
OpenMP threads slow tiny calls a hundredfold when the cores are busy.

    python benchmarks/bench_decode.py [--sizes 1024 4096 16384 65536] [--heads 8 32] [--repeats 7]
        [--prompt 2048] [--new 128] [--layers 2] [--skip-generate]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
import torch.nn.functional as F

from ascender_torch import ascender_attention

from _measure import median_seconds, print_table


def decode_rows(sizes, heads, repeats):
    rows = []
    for H in heads:
        for N in sizes:
            g = torch.Generator().manual_seed(N + H)
            k, v = (torch.randn(1, H, N, 64, generator=g) for _ in range(2))
            z, h = (torch.randn(1, H, N, 32, generator=g) for _ in range(2))
            q = torch.randn(1, H, 1, 64, generator=g)
            with torch.no_grad():
                t_a = median_seconds(lambda: ascender_attention(q, k, v, z, h, variant="paper", is_causal=True),
                                     repeats)
                t_s = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v), repeats)
            rows.append((N, H, f"{t_a * 1e3:.3f}", f"{t_s * 1e3:.3f}", f"{t_a / t_s:.1f}x"))
            print(f"H = {H}, N = {N} done", flush=True)
    return rows


def generation_rows(prompt, new, layers):
    import copy

    import transformers

    from ascender_torch.integrations import hf

    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                                      max_position_embeddings=prompt + new + 8)
    rows = []
    for name in ("sdpa", "ascender"):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(copy.deepcopy(config)).eval()  # convert sets its config's attention
        if name == "ascender":
            model = hf.convert(model, variant="paper", omega_init=0.1)
        ids = torch.randint(0, 1000, (1, prompt), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            model.generate(ids[:, :64], max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)  # the prefill alone
            t_prefill = time.perf_counter() - t0
            # one cached step at a time: the model's own cost of a new token
            cache, nxt, steps = out.past_key_values, out.logits[:, -1:].argmax(-1), []
            for _ in range(16):
                t0 = time.perf_counter()
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                steps.append(time.perf_counter() - t0)
                cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            gen = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
            t_total = time.perf_counter() - t0
        assert gen.shape[1] == prompt + new
        decode = max(t_total - t_prefill, 1e-9)
        step = sorted(steps)[len(steps) // 2]
        rows.append((name, f"{t_prefill:.2f}", f"{t_total:.2f}", f"{new / decode:.1f}", f"{step * 1e3:.2f}"))
        print(f"{name} done", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    ap.add_argument("--heads", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--skip-generate", action="store_true")
    args = ap.parse_args()
    print(f"# bench_decode: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, median of {args.repeats}")
    table = decode_rows(args.sizes, args.heads, args.repeats)
    print()
    print_table(("cache N", "H", "ascender ms", "sdpa ms", "ratio"), table)
    if not args.skip_generate:
        rows = generation_rows(args.prompt, args.new, args.layers)
        print()
        print(f"greedy generation: prompt {args.prompt}, {args.new} new tokens, {args.layers} layers, "
              f"d_model 256, 8 heads")
        print_table(("attention", "prefill s", "generate s", "new tokens / s (generate)", "cached step ms"), rows)
        ratio = float(rows[1][3]) / float(rows[0][3])
        step_ratio = float(rows[0][4]) / float(rows[1][4])
        print(f"ascender / sdpa tokens per second: {ratio:.2f} (generate), {step_ratio:.2f} (cached steps)")


if __name__ == "__main__":
    main()
