"""The paper's ASCender training recipe (seed 001, Training Setup and section 12) as a schedule.

Alignment and Cohesion act from step 0, Separation only after a warm-up fraction of training,
and each bias weight omega starts small and ramps up to its learned value:

    effective omega_X(step) = m_X(step) * omega_X        (omega_X: the learnable parameter)

    m_align(t) = m_coh(t) = min(1, t / R)                 R = ramp * total_steps
    m_sep(t)   = 0                                        for t < S = sep_start * total_steps
               = min(1, (t - S) / R)                      for t >= S

With the defaults (sep_start=0.15, ramp=0.1) Separation is off for the first 15% of the
steps, and every multiplier reaches 1 by 25% of training; from then on the module computes
exactly what it would without the schedule.

How it acts on a model: every ASCender submodule (``ASCenderHead``, ``ASCenderAttention`` and the
Hugging Face ``ASCenderLatents``: the modules with a ``scalar_attributes`` map from the op's scalar
names to their parameters, e.g. ``omega_sep`` -> ``omega_s`` in ``ASCenderHead``) gets a
``torch.nn.utils.parametrize`` parametrization on its three omega parameters that multiplies the
parameter by a scalar multiplier buffer. Consequences, all deliberate:

* The learned values are never overwritten: the optimizer keeps updating the same Parameter
  objects (``module.parametrizations.<name>.original`` while the schedule is attached; the
  parametrization keeps their identity, so an optimizer built before or after attaching sees the
  same tensors and its state stays valid).
* Gradients reach omega_X scaled by m_X; while m_X = 0 its gradient is exactly 0, so Adam's
  moments for it stay 0 and it does not move -- except for decoupled weight decay (AdamW applies
  decay to parameters with a zero gradient). Keep the ASCender scalars out of weight decay.
* While attached, ``state_dict`` keys of these parameters read
  ``...parametrizations.omega_sep.original`` and ``module.omega_sep`` is the scaled tensor.
  ``remove()`` detaches the schedule and puts the raw learned Parameter objects back under their
  usual names, so checkpoints saved after ``remove()`` load into a model without a schedule.
* Nothing else changes: lambda_*, the other scalars and all projections are left alone
  (scaling lambda_sep would not switch Separation off, because the row normalization removes
  a row's scale; the multiplier on omega_sep does).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

BIASES = ("align", "sep", "coh")


class _Scaled(nn.Module):
    """Parametrization omega -> multiplier * omega, the multiplier a (non-persistent) buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("multiplier", torch.ones(()), persistent=False)

    def forward(self, omega):
        return self.multiplier.to(omega.dtype) * omega


def multipliers(step: int, total_steps: int, sep_start: float = 0.15, ramp: float = 0.1) -> dict:
    """The multipliers m_align, m_sep, m_coh in [0, 1] at `step` (see the module docstring)."""
    if total_steps <= 0:
        raise ValueError(f"multipliers: total_steps must be > 0, got {total_steps}")
    if not 0.0 <= sep_start <= 1.0 or not 0.0 <= ramp <= 1.0:
        raise ValueError(f"multipliers: sep_start and ramp are fractions in [0, 1], got {sep_start}, {ramp}")
    ramp_steps = ramp * total_steps
    sep_steps = sep_start * total_steps

    def rise(t):  # t >= 0 steps since the ramp began
        return 1.0 if ramp_steps == 0 else min(1.0, t / ramp_steps)

    return {"align": rise(step), "sep": rise(step - sep_steps) if step >= sep_steps else 0.0,
            "coh": rise(step)}


def _omega_names(module):
    """bias -> the module's omega parameter name, for an ASCender module whose omegas are plain
    parameters (not yet scheduled); else None."""
    attributes = getattr(module, "scalar_attributes", None)
    if attributes is None:
        return None
    names = {bias: attributes[f"omega_{bias}"] for bias in BIASES}
    return names if all(isinstance(module._parameters.get(n), nn.Parameter) for n in names.values()) else None


class ASCenderSchedule:
    """Attach the recipe to every ASCender module in `model`; call ``step(t)`` before each
    training step t (0-based) and ``remove()`` when done.

        schedule = ASCenderSchedule(model, total_steps=2000)           # sep after 15%, 10% ramps
        for t in range(2000):
            schedule.step(t)
            loss = ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
        schedule.remove()                                              # plain parameters again

    Raises ValueError if `model` contains no module with the three omega parameters.
    """

    def __init__(self, model: nn.Module, total_steps: int, *, sep_start: float = 0.15, ramp: float = 0.1):
        multipliers(0, total_steps, sep_start, ramp)  # validates the arguments
        self.total_steps, self.sep_start, self.ramp = total_steps, sep_start, ramp
        self._scaled = {bias: [] for bias in BIASES}  # bias -> its _Scaled parametrizations
        self._attached = []  # (module, parameter name)
        for module in list(model.modules()):
            names = _omega_names(module)
            if names is None:
                continue
            for bias, name in names.items():
                scaled = _Scaled().to(getattr(module, name).device)
                parametrize.register_parametrization(module, name, scaled)
                self._scaled[bias].append(scaled)
                self._attached.append((module, name))
        if not self._attached:
            raise ValueError("ASCenderSchedule: the model has no module with omega_align/omega_sep/omega_coh "
                             "(or omega_a/omega_s/omega_c) parameters")
        self.step(0)

    def step(self, step: int) -> dict:
        """Set the multipliers for training step `step`; returns them."""
        current = multipliers(step, self.total_steps, self.sep_start, self.ramp)
        for bias, value in current.items():
            for scaled in self._scaled[bias]:
                scaled.multiplier.fill_(value)
        return current

    def remove(self) -> None:
        """Detach: the raw learned Parameters return under their own names (the multipliers are
        dropped, not folded in; after the ramps they are 1, so the model's outputs are unchanged)."""
        for module, name in self._attached:
            parametrize.remove_parametrizations(module, name, leave_parametrized=False)
        self._attached.clear()
        for scaled in self._scaled.values():
            scaled.clear()
