// magnitude_cpu.cpp -- the Magnitude Attention ops on CPU tensors: the C kernels of csrc/cpu.
#include "magnitude_op.h"

namespace asc_binding {
namespace {

void forward(const MagnitudeCall& call, const mag_fwd_args& a) {
  const int rc = call.q.scalar_type() == at::kFloat ? magnitude_fwd_f32(&call.p, &a) : magnitude_fwd_f64(&call.p, &a);
  TORCH_CHECK(rc == 0, "magnitude: the CPU kernel could not allocate its O(N + n_iter) scratch memory (N = ", call.p.N,
              ", n_iter = ", call.p.n_iter, ")");
}

void backward(const MagnitudeCall& call, const mag_bwd_args& a) {
  const int rc = call.q.scalar_type() == at::kFloat ? magnitude_bwd_f32(&call.p, &a) : magnitude_bwd_f64(&call.p, &a);
  TORCH_CHECK(rc == 0, "magnitude: the CPU backward could not allocate its O(n_iter x N) scratch memory (N = ",
              call.p.N, ", n_iter = ", call.p.n_iter, ")");
}

constexpr MagnitudeBackend kCpu{c10::DeviceType::CPU, /*half_types=*/false, forward, backward};

}  // namespace
}  // namespace asc_binding

TORCH_LIBRARY_IMPL(ascender, CPU, m) { asc_binding::register_magnitude_ops<asc_binding::kCpu>(m); }
