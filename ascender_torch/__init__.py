"""ascender_torch: fused, memory-lean ASCender attention for PyTorch."""

from . import reference
from .functional import alibi_slopes, ascender_attention
from .modules import ASCenderAttention, ASCenderHead

__all__ = ["ASCenderAttention", "ASCenderHead", "alibi_slopes", "ascender_attention", "reference"]
__version__ = "0.1.0"
