"""The three tasks of the small-scale quality benchmark: data, model, training and the metric.

Every task is a function ``run_<task>(kind, seed, cfg) -> dict`` that trains one model of attention
`kind` (models.KINDS) from seed `seed` and returns its metrics and trainable parameter count.
ASCender models train under ``ASCenderSchedule`` (the paper's recipe); all models use Adam with a
linear warm-up and cosine decay of the learning rate, the same steps and the same batches (the data
stream depends on the seed only, not on the model).
"""

from __future__ import annotations

import math
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from ascender_torch import ASCenderSchedule
from corpus import VOCAB, fixed_windows, random_windows
from models import CharLM, Transformer, trainable_parameters


def _uses_ascender(model):
    return any(hasattr(m, "omega_align") or hasattr(m, "omega_a") for m in model.modules())


def fit(model, steps, lr, loss_of_step, progress=None):
    """Train `model` for `steps` Adam steps; loss_of_step(t) -> scalar loss of step t.
    The learning rate warms up linearly over 5% of the steps and then follows a cosine to 0.
    progress(t, loss), if given, is called after every step (outside the timed part).
    Returns the wall-clock seconds of every step (batch, forward, backward, optimizer)."""
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    warmup = max(1, steps // 20)
    lr_at = lambda t: lr * min((t + 1) / warmup, 0.5 * (1 + math.cos(math.pi * t / steps)))  # noqa: E731
    schedule = ASCenderSchedule(model, steps) if _uses_ascender(model) else None
    model.train()
    seconds = []
    for t in range(steps):
        start = time.perf_counter()
        if schedule is not None:
            schedule.step(t)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(t)
        loss = loss_of_step(t)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        seconds.append(time.perf_counter() - start)
        if progress is not None:
            progress(t, loss.item())
    if schedule is not None:
        schedule.remove()
    model.eval()
    return seconds


# ---------------------------------------------------------------- (a) character-level LM

def lm_bits_per_char(model, windows, batch=32):
    """Mean next-byte cross-entropy in bits over all positions of `windows` [count, seq_len + 1]."""
    total, count = 0.0, 0
    with torch.no_grad():
        for chunk in windows.split(batch):
            logits = model(chunk[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, VOCAB), chunk[:, 1:].reshape(-1), reduction="sum").item()
            count += chunk[:, 1:].numel()
    return total / count / math.log(2)


def run_lm(kind, seed, cfg, corpus, progress=None):
    """Validation bits/char, trainable parameters and the median seconds of a training step;
    cfg["visibility"] (optional) is the window and global tokens of the windowed kinds."""
    train, val = corpus
    torch.manual_seed(seed)
    model = CharLM(kind, VOCAB, cfg["d_model"], cfg["heads"], cfg["layers"], cfg["seq_len"],
                   visibility=cfg.get("visibility"))
    data_rng = torch.Generator().manual_seed(seed)

    def loss_of_step(_):
        batch = random_windows(train, cfg["batch"], cfg["seq_len"], data_rng)
        return F.cross_entropy(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))

    seconds = fit(model, cfg["steps"], cfg["lr"], loss_of_step, progress)
    bpc = lm_bits_per_char(model, fixed_windows(val, cfg["eval_windows"], cfg["seq_len"]))
    return {"bits_per_char": bpc, "step_seconds": statistics.median(seconds), "params": trainable_parameters(model)}


# ---------------------------------------------------------------- (b) associative recall, clustered distractors

def recall_batch(batch, n_items, key_dim, n_values, cluster_sizes, generator):
    """Associative recall with a cluster of near-duplicate distractor keys (seed 004's "probability
    hijacking"). Each example: n_items (key, value) items and a final query token. The query is a
    noisy copy of one target key (cosine ~0.9); m of the other items (m drawn from cluster_sizes per
    example) are near-duplicates of one another (cosine ~0.99) and moderately similar to the target
    (cosine ~0.6), and all carry the same wrong value, so together they can outvote the target in a
    softmax; the rest have random keys and values. Returns inputs [B, n_items + 1, key_dim + n_values + 1]
    (key, one-hot value, query flag), labels [B] and m [B]."""
    g = generator
    unit = lambda x: x / x.norm(dim=-1, keepdim=True) * math.sqrt(key_dim)  # noqa: E731  (norm sqrt(key_dim))
    keys = unit(torch.randn(batch, n_items, key_dim, generator=g))
    values = torch.randint(0, n_values, (batch, n_items), generator=g)
    target_value = values[:, 0].clone()
    sizes = torch.tensor(cluster_sizes)[torch.randint(0, len(cluster_sizes), (batch,), generator=g)]
    center = unit(0.6 * keys[:, 0] + 0.8 * unit(torch.randn(batch, key_dim, generator=g)))
    wrong = (target_value + torch.randint(1, n_values, (batch,), generator=g)) % n_values
    members = unit(center[:, None] + 0.1 * torch.randn(batch, n_items, key_dim, generator=g))
    in_cluster = (torch.arange(n_items)[None] >= 1) & (torch.arange(n_items)[None] <= sizes[:, None])
    keys = torch.where(in_cluster[..., None], members, keys)
    values = torch.where(in_cluster, wrong[:, None], values)
    query = unit(keys[:, 0] + 0.5 * torch.randn(batch, key_dim, generator=g))
    order = torch.argsort(torch.rand(batch, n_items, generator=g), dim=1)  # the target's position is random
    keys, values = keys.gather(1, order[..., None].expand_as(keys)), values.gather(1, order)
    items = torch.cat([keys, F.one_hot(values, n_values).float(), torch.zeros(batch, n_items, 1)], -1)
    query_token = torch.cat([query, torch.zeros(batch, n_values), torch.ones(batch, 1)], -1)[:, None]
    return torch.cat([items, query_token], 1), target_value, sizes


class RecallModel(nn.Module):
    def __init__(self, kind, cfg):
        super().__init__()
        self.inp = nn.Linear(cfg["key_dim"] + cfg["n_values"] + 1, cfg["d_model"])
        self.body = Transformer(kind, cfg["d_model"], cfg["heads"], cfg["layers"])
        self.out = nn.Linear(cfg["d_model"], cfg["n_values"])

    def forward(self, x):
        return self.out(self.body(self.inp(x))[:, -1])


def run_recall(kind, seed, cfg, progress=None):
    torch.manual_seed(seed)
    model = RecallModel(kind, cfg)
    data_rng = torch.Generator().manual_seed(seed)
    shape = (cfg["n_items"], cfg["key_dim"], cfg["n_values"])

    def loss_of_step(_):
        x, y, _ = recall_batch(cfg["batch"], *shape, cfg["train_cluster_sizes"], data_rng)
        return F.cross_entropy(model(x), y)

    fit(model, cfg["steps"], cfg["lr"], loss_of_step, progress)
    metrics = {"params": trainable_parameters(model)}
    test_rng = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for m in cfg["eval_cluster_sizes"]:
            x, y, _ = recall_batch(cfg["eval_examples"], *shape, [m], test_rng)
            metrics[f"recall_acc_m{m}"] = (model(x).argmax(-1) == y).float().mean().item()
    return metrics


# ---------------------------------------------------------------- (c) ListOps

OPERATORS = {"[MAX": max, "[MIN": min, "[MED": statistics.median_low, "[SM": lambda xs: sum(xs) % 10}
LISTOPS_TOKENS = ["<pad>", "]", *OPERATORS, *map(str, range(10))]


def listops_tree(rng, depth, max_depth, max_args, p_operator):
    """A random ListOps expression as (tokens, value): an operator over 2..max_args arguments, each
    argument an operator with probability p_operator (while depth < max_depth) or a digit."""
    op = rng.choice(list(OPERATORS))
    tokens, args = [op], []
    for _ in range(rng.randint(2, max_args)):
        if depth + 1 < max_depth and rng.random() < p_operator:
            sub_tokens, value = listops_tree(rng, depth + 1, max_depth, max_args, p_operator)
        else:
            value = rng.randint(0, 9)
            sub_tokens = [str(value)]
        tokens += sub_tokens
        args.append(value)
    return tokens + ["]"], OPERATORS[op](args)


def listops_examples(count, rng, cfg):
    """`count` expressions of at most cfg["max_len"] tokens (longer ones are redrawn), as
    (token ids [count, max_len] padded with 0, labels [count])."""
    ids = torch.zeros(count, cfg["max_len"], dtype=torch.long)
    labels = torch.empty(count, dtype=torch.long)
    index = {t: i for i, t in enumerate(LISTOPS_TOKENS)}
    filled = 0
    while filled < count:
        tokens, value = listops_tree(rng, 0, cfg["max_depth"], cfg["max_args"], cfg["p_operator"])
        if len(tokens) > cfg["max_len"]:
            continue
        ids[filled, :len(tokens)] = torch.tensor([index[t] for t in tokens])
        labels[filled] = value
        filled += 1
    return ids, labels


class ListOpsModel(nn.Module):
    """Bidirectional encoder over the tokens (padding masked), mean-pooled, 10-way classifier."""

    def __init__(self, kind, cfg):
        super().__init__()
        self.embed = nn.Embedding(len(LISTOPS_TOKENS), cfg["d_model"])
        self.pos = nn.Parameter(torch.randn(cfg["max_len"], cfg["d_model"]) * 0.02)
        self.body = Transformer(kind, cfg["d_model"], cfg["heads"], cfg["layers"])
        self.out = nn.Linear(cfg["d_model"], 10)

    def forward(self, ids):
        width = int((ids != 0).sum(1).max())
        ids = ids[:, :width]
        padding = ids == 0
        h = self.body(self.embed(ids) + self.pos[:width], key_padding_mask=padding)
        keep = (~padding).float()[..., None]
        return self.out((h * keep).sum(1) / keep.sum(1))


def run_listops(kind, seed, cfg, progress=None):
    torch.manual_seed(seed)
    model = ListOpsModel(kind, cfg)
    data_rng = random.Random(seed)

    def loss_of_step(_):
        ids, labels = listops_examples(cfg["batch"], data_rng, cfg)
        return F.cross_entropy(model(ids), labels)

    fit(model, cfg["steps"], cfg["lr"], loss_of_step, progress)
    ids, labels = listops_examples(cfg["eval_examples"], random.Random(10_000 + seed), cfg)
    with torch.no_grad():
        accuracy = torch.cat([model(i).argmax(-1) for i in ids.split(256)]).eq(labels).float().mean().item()
    return {"listops_acc": accuracy, "params": trainable_parameters(model)}
