"""Train a small character-level ASCender language model on the Python standard library's source,
compare it with the same model using plain attention, and draw the paper's Fig. 1 and Fig. 4.

Both models: byte vocabulary, learned positions, pre-norm Transformer blocks, causal; the only
difference is the attention module (ASCenderAttention, paper variant, under the paper's warm-up
schedule, against softmax attention), with the plain model's MLP widened so the parameter counts
match. Same seed, same batches, same steps. Validation: a fixed set of windows from held-out files
(every 10th stdlib file). The defaults take a few minutes on a 2-core CPU.

    make demo            (or: python examples/demo.py [--steps 1200 --seq-len 96 --d-model 64 ...])
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ascender_torch import viz

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "quality"))
from corpus import VOCAB, fixed_windows, random_windows, stdlib_corpus  # noqa: E402
from models import CharLM, trainable_parameters  # noqa: E402
from tasks import fit, lm_bits_per_char  # noqa: E402


def progress_bar(label, steps):
    """A callback progress(t, loss) drawing a one-line bar on stderr (tqdm when installed)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=steps, desc=label, unit="step")

        def update(t, loss):
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            if t + 1 == steps:
                bar.close()
        return update
    start = time.perf_counter()

    def draw(t, loss):
        if (t + 1) % max(1, steps // 100) and t + 1 != steps:
            return
        done = (t + 1) / steps
        elapsed = time.perf_counter() - start
        sys.stderr.write(f"\r{label:>14} [{'#' * int(30 * done):<30}] {t + 1}/{steps} loss {loss:.3f} "
                         f"{elapsed:.0f}s, ~{elapsed / done - elapsed:.0f}s left ")
        if t + 1 == steps:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return draw


def train_lm(kind, args, corpus):
    torch.manual_seed(args.seed)
    model = CharLM(kind, VOCAB, args.d_model, args.heads, args.layers, args.seq_len, k_neighbors=args.k)
    data_rng = torch.Generator().manual_seed(args.seed)

    def loss_of_step(_):
        batch = random_windows(corpus[0], args.batch, args.seq_len, data_rng)
        logits = model(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))

    start = time.perf_counter()
    fit(model, args.steps, args.lr, loss_of_step, progress_bar(kind, args.steps))
    return model, time.perf_counter() - start


def char_label(byte):
    return {10: "\\n", 32: "·", 9: "\\t"}.get(byte, chr(byte) if 32 < byte < 127 else f"x{byte:02x}")


def draw_figures(model, val, args):
    """Fig. 1 on a held-out snippet, for the (layer, head) whose biases carry the largest variance
    share; Fig. 4 over a batch of held-out windows. Returns the two paths."""
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    windows = fixed_windows(val, 8, args.seq_len)[:, :-1]
    per_layer = viz.layer_maps(model, lambda: model(windows))
    shares = torch.stack([viz.variance_shares(m) for m in per_layer])  # [L, H, 4]
    fig4 = out / "fig4_head_specialization.png"
    viz.plot_head_specialization(shares, fig4, title=f"head specialization: variance shares of the biases "
                                                     f"(ASCender LM, {windows.shape[0]} held-out windows)")
    layer, head = divmod(int(shares[..., 1:].sum(-1).argmax()), shares.shape[1])
    snippet = windows[:1, :args.snippet]
    snippet_maps = viz.layer_maps(model, lambda: model(snippet))[layer]
    fig1 = out / "fig1_score_decomposition.png"
    viz.plot_decomposition(snippet_maps, fig1, head=head, tokens=[char_label(b) for b in snippet[0].tolist()],
                           title=f"score decomposition, layer {layer}, head {head}, held-out snippet")
    return fig1, fig4, shares


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--k", type=int, default=8, help="top-k neighbours of the paper variant")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-windows", type=int, default=256)
    parser.add_argument("--snippet", type=int, default=40, help="characters in the Fig. 1 snippet")
    parser.add_argument("--out-dir", default="demo_out")
    args = parser.parse_args()

    corpus = stdlib_corpus()
    print(f"corpus: Python {sys.version.split()[0]} stdlib sources, {corpus[0].numel() / 1e6:.1f} MB train, "
          f"{corpus[1].numel() / 1e6:.1f} MB validation (every 10th file); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, context {args.seq_len}; "
          f"{args.steps} steps of batch {args.batch}, seed {args.seed}")
    val_windows = fixed_windows(corpus[1], args.eval_windows, args.seq_len)
    results = {}
    for kind in ("asc-paper", "plain"):
        model, seconds = train_lm(kind, args, corpus)
        results[kind] = (model, seconds, lm_bits_per_char(model, val_windows))
    print(f"\n{'model':<26} {'params':>8} {'train s':>8} {'val loss (nats)':>16} {'bits/char':>10}")
    for kind, label in (("plain", "plain attention"), ("asc-paper", "ASCender (paper variant)")):
        model, seconds, bpc = results[kind]
        print(f"{label:<26} {trainable_parameters(model):>8} {seconds:>8.0f} {bpc * 0.6931471805599453:>16.4f} "
              f"{bpc:>10.4f}")
    delta = results["asc-paper"][2] - results["plain"][2]
    print(f"ASCender - plain: {delta:+.4f} bits/char (one seed: differences of a few hundredths are within "
          f"seed-to-seed noise; see docs/quality.md)")
    fig1, fig4, shares = draw_figures(results["asc-paper"][0], corpus[1], args)
    print("\nvariance shares of the biases per layer and head (align / sep / coh):")
    for layer, per_head in enumerate(shares):
        print(f"  layer {layer}: " + "   ".join(f"h{h} {s[1]:.2f}/{s[2]:.2f}/{s[3]:.2f}" for h, s in enumerate(per_head)))
    print(f"\nFig. 1 (score decomposition): {fig1.resolve()}\nFig. 4 (head specialization): {fig4.resolve()}")


if __name__ == "__main__":
    main()
