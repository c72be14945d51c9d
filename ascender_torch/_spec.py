"""The interface of the ascender ops, written once.

Every layer that names an op argument reads it from here: the registered schemas (`_ops`
defines the ops from `OpSpec.schema()`), the binding (it reads each argument by its name), the
fake kernels and the autograd rules (`_ops`), the functional API's signature and call
(`functional`), the reference twin's defaults (`reference`), the modules' and the Hugging Face
integration's defaults, and the tests' call helper. Adding an argument to the op is one entry
here plus its field in the C params struct, its check in the binding and its use in the kernels
and the twin (docs/adding_an_argument.md).

The C side holds its own single copy of what the kernels need (csrc/ascender.h: the epsilon
constants, the saved-statistics columns, the learnable scalars' order); `_ops` checks at import
that the compiled library agrees with this file.
"""

from __future__ import annotations

import enum
import inspect
import numbers
import operator
from dataclasses import dataclass

# The epsilon constants of the seed module (SPEC section 4); csrc/ascender.h has the C copy.
EPS_TAU = 1e-6  # tau_sep, tau_coh, kappa, score_temp and the centroid denominator
EPS_STD = 1e-6  # row normalization
EPS_NORM = 1e-12  # F.normalize
# The paper variant's heading is 0 where ||sum of the neighbours' unit keys|| <= EPS_HEADING x their count
# (unit keys that cancel in exact arithmetic leave a rounding residue; README, Semantics). Not a seed constant.
EPS_HEADING = 1e-5

REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Arg:
    """One argument of an op: its name, its schema type, its default in the Python API
    (REQUIRED: none) and what it means. A default the schema cannot express (scale=None, resolved
    to 1/sqrt(d) in Python) makes the schema argument required."""

    name: str
    type: str  # "Tensor", "Tensor?", "int", "int[]?", "float", "float?", "bool", "str"
    default: object = REQUIRED
    doc: str = ""

    def schema_default(self):
        """The default as schema text, or None where the schema cannot express it (a learnable
        scalar's number, scale=None resolved in Python)."""
        if self.default is REQUIRED or self.type == "Tensor":
            return None
        if self.default is None:
            return "None" if self.type.endswith("?") else None
        return f"'{self.default}'" if isinstance(self.default, str) else repr(self.default)


def _tensor(name, doc):
    return Arg(name, "Tensor", doc=doc)


def _learnable(name, default, doc):
    """A learnable per-head scalar: a number, a 0-dim or an [H] tensor in the Python API, a tensor in the op."""
    return Arg(name, "Tensor", default, doc)


def _optional_tensor(name, doc):
    return Arg(name, "Tensor?", None, doc)


class Keywords(tuple):
    """The keyword arguments of a Python entry point: a tuple of Args that also maps names to them."""

    def __new__(cls, args):
        keywords = super().__new__(cls, args)
        keywords.by_name = {a.name: a for a in args}
        return keywords


@dataclass(frozen=True)
class OpSpec:
    """An op's arguments (schema order) and the names of its outputs."""

    name: str
    args: tuple
    returns: tuple

    def schema(self) -> str:
        """The registered schema. Defaults are written for the trailing arguments that all have one
        (an op argument with a default must not precede one without); the Python API has them all."""
        parts, trailing = [], True
        for a in reversed(self.args):
            default = a.schema_default()
            trailing = trailing and default is not None
            parts.append(f"{a.type} {a.name}" + (f"={default}" if trailing else ""))
        args = ", ".join(reversed(parts))
        returns = ", ".join(f"Tensor {r}" for r in self.returns)
        return f"{self.name}({args}) -> ({returns})"

    def index(self, name: str) -> int:
        for i, a in enumerate(self.args):
            if a.name == name:
                return i
        raise KeyError(f"{self.name} has no argument {name!r}")

    def named(self, values) -> dict:
        """The op's arguments in schema order (as an autograd rule receives them) by name."""
        return {a.name: v for a, v in zip(self.args, values)}

    def bind(self, args: tuple, kwargs: dict) -> dict:
        """Every argument by name from a call's positional and keyword arguments (as a fake kernel
        receives them), the schema's defaults filled in."""
        named = self.named(args)
        named.update(kwargs)
        for a in self.args[len(args):]:
            if a.name not in named:
                named[a.name] = a.default
        return named

    def ordered(self, named: dict) -> tuple:
        """One entry per argument in schema order (missing names are None): e.g. the gradients an
        autograd rule returns."""
        return tuple(named.get(a.name) for a in self.args)


# ---------------------------------------------------------------------------------------------
# ASCender (SPEC sections 2-5)
# ---------------------------------------------------------------------------------------------

INPUTS = (
    _tensor("q", "[B, H, Nq, d] queries (the last Nq of the N tokens; Nq = N for self-attention)"),
    _tensor("k", "[B, H, N, d] keys"),
    _tensor("v", "[B, H, N, dv] values"),
    _tensor("z", "[B, H, N, dz] latent coordinates (Z = X U)"),
    _tensor("h", "[B, H, N, da] semantic projections (H = X P)"),
)

# The learnable per-head scalars in SPEC order: the order of the backward's dscalars rows and of
# csrc/ascender.h's ASC_SCALARS.
SCALARS = (
    _learnable("lambda_align", 1.0, "strength of the alignment bias"),
    _learnable("lambda_sep", 1.0, "strength of the separation bias"),
    _learnable("lambda_coh", 1.0, "strength of the cohesion bias"),
    _learnable("omega_align", 0.1, "weight of the normalized alignment bias in the score"),
    _learnable("omega_sep", 0.1, "weight of the normalized separation bias in the score"),
    _learnable("omega_coh", 0.1, "weight of the normalized cohesion bias in the score"),
    _learnable("score_temp", 1.0, "softmax temperature (plus 1e-6)"),
    _learnable("delta", 0.2, "redundancy threshold of the separation term"),
    _learnable("kappa", 32.0, "density scale of the separation gate"),
)
SCALAR_NAMES = tuple(a.name for a in SCALARS)
SCALAR_DEFAULTS = {a.name: a.default for a in SCALARS}

EXTRAS = (
    _optional_tensor("key_padding_mask", "[B, N] bool, True = padding"),
    _optional_tensor("attn_mask", "bool, broadcastable to [B, H, Nq, N], True = may attend"),
    _optional_tensor("attn_bias", "float, broadcastable to [B, H, Nq, N], added to S before the temperature; "
                                  "differentiable (beta^other)"),
    _optional_tensor("alibi_slopes", "[H] or [B, H] ALiBi slopes m_h (m_bh): adds -m_h |t - j| to S inside the kernel"),
    _optional_tensor("global_mask", "[B, N] bool, True = a global token (besides the first global_tokens)"),
    _optional_tensor("document_ids", "[B, N] integer: packed sequences; a query sees only keys of its own document"),
    _optional_tensor("sinks", "learnable sink logit per head ([H], 0-dim or a number), or per row (3-D, "
                              "broadcastable to [B, H, Nq]): joins the softmax's denominator only, as in GPT-OSS "
                              "(SPEC section 12); differentiable"),
    _optional_tensor("dropout_seed", "int64 [2]: (seed, offset) of the dropout mask's Philox stream (SPEC section "
                                     "9b), or [3] with a token offset o: the call's pair (t, j) draws as the "
                                     "pair (t + o, j + o) of a longer sequence (context parallelism); None: drawn "
                                     "from generator= or torch's default generator of q's device"),
)

# The token axes of each optional tensor, for the context-parallel path (ascender_torch/distributed.py):
# "tokens" = [B, N] over the sequence (a rank passes its [B, N_r] shard), "rows" = per query row when 3-D
# ([., ., Nq]: a rank passes its [., ., N_r] rows, or a last dim of 1; fewer dims: no token axis), "pairs" =
# [..., Nq, N] (refused there: O(N^2)), None = no token axis (passed on unchanged). A tensor argument
# missing here is refused by the sharded path, naming it.
TOKEN_AXES = {"key_padding_mask": "tokens", "attn_mask": "pairs", "attn_bias": "pairs", "alibi_slopes": None,
              "global_mask": "tokens", "document_ids": "tokens", "sinks": "rows",
              "dropout_seed": None}

VARIANTS = ("seed", "paper")
VARIANT_ALIASES = {"reference": "seed"}  # the SPEC's and earlier releases' name of "seed"

OPTIONS = (
    Arg("scale", "float", None, "multiplies q.k; None: 1/sqrt(d)"),
    Arg("variant", "str", "seed", "'seed' (alias 'reference'): what the seed module computes; 'paper': the "
                                  "method as written"),
    Arg("k_neighbors", "int", 16, "top-k size of the paper variant's semantic neighbourhood"),
    Arg("tau_sep", "float", 1.0, "separation kernel width (> 0)"),
    Arg("tau_coh", "float", 1.0, "cohesion kernel width (> 0)"),
    Arg("alpha_align", "float", -1.0, "alignment gate slope (paper variant)"),
    Arg("alpha_coh", "float", -1.0, "cohesion gate slope (paper variant)"),
    Arg("is_causal", "bool", False, "key j is visible to query token t only if j <= t"),
    Arg("mask_stats", "bool", True, "masks restrict every statistic (True) or only the softmax (False)"),
    Arg("softcap", "float?", None, "S <- softcap tanh(S / softcap) on the full score before the temperature "
                                   "(Gemma 2's attention logit softcapping); None: off"),
    Arg("window_size", "int[]?", None, "(left, right): query token t sees keys t - left .. t + right (-1: "
                                       "unbounded on that side); None: no window (SPEC section 8)"),
    Arg("global_tokens", "int", 0, "tokens 0 .. g - 1 are global: every query sees them and they see every key"),
    Arg("neighbours", "str", "semantic", "the paper variant's neighbourhood: 'semantic' (top-k of a_il) or "
                                         "'scores' (top-k of the base scores s_il)"),
    Arg("softcap_bias", "str", "inside", "'inside': softcap caps S + attn_bias + ALiBi; 'outside': it caps S only, "
                                         "attn_bias and ALiBi are added after the cap (FlashAttention's order, SPEC "
                                         "section 9)"),
    Arg("dropout_p", "float", 0.0, "attention dropout: each A_ij is dropped with probability p and the kept are "
                                   "scaled by 1 / (1 - p), after the softmax (SPEC section 9b); 0: off"),
    Arg("query_offset", "int?", None, "token of query row 0: the Nq rows are tokens query_offset .. query_offset "
                                      "+ Nq - 1 of the N keys; None: the last Nq tokens (N - Nq)"),
)

# scale first among the options: it has no schema default (None is resolved in Python), and a
# schema argument with a default must not precede one without
# rows32: float32 [B, H, Nq, len(Stat) + dz + d + dv + 2], per row the stats, c, u, out and aux again for float16 /
# bfloat16 (whose own 8 or 11 bits the backward's sums would amplify; the CUDA backward reads these), [B, H, Nq, 0]
# otherwise
ASCENDER_FWD = OpSpec("ascender_fwd", INPUTS + SCALARS + OPTIONS + EXTRAS,
                      ("out", "stats", "u", "c", "nbr", "aux", "rows32"))
# ascender_fwd for a result that is not differentiated (no autograd rule): few query rows take the
# CPU's decode kernel (docs/decode.md), which the backward's recomputation would not reproduce bit for bit;
# its rows32 has no columns
ASCENDER_INFER = OpSpec("ascender_infer", ASCENDER_FWD.args, ASCENDER_FWD.returns)
ASCENDER_MAPS = OpSpec("ascender_maps", ASCENDER_FWD.args, ("S_base", "b_align", "b_sep", "b_coh", "A"))
# every check of ascender_fwd that reads no data, on any device and dtype (the other backends' validation)
ASCENDER_CHECK = OpSpec("ascender_check", ASCENDER_FWD.args, ())
# ascender_fwd's outputs that carry gradients into the backward (grad_<name>); stats, c, nbr, rows32 do not
ASCENDER_DIFFERENTIABLE_OUTPUTS = ("out", "u", "aux")
ASCENDER_BWD = OpSpec(
    "ascender_bwd",
    (Arg("grad_out", "Tensor", doc="dL/dout [B, H, Nq, dv]"),) + ASCENDER_FWD.args + (
        Arg("attn_bias_grad", "bool", False, "also return dL/dattn_bias, [B, H, Nq, N] (O(N^2))"),
        _optional_tensor("grad_aux", "dL/daux [B, H, Nq, 2]"),
        _optional_tensor("grad_u", "dL/du [B, H, Nq, d]"),
    ) + tuple(_optional_tensor(name, f"the forward's {name} (the CPU and tiled CUDA backwards read them instead of "
                                     "running the forward again, docs/tiling.md); all or none")
              for name in ASCENDER_FWD.returns),
    tuple(f"d{a.name}" for a in INPUTS) + ("dscalars", "dattn_bias", "dsinks"),
)


class Stat(enum.IntEnum):
    """Columns of the forward's saved per-row statistics `stats` (csrc/ascender.h, enum asc_stat):
    LSE is the log-sum-exp of S / (score_temp + 1e-6) over the visible keys and the sink logit
    when there is one (+inf for a row with no visible key); MEAN_*/STD_* the raw bias rows' moments (std without the +1e-6); RHO the density;
    WC_SUM the centroid's denominator without +1e-6; GATE_* the paper variant's gates; UNORM the
    norm of the summed neighbour keys (the heading is 0 where it is <= EPS_HEADING x their count);
    COUNT n_i, the size of the statistics set; COH_SPREAD the cohesion gate's argument
    sum_l wc_il ||z_l - c_i||^2 / (sum_l wc_il + 1e-6)."""

    LSE = 0
    MEAN_A = 1
    STD_A = 2
    MEAN_S = 3
    STD_S = 4
    MEAN_C = 5
    STD_C = 6
    RHO = 7
    WC_SUM = 8
    GATE_A = 9
    GATE_C = 10
    UNORM = 11
    COUNT = 12
    COH_SPREAD = 13


# The raw bias rows in the order align, sep, coh, each with its (mean, std) columns
BIAS_MOMENTS = ((Stat.MEAN_A, Stat.STD_A), (Stat.MEAN_S, Stat.STD_S), (Stat.MEAN_C, Stat.STD_C))

# The Python API's keyword arguments of ascender_attention and of the twin, in this order
ASCENDER_KEYWORDS = Keywords(SCALARS + OPTIONS + EXTRAS)

# ---------------------------------------------------------------------------------------------
# Magnitude Attention (SPEC section 7)
# ---------------------------------------------------------------------------------------------

MAGNITUDE_INPUTS = (
    _tensor("q", "[B, H, N, d] queries"),
    _tensor("k", "[B, H, N, d] keys"),
    _tensor("v", "[B, H, N, dv] values"),
)
MAGNITUDE_SCALARS = (
    _learnable("t_raw", 0.0, "kernel sharpness t = softplus(t_raw)"),
    _learnable("beta", 1.0, "gate slope: sigmoid(beta mu + gamma)"),
    _learnable("gamma", 0.0, "gate offset"),
)
MAGNITUDE_OPTIONS = (
    Arg("scale", "float", None, "multiplies q.k; None: 1/sqrt(d)"),
    Arg("n_iter", "int", 4, "conjugate-gradient steps (>= 0)"),
    Arg("eps", "float", 1e-3, "Tikhonov term of (Zm + eps I) mu = 1 (> 0)"),
    _optional_tensor("key_padding_mask", "[B, N] bool, True = padding"),
)
MAGNITUDE_FWD = OpSpec("magnitude_fwd", MAGNITUDE_INPUTS + MAGNITUDE_SCALARS + MAGNITUDE_OPTIONS, ("out", "mu"))
MAGNITUDE_BWD = OpSpec(
    "magnitude_bwd",
    (Arg("grad_out", "Tensor", doc="dL/dout [B, H, N, dv]"),) + MAGNITUDE_FWD.args
    + (_optional_tensor("grad_mu", "dL/dmu [B, H, N]"),),
    ("dq", "dk", "dv", "dparams"),
)
MAGNITUDE_CHECK = OpSpec("magnitude_check", MAGNITUDE_FWD.args, ())
MAGNITUDE_KEYWORDS = Keywords(MAGNITUDE_SCALARS + MAGNITUDE_OPTIONS)

# Arguments that the Python API takes as numbers, 0-dim or [H] tensors and the ops as tensors
LEARNABLE = frozenset(a.name for a in SCALARS + MAGNITUDE_SCALARS)
# Learnable scalars that divide as (value + EPS_TAU) (SPEC section 4)
SHIFTED_DENOMINATORS = ("score_temp", "kappa")

OPS = (ASCENDER_FWD, ASCENDER_INFER, ASCENDER_MAPS, ASCENDER_BWD, ASCENDER_CHECK, MAGNITUDE_FWD, MAGNITUDE_BWD, MAGNITUDE_CHECK)


# ---------------------------------------------------------------------------------------------
# The Python API's view: keyword signatures, defaults and option values
# ---------------------------------------------------------------------------------------------


def signature(leading: tuple, keywords: tuple, flags: dict) -> inspect.Signature:
    """inspect.Signature of a Python entry point: the tensors `leading` positionally, then every
    keyword argument of the spec with its default, then the entry point's own `flags`."""
    params = [inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in leading]
    params += [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=a.default) for a in keywords]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=v) for n, v in flags.items()]
    return inspect.Signature(params)


def keyword_doc(keywords: tuple) -> str:
    """The keyword arguments as docstring lines, `name=default: meaning`."""
    return "\n".join(f"        {a.name}={a.default!r}: {a.doc}" for a in keywords)


def canonical_variant(variant) -> str:
    """'seed' or 'paper' ('reference' is accepted for 'seed'); anything else passes through for
    the binding to refuse with its message."""
    return VARIANT_ALIASES.get(variant, variant) if isinstance(variant, str) else variant


def default_scale(d: int) -> float:
    """The default scale of q.k, 1/sqrt(d) (1 for d = 0)."""
    return d ** -0.5 if d > 0 else 1.0


_FIXED_TYPES = {"bool": (bool,), "int": (int,), "float": (float, int), "str": (str,), "int[]": (tuple, list)}


def _python_value(op: str, arg: Arg, value):
    """An option's value as its schema type wants it, or an error naming the argument."""
    kind = arg.type.rstrip("?")
    if kind == "int[]":
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{op}: {arg.name} must be a tuple of ints, got {type(value).__name__} {value!r}")
        element = Arg(arg.name, "int")
        return [_python_value(op, element, x) for x in value]
    if type(value) in _FIXED_TYPES[kind]:  # the common case: a plain python value of the right type
        if kind == "float":
            return float(value)
        if kind == "int" and not -2 ** 63 <= value < 2 ** 63:
            raise ValueError(f"{op}: {arg.name} must fit in a 64-bit integer, got {value}")
        return value

    def refuse(what):
        raise TypeError(f"{op}: {arg.name} must be {what}, got {type(value).__name__} {value!r}")

    if kind == "int" and not isinstance(value, bool):
        try:  # numpy integers, 0-dim integer tensors
            return _python_value(op, arg, operator.index(value))
        except TypeError:
            pass
    if kind == "float" and not isinstance(value, bool) and isinstance(value, numbers.Real):
        return float(value)  # numpy floats
    refuse({"bool": "a bool", "int": "an int", "float": "a real number", "str": "a str"}[kind])


def options(op: str, keywords: Keywords, given: dict) -> dict:
    """The keyword arguments `given` to entry point `op`, completed with the spec's defaults and
    with every given fixed option converted to its schema type (errors name the argument).
    Unknown names raise TypeError like a Python call would."""
    known = keywords.by_name
    if not given.keys() <= known.keys():
        unknown = sorted(set(given) - set(known))
        raise TypeError(f"{op}() got an unexpected keyword argument {unknown[0]!r}; "
                        f"its keyword arguments are {', '.join(known)}")
    values = {}
    for name, arg in known.items():
        if name not in given:
            values[name] = arg.default
            continue
        value = given[name]
        if arg.type.rstrip("?") in _FIXED_TYPES and not (value is None and (arg.type.endswith("?") or
                                                                             arg.default is None)):
            value = _python_value(op, arg, value)
        values[name] = value
    if "variant" in values:
        values["variant"] = canonical_variant(values["variant"])
    return values


def resolved_scale(scale, q) -> float:
    """`scale`, or 1/sqrt(d) of q when None."""
    return default_scale(q.shape[-1] if q.dim() > 0 else 0) if scale is None else scale

