"""Tests of the oracle itself: ascender_torch/reference.py against shared/SPEC.md.

* hand-computed tiny cases (N = 1..4), derived with plain Python `math` from literal tables;
* limits and invariances: omega = 0 is scaled_dot_product_attention, k_neighbors is inert in
  the reference variant, causal mode leaks nothing;
* drop-in equivalence with the seed paper's own `ASCenderHead` (read from shared/seeds at test time);
* gradients: gradcheck with masks, and finite gradients in the SPEC's edge cases.

Everything runs in float64 with tolerance 1e-12 unless said otherwise.
"""

from __future__ import annotations

import math
import pathlib
import re

import pytest
import torch
import torch.nn.functional as F

import ascender_torch
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.reference import ascender_attention_reference as attn

from cases import VARIANTS

EPS = 1e-6  # the seed's epsilon: tau_sep, tau_coh, kappa, score_temp, centroid denominator, std
TOL = 1e-12
R = 1 / math.sqrt(2)
SEEDS_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "seeds"


# --------------------------------------------------------------------------------------------
# plain-Python helpers for the hand computations (no torch)
# --------------------------------------------------------------------------------------------

def dot(x, y):
    return sum(a * b for a, b in zip(x, y))


def sqdist(x, y):
    return sum((a - b) ** 2 for a, b in zip(x, y))


def normalize(x):
    n = math.sqrt(dot(x, x))
    return [a / n for a in x]


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def standardize(row, ddof):
    """(x - mean) / (std + 1e-6) over one row's visible entries; all 0 when n <= 1.
    ddof=1: unbiased std, divisor n - 1 (reference); ddof=0: population std, divisor n (paper)."""
    n = len(row)
    if n <= 1:
        return [0.0] * n
    mean = sum(row) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in row) / (n - ddof))
    return [(x - mean) / (std + EPS) for x in row]


def softmax(row):
    top = max(row)
    e = [math.exp(x - top) for x in row]
    return [x / sum(e) for x in e]


def combination(weights, vectors):
    """sum_l weights[l] * vectors[l]."""
    return [sum(w * vec[c] for w, vec in zip(weights, vectors)) for c in range(len(vectors[0]))]


def scatter(row_vals, cols, n):
    """Place the values of the visible columns `cols` into a length-n row of zeros."""
    out = [0.0] * n
    for j, x in zip(cols, row_vals):
        out[j] = x
    return out


def attend(s, biases, omegas, temp, v, J):
    """S_ij = s_ij + sum_t omega_t b^t_ij;  A_i. = softmax_{j in J(i)}(S_i. / (temp + 1e-6));
    y_i = sum_j A_ij v_j.  `biases` are full N x N rows (0 outside J). Returns (A, y)."""
    n = len(s)
    A, y = [], []
    for i in range(n):
        S = [s[i][j] + sum(om * b[i][j] for om, b in zip(omegas, biases)) for j in J[i]]
        p = softmax([x / (temp + EPS) for x in S])
        A.append(scatter(p, J[i], n))
        y.append(combination(p, [v[j] for j in J[i]]))
    return A, y


# --------------------------------------------------------------------------------------------
# torch-side helpers
# --------------------------------------------------------------------------------------------

def tensor(rows):
    """Rows of features (N lists) -> float64 [1, 1, N, F]."""
    return torch.tensor(rows, dtype=torch.float64)[None, None]


def run(tokens, **kw):
    """The oracle on one batch/head of hand-written tokens; returns y [N, dv] and maps [N, N]."""
    y, maps = attn(*(tensor(tokens[n]) for n in "qkvzh"), return_maps=True, **kw)
    return y[0, 0], {name: m[0, 0] for name, m in maps.items()}


def check(actual, expected, tol=TOL):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


def check_all(y, maps, expected):
    for name, value in expected.items():
        check(y if name == "y" else maps[name], value)


def random_tokens(B=2, H=3, N=7, d=5, dv=4, dz=3, da=3, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = dict(q=d, k=d, v=dv, z=dz, h=da)
    return {n: torch.randn(B, H, N, f, generator=g, dtype=torch.float64).requires_grad_(requires_grad)
            for n, f in shapes.items()}


def random_scalars(H, seed=0, requires_grad=False):
    """Per-head [H] learnable scalars, away from the defaults (kappa small enough that the eta
    clamp is active in some rows)."""
    g = torch.Generator().manual_seed(seed)

    def u(lo, hi):
        x = lo + (hi - lo) * torch.rand(H, generator=g, dtype=torch.float64)
        return x.requires_grad_(requires_grad)

    ranges = dict(lambda_align=(0.5, 1.5), lambda_sep=(0.5, 1.5), lambda_coh=(0.5, 1.5),
                  omega_align=(0.1, 0.6), omega_sep=(0.1, 0.6), omega_coh=(0.1, 0.6),
                  score_temp=(0.6, 1.6), delta=(0.05, 0.35), kappa=(1.0, 4.0))
    return {name: u(*ranges[name]) for name in SCALAR_NAMES}


# --------------------------------------------------------------------------------------------
# 1. hand-computed cases
# --------------------------------------------------------------------------------------------

# Three tokens shared by several hand cases, with their hand-derived tables.
TOK3 = dict(
    q=[[1, 0], [0, 1], [1, 1]],
    k=[[2, 0], [0, 1], [1, 1]],  # k^ = (1,0), (0,1), (r,r) with r = 1/sqrt2
    v=[[1, 2], [3, -1], [0, 1]],
    z=[[0, 0], [1, 0], [0, 1]],
    h=[[1, 0], [3, 4], [0, 2]],  # h^ = (1,0), (.6,.8), (0,1)
)
TOK3_QK = [[2, 0, 1], [0, 1, 1], [2, 1, 2]]  # q_i . k_j
TOK3_COS = [[1, 0, R], [0, 1, R], [R, R, 1]]  # k^_i . k^_j
TOK3_A = [[1, .6, 0], [.6, 1, .8], [0, .8, 1]]  # a_ij = h^_i . h^_j
TOK3_D = [[0, 1, 1], [1, 0, 2], [1, 2, 0]]  # D_ij = ||z_i - z_j||^2


@pytest.mark.parametrize("kappa", [32.0, 1.6], ids=["eta-unclamped", "eta-clamped-row0"])
def test_hand_reference_n3(kappa):
    """Reference variant, N = 3, no mask: key-cosine alignment, rho with self, unbiased std,
    a_02 below delta (relu -> 0); with kappa = 1.6 eta_0 clamps at 1 and eta_1, eta_2 do not."""
    lam_a, lam_s, lam_c = 1.0, 2.0, 0.5
    omegas = (0.3, 0.2, 0.1)
    temp, delta, tau_s, tau_c = 0.5, 0.2, 1.0, 2.0
    y, maps = run(TOK3, variant="seed", scale=1.0, lambda_align=lam_a, lambda_sep=lam_s,
                  lambda_coh=lam_c, omega_align=omegas[0], omega_sep=omegas[1], omega_coh=omegas[2],
                  score_temp=temp, delta=delta, kappa=kappa, tau_sep=tau_s, tau_coh=tau_c)
    z, v = TOK3["z"], TOK3["v"]
    J = [[0, 1, 2]] * 3

    # s_ij = scale * q_i . k_j with scale = 1
    s = TOK3_QK
    # alignment (reference): lambda_align * k^_i . k^_j
    beta_a = [[lam_a * c for c in row] for row in TOK3_COS]
    # kernels: D = [[0,1,1],[1,0,2],[1,2,0]]
    e1, e2 = math.exp(-1 / (tau_s + EPS)), math.exp(-2 / (tau_s + EPS))
    ws = [[1, e1, e1], [e1, 1, e2], [e1, e2, 1]]
    f1, f2 = math.exp(-1 / (tau_c + EPS)), math.exp(-2 / (tau_c + EPS))
    wc = [[1, f1, f1], [f1, 1, f2], [f1, f2, 1]]
    # density with self (ws_ii = 1): rho_0 = 1 + 2 e1 ~ 1.736, rho_1 = rho_2 = 1 + e1 + e2 ~ 1.503
    rho = [1 + 2 * e1, 1 + e1 + e2, 1 + e1 + e2]
    eta_raw = [r / (kappa + EPS) for r in rho]
    if kappa == 1.6:
        assert eta_raw[0] > 1 > eta_raw[1]  # the case is meant to clamp row 0 only
    else:
        assert max(eta_raw) < 1
    eta = [min(1.0, x) for x in eta_raw]
    # redundancy: relu(a - delta) = [[.8,.4,0],[.4,.8,.6],[0,.6,.8]] (a_02 = 0 < delta)
    relu = [[max(0.0, a - delta) for a in row] for row in TOK3_A]
    assert relu[0][2] == relu[2][0] == 0 and min(relu[0][1], relu[1][2]) > 0
    phi = [[ws[i][j] * relu[i][j] for j in range(3)] for i in range(3)]
    beta_s = [[-lam_s * eta[i] * phi[i][j] for j in range(3)] for i in range(3)]
    # centroids c_i = sum_l wc_il z_l / (sum_l wc_il + 1e-6), z = (0,0), (1,0), (0,1)
    den0, den1 = 1 + 2 * f1 + EPS, 1 + f1 + f2 + EPS
    c = [[f1 / den0, f1 / den0], [1 / den1, f2 / den1], [f2 / den1, 1 / den1]]
    assert c[1] == pytest.approx([x / den1 for x in combination(wc[1], z)], abs=1e-15)
    beta_c = [[lam_c * -sqdist(z[j], c[i]) / (tau_c + EPS) for j in range(3)] for i in range(3)]
    # row normalization with the unbiased std
    b_a, b_s, b_c = ([standardize(row, ddof=1) for row in beta] for beta in (beta_a, beta_s, beta_c))
    # spelled out for row 0 of the alignment, [1, 0, r]: mean (1 + r)/3, divisor n - 1 = 2
    m = (1 + 0 + R) / 3
    sd = math.sqrt(((1 - m) ** 2 + (0 - m) ** 2 + (R - m) ** 2) / 2)
    assert b_a[0] == pytest.approx([(1 - m) / (sd + EPS), -m / (sd + EPS), (R - m) / (sd + EPS)],
                                   abs=1e-15)
    A, y_exp = attend(s, (b_a, b_s, b_c), omegas, temp, v, J)

    check_all(y, maps, dict(S_base=s, b_align=b_a, b_sep=b_s, b_coh=b_c, A=A, y=y_exp))


def test_hand_paper_n4_top1():
    """Paper variant, N = 4, k_neighbors = 1: top-1 neighbour by a_il excluding self with a tie
    (row 2: a_21 = a_23 = 0.8 -> the lower index 1), u_i = k^ of that neighbour, rho without
    self, the gates, population std, default scale 1/sqrt(d)."""
    tok = dict(
        q=[[1, 0], [0, 1], [1, -1], [2, 1]],
        k=[[1, 0], [0, 2], [1, 1], [-1, 1]],  # k^ = (1,0), (0,1), (r,r), (-r,r)
        v=[[1, 0], [0, 1], [1, 1], [2, -1]],
        z=[[0, 0], [1, 0], [1, 1], [0, 1]],  # unit square: sides D = 1, diagonals D = 2
        h=[[1, 0], [3, 4], [0, 1], [-3, 4]],  # h^ = (1,0), (.6,.8), (0,1), (-.6,.8)
    )
    lam_a, lam_s, lam_c = 1.5, 1.0, 2.0
    omegas = (0.2, 0.3, 0.4)
    temp, delta, kappa, tau_s, tau_c = 2.0, 0.2, 32.0, 1.0, 0.5
    alpha_a, alpha_c = 2.0, -3.0
    y, maps = run(tok, variant="paper", k_neighbors=1, lambda_align=lam_a, lambda_sep=lam_s,
                  lambda_coh=lam_c, omega_align=omegas[0], omega_sep=omegas[1], omega_coh=omegas[2],
                  score_temp=temp, delta=delta, kappa=kappa, tau_sep=tau_s, tau_coh=tau_c,
                  alpha_align=alpha_a, alpha_coh=alpha_c)
    z, v = tok["z"], tok["v"]
    J = [[0, 1, 2, 3]] * 4

    # s_ij = q_i . k_j / sqrt(2)
    s = [[x / math.sqrt(2) for x in row]
         for row in [[1, 0, 1, -1], [0, 2, 1, 1], [1, -2, 0, -2], [2, 2, 3, -1]]]
    # semantic affinity a_ij = h^_i . h^_j
    a = [[1, .6, 0, -.6],
         [.6, 1, .8, .28],
         [0, .8, 1, .8],
         [-.6, .28, .8, 1]]
    # top-1 over l != i: row 0 -> 1 (0.6), row 1 -> 2 (0.8), row 2 -> 1 (tie with 3), row 3 -> 2
    nbr = [1, 2, 1, 2]
    kh = [[1, 0], [0, 1], [R, R], [-R, R]]
    u = [normalize(kh[l]) for l in nbr]  # u_0 = u_2 = (0,1), u_1 = u_3 = (r,r)
    # gate: one neighbour -> spread = ||k^_l - k^_l||^2 = 0 -> gamma_a = sigmoid(0) = 1/2
    gate_a = [sigmoid(alpha_a * 0.0)] * 4
    assert gate_a[0] == 0.5
    # r_align_ij = k^_j . u_i: rows [0,1,r,r], [r,r,1,0], [0,1,r,r], [r,r,1,0]
    r_align = [[0, 1, R, R], [R, R, 1, 0], [0, 1, R, R], [R, R, 1, 0]]
    assert r_align[1] == pytest.approx([dot(kh[j], u[1]) for j in range(4)], abs=1e-15)
    beta_a = [[lam_a * gate_a[i] * r_align[i][j] for j in range(4)] for i in range(4)]
    # kernels on the unit square
    D = [[0, 1, 2, 1], [1, 0, 1, 2], [2, 1, 0, 1], [1, 2, 1, 0]]
    ws = [[math.exp(-d / (tau_s + EPS)) for d in row] for row in D]
    wc = [[math.exp(-d / (tau_c + EPS)) for d in row] for row in D]
    # density without self: every row has two sides and one diagonal
    e1, e2 = ws[0][1], ws[0][2]
    rho = [2 * e1 + e2] * 4
    eta = [min(1.0, r / (kappa + EPS)) for r in rho]  # ~0.025, not clamped
    # relu(a - delta): rows [.8,.4,0,0], [.4,.8,.6,.08], [0,.6,.8,.6], [0,.08,.6,.8]
    phi = [[ws[i][j] * max(0.0, a[i][j] - delta) for j in range(4)] for i in range(4)]
    assert phi[0][2] == phi[0][3] == 0 and phi[1][3] > 0
    beta_s = [[-lam_s * eta[i] * phi[i][j] for j in range(4)] for i in range(4)]
    # centroids over all 4 (self included): with f1 = wc(side), f2 = wc(diagonal),
    # c_0 = (f1+f2, f1+f2)/den, c_1 = (1+f1, f1+f2)/den, c_2 = (1+f1, 1+f1)/den, c_3 = (f1+f2, 1+f1)/den
    f1, f2 = wc[0][1], wc[0][2]
    den = 1 + 2 * f1 + f2 + EPS
    c = [[(f1 + f2) / den, (f1 + f2) / den], [(1 + f1) / den, (f1 + f2) / den],
         [(1 + f1) / den, (1 + f1) / den], [(f1 + f2) / den, (1 + f1) / den]]
    # cohesion gate: sigmoid(alpha_coh * sum_l wc_il ||z_l - c_i||^2 / (sum_l wc_il + 1e-6))
    gate_c = [sigmoid(alpha_c * sum(wc[i][l] * sqdist(z[l], c[i]) for l in range(4)) / den)
              for i in range(4)]
    beta_c = [[lam_c * gate_c[i] * -sqdist(z[j], c[i]) / (tau_c + EPS) for j in range(4)]
              for i in range(4)]
    # row normalization with the population std
    b_a, b_s, b_c = ([standardize(row, ddof=0) for row in beta] for beta in (beta_a, beta_s, beta_c))
    # spelled out for row 0 of the alignment, 1.5 * 1/2 * [0, 1, r, r]: divisor n = 4
    row0 = [0, 0.75, 0.75 * R, 0.75 * R]
    m = 0.75 * (1 + 2 * R) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in row0) / 4)
    assert b_a[0] == pytest.approx([(x - m) / (sd + EPS) for x in row0], abs=1e-15)
    A, y_exp = attend(s, (b_a, b_s, b_c), omegas, temp, v, J)

    check_all(y, maps, dict(S_base=s, b_align=b_a, b_sep=b_s, b_coh=b_c, A=A, y=y_exp))


def test_hand_paper_padding_gates():
    """Paper variant, N = 4 with token 3 padded (mask_stats=True), k_neighbors = 5 (fewer exist):
    every statistic runs over J = {0,1,2}; row 3 (a padded query) has 3 neighbours and its own
    token is not in its set; gates with several neighbours; eta clamps in row 3 only."""
    tok = dict(
        q=[[1, 0], [0, 1], [1, 1], [1, -1]],
        k=[[1, 0], [0, 1], [3, 4], [5, -7]],  # k^ = (1,0), (0,1), (.6,.8); k_3 is padding
        v=[[1, 0], [0, 1], [2, 2], [100, -100]],  # v_3 would show if it leaked
        z=[[0, 0], [1, 0], [0, 2], [0, 0]],  # z_3 = z_0
        h=[[1, 0], [1, 1], [0, 1], [1, 0]],  # h^ = (1,0), (r,r), (0,1), (1,0)
    )
    lam_a, lam_s, lam_c = 1.0, 1.5, 0.8
    omegas = (0.5, 0.3, 0.2)
    temp, delta, kappa, tau_s, tau_c = 1.3, 0.2, 1.5, 2.0, 1.0
    alpha_a, alpha_c = 2.0, 0.5
    y, maps = run(tok, variant="paper", k_neighbors=5, scale=0.5,
                  key_padding_mask=torch.tensor([[False, False, False, True]]),
                  lambda_align=lam_a, lambda_sep=lam_s, lambda_coh=lam_c, omega_align=omegas[0],
                  omega_sep=omegas[1], omega_coh=omegas[2], score_temp=temp, delta=delta,
                  kappa=kappa, tau_sep=tau_s, tau_coh=tau_c, alpha_align=alpha_a, alpha_coh=alpha_c)
    z, v = tok["z"], tok["v"]
    vis = [0, 1, 2]
    J = [vis] * 4

    # s_ij = 0.5 q_i . k_j (S_base is the full map, padded column included)
    s = [[x / 2 for x in row] for row in [[1, 0, 3, 5], [0, 1, 4, -7], [1, 1, 7, -2], [1, -1, -1, 12]]]
    # neighbours: all visible l != i (k = 5 but only 2 or 3 candidates)
    nbr = [[1, 2], [0, 2], [0, 1], [0, 1, 2]]
    kh = [[1, 0], [0, 1], [.6, .8]]
    # u_0 = (.6,1.8)/sqrt(3.6), u_1 = (1.6,.8)/sqrt(3.2), u_2 = (1,1)/sqrt2, u_3 = (1.6,1.8)/sqrt(5.8)
    u = [[.6 / math.sqrt(3.6), 1.8 / math.sqrt(3.6)], [1.6 / math.sqrt(3.2), .8 / math.sqrt(3.2)],
         [R, R], [1.6 / math.sqrt(5.8), 1.8 / math.sqrt(5.8)]]
    assert u[3] == pytest.approx(normalize(combination([1, 1, 1], kh)), abs=1e-15)
    # spread = mean_l ||k^_l - mean k^||^2 = 1 - ||mean k^||^2 for unit vectors:
    # two neighbours -> (1 - cos)/2 with cos_12 = .8, cos_02 = .6, cos_01 = 0; row 3: 1 - 5.8/9
    spread = [0.1, 0.2, 0.5, 1 - 5.8 / 9]
    gate_a = [sigmoid(alpha_a * x) for x in spread]
    beta_a = [[lam_a * gate_a[i] * dot(kh[j], u[i]) for j in vis] for i in range(4)]
    # D over the visible columns (z_3 = z_0, so row 3 = row 0)
    D = [[0, 1, 4], [1, 0, 5], [4, 5, 0], [0, 1, 4]]
    ws = [[math.exp(-d / (tau_s + EPS)) for d in row] for row in D]
    wc = [[math.exp(-d / (tau_c + EPS)) for d in row] for row in D]
    # density over l in J(i), l != i; token 3 is not in J(3), so row 3 sums all three (incl. ws_30 = 1)
    rho = [ws[0][1] + ws[0][2], ws[1][0] + ws[1][2], ws[2][0] + ws[2][1], 1 + ws[3][1] + ws[3][2]]
    eta_raw = [r / (kappa + EPS) for r in rho]  # ~ .49, .46, .14, 1.16
    assert max(eta_raw[:3]) < 1 < eta_raw[3]
    eta = [min(1.0, x) for x in eta_raw]
    # a over the visible columns: rows [1,r,0], [r,1,r], [0,r,1], [1,r,0]; a = 0 < delta -> 0
    a = [[1, R, 0], [R, 1, R], [0, R, 1], [1, R, 0]]
    phi = [[ws[i][j] * max(0.0, a[i][j] - delta) for j in vis] for i in range(4)]
    beta_s = [[-lam_s * eta[i] * phi[i][j] for j in vis] for i in range(4)]
    # centroids over J = {0,1,2}: c_i = (wc_i1, 2 wc_i2) / (wc_i0 + wc_i1 + wc_i2 + 1e-6)
    den = [sum(row) + EPS for row in wc]
    c = [[wc[i][1] / den[i], 2 * wc[i][2] / den[i]] for i in range(4)]
    gate_c = [sigmoid(alpha_c * sum(wc[i][l] * sqdist(z[l], c[i]) for l in vis) / den[i])
              for i in range(4)]
    beta_c = [[lam_c * gate_c[i] * -sqdist(z[j], c[i]) / (tau_c + EPS) for j in vis] for i in range(4)]
    # population std over the 3 visible entries; the padded column is 0 in the maps
    b_a, b_s, b_c = ([scatter(standardize(row, ddof=0), vis, 4) for row in beta]
                     for beta in (beta_a, beta_s, beta_c))
    A, y_exp = attend(s, (b_a, b_s, b_c), omegas, temp, v, J)
    assert all(row[3] == 0 for row in A)

    check_all(y, maps, dict(S_base=s, b_align=b_a, b_sep=b_s, b_coh=b_c, A=A, y=y_exp))


def test_hand_reference_causal_n3():
    """Reference variant, is_causal (mask_stats=True): row 0 sees one key (n <= 1: biases 0,
    y_0 = v_0), row 1 sees two (unbiased std of a pair: |b| ~ 1/sqrt2), row 2 sees all."""
    lam_a, lam_s, lam_c = 1.0, 2.0, 0.5
    omegas = (0.3, 0.2, 0.1)
    temp, delta, kappa, tau_s, tau_c = 0.5, 0.2, 32.0, 1.0, 2.0
    y, maps = run(TOK3, variant="seed", scale=1.0, is_causal=True, lambda_align=lam_a,
                  lambda_sep=lam_s, lambda_coh=lam_c, omega_align=omegas[0], omega_sep=omegas[1],
                  omega_coh=omegas[2], score_temp=temp, delta=delta, kappa=kappa, tau_sep=tau_s,
                  tau_coh=tau_c)
    z, v = TOK3["z"], TOK3["v"]
    J = [[0], [0, 1], [0, 1, 2]]

    ws = [[math.exp(-d / (tau_s + EPS)) for d in row] for row in TOK3_D]
    wc = [[math.exp(-d / (tau_c + EPS)) for d in row] for row in TOK3_D]
    b_a, b_s, b_c = [], [], []
    for i, vis in enumerate(J):
        beta_a = [lam_a * TOK3_COS[i][j] for j in vis]
        # rho_i = sum_{j <= i} ws_ij (self included): 1, 1 + ws_10, 1 + ws_20 + ws_21
        rho = sum(ws[i][j] for j in vis)
        eta = min(1.0, rho / (kappa + EPS))
        beta_s = [-lam_s * eta * ws[i][j] * max(0.0, TOK3_A[i][j] - delta) for j in vis]
        # c_0 = z_0 / (1 + 1e-6); c_1 = (wc_10 z_0 + z_1) / (wc_10 + 1 + 1e-6); c_2 over all three
        den = sum(wc[i][l] for l in vis) + EPS
        c = [x / den for x in combination([wc[i][l] for l in vis], [z[l] for l in vis])]
        beta_c = [lam_c * -sqdist(z[j], c) / (tau_c + EPS) for j in vis]
        b_a.append(scatter(standardize(beta_a, ddof=1), vis, 3))
        b_s.append(scatter(standardize(beta_s, ddof=1), vis, 3))
        b_c.append(scatter(standardize(beta_c, ddof=1), vis, 3))
    # row 1 is a pair: (x - mean) / (|x0 - x1| / sqrt2 + 1e-6) = +-1/sqrt2 up to the 1e-6
    for b in (b_a, b_s, b_c):
        assert b[0] == [0.0, 0.0, 0.0]
        assert abs(b[1][0]) == pytest.approx(R, abs=1e-3) and b[1][0] == pytest.approx(-b[1][1])
    A, y_exp = attend(TOK3_QK, (b_a, b_s, b_c), omegas, temp, v, J)
    assert y_exp[0] == v[0]

    check_all(y, maps, dict(S_base=TOK3_QK, b_align=b_a, b_sep=b_s, b_coh=b_c, A=A, y=y_exp))


@pytest.mark.parametrize("variant", VARIANTS)
def test_hand_n2_unbiased_vs_population_std(variant):
    """N = 2: every bias row is a pair, normalized to +-1/sqrt2 with the unbiased std (reference)
    and to +-1 with the population std (paper). The paper's alignment uses the other token's
    key as heading, which flips the sign of b_align against the reference."""
    tok = dict(q=[[1, 0], [1, 1]], k=[[1, 0], [0, 1]], v=[[1, 0], [0, 1]], z=[[0], [1]],
               h=[[1, 0], [1, 1]])
    lam_a, lam_s, lam_c = 1.0, 1.0, 1.0
    omegas = (0.5, 0.4, 0.3)
    temp, delta, kappa, tau_s, tau_c = 1.0, 0.2, 32.0, 1.0, 1.0
    alpha_a, alpha_c = -1.0, -2.0
    paper = variant == "paper"
    y, maps = run(tok, variant=variant, scale=1.0, lambda_align=lam_a, lambda_sep=lam_s,
                  lambda_coh=lam_c, omega_align=omegas[0], omega_sep=omegas[1], omega_coh=omegas[2],
                  score_temp=temp, delta=delta, kappa=kappa, tau_sep=tau_s, tau_coh=tau_c,
                  alpha_align=alpha_a, alpha_coh=alpha_c)
    v = tok["v"]
    J = [[0, 1], [0, 1]]
    ddof = 0 if paper else 1

    s = [[1, 0], [1, 1]]  # q_i . k_j
    # alignment: reference k^_i . k^_j = identity; paper u_0 = k^_1, u_1 = k^_0 (the only
    # neighbour), gamma_a = sigmoid(alpha * 0) = 1/2, so beta_a = 1/2 * [[0,1],[1,0]]
    beta_a = [[0, .5], [.5, 0]] if paper else [[1, 0], [0, 1]]
    # D_01 = 1; ws_01 = e, wc_01 = f; a_01 = h^_0 . h^_1 = r > delta
    e = math.exp(-1 / (tau_s + EPS))
    f = math.exp(-1 / (tau_c + EPS))
    rho = e if paper else 1 + e  # self excluded (paper) / included (reference)
    eta = rho / (kappa + EPS)
    phi = [[1 * (1 - delta), e * (R - delta)], [e * (R - delta), 1 * (1 - delta)]]
    beta_s = [[-lam_s * eta * x for x in row] for row in phi]
    # centroids on the line z = 0, 1: c_0 = f / (1 + f + 1e-6), c_1 = 1 / (1 + f + 1e-6)
    den = 1 + f + EPS
    c = [f / den, 1 / den]
    r_coh = [[-c[0] ** 2, -(1 - c[0]) ** 2], [-c[1] ** 2, -(1 - c[1]) ** 2]]
    if paper:
        gate_c = [sigmoid(alpha_c * (1 * c[0] ** 2 + f * (1 - c[0]) ** 2) / den),
                  sigmoid(alpha_c * (f * c[1] ** 2 + 1 * (1 - c[1]) ** 2) / den)]
    else:
        gate_c = [1.0, 1.0]
    beta_c = [[lam_c * gate_c[i] * r_coh[i][j] / (tau_c + EPS) for j in range(2)] for i in range(2)]
    # a pair [x0, x1]: mean (x0+x1)/2, deviations +-(x0-x1)/2,
    # std = |x0-x1|/sqrt2 (n-1) or |x0-x1|/2 (n)
    b = []
    for beta in (beta_a, beta_s, beta_c):
        rows = []
        for x0, x1 in beta:
            half = (x0 - x1) / 2
            std = abs(x0 - x1) / (2 if paper else math.sqrt(2))
            rows.append([half / (std + EPS), -half / (std + EPS)])
            assert rows[-1] == pytest.approx(standardize([x0, x1], ddof), abs=1e-15)
            # (the 1e-6 shows at ~1e-4 in the separation row, whose entries are ~1e-2)
            assert abs(rows[-1][0]) == pytest.approx(1.0 if paper else R, abs=1e-3)
        b.append(rows)
    assert b[0][0][0] == pytest.approx(-1 if paper else R, abs=1e-5)
    A, y_exp = attend(s, b, omegas, temp, v, J)

    check_all(y, maps, dict(S_base=s, b_align=b[0], b_sep=b[1], b_coh=b[2], A=A, y=y_exp))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", ["N=1", "one-unpadded-key", "attn_mask-one-key"])
def test_single_visible_key(variant, case):
    """n_i <= 1: all normalized biases are 0 and y_i is the value of the one visible key."""
    if case == "N=1":
        tok = {n: [rows[1]] for n, rows in TOK3.items()}
        kw, key = {}, [0]
    elif case == "one-unpadded-key":  # every row sees only key 1
        tok, kw, key = TOK3, dict(key_padding_mask=torch.tensor([[True, False, True]])), [1, 1, 1]
    else:  # row i sees only key (i + 1) % 3
        key = [1, 2, 0]
        mask = torch.tensor([[j == key[i] for j in range(3)] for i in range(3)])
        tok, kw = TOK3, dict(attn_mask=mask)
    y, maps = run(tok, variant=variant, k_neighbors=2, **kw)
    n = len(key)
    zeros = [[0.0] * n for _ in range(n)]
    A = [[1.0 if j == key[i] else 0.0 for j in range(n)] for i in range(n)]
    check_all(y, maps, dict(b_align=zeros, b_sep=zeros, b_coh=zeros, A=A,
                            y=[tok["v"][key[i]] for i in range(n)]))


@pytest.mark.parametrize("variant", VARIANTS)
def test_empty_row_outputs_zero(variant):
    """n_i = 0 (a fully masked row): y_i = 0 and A_i. = 0; the other rows are unaffected."""
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    y, maps = run(TOK3, variant=variant, attn_mask=mask)
    y_full, _ = run(TOK3, variant=variant)
    check(y[1], [0.0, 0.0])
    check(maps["A"][1], [0.0, 0.0, 0.0])
    torch.testing.assert_close(y[[0, 2]], y_full[[0, 2]], atol=TOL, rtol=0)


# --------------------------------------------------------------------------------------------
# 2-4. limits and invariances on random inputs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("score_temp", [0.3, 1.0, 2.5])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_zero_omega_is_sdpa(variant, is_causal, score_temp, scale):
    t = random_tokens(seed=1)
    y = attn(**t, omega_align=0.0, omega_sep=0.0, omega_coh=0.0, score_temp=score_temp,
             scale=scale, variant=variant, is_causal=is_causal, k_neighbors=3)
    base = 1 / math.sqrt(t["q"].shape[-1]) if scale is None else scale
    expected = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=is_causal,
                                              scale=base / (score_temp + EPS))
    torch.testing.assert_close(y, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_per_head_scalars(variant):
    """[H] learnable scalars: head h of the output is the oracle run on head h alone with the
    h-th value of every scalar."""
    t = random_tokens(seed=6)
    sc = random_scalars(3, seed=6)
    kw = dict(variant=variant, k_neighbors=2, is_causal=True)
    y = attn(**t, **sc, **kw)
    for head in range(3):
        y_h = attn(**{n: x[:, head:head + 1] for n, x in t.items()},
                   **{n: float(x[head]) for n, x in sc.items()}, **kw)
        torch.testing.assert_close(y[:, head:head + 1], y_h, atol=TOL, rtol=0)


@pytest.mark.parametrize("masks", ["none", "padding", "causal"])
def test_reference_variant_ignores_k_neighbors(masks):
    t = random_tokens(seed=2)
    kw = dict(variant="seed", **random_scalars(3, seed=2))
    if masks == "padding":
        kw["key_padding_mask"] = torch.tensor([[False] * 5 + [True] * 2, [False] * 7])
    elif masks == "causal":
        kw["is_causal"] = True
    ys = [attn(**t, k_neighbors=kn, **kw) for kn in (1, 3, 100)]
    for other in ys[1:]:
        torch.testing.assert_close(other, ys[0], atol=0, rtol=0)


def test_paper_variant_k_neighbors_saturates():
    """Control for the test above: in the paper variant k matters, until it reaches N - 1."""
    t = random_tokens(seed=3)
    ys = {kn: attn(**t, k_neighbors=kn, variant="paper") for kn in (1, 3, 6, 100)}
    assert not torch.allclose(ys[1], ys[3], atol=1e-6)
    torch.testing.assert_close(ys[100], ys[6], atol=0, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("t_pos", [0, 3, 6])
def test_causal_leaks_nothing(variant, t_pos):
    """is_causal=True (mask_stats=True): changing tokens after position t changes neither the
    outputs at positions <= t nor their gradient, which is 0 for every input after t."""
    N = 8
    t = random_tokens(N=N, seed=4, requires_grad=True)
    changed = random_tokens(N=N, seed=5)
    kw = dict(variant=variant, is_causal=True, k_neighbors=3, **random_scalars(3, seed=4))
    mixed = {n: torch.cat([x.detach()[:, :, :t_pos + 1], changed[n][:, :, t_pos + 1:]], 2)
             for n, x in t.items()}
    y = attn(**t, **kw)
    y_mixed = attn(**mixed, **kw)
    torch.testing.assert_close(y_mixed[:, :, :t_pos + 1], y[:, :, :t_pos + 1], atol=TOL, rtol=0)

    past = y[:, :, :t_pos + 1]
    w = torch.randn(past.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (past * w).sum().backward()
    for n, x in t.items():
        assert torch.all(x.grad[:, :, t_pos + 1:] == 0), n

    # control: without mask_stats the statistics see the future and the past does change
    # (from row 1 on; row 0 has a single key in its softmax)
    if t_pos == 0:
        return
    y_ms = attn(**t, **{**kw, "mask_stats": False})
    y_ms_mixed = attn(**mixed, **{**kw, "mask_stats": False})
    assert not torch.allclose(y_ms_mixed[:, :, :t_pos + 1], y_ms[:, :, :t_pos + 1], atol=1e-9)


# --------------------------------------------------------------------------------------------
# 5. drop-in equivalence with the seed paper's ASCenderHead
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def seed_head_cls():
    """The seed paper's ASCenderHead, exec'd from the last ```python block of shared/seeds/001_*.txt
    that defines it (the test holds no copy of that code)."""
    if not SEEDS_DIR.is_dir():
        pytest.skip(f"seed papers directory not found: {SEEDS_DIR}")
    blocks = []
    for path in sorted(SEEDS_DIR.glob("001_*.txt")):
        text = path.read_text(encoding="utf-8")
        blocks += [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class ASCenderHead" in b]
    assert blocks, f"no ```python block with 'class ASCenderHead' in {SEEDS_DIR}/001_*.txt"
    namespace = {}
    exec(compile(blocks[-1], "seed_001_ASCenderHead", "exec"), namespace)
    return namespace["ASCenderHead"]


def make_heads(seed_head_cls, d_model, d_head, k):
    """The seed module with non-default scalars, and ours loaded from its state_dict; float64."""
    torch.manual_seed(0)
    seed = seed_head_cls(d_model, d_head, k=k, tau_sep=0.7, tau_coh=1.3)
    with torch.no_grad():
        for name, value in dict(lambda_align=0.8, lambda_sep=1.7, lambda_coh=0.6, omega_a=0.4,
                                omega_s=0.3, omega_c=0.5, score_temp=0.8, delta=0.1, kappa=3.0).items():
            getattr(seed, name).fill_(value)
    torch.manual_seed(123)  # different init, so only the state_dict can make them agree
    ours = ascender_torch.ASCenderHead(d_model, d_head, k=k, tau_sep=0.7, tau_coh=1.3)
    ours.load_state_dict(seed.state_dict())  # strict
    return seed.double(), ours.double()


def test_state_dict_keys_match_seed(seed_head_cls):
    seed = seed_head_cls(16, 8, k=4)
    ours = ascender_torch.ASCenderHead(16, 8, k=4)
    s_sd, o_sd = seed.state_dict(), ours.state_dict()
    assert set(s_sd) == set(o_sd)
    assert {n: t.shape for n, t in s_sd.items()} == {n: t.shape for n, t in o_sd.items()}
    assert {n: t.dtype for n, t in s_sd.items()} == {n: t.dtype for n, t in o_sd.items()}
    ours.load_state_dict(s_sd)  # strict, both ways
    seed.load_state_dict(o_sd)


@pytest.mark.parametrize("k, N", [(4, 7), (16, 16)])
@pytest.mark.parametrize("mask", ["none", "causal-2d", "random-3d"])
def test_matches_seed_module(seed_head_cls, k, N, mask):
    """Ours (the head, and the oracle called directly) give the seed module's Y, A and maps."""
    d_model, d_head, B = 12, 8, 2
    seed, ours = make_heads(seed_head_cls, d_model, d_head, k)
    g = torch.Generator().manual_seed(N)
    X = torch.randn(B, N, d_model, generator=g, dtype=torch.float64)
    if mask == "none":
        attn_mask = None
    elif mask == "causal-2d":
        attn_mask = torch.ones(N, N, dtype=torch.long).tril()
    else:  # 0 = blocked; the diagonal stays open so the seed has no empty (NaN) row
        attn_mask = (torch.rand(B, N, N, generator=g) < 0.6).long() | torch.eye(N, dtype=torch.long)

    with torch.no_grad():
        Y_s, A_s, maps_s = seed(X, attn_mask)
        Y_o, A_o, maps_o = ours(X, attn_mask)
        # the oracle itself, on the head's projections (mask only on the softmax, as the seed)
        qkvzh = [m(X).unsqueeze(1) for m in (seed.WQ, seed.WK, seed.WV, seed.U, seed.P)]
        y_r, maps_r = attn(*qkvzh, lambda_align=seed.lambda_align, lambda_sep=seed.lambda_sep,
                           lambda_coh=seed.lambda_coh, omega_align=seed.omega_a, omega_sep=seed.omega_s,
                           omega_coh=seed.omega_c, score_temp=seed.score_temp, delta=seed.delta,
                           kappa=seed.kappa, k_neighbors=k, tau_sep=0.7, tau_coh=1.3,
                           variant="seed", mask_stats=False, return_maps=True,
                           attn_mask=None if attn_mask is None else attn_mask.bool().reshape(-1, 1, N, N))
    assert torch.isfinite(Y_s).all()
    tol = dict(atol=1e-10, rtol=0)
    for name, (mine, theirs) in dict(Y=(Y_o, Y_s), A=(A_o, A_s), **{
            n: (maps_o[n], maps_s[n]) for n in ("S_base", "b_align", "b_sep", "b_coh")}).items():
        torch.testing.assert_close(mine, theirs, **tol, msg=lambda m: f"head {name}: {m}")
    torch.testing.assert_close(y_r.squeeze(1), Y_s, **tol)
    torch.testing.assert_close(maps_r["A"].squeeze(1), A_s, **tol)
    for n in ("S_base", "b_align", "b_sep", "b_coh"):
        torch.testing.assert_close(maps_r[n].squeeze(1), maps_s[n], **tol, msg=lambda m: f"oracle {n}: {m}")


# --------------------------------------------------------------------------------------------
# 6. gradients of the oracle
# --------------------------------------------------------------------------------------------

def masks_for(kind, B, N):
    if kind == "causal+padding":
        return dict(is_causal=True, key_padding_mask=torch.tensor([[False] * (N - 1) + [True]] * B))
    if kind == "attn_mask+empty-row":
        m = torch.rand(B, 1, N, N, generator=torch.Generator().manual_seed(7)) < 0.6
        m[..., 1, :] = False  # one fully masked row
        return dict(attn_mask=m)
    return {}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("masks", ["none", "causal+padding", "attn_mask+empty-row"])
@pytest.mark.parametrize("mask_stats", [True, False])
def test_gradcheck(variant, masks, mask_stats):
    B, H, N = 1, 2, 5
    t = random_tokens(B=B, H=H, N=N, d=4, dv=3, dz=2, da=3, seed=8, requires_grad=True)
    sc = random_scalars(H, seed=8, requires_grad=True)
    kw = dict(variant=variant, k_neighbors=2, alpha_align=-1.5, alpha_coh=0.7,
              mask_stats=mask_stats, **masks_for(masks, B, N))

    def f(*args):
        return attn(*args[:5], **dict(zip(SCALAR_NAMES, args[5:])), **kw)

    inputs = (*t.values(), *sc.values())
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def edge_case(name):
    """Inputs [B=2, H=2, N, *] and masks for the SPEC's degenerate cases."""
    N = 1 if name == "N=1" else 5
    t = random_tokens(B=2, H=2, N=N, d=4, dv=3, dz=2, da=3, seed=9)
    kw = {}
    if name == "identical-tokens":  # every bias row is constant: std = 0
        t = {n: x[:, :, :1].expand_as(x).clone() for n, x in t.items()}
    elif name == "fully-masked-row":
        m = torch.ones(2, 2, N, N, dtype=torch.bool)
        m[:, :, 2] = False
        kw = dict(attn_mask=m)
    elif name == "all-padding":
        kw = dict(key_padding_mask=torch.tensor([[True] * N, [False] * N]))
    elif name == "attn_mask-score_temp":  # the seed's grad of score_temp is NaN here
        kw = dict(attn_mask=torch.ones(N, N, dtype=torch.bool).tril())
    elif name == "zero-keys":  # zero k and h rows: k^ = h^ = 0
        t["k"][:, :, 1] = 0
        t["k"][:, 0, 3] = 0
        t["h"][:, :, 2] = 0
    return t, kw


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mask_stats", [True, False])
@pytest.mark.parametrize("case", ["identical-tokens", "N=1", "fully-masked-row", "all-padding",
                                  "attn_mask-score_temp", "zero-keys"])
def test_gradients_finite_in_edge_cases(variant, mask_stats, case):
    t, kw = edge_case(case)
    t = {n: x.requires_grad_() for n, x in t.items()}
    sc = random_scalars(2, seed=9, requires_grad=True)
    y, maps = attn(**t, **sc, **kw, variant=variant, k_neighbors=2, mask_stats=mask_stats,
                   return_maps=True)
    assert all(torch.isfinite(m).all() for m in maps.values())
    w = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (y * w).sum().backward()
    assert torch.isfinite(y).all()
    for name, x in {**t, **sc}.items():
        assert x.grad is not None and torch.isfinite(x.grad).all(), name
    if case == "fully-masked-row":  # y_2 = 0 and no gradient reaches q_2
        assert torch.all(y[:, :, 2] == 0) and torch.all(t["q"].grad[:, :, 2] == 0)
    if case == "all-padding":
        assert torch.all(y[0] == 0) and torch.all(t["q"].grad[0] == 0)
    if case == "attn_mask-score_temp":
        assert torch.any(sc["score_temp"].grad != 0)
    if case == "zero-keys":  # normalize(0) passes no gradient: h reaches y only through h^, and
        # a zero key only through the scores s = scale q.k (dL/dk_j = scale sum_i dL/ds_ij q_i)
        assert torch.all(t["h"].grad[:, :, 2] == 0)
        y, maps = attn(**t, **sc, **kw, variant=variant, k_neighbors=2, mask_stats=mask_stats,
                       return_maps=True)
        grad_s, grad_k = torch.autograd.grad((y * w).sum(), (maps["S_base"], t["k"]))
        via_scores = grad_s.transpose(-2, -1) @ t["q"] / 2  # scale = 1/sqrt(4)
        torch.testing.assert_close(grad_k[:, :, 1], via_scores[:, :, 1], atol=TOL, rtol=0)
        torch.testing.assert_close(grad_k[:, 0, 3], via_scores[:, 0, 3], atol=TOL, rtol=0)


def test_seed_score_temp_grad_is_nan_with_mask(seed_head_cls):
    """Documents the seed bug the oracle must not have (the oracle side is the edge-case test
    above): with any attn_mask the seed's score_temp gradient is NaN."""
    seed, _ = make_heads(seed_head_cls, 12, 8, k=4)
    X = torch.randn(2, 6, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Y, _, _ = seed(X, torch.ones(6, 6, dtype=torch.long).tril())
    Y.sum().backward()
    assert torch.isnan(seed.score_temp.grad)
