// op_call.h -- what every op of the binding shares: named access to the arguments of a boxed
// call, and the input checks that more than one op uses.
//
// The ops are defined from ascender_torch/_spec.py (ascender_torch/_ops.py registers their
// schemas), so the binding never depends on an argument's position: it reads each one by its
// schema name. Kernels are registered per backend as boxed functions (ascender_cpu.cpp, ...).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <utility>
#include <vector>

namespace asc_binding {

std::string shape_str(const at::Tensor& t);

// The arguments of one boxed call, by name. Outputs replace the arguments on the stack (finish).
class OpCall {
 public:
  OpCall(const c10::OperatorHandle& op, torch::jit::Stack* stack);

  const at::Tensor& tensor(const char* name) const { return at(name).toTensor(); }
  c10::optional<at::Tensor> optional_tensor(const char* name) const;
  int64_t integer(const char* name) const { return at(name).toInt(); }
  double real(const char* name) const { return at(name).toDouble(); }
  c10::optional<double> optional_real(const char* name) const;
  c10::optional<int64_t> optional_integer(const char* name) const;
  c10::optional<std::vector<int64_t>> optional_integers(const char* name) const;
  bool flag(const char* name) const { return at(name).toBool(); }
  std::string text(const char* name) const { return at(name).toStringRef(); }

  // Pops the arguments and pushes the op's outputs, in the schema's order.
  template <typename... Outputs>
  void finish(Outputs&&... outputs) {
    torch::jit::drop(*stack_, n_args_);
    torch::jit::push(*stack_, std::forward<Outputs>(outputs)...);
  }

 private:
  const c10::IValue& at(const char* name) const;

  const c10::FunctionSchema& schema_;
  torch::jit::Stack* stack_;
  size_t n_args_, first_;
};

// The boxed kernel of one op on one backend: the op's backend-independent body run with the
// backend's kernels (registered with torch::CppFunction::makeFromBoxedFunction).
template <typename Backend, const Backend& backend,
          void (*body)(const Backend&, const c10::OperatorHandle&, torch::jit::Stack*)>
void run_on(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  body(backend, op, stack);
}

// t must be [B, H, N, *] with the dtype and device of q, B and H of q and N keys; `who` prefixes
// the message ("ascender" or "magnitude").
void check_feature_tensor(const char* who, const at::Tensor& t, const char* name, const at::Tensor& q, int64_t N,
                          const char* dim_name);

// A per-head value must be 0-dim or [H], with the dtype and device of q.
void check_per_head(const char* who, const at::Tensor& t, const char* name, const at::Tensor& q, int64_t H);

// A checked per-head value as a contiguous [H] tensor.
at::Tensor per_head(const at::Tensor& t, int64_t H);

// The [H] rows of one [n, H] tensor with the per-head values of `ts` (each 0-dim or [H], checked by
// check_per_head): a single copy for Magnitude Attention's learnable values, not one each (on CUDA, a kernel each).
std::vector<at::Tensor> per_head_rows(const std::vector<at::Tensor>& ts, int64_t H);

}  // namespace asc_binding
