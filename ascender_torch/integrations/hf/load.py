"""Reloading a converted model saved with ``save_pretrained``: :func:`from_pretrained` builds the
model with its ASCender modules before the weights load."""

from __future__ import annotations

from .attention import register
from .convert import CONFIG_KEY, FORMAT_VERSION, OPTION_NAMES, _attach, _finish


def _model_class(model_class, config):
    """The model class an Auto class builds for ``config`` (the saved architecture when the Auto
    class has no entry for this config class)."""
    import transformers

    if not hasattr(model_class, "_model_mapping"):
        return model_class
    if type(config) in model_class._model_mapping:
        from transformers.models.auto.auto_factory import _get_model_class

        return _get_model_class(config, model_class._model_mapping)
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise ValueError(f"ascender: {model_class.__name__} has no model class for {type(config).__name__}; pass the "
                     "model class itself")


def from_pretrained(model_class, path, *args, **kwargs):
    """Loads a model saved with ``save_pretrained`` after :func:`convert`, converted, with its
    ASCender weights: ``hf.from_pretrained(AutoModelForCausalLM, path)`` (an Auto class or a model
    class; further arguments go to its ``from_pretrained``). The logits equal the saved model's."""
    import transformers

    config = kwargs.pop("config", None)
    if config is None:
        hub = {key: kwargs[key] for key in ("revision", "token", "cache_dir", "local_files_only",
                                            "trust_remote_code", "subfolder") if key in kwargs}
        config = transformers.AutoConfig.from_pretrained(path, **hub)
    recorded = getattr(config, CONFIG_KEY, None)
    if not isinstance(recorded, dict):
        raise ValueError(f"ascender: {path} holds no ASCender conversion (no '{CONFIG_KEY}' entry in its config); "
                         "load it normally and call hf.convert")
    if recorded.get("version", 1) > FORMAT_VERSION:
        raise ValueError(f"ascender: {path} was saved by a newer ascender_torch (format {recorded['version']})")
    options = {name: recorded[name] for name in OPTION_NAMES}
    cls = _model_class(model_class, config)

    def __init__(self, config, *a, **kw):  # noqa: N807 (the model is built with its ASCender modules)
        cls.__init__(self, config, *a, **kw)
        _attach(self, omega_init=0.0, saved=recorded["modules"], **options)

    loading = type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
    register()
    model, info = loading.from_pretrained(path, *args, config=config, output_loading_info=True, **kwargs)
    model.__class__ = cls
    missing = [key for key in info.get("missing_keys", ()) if ".ascender." in f".{key}"]
    if missing:
        more = " ..." if len(missing) > 4 else ""
        raise ValueError(f"ascender: {path} lacks the ASCender weights {missing[:4]}{more}")
    _finish(model, list(recorded["modules"]), options, verify=False)
    return model
