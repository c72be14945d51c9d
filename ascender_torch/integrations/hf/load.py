"""Reloading a converted model saved with ``save_pretrained``: :func:`from_pretrained` builds the
model with its ASCender modules before the weights load; the loaders that config.json's auto_map
names (save.py) let the Auto classes do the same with ``trust_remote_code=True``."""

from __future__ import annotations

from .attention import register
from .convert import OPTION_NAMES, _attach, _finish
from .save import CONFIG_KEY, FORMAT_VERSION, MODEL_TYPE


def _recorded(entry, path):
    """The conversion record of a saved config (its "ascender" entry), checked."""
    if not isinstance(entry, dict):
        raise ValueError(f"ascender: {path} holds no ASCender conversion (no '{CONFIG_KEY}' entry in its config); "
                         "load it normally and call hf.convert")
    if entry.get("version", 1) > FORMAT_VERSION:
        raise ValueError(f"ascender: {path} was saved by a newer ascender_torch (format {entry['version']})")
    return entry


def original_config(path, **kwargs):
    """The config of a saved conversion as the model's own config class (config.json names the type
    "ascender" since format 2; the record holds the model's own), with PreTrainedConfig.from_pretrained's
    keyword arguments (return_unused_kwargs, revision, ...)."""
    from transformers import PreTrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_dict, kwargs = PreTrainedConfig.get_config_dict(path, **kwargs)
    recorded = _recorded(config_dict.get(CONFIG_KEY), path)
    if config_dict.get("model_type") == MODEL_TYPE:
        config_dict["model_type"] = recorded["original_model_type"]
    return CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict, **kwargs)


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
    config = kwargs.pop("config", None)
    if config is None:
        hub = {key: kwargs[key] for key in ("revision", "token", "cache_dir", "local_files_only", "subfolder")
               if key in kwargs}
        config = original_config(path, **hub)
    recorded = _recorded(getattr(config, CONFIG_KEY, None), path)
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
    model.config.__dict__.pop("auto_map", None)  # (the saved loaders': the model is the architecture's own)
    missing = [key for key in info.get("missing_keys", ()) if ".ascender." in f".{key}"]
    if missing:
        more = " ..." if len(missing) > 4 else ""
        raise ValueError(f"ascender: {path} lacks the ASCender weights {missing[:4]}{more}")
    _finish(model, list(recorded["modules"]), options, verify=False)
    return model


class ASCenderConfig:
    """AutoConfig's entry in the auto_map of a saved conversion: loads the model's own config."""

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoConfig"):
        """(transformers registers a remote config class; the config loaded is a class it knows)"""

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        return original_config(path, **kwargs)


def auto_class_loader(name: str) -> type:
    """The Auto class ``name``'s entry in the auto_map of a saved conversion: its from_pretrained
    is :func:`from_pretrained` with that Auto class (the converted model, of the saved architecture's
    own class)."""
    import transformers

    auto = getattr(transformers, name)

    def load(cls, path, *args, **kwargs):
        return from_pretrained(auto, path, *args, **kwargs)

    def register_for_auto_class(cls, auto_class=None):
        """(transformers registers a remote model class; the model built is of a class it knows)"""

    return type(name, (), {"__doc__": f"{name}'s loader of a saved ASCender conversion (ascender_torch)",
                           "from_pretrained": classmethod(load),
                           "register_for_auto_class": classmethod(register_for_auto_class)})
