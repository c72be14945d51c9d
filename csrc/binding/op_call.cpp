// op_call.cpp -- named argument access of a boxed call and the shared input checks (op_call.h).
#include "op_call.h"

#include <sstream>

namespace asc_binding {

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

OpCall::OpCall(const c10::OperatorHandle& op, torch::jit::Stack* stack)
    : schema_(op.schema()), stack_(stack), n_args_(op.schema().arguments().size()) {
  TORCH_INTERNAL_ASSERT(stack->size() >= n_args_, "ascender: ", schema_.name(), " called with ", stack->size(),
                        " values for ", n_args_, " arguments");
  first_ = stack->size() - n_args_;
}

const c10::IValue& OpCall::at(const char* name) const {
  const auto index = schema_.argumentIndexWithName(name);
  TORCH_INTERNAL_ASSERT(index.has_value(), "ascender: the schema of ", schema_.name(), " has no argument '", name,
                        "' (ascender_torch/_spec.py and csrc/binding disagree; rebuild the extension)");
  return (*stack_)[first_ + *index];
}

c10::optional<double> OpCall::optional_real(const char* name) const {
  const c10::IValue& v = at(name);
  if (v.isNone()) return c10::nullopt;
  return v.toDouble();
}

c10::optional<int64_t> OpCall::optional_integer(const char* name) const {
  const c10::IValue& v = at(name);
  if (v.isNone()) return c10::nullopt;
  return v.toInt();
}

c10::optional<std::vector<int64_t>> OpCall::optional_integers(const char* name) const {
  const c10::IValue& v = at(name);
  if (v.isNone()) return c10::nullopt;
  return v.toIntVector();
}

c10::optional<at::Tensor> OpCall::optional_tensor(const char* name) const {
  const c10::IValue& v = at(name);
  if (v.isNone()) return c10::nullopt;
  return v.toTensor();
}

void check_feature_tensor(const char* who, const at::Tensor& t, const char* name, const at::Tensor& q, int64_t N,
                          const char* dim_name) {
  TORCH_CHECK(t.dim() == 4, who, ": ", name, " must be a 4-D tensor [B, H, N, ", dim_name, "], got shape ",
              shape_str(t));
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), who, ": ", name, " must have the dtype of q (", q.scalar_type(),
              "), got ", t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), who, ": ", name, " must be on the device of q (", q.device(), "), got ",
              t.device());
  TORCH_CHECK(t.size(0) == q.size(0) && t.size(1) == q.size(1) && t.size(2) == N, who, ": ", name,
              " must have shape [B, H, N, ", dim_name, "] = [", q.size(0), ", ", q.size(1), ", ", N, ", ", dim_name,
              "], got ", shape_str(t));
}

void check_per_head(const char* who, const at::Tensor& t, const char* name, const at::Tensor& q, int64_t H) {
  TORCH_CHECK(t.dim() == 0 || (t.dim() == 1 && t.size(0) == H), who, ": ", name,
              " must be a 0-dim tensor or have shape [H] = [", H, "], got shape ", shape_str(t));
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), who, ": ", name, " must have the dtype of q (", q.scalar_type(),
              "), got ", t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), who, ": ", name, " must be on the device of q (", q.device(), "), got ",
              t.device());
}

at::Tensor per_head(const at::Tensor& t, int64_t H) { return t.dim() == 0 ? t.expand({H}).contiguous() : t.contiguous(); }

std::vector<at::Tensor> per_head_rows(const std::vector<at::Tensor>& ts, int64_t H) {
  std::vector<at::Tensor> wide;
  for (const at::Tensor& t : ts) wide.push_back(t.dim() == 0 ? t.expand({H}) : t);
  const at::Tensor all = at::stack(wide);  // contiguous [n, H]: its rows are contiguous views
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < all.size(0); i++) rows.push_back(all[i]);
  return rows;
}

}  // namespace asc_binding
