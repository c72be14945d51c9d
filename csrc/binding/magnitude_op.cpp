// magnitude_op.cpp -- checks, outputs and kernel arguments of the Magnitude Attention ops
// (magnitude_op.h). Arguments are read by their names in ascender_torch/_spec.py.
#include "magnitude_op.h"

#include <cfloat>
#include <cmath>

#include "op_call.h"

namespace asc_binding {
namespace {

constexpr const char* kWho = "magnitude";

// The kernel's params from the arguments' metadata: every check of the ops, no data read.
// device: the backend's device (nullopt: any).
mag_params check_arguments(const OpCall& args, c10::optional<c10::DeviceType> device, bool half_types) {
  const at::Tensor& q = args.tensor("q");
  const at::Tensor& k = args.tensor("k");
  const at::Tensor& v = args.tensor("v");
  TORCH_CHECK(q.dim() == 4, "magnitude: q must be a 4-D tensor [B, H, N, d], got shape ", shape_str(q));
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble || (half_types && half),
              "magnitude: q must be ", half_types ? "float32, float64, float16 or bfloat16" : "float32 or float64",
              ", got ", q.scalar_type());
  TORCH_CHECK(!device.has_value() || q.device().type() == *device, "magnitude: the fused kernel runs on ",
              c10::DeviceTypeName(device.value_or(q.device().type())), " tensors, q is on ", q.device());
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2);
  check_feature_tensor(kWho, k, "k", q, N, "d");
  TORCH_CHECK(k.size(3) == q.size(3), "magnitude: k must have the shape of q ", shape_str(q), ", got ", shape_str(k));
  check_feature_tensor(kWho, v, "v", q, N, "dv");
  for (const char* name : {"t_raw", "beta", "gamma"}) check_per_head(kWho, args.tensor(name), name, q, H);
  if (const auto m = args.optional_tensor("key_padding_mask")) {
    TORCH_CHECK(m->scalar_type() == at::kBool && m->dim() == 2 && m->size(0) == B && m->size(1) == N &&
                    m->device() == q.device(),
                "magnitude: key_padding_mask must be a bool tensor [B, N] = [", B, ", ", N, "] on ", q.device(),
                " (True = padding), got ", m->scalar_type(), " ", shape_str(*m), " on ", m->device());
  }
  const int64_t n_iter = args.integer("n_iter");
  const double eps = args.real("eps"), scale = args.real("scale");
  TORCH_CHECK(n_iter >= 0, "magnitude: n_iter must be >= 0, got ", n_iter);
  TORCH_CHECK(std::isfinite(eps) && eps > 0, "magnitude: eps must be a finite number > 0, got ", eps);
  TORCH_CHECK(std::isfinite(scale), "magnitude: scale must be finite, got ", scale);
  const double largest = q.scalar_type() == at::kDouble ? DBL_MAX : FLT_MAX;
  TORCH_CHECK(std::abs(scale) <= largest && eps <= largest, "magnitude: scale and eps must be finite in the dtype of q (",
              q.scalar_type(), "), got ", scale, " and ", eps);
  return mag_params{B, H, N, q.size(3), v.size(3), n_iter, eps, scale};
}

// The checked call of a backend: params and contiguous inputs (the [H] values expanded).
MagnitudeCall check_inputs(const OpCall& args, const MagnitudeBackend& backend) {
  MagnitudeCall call;
  call.p = check_arguments(args, backend.device, backend.half_types);
  const int64_t H = call.p.H;
  call.q = args.tensor("q").contiguous();
  call.k = args.tensor("k").contiguous();
  call.v = args.tensor("v").contiguous();
  const std::vector<at::Tensor> params =
      per_head_rows({args.tensor("t_raw"), args.tensor("beta"), args.tensor("gamma")}, H);
  call.t_raw = params[0];
  call.beta = params[1];
  call.gamma = params[2];
  if (const auto m = args.optional_tensor("key_padding_mask")) call.key_padding_mask = m->contiguous();
  return call;
}

mag_fwd_args input_args(const MagnitudeCall& call) {
  mag_fwd_args a{};
  a.q = call.q.data_ptr();
  a.k = call.k.data_ptr();
  a.v = call.v.data_ptr();
  a.t_raw = call.t_raw.data_ptr();
  a.beta = call.beta.data_ptr();
  a.gamma = call.gamma.data_ptr();
  a.key_padding_mask = call.key_padding_mask.has_value()
                           ? reinterpret_cast<const uint8_t*>(call.key_padding_mask->data_ptr())
                           : nullptr;
  return a;
}

}  // namespace

void magnitude_check(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall args(op, stack);
  check_arguments(args, c10::nullopt, /*half_types=*/true);
  args.finish();
}

void magnitude_fwd(const MagnitudeBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall args(op, stack);
  const MagnitudeCall call = check_inputs(args, backend);
  const mag_params& p = call.p;
  at::Tensor out = at::empty({p.B, p.H, p.N, p.dv}, call.q.options());
  at::Tensor mu = at::empty({p.B, p.H, p.N}, call.q.options());
  mag_fwd_args a = input_args(call);
  a.out = out.data_ptr();
  a.mu = mu.data_ptr();
  backend.forward(call, a);
  args.finish(out, mu);
}

void magnitude_bwd(const MagnitudeBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall args(op, stack);
  const MagnitudeCall call = check_inputs(args, backend);
  const mag_params& p = call.p;
  const at::ScalarType dtype = call.q.scalar_type();
  const at::Tensor& grad_out = args.tensor("grad_out");
  TORCH_CHECK(grad_out.dim() == 4 && grad_out.size(0) == p.B && grad_out.size(1) == p.H && grad_out.size(2) == p.N &&
                  grad_out.size(3) == p.dv && grad_out.scalar_type() == dtype,
              "magnitude: grad_out must be [B, H, N, dv] = [", p.B, ", ", p.H, ", ", p.N, ", ", p.dv, "] of ", dtype,
              ", got ", grad_out.scalar_type(), " ", shape_str(grad_out));
  const at::Tensor dy = grad_out.contiguous();
  at::Tensor dmu;
  if (const auto grad_mu = args.optional_tensor("grad_mu")) {
    TORCH_CHECK(grad_mu->dim() == 3 && grad_mu->size(0) == p.B && grad_mu->size(1) == p.H && grad_mu->size(2) == p.N &&
                    grad_mu->scalar_type() == dtype,
                "magnitude: grad_mu must be [B, H, N] = [", p.B, ", ", p.H, ", ", p.N, "] of ", dtype, ", got ",
                grad_mu->scalar_type(), " ", shape_str(*grad_mu));
    dmu = grad_mu->contiguous();
  }
  at::Tensor dq = at::empty_like(call.q), dk = at::empty_like(call.k), dv = at::empty_like(call.v);
  at::Tensor dparams = at::empty({3, p.H}, call.q.options());
  mag_bwd_args a{};
  a.in = input_args(call);
  a.grad_out = dy.data_ptr();
  a.grad_mu = dmu.defined() ? dmu.data_ptr() : nullptr;
  a.dq = dq.data_ptr();
  a.dk = dk.data_ptr();
  a.dv = dv.data_ptr();
  a.dparams = dparams.data_ptr();
  backend.backward(call, a);
  args.finish(dq, dk, dv, dparams);
}

}  // namespace asc_binding

// The argument check reads no data: one kernel for every device, Meta (fake tensors) included.
TORCH_LIBRARY_IMPL(ascender, CompositeExplicitAutograd, m) {
  m.impl("magnitude_check", torch::CppFunction::makeFromBoxedFunction<&asc_binding::magnitude_check>());
}
