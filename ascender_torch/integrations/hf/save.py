"""Saving a converted model the Hugging Face way. ``model.save_pretrained(path)`` of a converted model
(convert and from_pretrained install this module's ``save_pretrained`` on the instance; its class is
unchanged) runs transformers' own, which writes the weights, the ASCender ones included, and the
conversion record (config.json's entry "ascender"), then makes the checkpoint loadable by the Auto
classes with ``trust_remote_code=True``, the convention for custom architectures:

* config.json's ``model_type`` becomes "ascender" (the record keeps the model's own as
  ``original_model_type``), a type transformers does not know: loading the checkpoint without
  ``trust_remote_code`` is an error that asks for it, instead of the original model silently built
  without its ASCender weights;
* its ``auto_map`` names, for AutoConfig and for every Auto class that builds this model type, the
  loaders of ``load.py`` through a small module written beside the weights, ``modeling_ascender.py``,
  which imports them from ascender_torch (so loading needs ascender_torch installed, and says so).
"""

from __future__ import annotations

import json
import os
import types
import warnings

CONFIG_KEY = "ascender"  # the entry of config.json that records a conversion
# 1: the record; 2: also the model's own model_type in it, config.json loadable by the Auto classes
FORMAT_VERSION = 2
MODEL_TYPE = "ascender"  # config.json's model_type in a saved conversion
REMOTE_MODULE = "modeling_ascender"  # the module written beside the weights

_REMOTE_CODE = '''"""Loads this checkpoint: a transformers model converted to ASCender attention by ascender_torch
(the conversion is the "ascender" entry of config.json). With ascender_torch installed,
{example}
returns the converted model with its ASCender weights. Written by ascender_torch's save_pretrained;
the loaders are ascender_torch/integrations/hf/load.py."""

from ascender_torch.integrations.hf.load import ASCenderConfig, auto_class_loader

{loaders}
'''


def install(model) -> None:
    """model.save_pretrained becomes this module's save_pretrained (an attribute of the instance)."""
    model.save_pretrained = types.MethodType(save_pretrained, model)


def save_pretrained(self, save_directory, *args, **kwargs):
    """transformers' save_pretrained of the model, then config.json and modeling_ascender.py written
    so that the Auto classes load the converted model with trust_remote_code=True (module docstring)."""
    # (transformers' positional order: save_directory, is_main_process, state_dict, push_to_hub, ...)
    main_process = args[0] if args else kwargs.get("is_main_process", True)
    if kwargs.get("push_to_hub") or (len(args) > 2 and args[2]):
        raise ValueError("ascender: save_pretrained(push_to_hub=True) would upload the checkpoint before it is made "
                         "loadable; call model.push_to_hub(repo_id), which saves through this method first")
    result = type(self).save_pretrained(self, save_directory, *args, **kwargs)
    if main_process:
        write_loaders(os.fspath(save_directory), self.config)
    return result


def _auto_classes(config) -> list:
    """The names of transformers' Auto classes that build a model for this config's class, the one
    that builds the saved architecture first."""
    import transformers

    found = {}  # Auto class name -> the class it builds
    for name in dir(transformers):
        mapping = getattr(getattr(transformers, name), "_model_mapping", None) if name.startswith("AutoModel") else None
        if mapping is not None and type(config) in mapping:
            found[name] = getattr(mapping[type(config)], "__name__", "")
    own = (getattr(config, "architectures", None) or [None])[0]
    return sorted(found, key=lambda name: (found[name] != own, name))


def write_loaders(directory: str, config) -> None:
    """config.json of a saved conversion rewritten for the Auto classes, and modeling_ascender.py."""
    path = os.path.join(directory, "config.json")
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    if "auto_map" in saved:  # a model with code of its own: its auto_map must stay
        warnings.warn("ascender: this model loads with code of its own (its config has an auto_map), so the checkpoint "
                      "is not made loadable by the Auto classes; load it with ascender_torch.integrations.hf."
                      "from_pretrained", RuntimeWarning, stacklevel=3)
        return
    autos = _auto_classes(config)
    saved["model_type"] = MODEL_TYPE
    saved["auto_map"] = {"AutoConfig": f"{REMOTE_MODULE}.ASCenderConfig",
                         **{name: f"{REMOTE_MODULE}.{name}" for name in autos}}
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    example = f"transformers.{autos[0] if autos else 'AutoModel'}.from_pretrained(path, trust_remote_code=True)"
    loaders = "\n".join(f'{name} = auto_class_loader("{name}")' for name in sorted(autos))
    with open(os.path.join(directory, REMOTE_MODULE + ".py"), "w", encoding="utf-8") as f:
        f.write(_REMOTE_CODE.format(example=example, loaders=loaders))
