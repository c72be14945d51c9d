"""The one interface (ascender_torch/_spec.py): the registered ops, the compiled library, the
Python entry points and the modules all derive from it; the options are type-checked once there;
"reference" stays an alias of the "seed" variant everywhere."""

from __future__ import annotations

import inspect

import pytest
import torch

import ascender_torch
from ascender_torch import ASCenderAttention, ASCenderHead, AttentionConfig, _C, _ops, _spec, ascender_attention
from ascender_torch import flops, magnitude_attention
from ascender_torch.reference import ascender_attention_reference, magnitude_attention_reference

from cases import make_problem


@pytest.mark.parametrize("op", _spec.OPS, ids=lambda op: op.name)
def test_registered_schemas_are_the_specs(op):
    registered = getattr(torch.ops.ascender, op.name).default._schema
    assert registered == torch._C.parse_schema("ascender::" + op.schema())
    assert tuple(a.name for a in registered.arguments) == tuple(a.name for a in op.args)
    assert tuple(r.name for r in registered.returns) == op.returns


def test_compiled_constants_are_the_specs():
    assert _C.SCALAR_NAMES == _spec.SCALAR_NAMES
    assert _C.STAT_NAMES == tuple(s.name for s in _spec.Stat)
    assert (_C.EPS_TAU, _C.EPS_STD, _C.EPS_NORM) == (_spec.EPS_TAU, _spec.EPS_STD, _spec.EPS_NORM)


def test_a_build_that_disagrees_is_refused(monkeypatch):
    monkeypatch.setattr(_C, "STAT_NAMES", _C.STAT_NAMES[:-1])
    with pytest.raises(ImportError, match="disagrees with ascender_torch/_spec.py on STAT_NAMES"):
        _ops._check_build_matches_spec()


@pytest.mark.parametrize("fn,keywords,flags", [
    (ascender_attention, _spec.ASCENDER_KEYWORDS, ("return_maps", "return_aux", "generator")),
    (ascender_attention_reference, _spec.ASCENDER_KEYWORDS, ("return_maps", "return_aux", "generator")),
    (magnitude_attention, _spec.MAGNITUDE_KEYWORDS, ("is_causal", "return_mu")),
    (magnitude_attention_reference, _spec.MAGNITUDE_KEYWORDS, ("is_causal", "return_mu")),
])
def test_entry_point_signatures_list_every_option(fn, keywords, flags):
    params = inspect.signature(fn).parameters
    assert [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY] == [a.name for a in keywords] + list(flags)
    for a in keywords:
        assert params[a.name].default == a.default or (a.default is None and params[a.name].default is None)
        assert f"{a.name}={a.default!r}" in fn.__doc__


def test_module_defaults_are_the_specs():
    head, attn = ASCenderHead(16, 8), ASCenderAttention(16, 2)
    for name, default in _spec.SCALAR_DEFAULTS.items():
        assert getattr(head, head.scalar_attributes[name]).item() == pytest.approx(default)
        assert torch.all(getattr(attn, name) == torch.tensor(default))
    options = {a.name: a.default for a in _spec.OPTIONS}
    for module in (head, attn):
        kw = module.op_keywords()
        assert (kw["k_neighbors"], kw["tau_sep"], kw["tau_coh"], kw["alpha_align"], kw["alpha_coh"]) == tuple(
            options[n] for n in ("k_neighbors", "tau_sep", "tau_coh", "alpha_align", "alpha_coh"))


@pytest.mark.parametrize("kw,error,pattern", [
    (dict(k_neighbors="3"), TypeError, r"ascender_attention: k_neighbors must be an int, got str '3'"),
    (dict(k_neighbors=2.5), TypeError, r"k_neighbors must be an int, got float 2.5"),
    (dict(k_neighbors=True), TypeError, r"k_neighbors must be an int, got bool True"),
    (dict(k_neighbors=2 ** 63), ValueError, r"k_neighbors must fit in a 64-bit integer, got 9223372036854775808"),
    (dict(tau_sep="1"), TypeError, r"tau_sep must be a real number, got str '1'"),
    (dict(is_causal=1), TypeError, r"is_causal must be a bool, got int 1"),
    (dict(variant=3), TypeError, r"variant must be a str, got int 3"),
    (dict(softness=1.0), TypeError, r"ascender_attention\(\) got an unexpected keyword argument 'softness'"),
])
def test_option_types_are_checked_with_the_name(kw, error, pattern):
    tensors, _, _ = make_problem(N=5)
    with pytest.raises(error, match=pattern):
        ascender_attention(*tensors, **kw)


def test_integral_and_real_option_values_are_converted():
    tensors, _, _ = make_problem(N=5)
    want = ascender_attention(*tensors, variant="paper", k_neighbors=2, tau_sep=2.0)
    got = ascender_attention(*tensors, variant="paper", k_neighbors=torch.tensor(2), tau_sep=2)
    assert torch.equal(got, want)


def test_reference_is_an_alias_of_seed():
    tensors, scalars, opts = make_problem(N=7)
    for fn in (ascender_attention, ascender_attention_reference):
        assert torch.equal(fn(*tensors, **scalars, **opts, variant="reference"),
                           fn(*tensors, **scalars, **opts, variant="seed"))
    assert ASCenderHead(16, 8, variant="reference").variant == "seed"
    assert ASCenderAttention(16, 2, variant="reference").variant == "seed"
    assert flops(AttentionConfig(d=8, variant="reference"), 16) == flops(AttentionConfig(d=8, variant="seed"), 16)


def test_public_names_still_import():
    """The names the README documents keep working after the renames (flops.py, variant "seed")."""
    from ascender_torch.reference import SCALAR_NAMES  # noqa: F401

    assert callable(ascender_torch.flops) and ascender_torch.reference.ascender_attention_reference
