/*
 * ascender_undef.h -- undefines the per-instantiation macros of the tiled kernel headers
 * (ascender_tile_impl.h, ascender_plan_impl.h), so that the next (type, ISA) instantiation
 * defines them afresh. Included by instantiate_types.h after each ASC_IMPL.
 */
#undef VL
#undef BM
#undef BN
#undef DC
#undef DEC_AHEAD
#undef DEC_SAFE
#undef DEC_ROW_PAIRS
#undef DEC_SPLIT_PAIRS
#undef MV
#undef MVB
#undef ASC_MV_HALF
#undef VLH
#undef VSH
#undef K1_NR1
#undef K1_NR2
#undef K2_NF
#undef K3_ACC
#undef VS
#undef VI
#undef ASC_ELEM
#undef ASC_HEAD
#undef VD
#undef NH
#undef VDL
#undef ASC_XV
#undef ASC_XVD
