"""Attention dropout's mask (SPEC section 9b) in PyTorch integer ops: csrc/philox.h's function of
(seed, offset, b, h, t, j), bit for bit, for the dense twin and the block-wise path (docs/dropout.md).

Philox4x32-10 on int64 tensors that hold 32-bit words: every product of two words is split into
16 x 32-bit partial products (each below 2^48), so nothing overflows and the result is exact on any
device. The pair (query token t, key j) of (batch b, head h) takes word j mod 4 of Philox4x32-10 with
counter (j // 4, t, offset + b H + h as two words) and key seed (two words), and is kept when that
word is >= floor(p 2^32). A stream (seed, offset, o) with a token offset o draws the call's pair (t, j)
as the pair (t + o, j + o) of a longer sequence: a call over the tokens [o, o + N) of a sequence
(context parallelism's ranks) gets the whole sequence's mask for its pairs.

`draw_seed` takes the (seed, offset) of a call from a generator, as an int64 tensor on the call's
device (no host synchronization on CUDA); the op saves it for the backward like any input.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # the round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # the key's Weyl increments


def draw_seed(device, generator: torch.Generator | None = None) -> torch.Tensor:
    """A call's dropout stream: an int64 tensor [2] (seed, offset) on `device`, drawn from `generator`
    or from torch's default generator of the device (so torch.manual_seed reproduces it and every call
    draws a new one)."""
    return torch.randint(-2 ** 63, 2 ** 63 - 1, (2,), dtype=torch.int64, device=device, generator=generator)


def resolve_seed(o: dict, device, generator: torch.Generator | None) -> None:
    """Gives the options o of a call a dropout_seed where dropout_p > 0 needs one and none was given."""
    if o["dropout_p"] > 0 and o["dropout_seed"] is None:
        o["dropout_seed"] = draw_seed(device, generator)


def threshold(p: float) -> int:
    """floor(p 2^32): a pair is dropped when its word is below it (p 2^32 is exact in double)."""
    return int(p * 2.0 ** 32)


def _mulhilo(m: int, x: torch.Tensor):
    """The high and low words of m x, m a 32-bit constant and x int64 words, exactly."""
    lo16, hi16 = x & 0xFFFF, x >> 16
    p_lo, p_hi = lo16 * m, hi16 * m  # < 2^48 each
    s = p_lo + ((p_hi & 0xFFFF) << 16)
    return (p_hi >> 16) + (s >> 32), s & MASK32


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of the counter (c0, c1, c2, c3) under the key (k0, k1): int64 tensors (or ints)
    holding 32-bit words, broadcast together; returns the four output words."""
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
        hi0, lo0 = _mulhilo(PHILOX_M[0], c0)
        hi1, lo1 = _mulhilo(PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def _words(x: torch.Tensor):
    """The low and high 32-bit words of the 64-bit patterns of an int64 tensor."""
    return x & MASK32, (x >> 32) & MASK32


def keep_mask(seed: torch.Tensor, p: float, B: int, H: int, tokens: torch.Tensor, keys: torch.Tensor,
              inspect_keys: bool = False) -> torch.Tensor:
    """[B, H, b, n] bool: which pairs (query token tokens[i], key keys[j]) dropout keeps, for the
    stream seed = int64 [2] (seed, offset) (draw_seed) or [3] (seed, offset, token offset). tokens [b],
    keys [n]: LongTensors on seed's device. inspect_keys: the keys may be read (eager mode on the CPU):
    where they are a range, one Philox call serves four keys, as in the kernels; else each key takes its
    own call (4x the work, the same words) and nothing synchronizes with the device."""
    device = seed.device
    if seed.numel() == 3:  # the pairs (t + o, j + o) of a longer sequence; the words take T mod 2^32 and
        o = seed[2] & (2 ** 34 - 1)  # J // 4 mod 2^32, so o mod 2^34 draws the same (as in the kernels)
        tokens, keys = tokens + o, keys + o
    k0, k1 = _words(seed[0])
    off_lo, off_hi = _words(seed[1])
    bh = (torch.arange(B, device=device).unsqueeze(1) * H + torch.arange(H, device=device)).reshape(B, H, 1, 1)
    lo = off_lo + bh  # offset + b H + h, carried into the high word (bh < 2^32)
    c2, c3 = lo & MASK32, (off_hi + (lo >> 32)) & MASK32
    t = (tokens & MASK32).reshape(1, 1, -1, 1)
    n = keys.numel()
    first = int(keys[0]) if n and inspect_keys else 0
    if n and inspect_keys and int(keys[-1]) - first == n - 1:  # a range: one Philox call per four keys
        g = torch.arange(first >> 2, ((first + n - 1) >> 2) + 1, device=device) & MASK32
        words = torch.stack(philox4x32_10(g.reshape(1, 1, 1, -1), t, c2, c3, k0, k1), -1)  # [B, H, b, G, 4]
        words = words.flatten(-2)[..., first & 3:(first & 3) + n]
    else:  # any other set of keys: each key's own call, its word picked
        words = torch.stack(philox4x32_10(((keys >> 2) & MASK32).reshape(1, 1, 1, -1), t, c2, c3, k0, k1), -1)
        words = words.gather(-1, (keys & 3).reshape(1, 1, 1, -1, 1).expand(*words.shape[:-1], 1)).squeeze(-1)
    return words >= threshold(p)
