"""The per-layer state of a converted attention module (:class:`ASCenderLatents`: the latent and
semantic projections U, P, the per-head scalars, the latents of the current call) and the error
the integration raises."""

from __future__ import annotations

import torch
from torch import nn

from ... import _spec as spec

NAME = "ascender"  # the attention implementation (and mask function) registered with transformers


class ASCenderUnsupportedError(NotImplementedError):
    """The model (or one of its attention modules) needs something ASCender cannot do."""


# Attention-function arguments that change the attention's result and that the op does not


class ASCenderLatents(nn.Module):
    """The per-layer ASCender state of a converted attention module: projections U, P
    (Linear(hidden, n_heads * d_latent), no bias), per-head scalars and the options. At run time
    it also holds the latents of the current call, handed from the pre-hook to the attention
    function."""

    scalar_attributes = {name: name for name in spec.SCALAR_NAMES}  # the op's scalars, same names here

    def __init__(self, hidden_size, n_heads, d_latent, *, variant="paper", omega_init=0.0, k=16,
                 tau_sep=1.0, tau_coh=1.0, alpha_align=-1.0, alpha_coh=-1.0, fully_masked="zero"):
        super().__init__()
        self.hidden_size, self.n_heads, self.d_latent = hidden_size, n_heads, d_latent
        self.variant, self.k = variant, k
        self.tau_sep, self.tau_coh, self.alpha_align, self.alpha_coh = tau_sep, tau_coh, alpha_align, alpha_coh
        self.fully_masked = fully_masked
        self._omega_init = omega_init
        self._build(hidden_size, n_heads)
        self._probing = False  # during convert's probe, sizes the module turns out to have replace the guesses
        self._latents = None  # (z, h) aligned with the keys of the module's current forward
        self._ran = False  # whether the current forward called the attention function
        self._cache = None  # the KV cache object of the current forward
        self._n_valid = None  # how many of the keys the KV cache returned hold tokens (static caches)
        self._where = ""  # the module's name in the model, for error messages
        self.latents_from = None  # the module whose keys (and latents) this one reuses (KV sharing), if any
        self._config = None  # the config whose attention implementation the module follows

    def _build(self, hidden_size, n_heads, like=None):
        self.hidden_size, self.n_heads = hidden_size, n_heads
        self.U = nn.Linear(hidden_size, n_heads * self.d_latent, bias=False)
        self.P = nn.Linear(hidden_size, n_heads * self.d_latent, bias=False)
        omega = self._omega_init
        initial = dict(spec.SCALAR_DEFAULTS, omega_align=omega, omega_sep=omega, omega_coh=omega,
                       score_temp=1.0 - spec.EPS_TAU)
        for name in spec.SCALAR_NAMES:
            setattr(self, name, nn.Parameter(torch.full((n_heads,), float(initial[name]))))
        if like is not None:
            self.to(like.device, like.dtype)

    def _resize(self, hidden_size=None, n_heads=None):
        """Rebuilds the projections and scalars for the sizes the probe found (convert time only)."""
        if not self._probing:
            raise ASCenderUnsupportedError(
                f"ascender: {self._where} gets hidden states of width {hidden_size or self.hidden_size} and "
                f"{n_heads or self.n_heads} query heads, but its projections were built for {self.hidden_size} "
                f"and {self.n_heads}")
        self._build(hidden_size or self.hidden_size, n_heads or self.n_heads, like=self.U.weight)
        self._resized = True

    def active(self):
        """Whether the module's model currently runs the "ascender" attention implementation."""
        return self._config is None or getattr(self._config, "_attn_implementation", NAME) == NAME

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_latent={self.d_latent}, variant={self.variant!r}, k={self.k}"

    def project(self, x):
        """z, h [B, H, n, d_latent] of hidden states x [B, n, hidden]."""
        if x.shape[-1] != self.hidden_size:
            self._resize(hidden_size=x.shape[-1])
        B, n = x.shape[0], x.shape[1]
        return tuple(p(x).reshape(B, n, self.n_heads, -1).transpose(1, 2) for p in (self.U, self.P))

    def take(self):
        """The latents of the module's current forward (several attention calls may share them, as in
        differential attention)."""
        latents = self._latents
        if latents is None:
            raise RuntimeError(
                f"ascender: the hidden states of {self._where or 'this attention module'} were not captured before "
                "its attention ran; convert the model with ascender_torch.integrations.hf.convert (which installs the "
                "hook that captures them)")
        self._ran = True
        return latents
