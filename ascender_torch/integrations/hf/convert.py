"""convert(): the ASCender modules and hooks added to a model, the attention implementation
switched, the conversion recorded in the config, and the probe (one tiny forward) that checks it."""

from __future__ import annotations

import inspect

import torch

from ...functional import ascender_attention
from .attention import ascender_attention_forward, register
from .cache import _update
from .discovery import (HEAD_DIM_NAMES, HIDDEN_NAMES, N_HEADS_NAMES, _attention_modules,
                        _bypasses_attention_interface, _config_of, _owner_configs, _refusals, _sizes)
from .hooks import _after_attention, _before_attention
from .latents import NAME, ASCenderLatents, ASCenderUnsupportedError
from .masks import _note_sdpa_support
from .save import CONFIG_KEY, FORMAT_VERSION, install


def _fail(model, reason):
    raise ASCenderUnsupportedError(f"ascender: cannot convert {type(model).__name__}: {reason}")


OPTION_NAMES = ("variant", "k", "tau_sep", "tau_coh", "alpha_align", "alpha_coh", "d_latent", "fully_masked")


def _attach(model, *, variant, omega_init, d_latent, k, tau_sep, tau_coh, alpha_align, alpha_coh, fully_masked,
            saved=None):
    """Adds the ASCender modules and hooks (no forward, no change of attention implementation);
    returns the names of the converted modules. ``saved``: the recorded modules and sizes of a
    saved conversion (name -> [hidden, heads, d_latent]), which must be this model's."""
    cls = type(model)
    if hasattr(cls, "_can_set_attn_implementation") and not cls._can_set_attn_implementation():
        _fail(model, "its attention modules do not dispatch to transformers' AttentionInterface, so the "
                     "attention implementation cannot be swapped (it would silently keep its own attention)")
    bypass = sorted({type(m).__name__ for m in model.modules() if _bypasses_attention_interface(m)})
    if bypass:
        _fail(model, f"its attention modules {bypass} compute attention themselves instead of dispatching to "
                     "transformers' AttentionInterface, so they would silently keep their own attention")
    modules = _attention_modules(model)
    if not any(not cross for _, _, cross in modules):
        _fail(model, "no self-attention module found: looked for modules whose forward calls transformers' "
                     "AttentionInterface (ALL_ATTENTION_FUNCTIONS), with sizes in the attributes "
                     f"{HEAD_DIM_NAMES} / {N_HEADS_NAMES} or in the config")
    reasons = _refusals(model, modules)
    if reasons:
        _fail(model, "; ".join(reasons))
    owners = _owner_configs(model)
    converted = []
    for name, m, cross in modules:
        if cross:  # cross-attention keeps sdpa
            m._ascender_cross_attention = True
            continue
        converted.append(name)
        if hasattr(m, "ascender"):
            continue
        config = _config_of(name, owners, model.config)
        hidden, n_heads, head_dim = _sizes(m, config)
        latent = d_latent or (max(head_dim // 2, 1) if head_dim else None)
        if saved is not None and name in saved:
            hidden, n_heads, latent = saved[name]
        if not (hidden and n_heads and latent):
            _fail(model, f"{name} ({type(m).__name__}): sizes not found (hidden {hidden}, heads {n_heads}, head dim "
                         f"{head_dim}); looked for the attributes {HIDDEN_NAMES}, {N_HEADS_NAMES} and "
                         f"{HEAD_DIM_NAMES} on the module and its config")
        _install(m, name, config, hidden, n_heads, latent,
                 dict(variant=variant, omega_init=omega_init, k=k, tau_sep=tau_sep, tau_coh=tau_coh,
                      alpha_align=alpha_align, alpha_coh=alpha_coh, fully_masked=fully_masked))
    if saved is not None and sorted(saved) != sorted(converted):
        _fail(model, f"the saved conversion has the modules {sorted(saved)}, this model {sorted(converted)}")
    return converted


def _install(m, name, config, hidden, n_heads, d_latent, options):
    ref = next(m.parameters(), None)
    asc = ASCenderLatents(hidden, n_heads, d_latent, **options)
    if ref is not None:  # the module's device and dtype (only the dtype while a loader builds the model on "meta")
        meta = asc.U.weight.is_meta or ref.is_meta
        asc = asc.to(dtype=ref.dtype) if meta else asc.to(ref.device, ref.dtype)
    asc._where, asc._config = name, getattr(m, "config", None) or config
    m.ascender = asc
    if not getattr(m, "_ascender_hooks", None):
        m._ascender_hooks = (m.register_forward_pre_hook(_before_attention, with_kwargs=True),
                             m.register_forward_hook(_after_attention, with_kwargs=True))


def _uninstall(m):
    del m.ascender
    for handle in getattr(m, "_ascender_hooks", ()):
        handle.remove()
    m._ascender_hooks = None


def _original_implementation(model):
    impl = getattr(model.config, "_attn_implementation", None)
    return impl if isinstance(impl, str) else "sdpa"


def _probe_inputs(model):
    """Tiny inputs for one forward, or None when the model's main input is not one built here."""
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    if main == "input_ids":
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None) or 2
        ids = torch.arange(3, 8).remainder(vocab).unsqueeze(0)
        inputs = {"input_ids": ids}
        if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
            inputs["decoder_input_ids"] = ids[:, :3]
    elif main == "pixel_values":
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", None)
        size = size if isinstance(size, int) else (size or [None])[0]
        channels = getattr(vision, "num_channels", 3)
        if not isinstance(size, int):
            return None
        inputs = {"pixel_values": torch.linspace(-1, 1, channels * size * size).reshape(1, channels, size, size)}
    else:
        return None
    if "use_cache" in params:
        inputs["use_cache"] = False
    device = next(model.parameters()).device
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _raised_by_ascender(error):
    """Whether the error comes from the converted attention (the hooks, the attention function or
    the op), not from the model's own code."""
    ours = {f.__code__ for f in (ascender_attention_forward, _before_attention, _after_attention, _update,
                                 ascender_attention)}
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in ours:
            return True
        tb = tb.tb_next
    return False


def _probe(model, converted):
    """One tiny forward: every converted module it reaches must run ASCender (the hooks raise
    otherwise); an error that is not ours means the probe's inputs do not suit the model, and the
    checks then happen at the model's first forward instead."""
    inputs = _probe_inputs(model)
    if inputs is None:
        return False
    training = model.training
    model.eval()
    latents = [m for m in model.modules() if isinstance(m, ASCenderLatents)]
    try:
        for m in latents:
            m._probing, m._resized = True, False
        with torch.no_grad():
            model(**inputs)
        if any(m._resized for m in latents):  # sizes corrected: check again with the final modules
            for m in latents:
                m._probing = False
            with torch.no_grad():
                model(**inputs)
    except ASCenderUnsupportedError as e:
        _fail(model, str(e).removeprefix("ascender: "))
    except Exception as e:  # noqa: BLE001
        if not _raised_by_ascender(e):  # inputs the model does not accept
            return False
        raise ASCenderUnsupportedError(f"ascender: cannot convert {type(model).__name__}: its attention fails "
                                       f"under ASCender: {type(e).__name__}: {e}") from e
    finally:
        model.train(training)
        for m in latents:
            m._latents, m._probing = None, False
    return True


def convert(model, variant="paper", omega_init=0.0, d_latent=None, k=16, tau_sep=1.0, tau_coh=1.0,
            alpha_align=-1.0, alpha_coh=-1.0, *, verify=True):
    """Adds ASCender to every self-attention module of a transformers model (in place), selects
    ``attn_implementation="ascender"`` and records the conversion in ``model.config`` (so that
    ``save_pretrained`` / :func:`from_pretrained` round-trip it). With ``verify`` (default) a tiny
    forward checks that every converted module runs ASCender. Raises :class:`ASCenderUnsupportedError`
    naming the model class and the reason when the model cannot be served. Returns the model."""
    register()
    recorded = getattr(model.config, CONFIG_KEY, None)
    options = dict(variant=variant, d_latent=d_latent, k=k, tau_sep=tau_sep, tau_coh=tau_coh, alpha_align=alpha_align,
                   alpha_coh=alpha_coh)
    if isinstance(recorded, dict) and any(isinstance(m, ASCenderLatents) for m in model.modules()):
        options = {name: recorded[name] for name in OPTION_NAMES}  # converted before: it keeps its options
    else:
        options["fully_masked"] = "mean" if _original_implementation(model) == "eager" else "zero"
    previous = model.config._attn_implementation
    had = {id(m) for m in model.modules() if hasattr(m, "ascender")}
    try:
        converted = _attach(model, omega_init=omega_init, **options)
        _finish(model, converted, options, verify)
    except Exception:  # leave the model as it was
        for m in model.modules():
            if isinstance(getattr(m, "ascender", None), ASCenderLatents) and id(m) not in had:
                _uninstall(m)
            if not had and getattr(m, "_ascender_cross_attention", False):
                del m._ascender_cross_attention
        if model.config._attn_implementation != previous:
            model.set_attn_implementation(previous)
        if recorded is None:
            model.config.__dict__.pop(CONFIG_KEY, None)
        else:
            setattr(model.config, CONFIG_KEY, recorded)
        raise
    return model


def _finish(model, converted, options, verify):
    _note_sdpa_support(model)
    model.set_attn_implementation(NAME)
    if model.config._attn_implementation != NAME:
        _fail(model, "transformers did not switch it to the 'ascender' attention implementation")
    if verify:
        _probe(model, converted)
    sizes = {name: [m.ascender.hidden_size, m.ascender.n_heads, m.ascender.d_latent]
             for name, m in model.named_modules() if name in converted}
    # (not under the key "model_type": transformers' config classes take a nested dict with their own
    # model_type for the config itself)
    setattr(model.config, CONFIG_KEY, dict(version=FORMAT_VERSION, original_model_type=model.config.model_type,
                                           **options, modules=sizes))
    install(model)  # its save_pretrained makes the checkpoint loadable by the Auto classes (save.py)
