// magnitude_op.h -- the Magnitude Attention ops (magnitude_fwd, magnitude_bwd) independent of the
// backend: inputs checked once, outputs allocated, the kernel's argument structs filled. A backend
// (magnitude_cpu.cpp) supplies the kernels and registers the ops with these bodies.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include "../ascender.h"
#include "op_call.h"

namespace asc_binding {

// The checked inputs of one call: contiguous tensors, the three learnable values as [H] each.
struct MagnitudeCall {
  at::Tensor q, k, v, t_raw, beta, gamma;
  c10::optional<at::Tensor> key_padding_mask;
  mag_params p;
};

struct MagnitudeBackend {
  c10::DeviceType device;
  bool half_types;  // float16 and bfloat16 besides float32 and float64
  void (*forward)(const MagnitudeCall& call, const mag_fwd_args& args);
  void (*backward)(const MagnitudeCall& call, const mag_bwd_args& args);
};

// The device-independent check of the magnitude ops' arguments (the op magnitude_check): what the
// kernels' checks do without reading data; the fake kernels run it.
void magnitude_check(const c10::OperatorHandle& op, torch::jit::Stack* stack);

void magnitude_fwd(const MagnitudeBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack);
void magnitude_bwd(const MagnitudeBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Registers both ops with a backend's kernels, inside TORCH_LIBRARY_IMPL(ascender, KEY, m).
template <const MagnitudeBackend& backend>
void register_magnitude_ops(torch::Library& m) {
  using B = MagnitudeBackend;
  m.impl("magnitude_fwd", torch::CppFunction::makeFromBoxedFunction<&run_on<B, backend, &magnitude_fwd>>());
  m.impl("magnitude_bwd", torch::CppFunction::makeFromBoxedFunction<&run_on<B, backend, &magnitude_bwd>>());
}

}  // namespace asc_binding
