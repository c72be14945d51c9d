"""The character-level corpus: the Python standard library's own source files, present on every
machine with Python. Characters are UTF-8 bytes (vocabulary 256; the stdlib source is almost all
ASCII, so bits per byte is bits per character there)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

VOCAB = 256


def stdlib_files() -> list[Path]:
    """Every *.py under the stdlib directory except site-packages, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted((p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts),
                  key=lambda p: p.relative_to(root).as_posix())


def stdlib_corpus() -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) uint8 tensors: files in sorted order, every 10th file (index % 10 == 9)
    goes to validation, so no file is split between the two."""
    train, val = bytearray(), bytearray()
    for index, path in enumerate(stdlib_files()):
        (val if index % 10 == 9 else train).extend(path.read_bytes())
    return torch.frombuffer(train, dtype=torch.uint8).clone(), torch.frombuffer(val, dtype=torch.uint8).clone()


def random_windows(data: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """`batch` windows of seq_len + 1 consecutive bytes at random offsets, as int64 [batch, seq_len + 1]."""
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=generator)
    return torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).long()


def fixed_windows(data: torch.Tensor, count: int, seq_len: int) -> torch.Tensor:
    """`count` evenly spaced windows of seq_len + 1 bytes (the same on every call): the evaluation set."""
    stride = (data.numel() - seq_len - 1) // count
    return torch.stack([data[i * stride:i * stride + seq_len + 1] for i in range(count)]).long()
