"""ascender_torch: fused, memory-lean ASCender attention for PyTorch."""

from . import distributed, reference
from .flops import AttentionConfig, flops
from .functional import alibi_slopes, ascender_attention, magnitude_attention
from .modules import ASCenderAttention, ASCenderHead, MagnitudeAttention
from .schedule import ASCenderSchedule

__all__ = ["ASCenderAttention", "ASCenderHead", "ASCenderSchedule", "AttentionConfig", "MagnitudeAttention",
           "alibi_slopes", "ascender_attention", "distributed", "flops", "magnitude_attention", "reference"]
__version__ = "0.1.0"
