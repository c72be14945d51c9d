"""Small pre-norm Transformers whose only difference is the attention module, with every model's
parameter count matched to the ASCender paper variant by widening the MLP.

Attention kinds (``KINDS``):

| kind | module |
|---|---|
| plain | softmax attention (q/k/v/out projections, ``scaled_dot_product_attention``) |
| asc-paper | ``ASCenderAttention(variant="paper")`` |
| asc-reference | ``ASCenderAttention(variant="seed")`` (the seed module's math) |
| magnitude | ``MagnitudeAttention`` (bidirectional only) |
| asc-paper+mag-gate | ``ASCenderAttention(variant="paper", magnitude_gate=True)`` (bidirectional only) |
| asc-no-align / -no-sep / -no-coh | the paper variant with that omega fixed at 0 and not trained (requires_grad=False), so its normalized bias never reaches the scores |

Windowed kinds (``WINDOWED``, the long-context study): ``plain-window`` and ``asc-paper-window`` are
``plain`` and ``asc-paper`` restricted to a ``visibility = dict(window_size=(left, right),
global_tokens=g)`` (SPEC section 8); a window changes no parameter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ascender_torch import ASCenderAttention, MagnitudeAttention
from ascender_torch.reference import allowed_keys

KINDS = ("plain", "asc-paper", "asc-reference", "magnitude", "asc-paper+mag-gate",
         "asc-no-align", "asc-no-sep", "asc-no-coh")
BIDIRECTIONAL_ONLY = ("magnitude", "asc-paper+mag-gate")
WINDOWED = {"plain-window": "plain", "asc-paper-window": "asc-paper"}  # windowed kind -> its dense kind
_ABLATED = {"asc-no-align": "omega_align", "asc-no-sep": "omega_sep", "asc-no-coh": "omega_coh"}


class PlainAttention(nn.Module):
    """Multi-head softmax self-attention with the same projections as ASCenderAttention.
    With window_size or global_tokens (SPEC section 8) a query attends to the keys J(i) that
    ASCenderAttention would let it see: ``scaled_dot_product_attention`` with that boolean mask
    (``reference.allowed_keys``, causality and padding included), so the work stays O(N^2)."""

    def __init__(self, d_model, n_heads, window_size=None, global_tokens=0):
        super().__init__()
        self.n_heads, self.window_size, self.global_tokens = n_heads, window_size, global_tokens
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, key_padding_mask=None, is_causal=False):
        B, N, D = x.shape
        q, k, v = (p(x).reshape(B, N, self.n_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.window_size is not None or self.global_tokens:
            mask = allowed_keys(B, 1, N, N, x.device, is_causal, key_padding_mask,
                                window_size=self.window_size, global_tokens=self.global_tokens)
            is_causal = False  # in the mask
        else:
            mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return self.out_proj(y.transpose(1, 2).reshape(B, N, D))


def make_attention(kind, d_model, n_heads, k_neighbors, visibility=None):
    """The attention module of `kind` (ablations: the omega fixed at 0, requires_grad=False). A
    windowed kind is its dense kind with `visibility` (dict(window_size=..., global_tokens=...));
    the other kinds see every key and ignore it."""
    structure = {}
    if kind in WINDOWED:
        if visibility is None:
            raise ValueError(f"{kind} needs visibility=dict(window_size=(left, right), global_tokens=g)")
        kind, structure = WINDOWED[kind], visibility
    if kind == "plain":
        return PlainAttention(d_model, n_heads, **structure)
    if kind == "magnitude":
        return MagnitudeAttention(d_model, n_heads)
    variant = "seed" if kind == "asc-reference" else "paper"
    attention = ASCenderAttention(d_model, n_heads, k=k_neighbors, variant=variant,
                                  magnitude_gate=kind == "asc-paper+mag-gate", **structure)
    if kind in _ABLATED:
        omega = getattr(attention, _ABLATED[kind])
        with torch.no_grad():
            omega.zero_()
        omega.requires_grad_(False)
    return attention


class _AttentionCall(nn.Module):
    """One calling convention for every kind: forward(x, key_padding_mask, is_causal) -> x."""

    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, x, key_padding_mask, is_causal):
        if isinstance(self.attention, PlainAttention):
            return self.attention(x, key_padding_mask, is_causal)
        if isinstance(self.attention, MagnitudeAttention):
            return self.attention(x, key_padding_mask)[0]
        return self.attention(x, key_padding_mask, is_causal=is_causal)[0]


class Block(nn.Module):
    def __init__(self, kind, d_model, n_heads, mlp_hidden, k_neighbors, visibility=None):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = _AttentionCall(make_attention(kind, d_model, n_heads, k_neighbors, visibility))
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, d_model))

    def forward(self, x, key_padding_mask=None, is_causal=False):
        x = x + self.attn(self.norm1(x), key_padding_mask, is_causal)
        return x + self.mlp(self.norm2(x))


def trainable_parameters(module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def matched_mlp_hidden(kind, d_model, n_heads, k_neighbors, mlp_ratio=4) -> int:
    """MLP width for `kind` so that a block has as many trainable parameters as an asc-paper
    block with MLP width mlp_ratio * d_model (each extra hidden unit costs 2 d_model + 1). A
    windowed kind counts as its dense kind."""
    target = trainable_parameters(make_attention("asc-paper", d_model, n_heads, k_neighbors))
    own = trainable_parameters(make_attention(WINDOWED.get(kind, kind), d_model, n_heads, k_neighbors))
    return mlp_ratio * d_model + round((target - own) / (2 * d_model + 1))


class Transformer(nn.Module):
    """n_layers blocks of `kind` and a final LayerNorm, on embedded inputs [B, N, d_model]
    (`visibility`: see make_attention)."""

    def __init__(self, kind, d_model, n_heads, n_layers, k_neighbors=8, visibility=None):
        super().__init__()
        hidden = matched_mlp_hidden(kind, d_model, n_heads, k_neighbors)
        self.blocks = nn.ModuleList(Block(kind, d_model, n_heads, hidden, k_neighbors, visibility)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x, key_padding_mask=None, is_causal=False):
        for block in self.blocks:
            x = block(x, key_padding_mask, is_causal)
        return self.norm(x)

    def attention_modules(self):
        return [block.attn.attention for block in self.blocks]


class CharLM(nn.Module):
    """Causal character (byte) language model: token + learned position embeddings, Transformer, tied head."""

    def __init__(self, kind, vocab, d_model, n_heads, n_layers, max_len, k_neighbors=8, visibility=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # tied with the output head: logits start near 0
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        self.body = Transformer(kind, d_model, n_heads, n_layers, k_neighbors, visibility)

    def hidden(self, tokens):
        return self.embed(tokens) + self.pos[:tokens.shape[1]]

    def forward(self, tokens):
        """Logits [B, N, vocab] for the next byte at every position."""
        return self.body(self.hidden(tokens), is_causal=True) @ self.embed.weight.t()
