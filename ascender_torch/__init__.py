"""ascender_torch: fused, memory-lean ASCender attention for PyTorch."""

from . import reference
from .functional import ascender_attention
from .modules import ASCenderAttention, ASCenderHead

__all__ = ["ASCenderAttention", "ASCenderHead", "ascender_attention", "reference"]
__version__ = "0.1.0"
