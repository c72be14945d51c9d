// ascender_cpu.cpp -- the ascender ops on CPU tensors: the C kernels of csrc/cpu (float32, float64).
#include <torch/library.h>

#include "ascender_op.h"

namespace asc_binding {
namespace {

void forward(const AscenderCall& call, const asc_fwd_args& a) {
  const int rc = call.q.scalar_type() == at::kFloat ? ascender_fwd_f32(&call.p, &a) : ascender_fwd_f64(&call.p, &a);
  TORCH_CHECK(rc == 0, "ascender: the CPU kernel could not allocate its O(N) scratch memory (N = ", call.p.N, ")");
}

void infer(const AscenderCall& call, const asc_fwd_args& a) {
  const int rc = call.q.scalar_type() == at::kFloat ? ascender_infer_f32(&call.p, &a) : ascender_infer_f64(&call.p, &a);
  TORCH_CHECK(rc == 0, "ascender: the CPU kernel could not allocate its scratch memory (N = ", call.p.N, ")");
}

void backward(const AscenderCall& call, const asc_bwd_args& a) {
  const int rc = call.q.scalar_type() == at::kFloat ? ascender_bwd_f32(&call.p, &a) : ascender_bwd_f64(&call.p, &a);
  TORCH_CHECK(rc == 0, "ascender: the CPU backward could not allocate its O(threads x N) scratch memory (N = ",
              call.p.N, ")");
}

constexpr AscenderBackend kCpu{c10::DeviceType::CPU, /*half_types=*/false, forward, infer, backward};

}  // namespace
}  // namespace asc_binding

TORCH_LIBRARY_IMPL(ascender, CPU, m) { asc_binding::register_ascender_ops<asc_binding::kCpu>(m); }

