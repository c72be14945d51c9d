// ascender_op.h -- the ascender ops (ascender_fwd, ascender_infer, ascender_maps, ascender_bwd) independent of the
// backend: every input checked once (messages name the argument, the expected and the received
// shape/dtype/device), the outputs allocated, the kernel's argument structs filled. A backend
// (ascender_cpu.cpp, ascender_cuda.cpp) supplies the kernels and registers the ops for its
// dispatch key with these bodies.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <vector>

#include "../ascender.h"
#include "op_call.h"

namespace asc_binding {

// The checked inputs of one call: contiguous tensors (the nine scalars in SPEC order, each 0-dim or [H]: bit s of
// scalars_shared set for a 0-dim one) and the kernel's params.
struct AscenderCall {
  at::Tensor q, k, v, z, h;
  std::vector<at::Tensor> scalars;
  uint32_t scalars_shared = 0;
  c10::optional<at::Tensor> key_padding_mask, attn_mask, attn_bias, alibi_slopes;
  c10::optional<at::Tensor> global_mask, document_ids;  // bool [B, N]; int64 [B, N]
  c10::optional<at::Tensor> sinks;                     // [H], or 3-D per row (SPEC section 12, docs/backward.md)
  c10::optional<at::Tensor> dropout_seed;               // int64 [3] (seed, offset, token offset), when dropout_p > 0
  asc_params p;
};

// What a backend provides: its device, the dtypes it computes in, and the kernels, which throw
// (TORCH_CHECK) when they fail.
struct AscenderBackend {
  c10::DeviceType device;
  bool half_types;  // float16 and bfloat16 besides float32 and float64
  void (*forward)(const AscenderCall& call, const asc_fwd_args& args);
  void (*infer)(const AscenderCall& call, const asc_fwd_args& args);  // a forward nothing differentiates
  void (*backward)(const AscenderCall& call, const asc_bwd_args& args);
};

// The device-independent check of the ascender ops' arguments (the op ascender_check): every
// check of check_inputs that reads no data, for any device and every floating dtype. The block-wise
// and dense backends and the fake kernels run it, so they refuse what the kernels refuse, with
// the same messages.
void ascender_check(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The boxed bodies of the four ops.
void ascender_fwd(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack);
void ascender_infer(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack);
void ascender_maps(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack);
void ascender_bwd(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Registers the four ops with a backend's kernels, inside TORCH_LIBRARY_IMPL(ascender, KEY, m).
template <const AscenderBackend& backend>
void register_ascender_ops(torch::Library& m) {
  using B = AscenderBackend;
  m.impl("ascender_fwd", torch::CppFunction::makeFromBoxedFunction<&run_on<B, backend, &ascender_fwd>>());
  m.impl("ascender_infer", torch::CppFunction::makeFromBoxedFunction<&run_on<B, backend, &ascender_infer>>());
  m.impl("ascender_maps", torch::CppFunction::makeFromBoxedFunction<&run_on<B, backend, &ascender_maps>>());
  m.impl("ascender_bwd", torch::CppFunction::makeFromBoxedFunction<&run_on<B, backend, &ascender_bwd>>());
}

}  // namespace asc_binding
