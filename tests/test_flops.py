"""ascender_torch.flops: hand counts on a tiny config, the matmul part against torch's own FLOP
counter, causal pair counts, and module configs."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import ascender_torch
from ascender_torch import ASCenderAttention, ASCenderHead, AttentionConfig, flops


def test_plain_attention_hand_count():
    # d = 2, dv = 1, N = 3: per pair forward 2d+1 (s) + 4 (softmax) + 2dv (y) = 5 + 4 + 2 = 11; per row dv = 1
    # backward per pair: (2d+3) + 2dv + 3 + 2d + 2d + 2dv = 7 + 2 + 3 + 4 + 4 + 2 = 22; per row 2dv = 2
    r = flops(dict(d=2, dv=1), 3)
    assert r["plain"]["per_pair"] == (11, 22)
    assert r["plain"]["forward"] == 9 * 11 + 3 * 1
    assert r["plain"]["backward"] == 9 * 22 + 3 * 2
    causal = flops(AttentionConfig(d=2, dv=1, causal=True, heads=4), 3)["plain"]
    assert causal["forward"] == 6 * 11 + 3 and causal["forward_layer"] == 4 * (6 * 11 + 3)


def test_ascender_hand_count():
    # d = 2, dv = 1, dz = da = 1, k = 1, reference variant, N = 2; per pair forward:
    # pass 1: 3dz + (2da+2) + 4 + (2+2dz) = 3 + 4 + 4 + 4 = 15; pass 2: (2d+1)*2 + 3dz + 6 = 10 + 3 + 6 = 19
    # moments 12; pass 3: 13 + 4 = 17; output 2dv = 2  ->  65 (reference: no top-k test, no cohesion gate)
    c = AttentionConfig(d=2, dv=1, dz=1, da=1, k_neighbors=1, variant="seed")
    r = flops(c, 2)["ascender"]
    assert r["per_pair"][0] == 65
    rows = 9 + (1 + 4) + (1 + 1)  # moments' std, centroid divide + clamp, y divide + log
    tokens = 2 * 2 + 2 * 1 + 4
    assert r["forward"] == 4 * 65 + 2 * (rows + tokens)
    paper = flops(AttentionConfig(d=2, dv=1, dz=1, da=1, k_neighbors=1), 2)["ascender"]
    assert paper["per_pair"][0] == 65 + 1 + 2  # + top-k candidate test + cohesion gate sum
    # backward: recompute the forward state (65 - 2, not the output), then passes 1-4 of docs/backward.md:
    # (2dv+3) + 2dv + 11 + (4d+1) + 33 + (5d+3) + 9 + (9dz+7) + (5dz+5) + 5da = 5+2+11+9+33+13+9+16+10+5 = 113
    assert r["per_pair"][1] == 63 + 113


def test_matmul_terms_match_torch_flop_counter():
    d, dv, N = 8, 4, 16
    q, k = torch.randn(N, d), torch.randn(N, d)
    v = torch.randn(N, dv)
    with FlopCounterMode(display=False) as counter:
        (torch.softmax(q @ k.T, -1) @ v).sum()
    r = flops(dict(d=d, dv=dv), N)["plain"]["terms"]["forward_pair"]
    # the two matmuls: 2 d + 2 dv per pair; our count adds 1 (scale) to the first
    assert counter.get_total_flops() == N * N * ((r["s = q.k (+ scale)"] - 1) + r["y += e v"])


def test_ascender_costs_more_than_plain_at_equal_n():
    r = flops(AttentionConfig(d=64, dz=32, da=32, heads=8), 4096)
    assert 2.0 < r["ratio"]["forward"] < 4.0 and r["ratio"]["backward"] > 1.5
    assert r["ascender"]["total_layer"] == 8 * r["ascender"]["total"]


def test_config_from_modules():
    attn = ASCenderAttention(64, 4, k=8)
    c = AttentionConfig.of(attn)
    assert (c.d, c.dv, c.dz, c.da, c.k_neighbors, c.heads, c.variant) == (16, 16, 8, 8, 8, 4, "paper")
    assert flops(attn, 10)["config"] == c
    head = ASCenderHead(32, 16)
    assert AttentionConfig.of(head, causal=True) == AttentionConfig(d=16, dz=8, da=8, variant="seed", causal=True)
    assert ascender_torch.flops is flops  # the function, not shadowed by a module
    with pytest.raises(ValueError):
        AttentionConfig(d=4, variant="other")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,n_global", [(None, 0), ((2, 1), 0), ((3, 0), 2), ((-1, 1), 1), ((0, -1), 3)])
def test_visible_pairs_count_the_twins_mask(causal, window, n_global):
    """flops() counts the pairs of J(i) (SPEC section 8): the same number as the twin's mask."""
    from ascender_torch.flops import visible_pairs
    from ascender_torch.reference import allowed_keys

    N = 11
    J = allowed_keys(1, 1, N, N, "cpu", causal, window_size=window, global_tokens=n_global)
    assert visible_pairs(N, causal, window, n_global) == int(J.sum())
    c = AttentionConfig(d=8, causal=causal, window=window, global_tokens=n_global)
    assert flops(c, N)["plain"]["forward"] == int(J.sum()) * flops(c, N)["plain"]["per_pair"][0] + N * 8
