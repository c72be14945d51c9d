"""Magnitude Attention (SPEC section 7, seed 004): the reference twin against the seed's claims
and a dense solve, its numerics and gradients, the MagnitudeAttention module, the fused op
against the reference, and ASCenderAttention's magnitude gate."""

from __future__ import annotations

import math

import pytest
import torch

import ascender_torch
from ascender_torch import MagnitudeAttention, functional
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.reference import magnitude_attention_reference

from cases import rel_err

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _inv_softplus(t: float) -> float:
    return t + math.log(-math.expm1(-t))


def _kernel_matrix(k: torch.Tensor, t: float, eps: float) -> torch.Tensor:
    """Zm + eps I for one key set k [N, d], built independently of the reference."""
    D = torch.cdist(k, k, compute_mode="donot_use_mm_for_euclid_dist") ** 2
    return torch.exp(-t * D / k.shape[-1]) + eps * torch.eye(k.shape[0], dtype=k.dtype)


def make_magnitude_problem(B=2, H=2, N=9, d=8, dv=5, dtype=torch.float64, seed=0, t_raw=(0.2, -0.5)):
    """Random q, k, v [B, H, N, *], per-head t_raw, beta, gamma, and a key_padding_mask that pads
    two keys of batch 0 (more valid keys than the default n_iter, so no step runs at the rounding
    level) and, for B >= 3, every key of batch 2 (an all-frozen (b, h) and all-empty rows)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    q, k, v = rnd(B, H, N, d), rnd(B, H, N, d), rnd(B, H, N, dv)
    params = dict(t_raw=torch.tensor(t_raw, dtype=dtype)[:H], beta=(rnd(H) + 1.0), gamma=rnd(H) * 0.5)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, 2] = kpm[0, N - 2] = True
    if B >= 3:
        kpm[2] = True
    return (q, k, v), params, kpm


def _leaves(tensors, params, dtype):
    tensors = [t.detach().to(dtype).requires_grad_() for t in tensors]
    params = {n: p.detach().to(dtype).requires_grad_() for n, p in params.items()}
    return tensors, params


def _outputs_and_grads(fn, tensors, params, dtype, **kw):
    """y, mu and the gradients of a loss that uses both, w.r.t. q, k, v, t_raw, beta, gamma."""
    tensors, params = _leaves(tensors, params, dtype)
    y, mu = fn(*tensors, **params, return_mu=True, **kw)
    wy = torch.linspace(-1.0, 1.0, y.numel(), dtype=dtype).reshape(y.shape)
    wm = torch.linspace(0.5, -0.5, mu.numel(), dtype=dtype).reshape(mu.shape)
    ((wy * y).sum() + (wm * mu).sum()).backward()
    return [y, mu] + [t.grad for t in tensors] + [p.grad for p in params.values()]


# ---------------------------------------------------------------------------------------------
# The seed's worked example: 50 clones and one distinct key
# ---------------------------------------------------------------------------------------------


def _clones_and_unique(n_clones=50, d=8, far=20.0, dtype=torch.float64):
    """k [1, 1, n_clones + 1, d]: n_clones copies of e_0, then far * e_1 (orthogonal to the clones,
    ||k_u - k_c||^2 / d = (far^2 + 1) / 8 ~ 50, so Zm between the groups is ~e^-50 at t = 1)."""
    k = torch.zeros(1, 1, n_clones + 1, d, dtype=dtype)
    k[..., :n_clones, 0] = 1.0
    k[..., n_clones, 1] = far
    return k


@pytest.mark.parametrize("n_iter", [3, 4, 10])
def test_worked_example_clones_share_one_unit_of_magnitude(n_iter):
    """(Zm + eps I) mu = 1 with 50 identical keys and one far key: each clone gets mu = 1/50, the
    unique key mu = 1, so the cluster's total mu (its effective count) is one key."""
    k = _clones_and_unique()
    eps = 1e-6
    _, mu = magnitude_attention_reference(k, k, k, t_raw=_inv_softplus(1.0), eps=eps, n_iter=n_iter,
                                          return_mu=True)
    mu = mu[0, 0]
    # exact: 50 mu_c + eps mu_c = 1 and (1 + eps) mu_u = 1 (cross terms ~e^-50)
    assert torch.allclose(mu[:50], torch.full_like(mu[:50], 1 / 50), rtol=1e-4, atol=0)
    assert mu[50].item() == pytest.approx(1.0, rel=1e-4)
    assert mu[:50].sum().item() == pytest.approx(1.0, rel=1e-4)  # 50 clones = 1 effective key
    assert mu.sum().item() == pytest.approx(2.0, rel=1e-4)  # the magnitude |X| of the whole set


def test_worked_example_mu_weighting_removes_probability_hijacking():
    """The seed's numbers: e^(q.k_u) = 20 for the unique key, e^(q.k_c) = 1 for each of 50 clones.
    Plain attention gives the cluster 50/70 of the mass and the unique key 20/70. We check:
    (a) plain attention (gate = 1: beta = 0, gamma = +large) reproduces 20/70 and 50/70;
    (b) weighting each value by mu instead (the seed's idealized gate, softmax @ (mu * v), with mu
        from the reference) gives the cluster a total contribution of (1/70) * 50 * (1/50) = 1/70,
        exactly one clone-scored key, i.e. the 50 clones count as one key;
    (c) the operator's actual gate sigmoid(beta mu + gamma) is applied per key: with values e_0 on
        the clones and e_1 on the unique key, y = [50 g_c, 20 g_u] / 70."""
    d = 8
    k = _clones_and_unique(d=d)
    scale = 1.0 / math.sqrt(d)
    q = torch.zeros(1, 1, 1, d, dtype=torch.float64)
    q[..., 1] = math.log(20.0) / (scale * 20.0)  # q.k_u * scale = ln 20, q.k_c = 0
    q = q.expand(1, 1, 51, d)
    v = torch.zeros(1, 1, 51, 2, dtype=torch.float64)
    v[..., :50, 0] = 1.0
    v[..., 50, 1] = 1.0
    kw = dict(t_raw=_inv_softplus(1.0), eps=1e-6, n_iter=4)

    y_plain = magnitude_attention_reference(q, k, v, beta=0.0, gamma=40.0, **kw)[0, 0, 0]
    assert y_plain.tolist() == pytest.approx([50 / 70, 20 / 70], rel=1e-12)

    _, mu = magnitude_attention_reference(q, k, v, return_mu=True, **kw)
    P = torch.softmax(scale * q[0, 0, :1] @ k[0, 0].T, dim=-1)[0]  # [51]
    assert P[50].item() == pytest.approx(20 / 70, rel=1e-12)
    y_mu = P @ (mu[0, 0].unsqueeze(-1) * v[0, 0])
    assert y_mu[0].item() == pytest.approx(1 / 70, rel=1e-4)  # the cluster = one key with score 1
    assert y_mu[1].item() == pytest.approx(20 / 70, rel=1e-4)  # the unique key keeps its weight
    assert (y_mu[1] / y_mu[0]).item() == pytest.approx(20.0, rel=1e-4)  # relevance ratio restored

    beta, gamma = 20.0, -10.0
    y = magnitude_attention_reference(q, k, v, beta=beta, gamma=gamma, **kw)[0, 0, 0]
    g_c, g_u = torch.sigmoid(torch.tensor([beta / 50 + gamma, beta + gamma], dtype=torch.float64))
    assert y.tolist() == pytest.approx([50 * g_c.item() / 70, 20 * g_u.item() / 70], rel=1e-4)
    assert y[0] < 1e-2 * y[1]  # with beta > 0 the redundant cluster is suppressed


# ---------------------------------------------------------------------------------------------
# Truncated CG against a dense solve; numerics
# ---------------------------------------------------------------------------------------------


def test_cg_approaches_dense_solve():
    """mu after n_iter = 1..N CG steps on random keys (N = 24, float64, t = 2, eps = 1e-3:
    cond(A) ~ 30): the A-norm of the error (what CG minimizes) never grows, the residual
    ||A mu - 1|| ends small, and at n_iter = N mu equals torch.linalg.solve to 1e-8."""
    N, d, t, eps = 24, 8, 2.0, 1e-3
    k = torch.randn(1, 1, N, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    A = _kernel_matrix(k[0, 0], t, eps)
    exact = torch.linalg.solve(A, torch.ones(N, dtype=torch.float64))
    residuals, energy = [], []
    for n_iter in range(1, N + 1):
        _, mu = magnitude_attention_reference(k, k, k, t_raw=_inv_softplus(t), eps=eps, n_iter=n_iter,
                                              return_mu=True)
        mu = mu[0, 0]
        residuals.append((A @ mu - 1).norm().item())
        e = mu - exact
        energy.append((e @ A @ e).clamp_min(0).sqrt().item())
    print("\nn_iter  ||A mu - 1||  ||mu - mu*||_A")
    for n_iter, (r, e) in enumerate(zip(residuals, energy), start=1):
        print(f"{n_iter:6d}  {r:11.3e}  {e:14.3e}")
    assert all(b <= a * (1 + 1e-9) + 1e-13 for a, b in zip(energy, energy[1:])), energy
    assert residuals[N // 2] < 1e-2 * residuals[0]
    assert residuals[-1] < 1e-8 * math.sqrt(N)
    _, mu = magnitude_attention_reference(k, k, k, t_raw=_inv_softplus(t), eps=eps, n_iter=N, return_mu=True)
    assert rel_err(mu[0, 0], exact) < 1e-8


def test_padded_keys_are_removed_from_the_solve():
    """A padded key changes nothing: mu and y over the valid keys equal those of the problem with
    the padded keys deleted, mu is 0 at the padded keys, and an all-padded batch gives y = 0."""
    (q, k, v), params, kpm = make_magnitude_problem(B=3, N=9)
    y, mu = magnitude_attention_reference(q, k, v, **params, key_padding_mask=kpm, return_mu=True)
    keep = ~kpm[0]
    y_cut, mu_cut = magnitude_attention_reference(q[:1, :, keep], k[:1, :, keep], v[:1, :, keep], **params,
                                                  return_mu=True)
    assert rel_err(mu[0][:, keep], mu_cut[0]) < 1e-13
    assert rel_err(y[0][:, keep], y_cut[0]) < 1e-13
    assert (mu[0][:, ~keep] == 0).all() and (mu[2] == 0).all()
    assert (y[2] == 0).all()
    # the unpadded batch is untouched by the other batches' masks
    assert rel_err(y[1], magnitude_attention_reference(q[1:2], k[1:2], v[1:2], **params)[0]) < 1e-13


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ill_conditioned_duplicates_stay_finite(dtype):
    """Exact duplicate keys (a 4-clone and a 3-clone group) with eps = 1e-12 and n_iter = 10, past
    CG's convergence: y and mu are finite and the gradients of y.sum() w.r.t. q, k, v, t_raw, beta,
    gamma are finite (the freeze rule keeps 0/0 and x/0 out of both passes)."""
    (q, k, v), params, _ = make_magnitude_problem(N=9, seed=1)
    k[:, :, 1:4] = k[:, :, :1]
    k[:, :, 6:8] = k[:, :, 5:6]
    tensors, params = _leaves((q, k, v), params, dtype)
    y, mu = magnitude_attention_reference(*tensors, **params, eps=1e-12, n_iter=10, return_mu=True)
    assert torch.isfinite(y).all() and torch.isfinite(mu).all()
    y.sum().backward()
    for name, t in zip(("q", "k", "v", *params), (*tensors, *params.values())):
        assert t.grad is not None and torch.isfinite(t.grad).all(), name


def test_many_iterations_past_convergence_keep_gradients_finite():
    """The freeze rule stops a solve that converged to rounding, so extra steps add no noise."""
    (q, k, v), params, _ = make_magnitude_problem(N=9, seed=2)
    tensors, params = _leaves((q, k, v), params, torch.float64)
    magnitude_attention_reference(*tensors, **params, n_iter=100).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (*tensors, *params.values()))


def test_frozen_head_keeps_its_mu():
    """A (b, h) with rho = 0 from the start (no valid key) stays at mu = 0 without NaN; one that
    converges exactly (a single valid key: mu = 1/(1 + eps) after one step) does not move later."""
    (q, k, v), params, _ = make_magnitude_problem(B=2, N=5)
    kpm = torch.ones(2, 5, dtype=torch.bool)
    kpm[0, 3] = False
    for n_iter in (1, 2, 7):
        y, mu = magnitude_attention_reference(q, k, v, **params, eps=1e-3, n_iter=n_iter, key_padding_mask=kpm,
                                              return_mu=True)
        assert torch.isfinite(y).all()
        assert torch.allclose(mu[0, :, 3], torch.full((2,), 1 / (1 + 1e-3), dtype=torch.float64), rtol=1e-15)
        assert (mu[1] == 0).all() and (y[1] == 0).all()


def test_gradcheck_reference():
    """float64 gradcheck w.r.t. q, k, v and per-head [H] t_raw, beta, gamma, through y and mu, with
    a key_padding_mask (two padded keys in batch 0, all keys padded in batch 2)."""
    (q, k, v), params, kpm = make_magnitude_problem(B=3, H=2, N=7, d=4, dv=3)
    tensors, params = _leaves((q, k, v), params, torch.float64)
    names = tuple(params)

    def fn(q, k, v, *ps):
        return magnitude_attention_reference(q, k, v, **dict(zip(names, ps)), n_iter=4, key_padding_mask=kpm,
                                             return_mu=True)

    assert torch.autograd.gradcheck(fn, (*tensors, *params.values()), fast_mode=False)


def test_scalar_and_per_head_parameters_agree():
    """A number, a 0-dim tensor and an [H] tensor holding the same value give the same output."""
    (q, k, v), _, _ = make_magnitude_problem()
    a = magnitude_attention_reference(q, k, v, t_raw=0.3, beta=1.2, gamma=-0.4)
    b = magnitude_attention_reference(q, k, v, t_raw=torch.tensor(0.3, dtype=torch.float64),
                                      beta=torch.tensor(1.2, dtype=torch.float64), gamma=-0.4)
    c = magnitude_attention_reference(q, k, v, t_raw=torch.full((2,), 0.3, dtype=torch.float64), beta=1.2,
                                      gamma=torch.full((2,), -0.4, dtype=torch.float64))
    assert torch.equal(a, b) and torch.equal(a, c)


def test_is_causal_raises():
    (q, k, v), _, _ = make_magnitude_problem()
    with pytest.raises(ValueError, match="is_causal is not supported.*mu depend on every key"):
        magnitude_attention_reference(q, k, v, is_causal=True)


def test_query_count_must_match_keys():
    (q, k, v), _, _ = make_magnitude_problem()
    with pytest.raises(ValueError, match="as many rows"):
        magnitude_attention_reference(q[:, :, :3], k, v)


# ---------------------------------------------------------------------------------------------
# MagnitudeAttention (the module)
# ---------------------------------------------------------------------------------------------

MODULE_PARAMS = {"q_proj.weight": (32, 24), "q_proj.bias": (32,), "k_proj.weight": (32, 24), "k_proj.bias": (32,),
                 "v_proj.weight": (32, 24), "v_proj.bias": (32,), "out_proj.weight": (24, 32),
                 "out_proj.bias": (24,), "t_raw": (4,), "beta": (4,), "gamma": (4,)}


def _module(seed=0, **kw):
    torch.manual_seed(seed)
    m = MagnitudeAttention(24, 4, d_head=8, t_init=0.7, beta_init=1.5, gamma_init=-0.2, **kw).double()
    with torch.no_grad():  # make the heads differ
        m.t_raw.add_(torch.linspace(-0.3, 0.3, 4, dtype=torch.float64))
        m.beta.add_(torch.linspace(-1.0, 1.0, 4, dtype=torch.float64))
    return m


def test_module_parameters_and_init():
    m = MagnitudeAttention(24, 4, d_head=8, t_init=0.7, beta_init=1.5, gamma_init=-0.2)
    assert {n: tuple(p.shape) for n, p in m.state_dict().items()} == MODULE_PARAMS
    assert torch.allclose(torch.nn.functional.softplus(m.t_raw), torch.full((4,), 0.7))
    assert (m.beta == 1.5).all() and (m.gamma == -0.2).all()
    assert m.n_iter == 4 and m.eps == 1e-3
    assert MagnitudeAttention(24, 4).d_head == 6
    assert "bias" not in " ".join(n for n, _ in MagnitudeAttention(24, 4, bias=False).named_parameters())
    with pytest.raises(ValueError, match="divisible"):
        MagnitudeAttention(25, 4)
    assert "MagnitudeAttention" in ascender_torch.__all__


def test_module_matches_reference_and_returns_mu():
    m = _module()
    B, N = 3, 10
    x = torch.randn(B, N, 24, dtype=torch.float64)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1, 7:] = True
    out, mu = m(x, key_padding_mask=kpm, need_weights=True)
    assert out.shape == (B, N, 24) and mu.shape == (B, 4, N)
    assert (mu[1, :, 7:] == 0).all() and (mu[1, :, :7] != 0).all()
    heads = [p(x).reshape(B, N, 4, 8).transpose(1, 2) for p in (m.q_proj, m.k_proj, m.v_proj)]
    y_ref, mu_ref = magnitude_attention_reference(*heads, t_raw=m.t_raw, beta=m.beta, gamma=m.gamma, n_iter=4,
                                                  eps=1e-3, key_padding_mask=kpm, return_mu=True)
    out_ref = m.out_proj(y_ref.transpose(1, 2).reshape(B, N, 32))
    assert rel_err(out, out_ref) < 1e-10 and rel_err(mu, mu_ref) < 1e-10
    out2, none = m(x, key_padding_mask=kpm)
    assert none is None and rel_err(out2, out) < 1e-12
    out.sum().backward()
    for name in ("t_raw", "beta", "gamma", "k_proj.weight"):
        grad = m.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0, name


def test_module_sequence_first_and_state_dict():
    a, b = _module(seed=1), _module(seed=2, batch_first=False)
    b.load_state_dict(a.state_dict(), strict=True)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    out_a, _ = a(x)
    out_b, _ = b(x.transpose(0, 1))
    assert out_b.shape == (6, 2, 24)
    assert rel_err(out_b.transpose(0, 1), out_a) < 1e-12
    with pytest.raises(ValueError, match="3-D"):
        a(x[0])


# ---------------------------------------------------------------------------------------------
# The fused op (ascender_torch.functional.magnitude_attention) against the reference.
# ---------------------------------------------------------------------------------------------


def _fused():
    return functional.magnitude_attention


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "key_padding"])
@pytest.mark.parametrize("n_iter", [1, 4, 6])
def test_fused_matches_reference_float64(masked, n_iter):
    """values (y, mu) and gradients w.r.t. q, k, v, t_raw, beta, gamma at 1e-10."""
    fused = _fused()
    (q, k, v), params, kpm = make_magnitude_problem(B=3, N=11, seed=4)
    kw = dict(n_iter=n_iter, eps=1e-3, key_padding_mask=kpm if masked else None)
    got = _outputs_and_grads(fused, (q, k, v), params, torch.float64, **kw)
    want = _outputs_and_grads(magnitude_attention_reference, (q, k, v), params, torch.float64, **kw)
    for name, a, b in zip(("y", "mu", "dq", "dk", "dv", "dt_raw", "dbeta", "dgamma"), got, want):
        assert a.shape == b.shape, name
        assert rel_err(a, b) < TOL[torch.float64], name


def test_fused_matches_reference_float32():
    """float32 fused against the float64 reference at 1e-5 (t = 1.3 and 2.1, well
    conditioned: the float32 reference itself is within ~2e-6 here)."""
    fused = _fused()
    (q, k, v), params, kpm = make_magnitude_problem(B=3, N=16, seed=5, t_raw=(1.0, 2.0))
    kw = dict(n_iter=4, eps=1e-3, key_padding_mask=kpm)
    got = _outputs_and_grads(fused, (q, k, v), params, torch.float32, **kw)
    want = _outputs_and_grads(magnitude_attention_reference, (q, k, v), params, torch.float64, **kw)
    for name, a, b in zip(("y", "mu", "dq", "dk", "dv", "dt_raw", "dbeta", "dgamma"), got, want):
        assert a.dtype == torch.float32, name
        assert rel_err(a, b) < TOL[torch.float32], name


def test_fused_scalar_parameters_and_default_scale():
    """python-number parameters, a custom scale, y-only return."""
    fused = _fused()
    (q, k, v), _, _ = make_magnitude_problem(seed=6)
    for kw in (dict(), dict(t_raw=0.4, beta=-2.0, gamma=0.5, scale=0.3)):
        assert rel_err(fused(q, k, v, **kw), magnitude_attention_reference(q, k, v, **kw)) < TOL[torch.float64]


def test_fused_ill_conditioned_matches_and_is_finite():
    """duplicate keys, eps = 1e-12, n_iter = 10: finite in both passes (the freeze rule
    must be the reference's; values are compared loosely since the steps past convergence run on
    rounding noise)."""
    fused = _fused()
    (q, k, v), params, _ = make_magnitude_problem(N=9, seed=1)
    k[:, :, 1:4] = k[:, :, :1]
    k[:, :, 6:8] = k[:, :, 5:6]
    tensors, params = _leaves((q, k, v), params, torch.float64)
    y = fused(*tensors, **params, eps=1e-12, n_iter=10)
    assert torch.isfinite(y).all()
    y.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (*tensors, *params.values()))
    assert rel_err(y, magnitude_attention_reference(q, k, v, **params, eps=1e-12, n_iter=10)) < 1e-3


def test_fused_is_causal_raises():
    """the same clear error as the reference."""
    fused = _fused()
    (q, k, v), _, _ = make_magnitude_problem()
    with pytest.raises(ValueError, match="is_causal is not supported"):
        fused(q, k, v, is_causal=True)


def test_fused_gradcheck():
    """float64 gradcheck of the fused op (y and mu) with per-head parameters and padding."""
    fused = _fused()
    (q, k, v), params, kpm = make_magnitude_problem(B=3, H=2, N=7, d=4, dv=3)
    tensors, params = _leaves((q, k, v), params, torch.float64)
    names = tuple(params)

    def fn(q, k, v, *ps):
        return fused(q, k, v, **dict(zip(names, ps)), n_iter=4, key_padding_mask=kpm, return_mu=True)

    assert torch.autograd.gradcheck(fn, (*tensors, *params.values()), fast_mode=False)


def test_ascender_attention_magnitude_gate_matches_its_definition():
    """ASCenderAttention(magnitude_gate=True) = ASCender on v gated by sigmoid(beta mu + gamma),
    with mu from the reference solve; gradients reach the gate's parameters."""
    from ascender_torch import ASCenderAttention
    from ascender_torch.reference import ascender_attention_reference

    torch.manual_seed(0)
    m = ASCenderAttention(16, 2, k=3, magnitude_gate=True).double()
    with torch.no_grad():
        m.mag_beta.copy_(torch.tensor([2.0, -1.0]))
        m.mag_gamma.copy_(torch.tensor([0.1, 0.3]))
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 5:] = True
    y, _ = m(x, key_padding_mask=kpm)
    heads = [m._heads(p, x) for p in (m.q_proj, m.k_proj, m.v_proj, m.U, m.P)]
    _, mu = magnitude_attention_reference(heads[1], heads[1], heads[2], t_raw=m.mag_t_raw, n_iter=4, eps=1e-3,
                                          key_padding_mask=kpm, return_mu=True)
    gate = torch.sigmoid(m.mag_beta.view(1, -1, 1) * mu + m.mag_gamma.view(1, -1, 1))
    want = ascender_attention_reference(heads[0], heads[1], heads[2] * gate.unsqueeze(-1), heads[3], heads[4],
                                        **{n: getattr(m, n) for n in SCALAR_NAMES}, k_neighbors=3,
                                        variant="paper", key_padding_mask=kpm)
    want = m.out_proj(want.transpose(1, 2).reshape(2, 7, 16))
    torch.testing.assert_close(y, want, rtol=1e-9, atol=1e-11)
    y.square().sum().backward()
    for p in (m.mag_t_raw, m.mag_beta, m.mag_gamma):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="magnitude_gate needs bidirectional attention"):
        m(x, is_causal=True)


@pytest.mark.parametrize("kw,pattern", [
    (dict(n_iter=-1), r"n_iter must be >= 0, got -1"),
    (dict(eps=0.0), r"eps must be a finite number > 0, got 0"),
    (dict(t_raw=torch.zeros(3, dtype=torch.float64)), r"t_raw must be a 0-dim tensor or have shape \[H\] = \[2\]"),
    (dict(key_padding_mask=torch.zeros(2, 5, dtype=torch.bool)), r"key_padding_mask must be a bool tensor \[B, N\]"),
])
def test_fused_bad_inputs(kw, pattern):
    (q, k, v), _, _ = make_magnitude_problem(B=2, N=6)
    with pytest.raises(RuntimeError, match=pattern):
        functional.magnitude_attention(q, k, v, **kw)
    with pytest.raises(RuntimeError, match=r"v must have shape \[B, H, N, dv\]"):
        functional.magnitude_attention(q, k, v[:, :, :5])


@pytest.mark.parametrize("fn", [functional.magnitude_attention, magnitude_attention_reference], ids=["fused", "twin"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("padded", [False, True], ids=["valid", "padded"])
@pytest.mark.parametrize("what", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_inputs_reach_exactly_the_rows_that_depend_on_them(fn, where, padded, what):
    """SPEC section 11 for Magnitude Attention, a NaN / Inf in one entry of token `tok` of (b, h) =
    (1, 0): in q, its own row is non-finite; in a valid key's k or v, every row of (1, 0) (each
    attends to every valid key), and in k every valid entry of mu too (the solve couples them); in a
    padded key's k or v, nothing. Every other row and mu equal the run with a finite value there,
    and a loss over the rows it did not reach has finite gradients."""
    B, H, N, d, tok = 2, 2, 7, 4, 5 if padded else 2
    g = torch.Generator().manual_seed(3)
    clean = {n: torch.randn(B, H, N, d, generator=g, dtype=torch.float64) for n in "qkv"}
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[:, 5] = True
    params = dict(t_raw=torch.tensor([0.2, -0.3]), beta=torch.tensor([1.5, 0.5]), gamma=torch.tensor([0.1, 0.2]))
    params = {n: p.double() for n, p in params.items()}
    sick = {n: t.clone() for n, t in clean.items()}
    sick[where][1, 0, tok, 1] = what

    rows = torch.zeros(B, H, N, dtype=torch.bool)  # the rows the value must reach
    mu_hit = torch.zeros(B, H, N, dtype=torch.bool)
    if where == "q":
        rows[1, 0, tok] = True
    elif not padded:
        rows[1, 0] = True
        mu_hit[1, 0] = ~kpm[1] if where == "k" else False

    def run(tensors):
        inputs = [tensors[n].clone().requires_grad_() for n in "qkv"]
        ps = {n: p.clone().requires_grad_() for n, p in params.items()}
        y, mu = fn(*inputs, **ps, key_padding_mask=kpm, return_mu=True)
        torch.where(rows.unsqueeze(-1), torch.zeros_like(y), y).sum().backward()
        return y.detach(), mu.detach(), [t.grad for t in inputs] + [ps[n].grad for n in params]

    y, mu, grads = run(sick)
    y_ref, mu_ref, _ = run(clean)
    assert torch.equal(~torch.isfinite(y).all(-1), rows)
    assert torch.equal(~torch.isfinite(mu), mu_hit)
    torch.testing.assert_close(y[~rows], y_ref[~rows], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mu[~mu_hit], mu_ref[~mu_hit], rtol=1e-12, atol=1e-12)
    for name, grad in zip(("q", "k", "v") + tuple(params), grads):
        assert torch.isfinite(grad).all(), f"d{name} non-finite from a loss over rows that {where} cannot reach"
