"""Auxiliary losses of paper section 8 (SPEC section 5): the per-row terms returned by the fused
op against hand computation and reference.py, and their exact gradients (gradcheck)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ascender_torch import ascender_attention
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.reference import ascender_attention_reference

from cases import CPU_FUSED, MASK_MODES, VARIANTS, on, full_scalars, make_masks, make_problem, rel_err, resolvable_rows


def test_reference_aux_by_hand_two_tokens():
    """N = 2, paper variant, no mask: each token's only neighbour is the other one, so
    u_0 = k^_1, u_1 = k^_0 and align_i = 1 - k^_0.k^_1; coh and sep written out from SPEC §4."""
    g = torch.Generator().manual_seed(5)
    q, k, v, z, h = (torch.randn(1, 1, 2, 3, generator=g, dtype=torch.float64) for _ in range(5))
    delta, tau = 0.1, 1.0
    y, aux = ascender_attention_reference(q, k, v, z, h, variant="paper", k_neighbors=1, delta=delta,
                                          tau_sep=tau, tau_coh=tau, return_aux=True)
    z0, z1 = z[0, 0]
    D = ((z0 - z1) ** 2).sum()
    w = torch.exp(-D / (tau + 1e-6))  # ws_01 = wc_01; ws_ii = wc_ii = 1
    c0 = (z0 + w * z1) / (1 + w + 1e-6)
    c1 = (w * z0 + z1) / (1 + w + 1e-6)
    hn = F.normalize(h[0, 0], dim=-1)
    a01 = hn[0] @ hn[1]
    phi = torch.stack([torch.stack([torch.relu(1 - torch.tensor(delta, dtype=torch.float64)), w * torch.relu(a01 - delta)]),
                       torch.stack([w * torch.relu(a01 - delta), torch.relu(1 - torch.tensor(delta, dtype=torch.float64))])])
    _, maps = ascender_attention_reference(q, k, v, z, h, variant="paper", k_neighbors=1, delta=delta, tau_sep=tau,
                                           tau_coh=tau, return_maps=True)
    A = maps["A"][0, 0]
    want_coh = torch.stack([A[0, 0] * ((z0 - c0) ** 2).sum() + A[0, 1] * ((z1 - c0) ** 2).sum(),
                            A[1, 0] * ((z0 - c1) ** 2).sum() + A[1, 1] * ((z1 - c1) ** 2).sum()])
    want_sep = (A * phi).sum(-1)
    kn = F.normalize(k[0, 0], dim=-1)
    want_align = (1 - kn[0] @ kn[1]).expand(2)
    torch.testing.assert_close(aux["coh"][0, 0], want_coh, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(aux["sep"][0, 0], want_sep, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(aux["align"][0, 0], want_align, rtol=1e-12, atol=1e-12)


def test_reference_variant_has_no_alignment_term():
    tensors, scalars, opts = make_problem(N=5)
    _, aux = ascender_attention(*tensors, **scalars, **opts, variant="seed", return_aux=True)
    assert set(aux) == {"coh", "sep"}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
def test_fused_aux_matches_reference(target, variant, mode):
    tensors, scalars, opts = make_problem(N=11, seed=3)
    masks = make_masks(mode, 2, 2, 11, seed=3)
    tensors, scalars, masks = on(target.device, tensors), on(target.device, scalars), on(target.device, masks)
    y, maps, aux = ascender_attention(*tensors, **scalars, **opts, **masks, variant=variant, return_maps=True,
                                      return_aux=True)
    want_y, want = ascender_attention_reference(*tensors, **scalars, **opts, **masks, variant=variant,
                                                return_aux=True)
    assert rel_err(y, want_y) <= 1e-10
    assert set(aux) == set(want)
    for name in want:
        assert aux[name].shape == (2, 2, 11)
        assert rel_err(aux[name], want[name]) <= 1e-10, name
    empty = maps["A"].sum(-1) == 0  # rows with no visible key: no attention, no aux term
    assert torch.equal(aux["coh"][empty], torch.zeros_like(aux["coh"][empty]))


def test_aux_needs_self_attention():
    tensors, scalars, opts = make_problem(N=6)
    q = tensors[0][:, :, -2:]
    with pytest.raises(ValueError, match="return_aux needs self-attention"):
        ascender_attention(q, *tensors[1:], **scalars, **opts, return_aux=True)


def _aux_gradcheck(variant, mode, N, B=1, H=2, seed=0, target=CPU_FUSED):
    tensors, scalars, opts = make_problem(B=B, H=H, N=N, d=4, dv=3, dz=3, da=3, seed=seed)
    scalars = full_scalars(scalars, H, torch.float64)
    masks = make_masks(mode, B, H, N, seed=seed)
    tensors, scalars, masks = on(target.device, tensors), on(target.device, scalars), on(target.device, masks)
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).double()
    inputs = [t.clone().requires_grad_() for t in tensors] + [scalars[n].requires_grad_() for n in SCALAR_NAMES]
    weights = torch.randn(3, B, H, N, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(target.device)
    weights = weights * keep

    def f(q, k, v, z, h, *sc):
        _, aux = ascender_attention(q, k, v, z, h, **dict(zip(SCALAR_NAMES, sc)), **opts, **masks, variant=variant,
                                    return_aux=True)
        return sum((w * aux[name]).sum() for w, name in zip(weights, ("coh", "sep", "align")) if name in aux)

    # the block-wise path: fast mode (random projections of the Jacobian; its full Jacobians would take
    # minutes), its gradients equal the fused op's to 1e-10 anyway (test_blockwise.py)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=target.backend != "fused",
                                    nondet_tol=target.nondet_tol)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ("none", "causal", "key_padding", "attn_mask_stats", "attn_mask_seed"))
@pytest.mark.parametrize("N", [1, 2, 5, 9])
def test_aux_gradcheck(target, variant, mode, N):
    _aux_gradcheck(variant, mode, N, B=2 if mode == "key_padding" else 1, target=target)


def test_aux_and_output_gradients_add_up():
    """One backward through y and all three aux terms equals reference.py autograd."""
    tensors, scalars, opts = make_problem(N=10, seed=7)
    scalars = full_scalars(scalars, 2, torch.float64)
    gy = torch.randn(2, 2, 10, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = []
    for fn in (ascender_attention, ascender_attention_reference):
        inputs = [t.clone().requires_grad_() for t in tensors]
        sc = [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]
        y, aux = fn(*inputs, **dict(zip(SCALAR_NAMES, sc)), **opts, variant="paper", is_causal=True,
                    return_aux=True)
        loss = (gy * y).sum() + 0.3 * aux["coh"].mean() + 0.5 * aux["sep"].mean() + 0.7 * aux["align"].mean()
        grads.append(torch.autograd.grad(loss, inputs + sc))
    for got, want in zip(*grads):
        assert rel_err(got, want) <= 1e-9


def test_multihead_module_returns_aux():
    """ASCenderAttention(return_aux=True): the aux terms of its own projections, per head, as the twin computes them."""
    from ascender_torch import ASCenderAttention

    torch.manual_seed(0)
    m = ASCenderAttention(16, 2, k=3).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    out, weights, aux = m(x, is_causal=True, return_aux=True)
    assert weights is None
    heads = [m._heads(p, x) for p in (m.q_proj, m.k_proj, m.v_proj, m.U, m.P)]
    _, want = ascender_attention_reference(*heads, **{n: getattr(m, n) for n in SCALAR_NAMES}, k_neighbors=3,
                                           variant="paper", is_causal=True, return_aux=True)
    for name in ("coh", "sep", "align"):
        assert rel_err(aux[name], want[name]) <= 1e-10, name
    torch.testing.assert_close(out, m(x, is_causal=True)[0], rtol=0, atol=0)


def test_aux_only_loss_under_torch_compile():
    """A loss on the aux terms alone (the output unused) gives eager's gradients under torch.compile."""
    tensors, scalars, opts = make_problem(N=6)

    def loss(*ts):
        _, aux = ascender_attention(*ts, **scalars, **opts, variant="paper", return_aux=True)
        return aux["coh"].sum() + aux["sep"].sum() + aux["align"].sum()

    eager = [t.clone().requires_grad_() for t in tensors]
    compiled = [t.clone().requires_grad_() for t in tensors]
    loss(*eager).backward()
    torch.compile(loss, fullgraph=True)(*compiled).backward()
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)
