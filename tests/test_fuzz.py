"""Property-based fuzzing (hypothesis) of the public API on every backend present.

Random shapes (zero sizes, decode rows), strides, dtypes, masks, windows, global tokens, packed
documents, softcap, attention sinks, both neighbour rules and the other options, extreme and non-finite values, for
ascender_attention on the fused CPU and the block-wise backends, magnitude_attention and the
modules. Properties:

* the call returns or raises a clear error (TypeError / ValueError / RuntimeError with a message
  that names what is wrong); the process never crashes;
* finite in-range inputs give finite outputs and gradients;
* a NaN or Inf in one token's inputs reaches only the rows that can see that token (SPEC section
  11; a row without a visible key sees nothing), in the output and in the gradients of a loss over
  the other rows, with and without autograd (without it, few query rows run the decode kernel);
  a NaN reaches every row the twin says;
* float64 results equal the dense twin's where the neighbour sets have no near-ties.

`make test` runs the "ci" profile (a few hundred cases); `make fuzz` the "long" one (HYPOTHESIS_PROFILE=long,
100,000 cases per property), printing the statistics.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ascender_torch import ASCenderAttention, MagnitudeAttention, ascender_attention, magnitude_attention  # noqa: E402
from ascender_torch._spec import SCALAR_NAMES  # noqa: E402
from ascender_torch.backends import attention_backend  # noqa: E402
from ascender_torch.reference import allowed_keys, ascender_attention_reference  # noqa: E402

from ascender_torch._spec import Stat  # noqa: E402

from cases import fused_forward, rel_err, resolvable_rows  # noqa: E402

settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=100_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ERRORS = (TypeError, ValueError, RuntimeError)
BACKENDS = ("fused", "blockwise")


@pytest.fixture(autouse=True)
def _quiet_backend_notes():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "ascender_torch: ", RuntimeWarning)
        yield


@st.composite
def problems(draw, dtypes=(torch.float64, torch.float32)):
    """A random ascender_attention call: tensors, keyword arguments and a description of the data."""
    B, H = draw(st.integers(0, 2)), draw(st.integers(1, 3))
    N = draw(st.integers(0, 11))
    Nq = draw(st.sampled_from([N, N, N, max(N - 1, 0), min(1, N)]))
    d, dv, dz, da = (draw(st.integers(1, 6)) for _ in range(4))
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    g = torch.Generator().manual_seed(seed)
    magnitude = draw(st.sampled_from([1.0, 1.0, 1e-3, 1e3, 1e6]))

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s * magnitude).to(dtype)

    q, k, v = rnd(B, H, Nq, d), rnd(B, H, N, d), rnd(B, H, N, dv)
    z, h = rnd(B, H, N, dz, s=0.3 / magnitude ** 0.5), rnd(B, H, N, da)
    if draw(st.booleans()):  # non-contiguous: the same values through transposed storage
        q, k, v, z, h = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, z, h))
    kw = dict(variant=draw(st.sampled_from(["seed", "paper"])), k_neighbors=draw(st.integers(0, N + 2)),
              is_causal=draw(st.booleans()), mask_stats=draw(st.booleans()),
              neighbours=draw(st.sampled_from(["semantic", "scores"])))
    if draw(st.integers(0, 2)) == 0:  # SPEC section 8: windows, global tokens, packed documents
        kw["mask_stats"] = True  # (they are an error without it)
        if draw(st.booleans()):
            kw["window_size"] = (draw(st.integers(-1, 4)), draw(st.integers(-1, 4)))
        kw["global_tokens"] = draw(st.integers(0, min(N, 3)))
        if draw(st.integers(0, 3)) == 0:
            kw["global_mask"] = torch.rand(B, N, generator=g) < 0.2
        if draw(st.booleans()):
            ids = torch.randint(0, 3, (B, N), generator=g)
            kw["document_ids"] = ids if draw(st.integers(0, 3)) == 0 else ids.sort(-1).values
    if draw(st.integers(0, 3)) == 0:  # SPEC section 9
        kw["softcap"] = draw(st.floats(0.5, 20))
    if draw(st.booleans()):
        kw["key_padding_mask"] = torch.rand(B, N, generator=g) < draw(st.sampled_from([0.2, 0.5, 1.0]))
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(Nq, N), (1, Nq, N), (B, 1, Nq, N), (B, H, Nq, N), (1, N)]))
        kw["attn_mask"] = torch.rand(*shape, generator=g) < 0.7
    if draw(st.booleans()):
        kw["attn_bias"] = rnd(1, H, Nq, N, s=0.5 / magnitude)
    if draw(st.booleans()):
        kw["alibi_slopes"] = torch.rand(H, generator=g).to(dtype)
    if draw(st.integers(0, 2)) == 0:  # SPEC section 12
        kw["sinks"] = (torch.randn(H, generator=g, dtype=torch.float64) * 2).to(dtype)
    for name in ("omega_align", "omega_sep", "omega_coh"):
        kw[name] = draw(st.floats(-2, 2))
    kw["score_temp"] = draw(st.floats(0.2, 3))
    kw["kappa"] = draw(st.floats(0.1, 40))
    kw["delta"] = draw(st.floats(-1, 1))
    return (q, k, v, z, h), kw


def _call(backend, tensors, kw):
    """ascender_attention on `backend` (3-row blocks), or None after a clear error (one that names
    what is wrong); anything else fails the test."""
    try:
        with attention_backend(backend, block_rows=3):
            return ascender_attention(*tensors, **kw)
    except ERRORS as e:
        assert "ascender" in str(e) or "must" in str(e), str(e)
        return None


def _visible(tensors, kw):
    """[B, H, Nq, N] bool: the keys each row sees (SPEC sections 3 and 8)."""
    q, k = tensors[0], tensors[1]
    B, H, Nq, _ = q.shape
    return allowed_keys(B, H, Nq, k.shape[2], q.device, kw["is_causal"], kw.get("key_padding_mask"),
                        kw.get("attn_mask"), window_size=kw.get("window_size"), global_tokens=kw.get("global_tokens", 0),
                        global_mask=kw.get("global_mask"), document_ids=kw.get("document_ids"))


def _sees(tensors, kw, token):
    """[B, H, Nq] bool: the rows whose output may depend on the inputs of `token` (SPEC section 11):
    the token is in the row's statistics set (its visible keys with mask_stats, else every token)
    or it is the row's own token; a row without a visible key sees nothing (its output is 0)."""
    Nq, N = tensors[0].shape[2], tensors[1].shape[2]
    J = _visible(tensors, kw)
    visible = J[..., token] if kw["mask_stats"] else torch.ones(J.shape[:3], dtype=torch.bool)
    own = torch.zeros(Nq, dtype=torch.bool)
    if 0 <= token - (N - Nq) < Nq:
        own[token - (N - Nq)] = True
    return (visible | own) & J.any(-1)


@pytest.mark.parametrize("backend", BACKENDS)
@given(problem=problems())
def test_finite_inputs_give_finite_results_or_clear_errors(backend, problem):
    tensors, kw = problem
    inputs = [t.detach().requires_grad_() for t in tensors]
    y = _call(backend, inputs, kw)
    if y is None:
        return
    assert y.shape == tensors[0].shape[:3] + (tensors[2].shape[-1],)
    assert torch.isfinite(y).all()
    with torch.no_grad():  # the inference op: the decode kernel for few query rows
        assert torch.isfinite(_call(backend, tensors, kw)).all()
    if y.numel():
        y.backward(torch.randn_like(y))
        for t in inputs:
            assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("backend", BACKENDS)
@given(problem=problems(), where=st.integers(0, 4), what=st.sampled_from([float("nan"), float("inf")]),
       at=st.integers(0, 10 ** 6))
def test_non_finite_inputs_reach_only_the_rows_that_see_them(backend, problem, where, what, at):
    tensors, kw = problem
    tensors = [t.clone() for t in tensors]
    target = tensors[where]
    assume(target.numel() > 0)
    B, H, n, f = target.shape
    b, hd, tok, c = (at % B, (at // B) % H, (at // (B * H)) % n, (at // (B * H * n)) % f)
    target[b, hd, tok, c] = what
    N, Nq = tensors[1].shape[2], tensors[0].shape[2]
    token = tok + (N - Nq) if where == 0 else tok  # q holds the last Nq tokens
    if where == 0:  # q_i enters its own row only, if that row has a visible key
        clean = torch.ones(Nq, dtype=torch.bool)
        clean[tok] = not _visible(tensors, kw)[b, hd, tok].any()
    else:
        clean = ~_sees(tensors, kw, token)[b, hd]  # [Nq]: rows of (b, hd) that cannot see the token
    others = torch.ones(B, H, Nq, dtype=torch.bool)
    others[b, hd] = clean
    inputs = [t.detach().requires_grad_() for t in tensors]
    y = _call(backend, inputs, kw)
    if y is None:
        return
    assert torch.isfinite(y[others]).all(), "a NaN/Inf reached a row that cannot see it"
    # a NaN reaches every row that sees it, as in the twin (an Inf may leave a row finite where the
    # arithmetic has a finite limit, e.g. weight exp(-inf) = 0 for an infinitely distant latent)
    sick = ~torch.isfinite(ascender_attention_reference(*tensors, **kw)).all(-1) if what != what else None
    if sick is not None:
        assert torch.equal(~torch.isfinite(y).all(-1), sick), "the rows a NaN reaches differ from the twin's"
    if tensors[0].dtype == torch.float64:  # and those rows do not depend on the token at all
        finite = [t.clone() for t in tensors]
        finite[where][b, hd, tok, c] = 0.5
        y_finite = _call(backend, [t.detach().requires_grad_() for t in finite], kw)  # y's kernel: autograd
        torch.testing.assert_close(y[others], y_finite[others], rtol=1e-9, atol=1e-9,
                                   msg="a row that cannot see the token changed with its value")
    with torch.no_grad():  # the inference op (the decode kernel for few query rows): the same rule
        y_inf = _call(backend, tensors, kw)
        assert torch.isfinite(y_inf[others]).all(), "a NaN/Inf reached a row that cannot see it (no grad)"
        if sick is not None:
            assert torch.equal(~torch.isfinite(y_inf).all(-1), sick), "the rows a NaN reaches differ (no grad)"
        if tensors[0].dtype == torch.float64:
            torch.testing.assert_close(y_inf[others], _call(backend, finite, kw)[others], rtol=1e-9, atol=1e-9,
                                       msg="a row that cannot see the token changed with its value (no grad)")
    if others.any():
        (y * others.unsqueeze(-1)).sum().backward()
        for name, t in zip("qkvzh", inputs):
            assert torch.isfinite(t.grad).all(), f"d{name} non-finite from a loss over rows that cannot see it"


def _well_posed_rows(tensors, kw, rel=1e-6):
    """[B, H, Nq] rows whose result is a continuous function of the inputs at this point, so two
    correct float64 implementations agree to rounding: the bias rows' stds are above rounding
    (cases.resolvable_rows), and in the paper variant the neighbour set has no near-tie at its
    boundary and the summed neighbour keys m_i are not a near-cancellation (u_i = m_i / |m_i|)."""
    scalars = {n: torch.tensor(kw[n], dtype=torch.float64) for n in kw if n in SCALAR_NAMES}
    rest = {n: v for n, v in kw.items() if n not in scalars and n != "variant"}
    rows = resolvable_rows(tensors, scalars, {}, rest, kw["variant"], rel=rel)
    if kw["variant"] != "paper" or rows.numel() == 0:
        return rows
    fwd = fused_forward(tensors, scalars, {}, rest, "paper")
    stats = fwd["stats"]
    count = (fwd["nbr"] >= 0).sum(-1)
    rows &= (stats[..., Stat.UNORM] > rel * count) | (count == 0)
    q, k, _, _, h = tensors
    B, H, Nq, _ = q.shape
    N = k.shape[2]
    if kw["neighbours"] == "scores":  # the ranking: s_il = scale q_i . k_l, or a_il = h^_i . h^_l
        a = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    else:
        hn = torch.nn.functional.normalize(h, dim=-1)
        a = hn[..., N - Nq:, :] @ hn.transpose(-2, -1)
    J = _visible(tensors, kw)
    T = J if kw["mask_stats"] else torch.ones_like(J)
    T = T & (torch.arange(N).unsqueeze(0) != torch.arange(N - Nq, N).unsqueeze(1))
    # outside T: -inf, below any score (a sentinel of -3 was below every a_il but not every s_il)
    ranked = torch.where(T, a, torch.full_like(a, -torch.inf)).sort(-1, descending=True).values
    kk = min(kw["k_neighbors"], max(N - 1, 0))
    if 0 < kk < N:
        inside, outside = ranked[..., kk - 1], ranked[..., kk]
        rows &= (outside == -torch.inf) | (inside - outside > rel)
    return rows


@given(problem=problems(dtypes=(torch.float64,)))
def test_float64_equals_the_twin(problem):
    tensors, kw = problem
    try:
        y = ascender_attention(*tensors, **kw)
    except ERRORS:
        return
    want = ascender_attention_reference(*tensors, **kw)
    rows = _well_posed_rows(tensors, kw)
    assume(rows.any())
    assert rel_err(y[rows], want[rows]) <= 1e-8


@given(B=st.integers(0, 2), H=st.integers(1, 3), N=st.integers(0, 9), d=st.integers(1, 5),
       n_iter=st.sampled_from([0, 1, 4, 30]), eps=st.sampled_from([1e-3, 0.1, 1.0]), seed=st.integers(0, 999),
       pad=st.booleans())
def test_magnitude_attention_finite_and_equals_the_twin(B, H, N, d, n_iter, eps, seed, pad):
    from ascender_torch.reference import magnitude_attention_reference

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g, dtype=torch.float64) for _ in range(3))
    kpm = (torch.rand(B, N, generator=g) < 0.3) if pad else None
    inputs = [t.requires_grad_() for t in (q, k, v)]
    y = magnitude_attention(*inputs, n_iter=n_iter, eps=eps, key_padding_mask=kpm)
    assert torch.isfinite(y).all()
    if eps >= 0.1:  # cond(Zm + eps I) <= (N + eps) / eps: with eps = 1e-3 and near-duplicate keys the
        # unrolled solve amplifies rounding ~1e7-fold in any implementation (docs/cuda.md, Magnitude)
        want = magnitude_attention_reference(q, k, v, n_iter=n_iter, eps=eps, key_padding_mask=kpm)
        assert rel_err(y, want) <= 1e-8
    if y.numel():
        y.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in inputs)


@given(B=st.integers(1, 2), H=st.integers(1, 3), N=st.integers(1, 9), d=st.integers(1, 5), n_iter=st.sampled_from([0, 1, 4]),
       seed=st.integers(0, 999), pad=st.booleans(), where=st.sampled_from("qkv"),
       what=st.sampled_from([float("nan"), float("inf"), -float("inf")]), at=st.integers(0, 10 ** 6))
def test_magnitude_non_finite_inputs_reach_the_rows_the_twin_says(B, H, N, d, n_iter, seed, pad, where, what, at):
    """A NaN / Inf in one entry of q, k or v reaches only rows and mu entries that the twin says it
    reaches (SPEC section 11, docs/magnitude.md), all of them for a NaN (an Inf may legitimately give
    some rows a weight of exactly 0 for its key); the other rows equal the twin's, and a loss over
    them has finite gradients."""
    from ascender_torch.reference import magnitude_attention_reference

    g = torch.Generator().manual_seed(seed)
    tensors = {n: torch.randn(B, H, N, d, generator=g, dtype=torch.float64) for n in "qkv"}
    kpm = (torch.rand(B, N, generator=g) < 0.3) if pad else None
    flat = tensors[where].view(-1)
    flat[at % flat.numel()] = what

    def run(fn):
        inputs = [tensors[n].clone().requires_grad_() for n in "qkv"]
        # eps = 0.1: well-conditioned (see the property above), so the rows it did not reach equal the twin's
        y, mu = fn(*inputs, n_iter=n_iter, eps=0.1, key_padding_mask=kpm, return_mu=True)
        return inputs, y, mu

    inputs, y, mu = run(magnitude_attention)
    _, y_twin, mu_twin = run(magnitude_attention_reference)
    reached, hit = ~torch.isfinite(y_twin).all(-1), ~torch.isfinite(y).all(-1)
    mu_reached, mu_hit = ~torch.isfinite(mu_twin), ~torch.isfinite(mu)
    assert not (hit & ~reached).any() and not (mu_hit & ~mu_reached).any()
    if what != what:  # NaN
        assert torch.equal(hit, reached) and torch.equal(mu_hit, mu_reached)
    assert rel_err(y[~reached], y_twin[~reached]) <= 1e-8
    torch.where(reached.unsqueeze(-1), torch.zeros_like(y), y).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in inputs)


@given(B=st.integers(0, 2), N=st.integers(0, 7), heads=st.integers(1, 3), variant=st.sampled_from(["seed", "paper"]),
       causal=st.booleans(), seed=st.integers(0, 999))
def test_modules_finite(B, N, heads, variant, causal, seed):
    torch.manual_seed(seed)
    x = torch.randn(B, N, 6 * heads, requires_grad=True)
    out, _ = ASCenderAttention(6 * heads, heads, k=3, variant=variant)(x, is_causal=causal)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out2, _ = MagnitudeAttention(6 * heads, heads)(x)
    assert out2.shape == x.shape and torch.isfinite(out2).all()
    if out.numel():
        (out.sum() + out2.sum()).backward()
        assert torch.isfinite(x.grad).all()
