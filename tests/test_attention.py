"""ASCenderAttention: the multi-head module against reference.py, its masks and layouts,
persistence (state_dict, safetensors) and torch.compile."""

from __future__ import annotations

import pytest
import torch

from ascender_torch import ASCenderAttention, ASCenderHead
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.reference import ascender_attention_reference

from cases import VARIANTS


def _module(variant="paper", seed=0, **kw):
    torch.manual_seed(seed)
    m = ASCenderAttention(24, 3, k=4, variant=variant, **kw).double()
    with torch.no_grad():  # per-head scalars that differ between heads
        for name in ("omega_align", "omega_sep", "omega_coh", "score_temp", "kappa", "delta"):
            getattr(m, name).mul_(torch.tensor([0.7, 1.0, 1.6], dtype=torch.float64))
    return m


def _reference_forward(m, x, **kw):
    B, N, _ = x.shape
    heads = [p(x).reshape(B, N, m.n_heads, -1).transpose(1, 2) for p in (m.q_proj, m.k_proj, m.v_proj, m.U, m.P)]
    y = ascender_attention_reference(
        *heads, **{n: getattr(m, n) for n in SCALAR_NAMES}, k_neighbors=m.k, tau_sep=m.tau_sep, tau_coh=m.tau_coh,
        alpha_align=m.alpha_align, alpha_coh=m.alpha_coh, variant=m.variant, mask_stats=m.mask_stats, **kw)
    return m.out_proj(y.transpose(1, 2).reshape(B, N, -1))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("masking", ["none", "causal", "key_padding", "attn_mask"])
def test_matches_reference_outputs_and_gradients(variant, masking):
    m = _module(variant)
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    kw = {}
    if masking == "causal":
        kw = dict(is_causal=True)
    elif masking == "key_padding":
        kpm = torch.zeros(2, 9, dtype=torch.bool)
        kpm[1, 6:] = True
        kw = dict(key_padding_mask=kpm)
    elif masking == "attn_mask":
        kw = dict(attn_mask=torch.rand(2, 3, 9, 9, generator=torch.Generator().manual_seed(0)) > 0.3)
    y, A = m(x, **kw)
    assert A is None and y.shape == x.shape
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, list(m.parameters()), g)
    y_ref = _reference_forward(m, x, **kw)
    grads_ref = torch.autograd.grad(y_ref, list(m.parameters()), g)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    for (name, _), a, b in zip(m.named_parameters(), grads, grads_ref):
        # the absolute floor is float64 rounding of O(1) terms: the row normalization is scale
        # invariant, so the lambda gradients are O(eps) sums of O(1) terms that cancel in autograd
        atol = max(1e-10 * b.abs().max().item(), 1e-15)
        torch.testing.assert_close(a, b, rtol=1e-8, atol=atol, msg=name)


def test_heads_are_single_head_modules():
    """Without projection biases, head h is an ASCenderHead with head h's weights and scalars, and
    the output is out_proj of the concatenated head outputs."""
    m = _module("paper", bias=False)
    x = torch.randn(1, 8, 24, dtype=torch.float64)
    y, A = m(x, need_weights=True)
    assert A.shape == (1, 3, 8, 8)
    names = dict(lambda_align="lambda_align", lambda_sep="lambda_sep", lambda_coh="lambda_coh",
                 omega_align="omega_a", omega_sep="omega_s", omega_coh="omega_c", score_temp="score_temp",
                 delta="delta", kappa="kappa")
    assert ASCenderHead.scalar_attributes == names
    outs = []
    for h in range(3):
        head = ASCenderHead(24, 8, k=4, variant="paper").double()
        rows, lat = slice(8 * h, 8 * (h + 1)), slice(4 * h, 4 * (h + 1))
        with torch.no_grad():
            for mine, proj, sl in (("WQ", m.q_proj, rows), ("WK", m.k_proj, rows), ("WV", m.v_proj, rows),
                                   ("U", m.U, lat), ("P", m.P, lat)):
                getattr(head, mine).weight.copy_(proj.weight[sl])
            for ours, theirs in names.items():
                getattr(head, theirs).fill_(getattr(m, ours)[h].item())
        Y_h, A_h, _ = head(x, mask_stats=True)
        torch.testing.assert_close(A[:, h], A_h, rtol=1e-12, atol=1e-14)
        outs.append(Y_h)
    torch.testing.assert_close(y, m.out_proj(torch.cat(outs, -1)), rtol=1e-12, atol=1e-14)


def test_batch_first_false():
    m = _module(batch_first=True)
    m2 = _module(batch_first=False)
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    y, _ = m(x, is_causal=True)
    y2, _ = m2(x.transpose(0, 1), is_causal=True)
    torch.testing.assert_close(y2.transpose(0, 1), y, rtol=0, atol=0)


@pytest.mark.parametrize("cls,kw", [(ASCenderAttention, dict(n_heads=3)), (ASCenderHead, dict(d_head=8))])
def test_state_dict_and_safetensors_round_trip(tmp_path, cls, kw):
    safetensors = pytest.importorskip("safetensors.torch")
    torch.manual_seed(1)
    a = cls(24, **kw).double()
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.01 * torch.randn_like(p))
    torch.manual_seed(2)
    b, c = cls(24, **kw).double(), cls(24, **kw).double()
    b.load_state_dict(a.state_dict(), strict=True)
    path = tmp_path / "m.safetensors"
    safetensors.save_file(a.state_dict(), str(path))
    c.load_state_dict(safetensors.load_file(str(path)), strict=True)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    want = a(x, need_weights=False)[0]
    assert torch.equal(b(x, need_weights=False)[0], want)
    assert torch.equal(c(x, need_weights=False)[0], want)


def test_compile_fullgraph_matches_eager():
    m = _module("paper")
    x = torch.randn(2, 10, 24, dtype=torch.float64, requires_grad=True)

    def loss(inp):
        return m(inp, is_causal=True)[0].square().sum()

    eager = loss(x)
    g_eager = torch.autograd.grad(eager, [x, *m.parameters()])
    compiled = torch.compile(loss, fullgraph=True)(x)
    g_comp = torch.autograd.grad(compiled, [x, *m.parameters()])
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_bad_construction_and_input():
    with pytest.raises(ValueError, match="d_model \\(10\\) is not divisible by n_heads \\(3\\)"):
        ASCenderAttention(10, 3)
    with pytest.raises(ValueError, match="x must be 3-D"):
        ASCenderAttention(12, 3)(torch.randn(12))
