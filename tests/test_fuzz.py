"""Property-based fuzzing (hypothesis) of the public API on every backend present.

Random shapes (zero sizes, decode rows, feature sizes of 1), strides, dtypes, masks, windows,
global tokens, packed documents (ids of every integer dtype, at the ends of its range), softcap,
attention sinks, both neighbour rules and the other options, duplicate tokens (exact ties) and
negated keys, extreme and non-finite values (in the tokens' inputs and in per-head scalars), for
ascender_attention on the fused CPU and the block-wise backends, magnitude_attention and the
modules. Properties:

* the call returns or raises a clear error (TypeError / ValueError / RuntimeError with a message
  that names what is wrong); the process never crashes;
* finite in-range inputs give finite outputs and gradients;
* a NaN or Inf in one token's inputs, or in one head's entry of a learnable scalar, the ALiBi
  slopes or the sink logits, reaches only the rows that can see it (SPEC section 11; a row without a visible key sees
  nothing), in the output and in the gradients of a loss over the other rows, with and without
  autograd (without it, few query rows run the decode kernel); a NaN reaches every row the twin says;
* float64 results (and, for inputs of unit size, gradients) equal the dense twin's where the result
  is a continuous function of the inputs (no near-tie at a neighbour set's boundary, other than
  between equal keys, which tie exactly; no heading near the zero-heading threshold; bias rows above
  rounding);
* a wrong argument (a scalar or a mask of the wrong type, shape, dtype or value) is a TypeError,
  ValueError or RuntimeError whose message names it, on the three backends.

`make test` runs the "ci" profile (a few hundred cases); `make fuzz` the "long" one (HYPOTHESIS_PROFILE=long,
100,000 cases per property), printing the statistics.
Last long run (issue 29, 2026-11-26, the shared 2-core machine under a load of 10-15): 600 examples
per property (a copy of this file with max_examples=600), 9 passed in 19 min, no failing example.
At that rate the long profile's 100,000 per property would take about two days there; not run.
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
from ascender_torch._spec import EPS_HEADING, SCALAR_DEFAULTS, SCALAR_NAMES  # noqa: E402
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
ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32, torch.uint64)
PER_HEAD = SCALAR_NAMES + ("alibi_slopes", "sinks")


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
    d, dv, dz, da = (draw(st.one_of(st.just(1), st.integers(1, 6))) for _ in range(4))  # d = 1: unit keys are +-1
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    g = torch.Generator().manual_seed(seed)
    magnitude = draw(st.sampled_from([1.0, 1.0, 1e-3, 1e3, 1e6]))

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s * magnitude).to(dtype)

    q, k, v = rnd(B, H, Nq, d), rnd(B, H, N, d), rnd(B, H, N, dv)
    z, h = rnd(B, H, N, dz, s=0.3 / magnitude ** 0.5), rnd(B, H, N, da)
    if N > 1 and draw(st.integers(0, 3)) == 0:  # duplicate tokens (exact ties), maybe with negated keys
        negate = draw(st.booleans())  # (k^ and -k^ cancel in a heading)
        for src, dst in torch.randint(0, N, (draw(st.integers(1, N)), 2), generator=g).tolist():
            for t in (k, v, z, h):
                t[:, :, dst] = t[:, :, src]
            if negate:
                k[:, :, dst] = -k[:, :, dst]
            if min(src, dst) >= N - Nq:
                q[:, :, dst - (N - Nq)] = q[:, :, src - (N - Nq)]
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
        if draw(st.booleans()):  # three documents, ids of any integer dtype, at the ends of its range
            ids = torch.randint(0, 3, (B, N), generator=g)
            ids = ids if draw(st.integers(0, 3)) == 0 else ids.sort(-1).values
            dtype_ids = draw(st.sampled_from(ID_DTYPES))
            lo, hi = torch.iinfo(dtype_ids).min, torch.iinfo(dtype_ids).max
            values = draw(st.permutations(sorted({lo, lo + 1, 0, 1, hi - 1, hi})))[:3]
            kw["document_ids"] = torch.tensor(values, dtype=dtype_ids)[ids]
    if draw(st.integers(0, 3)) == 0:  # SPEC section 9
        kw["softcap"] = draw(st.floats(0.5, 20))
        kw["softcap_bias"] = draw(st.sampled_from(["inside", "outside"]))
    if draw(st.booleans()):
        kw["key_padding_mask"] = torch.rand(B, N, generator=g) < draw(st.sampled_from([0.2, 0.5, 1.0]))
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(Nq, N), (1, Nq, N), (B, 1, Nq, N), (B, H, Nq, N), (1, N)]))
        kw["attn_mask"] = torch.rand(*shape, generator=g) < 0.7
    if draw(st.booleans()):
        kw["attn_bias"] = rnd(1, H, Nq, N, s=0.5 / magnitude)
    if draw(st.booleans()):
        kw["alibi_slopes"] = torch.rand(*draw(st.sampled_from([(H,), (B, H)])), generator=g).to(dtype)
    if draw(st.integers(0, 2)) == 0:  # SPEC section 12
        kw["sinks"] = (torch.randn(H, generator=g, dtype=torch.float64) * 2).to(dtype)
    if draw(st.integers(0, 3)) == 0:  # SPEC section 9b: one stream, so that every backend drops the same pairs
        kw["dropout_p"] = draw(st.sampled_from([0.1, 0.5]))
        kw["dropout_seed"] = torch.tensor([draw(st.integers(-2 ** 63, 2 ** 63 - 1)), draw(st.integers(0, 2 ** 40))])
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


def _poisoned(tensors, kw, where, what, at, name):
    """One non-finite entry: in q, k, v, z or h (where = 0 .. 4), or in one head's entry of the
    per-head value `name` (where = 5). Returns the inputs and options with it, the same with a
    finite value there, and the rows [B, H, Nq] that cannot see it (SPEC section 11)."""
    B, H, Nq = tensors[0].shape[:3]
    N = tensors[1].shape[2]
    finite, kw_finite = [t.clone() for t in tensors], kw
    tensors = [t.clone() for t in tensors]
    others = torch.ones(B, H, Nq, dtype=torch.bool)
    if where == 5:  # every row of that head that has a visible key
        hd = at % H
        value = kw.get(name, SCALAR_DEFAULTS.get(name, 0.5))
        finite_values = torch.as_tensor(value, dtype=tensors[0].dtype)
        finite_values = (finite_values if finite_values.dim() == 2 else finite_values.expand(H)).clone()  # ([B, H])
        values = finite_values.clone()
        values[..., hd] = what
        kw, kw_finite = dict(kw, **{name: values}), dict(kw, **{name: finite_values})
        others[:, hd] = ~_visible(tensors, kw)[:, hd].any(-1)
        return tensors, kw, finite, kw_finite, others
    target = tensors[where]
    assume(target.numel() > 0)
    _, _, n, f = target.shape
    b, hd, tok, c = (at % B, (at // B) % H, (at // (B * H)) % n, (at // (B * H * n)) % f)
    target[b, hd, tok, c] = what
    finite[where][b, hd, tok, c] = 0.5
    token = tok + (N - Nq) if where == 0 else tok  # q holds the last Nq tokens
    if where == 0:  # q_i enters its own row only, if that row has a visible key
        others[b, hd, tok] = not _visible(tensors, kw)[b, hd, tok].any()
    else:
        others[b, hd] = ~_sees(tensors, kw, token)[b, hd]  # [Nq]: rows of (b, hd) that cannot see the token
    return tensors, kw, finite, kw_finite, others


@pytest.mark.parametrize("backend", BACKENDS)
@given(problem=problems(), where=st.integers(0, 5), what=st.sampled_from([float("nan"), float("inf")]),
       at=st.integers(0, 10 ** 6), name=st.sampled_from(PER_HEAD))
def test_non_finite_inputs_reach_only_the_rows_that_see_them(backend, problem, where, what, at, name):
    tensors, kw, finite, kw_finite, others = _poisoned(*problem, where, what, at, name)
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
    if tensors[0].dtype == torch.float64:  # and those rows do not depend on the token or value at all
        y_finite = _call(backend, [t.detach().requires_grad_() for t in finite], kw_finite)  # y's kernel: autograd
        torch.testing.assert_close(y[others], y_finite[others], rtol=1e-9, atol=1e-9,
                                   msg="a row that cannot see the token changed with its value")
    with torch.no_grad():  # the inference op (the decode kernel for few query rows): the same rule
        y_inf = _call(backend, tensors, kw)
        assert torch.isfinite(y_inf[others]).all(), "a NaN/Inf reached a row that cannot see it (no grad)"
        if sick is not None:
            assert torch.equal(~torch.isfinite(y_inf).all(-1), sick), "the rows a NaN reaches differ (no grad)"
        if tensors[0].dtype == torch.float64:
            torch.testing.assert_close(y_inf[others], _call(backend, finite, kw_finite)[others], rtol=1e-9, atol=1e-9,
                                       msg="a row that cannot see the token changed with its value (no grad)")
    if others.any():
        (y * others.unsqueeze(-1)).sum().backward()
        for n, t in zip("qkvzh", inputs):
            assert torch.isfinite(t.grad).all(), f"d{n} non-finite from a loss over rows that cannot see it"


def _well_posed_rows(tensors, kw, rel=1e-6):
    """[B, H, Nq] rows whose result is a continuous function of the inputs at this point, so two
    correct float64 implementations agree to rounding: the bias rows' stds are above rounding
    (cases.resolvable_rows), and in the paper variant the neighbour set has no near-tie at its
    boundary other than between equal keys (which tie exactly: the lower index wins on every
    backend), and the summed neighbour keys m_i are not near the zero-heading threshold
    (u_i = 0 where ||m_i|| <= EPS_HEADING |N(i)|)."""
    scalars = {n: torch.tensor(kw[n], dtype=torch.float64) for n in kw if n in SCALAR_NAMES}
    rest = {n: v for n, v in kw.items() if n not in scalars and n != "variant"}
    rows = resolvable_rows(tensors, scalars, {}, rest, kw["variant"], rel=rel)
    if kw["variant"] != "paper" or rows.numel() == 0:
        return rows
    fwd = fused_forward(tensors, scalars, {}, rest, "paper")
    count = (fwd["nbr"] >= 0).sum(-1)
    rows &= ((fwd["stats"][..., Stat.UNORM] - EPS_HEADING * count).abs() > rel * count) | (count == 0)
    q, k, _, _, h = tensors
    B, H, Nq, _ = q.shape
    N = k.shape[2]
    if kw["neighbours"] == "scores":  # the ranking: s_il = scale q_i . k_l, or a_il = h^_i . h^_l
        a, keys = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5, k
    else:
        hn = torch.nn.functional.normalize(h, dim=-1)
        a, keys = hn[..., N - Nq:, :] @ hn.transpose(-2, -1), h
    J = _visible(tensors, kw)
    T = J if kw["mask_stats"] else torch.ones_like(J)
    T = T & (torch.arange(N).unsqueeze(0) != torch.arange(N - Nq, N).unsqueeze(1))
    # outside T: -inf, below any score (a sentinel of -3 was below every a_il but not every s_il)
    ranked = torch.where(T, a, torch.full_like(a, -torch.inf)).sort(-1, descending=True).values
    kk = min(kw["k_neighbors"], max(N - 1, 0))
    if 0 < kk < N:
        inside, outside = ranked[..., kk - 1], ranked[..., kk]
        # the keys near the boundary value: harmless if they are all equal (an exact tie)
        near = T & ((a - inside.unsqueeze(-1)).abs() <= rel)
        first = keys.gather(2, near.int().argmax(-1, keepdim=True).expand(B, H, Nq, keys.shape[-1]))
        exact_tie = (~near | (keys.unsqueeze(2) == first.unsqueeze(3)).all(-1)).all(-1)
        rows &= (outside == -torch.inf) | (inside - outside > rel) | exact_tie
    return rows


@given(problem=problems(dtypes=(torch.float64,)))
def test_float64_equals_the_twin(problem):
    """y and the gradients of a loss over the well-posed rows, fused and block-wise, equal the twin's
    (the gradients caught the block-wise path and the twin breaking exact ties, issue 29)."""
    tensors, kw = problem
    if _call("fused", tensors, kw) is None:
        return
    rows = _well_posed_rows(tensors, kw)
    assume(rows.any())
    up = torch.randn(*rows.shape, tensors[2].shape[-1], dtype=torch.float64,
                     generator=torch.Generator().manual_seed(0)) * rows.unsqueeze(-1)

    def run(op):
        inputs = [t.detach().requires_grad_() for t in tensors]
        y = op(*inputs, **kw)
        return [y[rows]] + list(torch.autograd.grad((y * up).sum(), inputs, allow_unused=True, materialize_grads=True))

    want = run(ascender_attention_reference)
    # Gradients on inputs of unit size only: with entries of 1e3 .. 1e6 a saturated softmax or softcap
    # has a gradient of exactly 0 in the twin and of eps x |v| |k| / temperature (1e-8 and more) in the
    # kernels, which rounding explains. A gradient may be 0 exactly (dh with da = 1): errors are also
    # measured against the largest gradient.
    unit = max(t.abs().max().item() if t.numel() else 0.0 for t in tensors) <= 10
    scale = max(g.abs().max().item() if g.numel() else 0.0 for g in want[1:])
    for backend in BACKENDS:
        with attention_backend(backend, block_rows=3):
            got = run(ascender_attention)
        assert rel_err(got[0], want[0]) <= 1e-8, backend
        for name, a, b in zip(("dq", "dk", "dv", "dz", "dh"), got[1:], want[1:]):
            if unit and b.numel():
                assert (a - b).abs().max() <= 1e-7 * b.abs().max() + 1e-10 * scale, (backend, name)


def _bad_arguments(B, H, Nq, N, dtype):
    """(name, value) pairs, each an argument the user got wrong, for a call with these sizes."""
    scalars = [(name, value) for name in SCALAR_NAMES for value in (
        "a", "1.5", None, 1j, [0.1] * H, True, torch.tensor(True), torch.tensor(0.5j), torch.ones(H + 1, dtype=dtype))]
    return scalars + [
        ("score_temp", -1e-6), ("kappa", torch.full((H,), -1e-6, dtype=dtype)), ("omega_sep", float("nan")),
        ("sinks", "a"), ("sinks", 1j), ("sinks", torch.ones(H + 1, dtype=dtype)), ("sinks", float("nan")),
        ("attn_mask", [[True] * N] * Nq), ("attn_mask", torch.ones(Nq + 2, N + 2, dtype=torch.bool)),
        ("attn_mask", torch.ones(Nq, N)), ("attn_mask", torch.ones(Nq, N, dtype=torch.uint8)),
        ("key_padding_mask", [[False] * N] * B), ("key_padding_mask", torch.zeros(B, N + 1, dtype=torch.bool)),
        ("key_padding_mask", torch.zeros(B, N, dtype=torch.uint8)),
        ("attn_bias", torch.zeros(Nq, N, dtype=torch.bool)), ("attn_bias", [[0.0] * N] * Nq),
        ("attn_bias", torch.zeros(Nq + 2, N + 2, dtype=dtype)),
        ("attn_bias", torch.zeros(Nq, N, dtype=torch.complex64)),
        ("global_mask", [[False] * N] * B), ("global_mask", torch.zeros(B, N, dtype=torch.long)),
        ("document_ids", [[0] * N] * B), ("document_ids", torch.zeros(B, N)),
        ("document_ids", torch.zeros(B, N + 1, dtype=torch.long)),
        ("alibi_slopes", torch.ones(H + 1, dtype=dtype)), ("alibi_slopes", float("inf")),
        ("k_neighbors", -1), ("k_neighbors", 2.5), ("k_neighbors", "3"), ("tau_sep", 0.0), ("tau_coh", float("nan")),
        ("scale", float("inf")), ("alpha_align", "x"), ("softcap", -1.0), ("softcap", 0.0), ("is_causal", "yes"),
        ("window_size", (-2, 0)), ("window_size", 3), ("window_size", (1, 2, 3)), ("global_tokens", N + 1),
        ("global_tokens", -1), ("variant", "flash"), ("neighbours", "keys"), ("mask_stats", None),
    ]


@given(problem=problems(), choice=st.integers(0, 10 ** 6))
def test_a_wrong_argument_is_an_error_that_names_it(problem, choice):
    """One argument of a valid call made wrong: a TypeError, ValueError or RuntimeError naming it, on
    the three backends (a mis-shaped attn_bias was reported as attn_mask, a list mask reached the
    dispatcher's message, a string scalar failed inside float() or was taken as a number)."""
    tensors, kw = problem
    if _call("fused", tensors, kw) is None:
        return
    q = tensors[0]
    bad = _bad_arguments(*q.shape[:3], tensors[1].shape[2], q.dtype)
    name, value = bad[choice % len(bad)]
    wrong = dict(kw, mask_stats=True)  # (structured options need mask_stats)
    wrong[name] = value
    for backend in ("fused", "blockwise", "dense"):
        with attention_backend(backend), pytest.raises(ERRORS) as error:
            ascender_attention(*tensors, **wrong)
        assert name in str(error.value), (backend, name, value, str(error.value))


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
