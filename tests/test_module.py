"""ASCenderHead (the drop-in module) and the op's registration: state_dict, outputs, maps,
opcheck and torch.compile tracing."""

from __future__ import annotations

import pytest
import torch

import ascender_torch
from ascender_torch import ASCenderHead
from ascender_torch.reference import ascender_attention_reference

from cases import VARIANTS, make_problem, op_arguments

PARAM_NAMES = {"WQ.weight", "WK.weight", "WV.weight", "U.weight", "P.weight", "lambda_align", "lambda_sep",
               "lambda_coh", "omega_a", "omega_s", "omega_c", "score_temp", "delta", "kappa"}


def _head(variant="seed", seed=0, **kw):
    torch.manual_seed(seed)
    head = ASCenderHead(32, 16, k=4, variant=variant, **kw).double()
    with torch.no_grad():  # move the learnable scalars off their defaults
        head.omega_a.fill_(0.7)
        head.omega_s.fill_(-0.5)
        head.omega_c.fill_(0.4)
        head.kappa.fill_(3.0)
    return head


def _reference_of(head, X, **kw):
    q, k, v, z, h = (m(X).unsqueeze(1) for m in (head.WQ, head.WK, head.WV, head.U, head.P))
    return ascender_attention_reference(
        q, k, v, z, h, lambda_align=head.lambda_align, lambda_sep=head.lambda_sep, lambda_coh=head.lambda_coh,
        omega_align=head.omega_a, omega_sep=head.omega_s, omega_coh=head.omega_c, score_temp=head.score_temp,
        delta=head.delta, kappa=head.kappa, k_neighbors=head.k, tau_sep=head.tau_sep, tau_coh=head.tau_coh,
        variant=head.variant, return_maps=True, **kw)


def test_parameter_names_and_shapes():
    head = ASCenderHead(64, 32)
    shapes = {n: tuple(p.shape) for n, p in head.named_parameters()}
    assert set(shapes) == PARAM_NAMES
    assert shapes["WQ.weight"] == (32, 64) and shapes["U.weight"] == (16, 64) and shapes["P.weight"] == (16, 64)
    assert all(shapes[n] == () for n in PARAM_NAMES if "." not in n)
    assert head.variant == "seed" and head.k == 16 and head.tau_sep == 1.0 and head.tau_coh == 1.0
    defaults = dict(lambda_align=1.0, lambda_sep=1.0, lambda_coh=1.0, omega_a=0.1, omega_s=0.1, omega_c=0.1,
                    score_temp=1.0, delta=0.2, kappa=32.0)
    for name, value in defaults.items():
        assert getattr(head, name).item() == pytest.approx(value)


def test_state_dict_round_trip():
    a, b = _head(seed=1), _head(seed=2)
    b.load_state_dict(a.state_dict(), strict=True)
    X = torch.randn(2, 9, 32, dtype=torch.float64)
    assert torch.equal(a(X, need_weights=False)[0], b(X, need_weights=False)[0])
    buf = __import__("io").BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    c = _head(seed=3)
    c.load_state_dict(torch.load(buf), strict=True)
    assert torch.equal(a(X, need_weights=False)[0], c(X, need_weights=False)[0])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("masking", ["none", "seed_attn_mask", "causal", "key_padding"])
def test_head_matches_reference(variant, masking):
    head = _head(variant)
    X = torch.randn(2, 10, 32, dtype=torch.float64)
    kw, ref_kw = {}, {}
    if masking == "seed_attn_mask":  # the seed's convention: 0 = blocked; statistics see all tokens
        mask = (torch.rand(2, 10, 10) > 0.3).double()
        kw, ref_kw = dict(attn_mask=mask), dict(attn_mask=(mask != 0).unsqueeze(1), mask_stats=False)
    elif masking == "causal":
        kw = ref_kw = dict(is_causal=True)
    elif masking == "key_padding":
        kpm = torch.zeros(2, 10, dtype=torch.bool)
        kpm[0, 7:] = True
        kw = ref_kw = dict(key_padding_mask=kpm)
    Y, A, maps = head(X, **kw)
    with torch.no_grad():
        y_ref, maps_ref = _reference_of(head, X, **ref_kw)
    torch.testing.assert_close(Y, y_ref.squeeze(1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(A, maps_ref["A"].squeeze(1), rtol=1e-10, atol=1e-12)
    assert set(maps) == {"S_base", "b_align", "b_sep", "b_coh"}
    for name, m in maps.items():
        assert m.shape == (2, 10, 10)
        torch.testing.assert_close(m, maps_ref[name].squeeze(1), rtol=1e-9, atol=1e-9)


def test_need_weights_false_returns_only_Y():
    head = _head()
    X = torch.randn(2, 10, 32, dtype=torch.float64)
    Y, A, maps = head(X, need_weights=False)
    assert A is None and maps is None
    assert torch.equal(Y, head(X)[0])


def test_maps_are_detached_inspection_tensors():
    head = _head()
    X = torch.randn(1, 6, 32, dtype=torch.float64)
    Y, A, maps = head(X)
    assert Y.requires_grad  # Y is the op's output in the autograd graph
    assert not A.requires_grad and not any(m.requires_grad for m in maps.values())


def test_head_handles_seed_failure_cases():
    """Where the seed module crashes (N < k) or returns NaN (N = 1, fully masked rows)."""
    head = _head("seed")
    with torch.no_grad():
        Y, A, _ = head(torch.randn(1, 1, 32, dtype=torch.float64))  # N = 1
        assert torch.isfinite(Y).all() and torch.equal(A, torch.ones(1, 1, 1, dtype=torch.float64))
        Y, _, _ = head(torch.randn(2, 3, 32, dtype=torch.float64))  # N < k
        assert torch.isfinite(Y).all()
        mask = torch.ones(3, 3)
        mask[1] = 0  # query 1 sees nothing
        Y, A, _ = head(torch.randn(2, 3, 32, dtype=torch.float64), attn_mask=mask)
        assert torch.equal(Y[:, 1], torch.zeros_like(Y[:, 1])) and torch.isfinite(Y).all()


def _op_args(variant="paper", dtype=torch.float64):
    tensors, scalars, opts = make_problem(N=6, dtype=dtype)
    return op_arguments(tensors, scalars, dict(opts, tau_coh=0.5, alpha_align=-1.0, alpha_coh=1.0, scale=0.3),
                        dict(attn_mask=torch.ones(6, 6, dtype=torch.bool).tril()), variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_opcheck(variant):
    args = _op_args(variant)
    tests = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.ascender.ascender_fwd.default, (), args, test_utils=tests)
    torch.library.opcheck(torch.ops.ascender.ascender_maps.default, (), args, test_utils=tests)


def test_torch_compile_fullgraph_matches_eager():
    head = _head("paper")
    X = torch.randn(2, 12, 32, dtype=torch.float64)

    def fwd(x):
        return head(x, need_weights=False, is_causal=True)[0]

    with torch.no_grad():
        eager = fwd(X)
        compiled = torch.compile(fwd, fullgraph=True, backend="aot_eager")(X)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_public_api():
    assert set(ascender_torch.__all__) >= {"ASCenderHead", "ascender_attention", "reference"}
