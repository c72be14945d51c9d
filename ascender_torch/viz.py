"""Figures of the paper (seed 001, Figure Guide): Fig. 1, the score decomposition of one example and
head, and Fig. 4, the head-specialization heatmap. matplotlib is imported only inside the plotting
functions (Agg backend, PNG files), so the rest of the package does not need it.

Score decomposition. For one query row i of one head, the pre-temperature scores are

    S_ij = S_base_ij + omega_align b_align_ij + omega_sep b_sep_ij + omega_coh b_coh_ij

(S_base = scale q_i.k_j; b_X the row-normalized biases the op returns with return_maps=True).

Variance share (Fig. 4). For head h, over the rows i with n_i >= 2 visible keys J(i) and the
batch, the share of addend X in {base, align, sep, coh} is

    share_X = mean_{b, i} [ Var_{j in J(i)}(T^X_ij) / sum_Y Var_{j in J(i)}(T^Y_ij) ]

with T^base = S_base, T^X = omega_X b_X for the biases, Var the population variance over the
visible keys of the row. The shares of a row sum to 1 (a row whose addends are all constant is
left out). Only the variation across keys shapes a softmax row, hence variances; the covariances
between addends are not attributed to anyone, so these are shares of the summed variances, not of
Var(S). score_temp divides every addend alike and does not change the shares.
"""

from __future__ import annotations

import torch

from .functional import ascender_attention
from .modules import ASCenderAttention, ASCenderHead

ADDENDS = ("base", "align", "sep", "coh")


def _omegas(module):
    names = (module.scalar_attributes[n] for n in ("omega_align", "omega_sep", "omega_coh"))
    return torch.stack([getattr(module, n).detach().float().reshape(-1) for n in names], -1)  # [H, 3]


def visible_keys(batch, n, is_causal=False, key_padding_mask=None):
    """Bool [batch, 1, n, n]: True where query i may see key j (SPEC section 3, no attn_mask)."""
    visible = torch.ones(batch, 1, n, n, dtype=torch.bool)
    if is_causal:
        visible &= torch.ones(n, n, dtype=torch.bool).tril()
    if key_padding_mask is not None:
        visible &= ~key_padding_mask.cpu()[:, None, None, :]
    return visible


def attention_maps(module, x, *, is_causal=False, key_padding_mask=None):
    """Maps of `module` (ASCenderAttention or ASCenderHead) on input x [B, N, d_model] (batch first):
    dict(S_base, b_align, b_sep, b_coh, A: [B, H, N, N] float, visible: bool [B, 1, N, N],
    omega: [H, 3] the (effective) omega_align, omega_sep, omega_coh). No gradient."""
    with torch.no_grad():
        if isinstance(module, ASCenderHead):
            _, A, maps = module(x, need_weights=True, is_causal=is_causal, key_padding_mask=key_padding_mask)
            maps = {name: m.unsqueeze(1) for name, m in dict(maps, A=A).items()}
        elif isinstance(module, ASCenderAttention):
            _, maps = ascender_attention(*module.head_tensors(x), **module.op_keywords(), is_causal=is_causal,
                                         key_padding_mask=key_padding_mask, return_maps=True)
        else:
            raise TypeError(f"attention_maps: expected ASCenderAttention or ASCenderHead, got {type(module).__name__}")
    maps = {name: m.float().cpu() for name, m in maps.items()}
    maps["visible"] = visible_keys(x.shape[0], x.shape[1], is_causal, key_padding_mask)
    maps["omega"] = _omegas(module).cpu()
    return maps


def layer_maps(model, run):
    """attention_maps of every ASCenderAttention/ASCenderHead in `model`, in module order, on the
    inputs each one receives while `run()` (e.g. ``lambda: model(tokens)``) executes."""
    modules = [m for m in model.modules() if isinstance(m, (ASCenderAttention, ASCenderHead))]
    calls = {}

    def capture(module, args, kwargs):
        calls.setdefault(module, (args, kwargs))

    hooks = [m.register_forward_pre_hook(capture, with_kwargs=True) for m in modules]
    try:
        with torch.no_grad():
            run()
    finally:
        for hook in hooks:
            hook.remove()
    result = []
    for module in modules:
        args, kwargs = calls[module]
        x = args[0] if getattr(module, "batch_first", True) else args[0].transpose(0, 1)
        padding = args[1] if len(args) > 1 else kwargs.get("key_padding_mask")
        result.append(attention_maps(module, x, is_causal=kwargs.get("is_causal", False), key_padding_mask=padding))
    return result


def variance_shares(maps):
    """[H, 4] shares of base, align, sep, coh in the score variance (module docstring), from a dict
    of attention_maps."""
    omega = maps["omega"]  # [H, 3]
    addends = [maps["S_base"]] + [maps[f"b_{name}"] * omega[:, i].view(1, -1, 1, 1)
                                   for i, name in enumerate(ADDENDS[1:])]
    visible = maps["visible"].expand_as(maps["S_base"]).float()
    count = visible.sum(-1)  # [B, H, N]
    variances = []
    for t in addends:
        mean = (t * visible).sum(-1) / count.clamp_min(1)
        variances.append((((t - mean[..., None]) ** 2) * visible).sum(-1) / count.clamp_min(1))
    variances = torch.stack(variances, -1)  # [B, H, N, 4]
    total = variances.sum(-1)
    used = (count >= 2) & (total > 0)
    shares = torch.where(used[..., None], variances / total.clamp_min(1e-30)[..., None], 0.0)
    return shares.sum((0, 2)) / used.sum((0, 2)).clamp_min(1)[:, None]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_decomposition(maps, path, *, batch=0, head=0, tokens=None, title=None):
    """Fig. 1: S_base, b_align, b_sep, b_coh and A of one example and head, side by side, written
    to `path` (PNG). The three biases share one symmetric colour scale; keys a query cannot see are
    blank. tokens: labels of the N positions (queries on the y axis, keys on the x axis)."""
    plt = _pyplot()
    import numpy as np

    visible = maps["visible"].expand_as(maps["S_base"])[batch, head].numpy()
    panel = {name: np.ma.masked_where(~visible, maps[name][batch, head].numpy())
             for name in ("S_base", "b_align", "b_sep", "b_coh", "A")}
    bias_limit = max(float(np.abs(panel[n]).max()) for n in ("b_align", "b_sep", "b_coh")) or 1.0
    base_limit = float(np.abs(panel["S_base"]).max()) or 1.0
    omega = maps["omega"][head].tolist()
    specs = [("S_base", r"$S^{base}$", "RdBu_r", -base_limit, base_limit),
             ("b_align", rf"$\tilde\beta^{{align}}$ ($\omega$={omega[0]:.2f})", "PuOr_r", -bias_limit, bias_limit),
             ("b_sep", rf"$\tilde\beta^{{sep}}$ ($\omega$={omega[1]:.2f})", "PuOr_r", -bias_limit, bias_limit),
             ("b_coh", rf"$\tilde\beta^{{coh}}$ ($\omega$={omega[2]:.2f})", "PuOr_r", -bias_limit, bias_limit),
             ("A", "$A$ (attention)", "viridis", 0.0, float(panel["A"].max()) or 1.0)]
    n = visible.shape[-1]
    fig, axes = plt.subplots(1, 5, figsize=(4.2 * 5, 4.6), constrained_layout=True)
    for ax, (name, label, cmap, low, high) in zip(axes, specs):
        image = ax.imshow(panel[name], cmap=cmap, vmin=low, vmax=high, interpolation="nearest")
        ax.set_title(label)
        ax.set_xlabel("key")
        if tokens is not None:
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=7)
            ax.set_yticks(range(n), tokens, fontsize=7)
        if name in ("S_base", "b_coh", "A"):  # one colour bar per scale: base, the three biases, A
            fig.colorbar(image, ax=ax if name != "b_coh" else axes[1:4], shrink=0.8)
    axes[0].set_ylabel("query")
    fig.suptitle(title or f"score decomposition, example {batch}, head {head}")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_head_specialization(shares, path, *, title=None):
    """Fig. 4: for each layer (rows) and head (columns), the variance share of each bias (one panel
    per bias, common 0..max colour scale, values written in the cells); shares: [L, H, 4] as
    stacked variance_shares, written to `path` (PNG)."""
    plt = _pyplot()

    shares = torch.as_tensor(shares)
    n_layers, n_heads, _ = shares.shape
    top = float(shares[..., 1:].max()) or 1.0
    fig, axes = plt.subplots(1, 3, figsize=(3 + 1.3 * n_heads * 3, 1.5 + 0.6 * n_layers), constrained_layout=True)
    for ax, (index, name) in zip(axes, enumerate(ADDENDS[1:], start=1)):
        image = ax.imshow(shares[..., index].numpy(), cmap="magma", vmin=0.0, vmax=top, aspect="auto")
        for layer in range(n_layers):
            for head in range(n_heads):
                value = float(shares[layer, head, index])
                ax.text(head, layer, f"{value:.2f}", ha="center", va="center",
                        color="white" if value < 0.6 * top else "black", fontsize=8)
        ax.set_title(f"{name}")
        ax.set_xticks(range(n_heads), [f"h{h}" for h in range(n_heads)])
        ax.set_yticks(range(n_layers), [f"layer {layer}" for layer in range(n_layers)])
    fig.colorbar(image, ax=axes, shrink=0.9, label="share of score variance")
    fig.suptitle(title or "head specialization: Var_j(omega_X b_X) / sum of addend variances, mean over rows")
    fig.savefig(path, dpi=110)
    plt.close(fig)
