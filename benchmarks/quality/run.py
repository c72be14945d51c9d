"""Small-scale quality benchmark (the paper's Table 1, CPU-sized): three tasks x attention kinds x
5 seeds; mean +- std per metric and a paired bootstrap p-value against plain attention.

    python benchmarks/quality/run.py [--seeds 5] [--tasks lm recall listops] [--out results.json]

The task lm-long is the paper's RQ2 (efficiency at equal quality): the character LM at context 1024,
dense and windowed (plus global tokens) plain and ASCender attention, bits/char and seconds per step:

    python benchmarks/quality/run.py --tasks lm-long --seeds 3 --out benchmarks/quality/results_long.json

Prints a markdown table and writes every per-seed result to the JSON file. Task settings are in
CONFIG; tasks.py has the data and the training loop, models.py the models.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import stdlib_corpus  # noqa: E402
from models import BIDIRECTIONAL_ONLY, KINDS, WINDOWED  # noqa: E402
from tasks import run_listops, run_lm, run_recall  # noqa: E402

CONFIG = {
    "lm": dict(d_model=32, heads=2, layers=2, seq_len=64, batch=16, steps=300, lr=3e-3, eval_windows=256),
    "recall": dict(d_model=32, heads=2, layers=2, key_dim=8, n_values=8, n_items=12, batch=32, steps=800, lr=3e-3,
                   train_cluster_sizes=list(range(12)), eval_cluster_sizes=[0, 4, 8, 11], eval_examples=2000),
    "listops": dict(d_model=32, heads=2, layers=2, max_len=48, max_depth=4, max_args=4, p_operator=0.35,
                    batch=32, steps=200, lr=3e-3, eval_examples=2000),
    "lm-long": dict(d_model=32, heads=2, layers=2, seq_len=1024, batch=4, steps=2000, lr=3e-3, eval_windows=64,
                    visibility=dict(window_size=(128, 0), global_tokens=4)),
}
TABLE_1 = ("lm", "recall", "listops")  # the default tasks
TASK_KINDS = {"lm-long": ("plain", "plain-window", "asc-paper", "asc-paper-window")}  # the others: every kind
SEEDS = (1, 2, 3, 5, 7)  # the paper's seeds


def paired_bootstrap_p(values, baseline, resamples=10_000, seed=0):
    """Two-sided paired bootstrap p-value of mean(values - baseline) = 0, pairs = seeds: the
    differences are centred (the null) and resampled with replacement; p is the share of resampled
    means at least as far from 0 as the observed one. With 5 pairs it is coarse and has little power."""
    diffs = torch.tensor(values, dtype=torch.float64) - torch.tensor(baseline, dtype=torch.float64)
    observed = diffs.mean().abs()
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, len(diffs), (resamples, len(diffs)), generator=g)
    means = (diffs - diffs.mean())[index].mean(1).abs()
    return (int((means >= observed - 1e-12).sum()) + 1) / (resamples + 1)


def run_all(tasks, seeds, log):
    corpus = stdlib_corpus() if {"lm", "lm-long"} & set(tasks) else None
    runners = {"lm": lambda kind, seed: run_lm(kind, seed, CONFIG["lm"], corpus),
               "lm-long": lambda kind, seed: run_lm(kind, seed, CONFIG["lm-long"], corpus),
               "recall": lambda kind, seed: run_recall(kind, seed, CONFIG["recall"]),
               "listops": lambda kind, seed: run_listops(kind, seed, CONFIG["listops"])}
    results = {}
    for task in tasks:
        for kind in TASK_KINDS.get(task, KINDS):
            if task.startswith("lm") and kind in BIDIRECTIONAL_ONLY:
                continue  # Magnitude Attention's mu depends on every key: no causal LM
            for seed in seeds:
                start = time.perf_counter()
                metrics = runners[task](kind, seed)
                metrics["seconds"] = time.perf_counter() - start
                results.setdefault(task, {}).setdefault(kind, []).append(dict(metrics, seed=seed))
                log(f"{task:8} {kind:20} seed {seed}: " +
                    ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k != "params"))
    return results


METRICS = [("lm", "bits_per_char", "LM bits/char ↓"), ("recall", "recall_acc_m0", "recall acc, m=0"),
           ("recall", "recall_acc_m4", "recall acc, m=4"), ("recall", "recall_acc_m8", "recall acc, m=8"),
           ("recall", "recall_acc_m11", "recall acc, m=11"), ("listops", "listops_acc", "ListOps acc"),
           ("lm-long", "bits_per_char", "LM-1024 bits/char ↓"), ("lm-long", "step_seconds", "s/step (median)")]
TIMINGS = {"step_seconds"}  # reported without a p-value (machine load, not the seed, makes them vary)


def table(results):
    metrics = [m for m in METRICS if m[0] in results]
    lines = ["| model | params (" + " / ".join(t for t in results) + ") | " + " | ".join(m[2] for m in metrics) + " |",
             "|---" * (2 + len(metrics)) + "|"]
    for kind in (k for k in KINDS + tuple(WINDOWED) if any(k in runs for runs in results.values())):
        params = " / ".join(str(results[t][kind][0]["params"]) if kind in results[t] else "–" for t in results)
        cells = []
        for task, key, _ in metrics:
            runs = results[task].get(kind)
            if runs is None:
                cells.append("n/a (bidirectional only)" if kind in BIDIRECTIONAL_ONLY else "–")
                continue
            values = [r[key] for r in runs]
            cell = f"{statistics.mean(values):.3f}" + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "")
            if kind != "plain" and key not in TIMINGS and len(values) > 1:
                cell += f" (p={paired_bootstrap_p(values, [r[key] for r in results[task]['plain']]):.2f})"
            cells.append(cell)
        lines.append(f"| {kind} | {params} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument("--tasks", nargs="+", default=list(TABLE_1), choices=list(CONFIG))
    parser.add_argument("--out", default="benchmarks/quality/results.json")
    parser.add_argument("--steps", type=int, help="train every task this many steps instead (a smoke run)")
    args = parser.parse_args()
    if args.steps is not None:
        for task in args.tasks:
            CONFIG[task]["steps"] = args.steps
    seeds = (SEEDS + tuple(range(100, 100 + args.seeds)))[:args.seeds]
    start = time.perf_counter()
    results = run_all(args.tasks, seeds, lambda line: print(line, file=sys.stderr, flush=True))
    wall = time.perf_counter() - start
    print(table(results))
    print(f"\n{len(seeds)} seeds {list(seeds)}; wall time {wall / 60:.1f} min; {platform.machine()}, "
          f"{torch.get_num_threads()} torch threads, torch {torch.__version__}; p: paired bootstrap vs plain")
    Path(args.out).write_text(json.dumps({"config": CONFIG, "seeds": list(seeds), "wall_seconds": wall,
                                          "torch": torch.__version__, "results": results}, indent=1))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
