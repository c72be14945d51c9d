// binding.cpp -- the only file that includes libtorch.
//
// Registers the ascender ops, checks every input once (messages name the argument,
// what was expected and what was received), makes inputs contiguous and calls the
// C kernels declared in ascender.h. Autograd and fake (meta) kernels are registered
// from Python in ascender_torch/_ops.py.
#include <Python.h>
#include <torch/library.h>
#include <ATen/ATen.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "ascender.h"

#ifdef ASCENDER_WITH_CUDA  // setup.py with ASCENDER_CUDA=1: the kernels of csrc/cuda for CUDA tensors
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/ascender_cuda.h"
#endif

namespace {

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

struct Inputs {
  at::Tensor q, k, v, z, h;
  std::vector<at::Tensor> scalars;  // nine [H] tensors, SPEC order
  c10::optional<at::Tensor> key_padding_mask, attn_mask, attn_bias, alibi_slopes;
  asc_params p;
};

const char* kScalarNames[9] = {"lambda_align", "lambda_sep", "lambda_coh",
                               "omega_align",  "omega_sep",  "omega_coh",
                               "score_temp",   "delta",      "kappa"};

// t must be [B, H, N, *] with the dtype and device of q, B and H of q and N of k.
void check_feature_tensor(const at::Tensor& t, const char* name, const at::Tensor& q, int64_t N,
                          const char* dim_name) {
  TORCH_CHECK(t.dim() == 4, "ascender: ", name, " must be a 4-D tensor [B, H, N, ", dim_name,
              "], got shape ", shape_str(t));
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "ascender: ", name, " must have the dtype of q (",
              q.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), "ascender: ", name, " must be on the device of q (", q.device(),
              "), got ", t.device());
  TORCH_CHECK(t.size(0) == q.size(0) && t.size(1) == q.size(1) && t.size(2) == N, "ascender: ", name,
              " must have shape [B, H, N, ", dim_name, "] = [", q.size(0), ", ", q.size(1), ", ", N, ", ",
              dim_name, "], got ", shape_str(t));
}

// A per-head value: 0-dim or [H], with the dtype and device of q; returned as contiguous [H].
at::Tensor per_head(const at::Tensor& t, const char* name, const at::Tensor& q, int64_t H) {
  TORCH_CHECK(t.dim() == 0 || (t.dim() == 1 && t.size(0) == H), "ascender: ", name,
              " must be a 0-dim tensor or have shape [H] = [", H, "], got shape ", shape_str(t));
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "ascender: ", name, " must have the dtype of q (",
              q.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), "ascender: ", name, " must be on the device of q (", q.device(),
              "), got ", t.device());
  return t.dim() == 0 ? t.expand({H}).contiguous() : t.contiguous();
}

Inputs check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& z, const at::Tensor& h, at::TensorList scalars,
                    const c10::optional<at::Tensor>& key_padding_mask,
                    const c10::optional<at::Tensor>& attn_mask, c10::string_view variant,
                    int64_t k_neighbors, double tau_sep, double tau_coh, double alpha_align,
                    double alpha_coh, double scale, bool is_causal, bool mask_stats,
                    const c10::optional<at::Tensor>& attn_bias, const c10::optional<at::Tensor>& alibi_slopes) {
  TORCH_CHECK(q.dim() == 4, "ascender: q must be a 4-D tensor [B, H, Nq, d], got shape ", shape_str(q));
#ifdef ASCENDER_WITH_CUDA
  const bool cuda = q.device().is_cuda();
  TORCH_CHECK(q.device().is_cpu() || cuda, "ascender: the fused kernel runs on CPU or CUDA tensors, q is on ",
              q.device());
#else
  const bool cuda = false;
  TORCH_CHECK(q.device().is_cpu(), "ascender: the fused kernel runs on CPU tensors, q is on ", q.device());
#endif
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble || (cuda && half), "ascender: q must be ",
              cuda ? "float32, float64, float16 or bfloat16" : "float32 or float64", ", got ", q.scalar_type());
  // the queries are the last Nq of the N tokens (Nq = N for self-attention)
  TORCH_CHECK(k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3) &&
                  k.size(2) >= q.size(2),
              "ascender: k must have shape [B, H, N, d] with the B, H, d of q ", shape_str(q),
              " and N >= Nq = ", q.size(2), ", got ", shape_str(k));
  const int64_t N = k.size(2);
  check_feature_tensor(k, "k", q, N, "d");
  check_feature_tensor(v, "v", q, N, "dv");
  check_feature_tensor(z, "z", q, N, "dz");
  check_feature_tensor(h, "h", q, N, "da");

  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2);
  Inputs in;
  in.q = q.contiguous();
  in.k = k.contiguous();
  in.v = v.contiguous();
  in.z = z.contiguous();
  in.h = h.contiguous();

  TORCH_CHECK(scalars.size() == 9, "ascender: expected 9 learnable scalars, got ", scalars.size());
  for (size_t s = 0; s < 9; s++) {
    in.scalars.push_back(per_head(scalars[s], kScalarNames[s], q, H));
  }

  asc_params& p = in.p;
  p.am_sb = p.am_sh = p.am_si = p.am_sj = 0;
  if (key_padding_mask.has_value()) {
    const at::Tensor& m = *key_padding_mask;
    TORCH_CHECK(m.scalar_type() == at::kBool, "ascender: key_padding_mask must be a bool tensor ",
                "(True = padding), got ", m.scalar_type());
    TORCH_CHECK(m.device() == q.device(), "ascender: key_padding_mask must be on the device of q (",
                q.device(), "), got ", m.device());
    TORCH_CHECK(m.dim() == 2 && m.size(0) == B && m.size(1) == N,
                "ascender: key_padding_mask must have shape [B, N] = [", B, ", ", N, "], got shape ",
                shape_str(m));
    in.key_padding_mask = m.contiguous();
  }
  // attn_mask and attn_bias broadcast to [B, H, Nq, N]; broadcast dims get stride 0
  auto broadcast_strides = [&](const at::Tensor& m, const char* name, int64_t* st) -> at::Tensor {
    bool ok = m.dim() <= 4;
    const int64_t target[4] = {B, H, Nq, N};
    for (int64_t a = 0; ok && a < m.dim(); a++) {
      const int64_t sz = m.size(m.dim() - 1 - a), want = target[3 - a];
      ok = sz == want || sz == 1;
    }
    TORCH_CHECK(ok, "ascender: ", name, " must be broadcastable to [B, H, Nq, N] = [", B, ", ", H, ", ", Nq,
                ", ", N, "], got shape ", shape_str(m));
    TORCH_CHECK(m.device() == q.device(), "ascender: ", name, " must be on the device of q (", q.device(),
                "), got ", m.device());
    at::Tensor e = m.expand({B, H, Nq, N});
    for (int a = 0; a < 4; a++) st[a] = e.stride(a);
    return e;
  };
  if (attn_mask.has_value()) {
    TORCH_CHECK(attn_mask->scalar_type() == at::kBool, "ascender: attn_mask must be a bool tensor ",
                "(True = may attend), got ", attn_mask->scalar_type());
    int64_t st[4];
    in.attn_mask = broadcast_strides(*attn_mask, "attn_mask", st);
    p.am_sb = st[0], p.am_sh = st[1], p.am_si = st[2], p.am_sj = st[3];
  }
  p.ab_sb = p.ab_sh = p.ab_si = p.ab_sj = 0;
  if (attn_bias.has_value()) {
    TORCH_CHECK(attn_bias->scalar_type() == q.scalar_type(), "ascender: attn_bias must have the dtype of q (",
                q.scalar_type(), "), got ", attn_bias->scalar_type());
    int64_t st[4];
    in.attn_bias = broadcast_strides(*attn_bias, "attn_bias", st);
    p.ab_sb = st[0], p.ab_sh = st[1], p.ab_si = st[2], p.ab_sj = st[3];
  }
  if (alibi_slopes.has_value()) in.alibi_slopes = per_head(*alibi_slopes, "alibi_slopes", q, H);

  int variant_id;
  if (variant == "reference") {
    variant_id = ASC_VARIANT_SEED;
  } else if (variant == "paper") {
    variant_id = ASC_VARIANT_PAPER;
  } else {
    TORCH_CHECK(false, "ascender: variant must be 'reference' or 'paper', got '", std::string(variant), "'");
  }
  TORCH_CHECK(k_neighbors >= 0, "ascender: k_neighbors must be >= 0, got ", k_neighbors);
  TORCH_CHECK(std::isfinite(tau_sep) && tau_sep > 0, "ascender: tau_sep must be a finite number > 0, got ",
              tau_sep);
  TORCH_CHECK(std::isfinite(tau_coh) && tau_coh > 0, "ascender: tau_coh must be a finite number > 0, got ",
              tau_coh);
  TORCH_CHECK(std::isfinite(alpha_align), "ascender: alpha_align must be finite, got ", alpha_align);
  TORCH_CHECK(std::isfinite(alpha_coh), "ascender: alpha_coh must be finite, got ", alpha_coh);
  TORCH_CHECK(std::isfinite(scale), "ascender: scale must be finite, got ", scale);

  p.B = B;
  p.H = H;
  p.N = N;
  p.Nq = Nq;
  p.d = q.size(3);
  p.dv = v.size(3);
  p.dz = z.size(3);
  p.da = h.size(3);
  p.variant = variant_id;
  p.k_neighbors = k_neighbors;
  p.n_nbr = variant_id == ASC_VARIANT_PAPER ? std::min<int64_t>(k_neighbors, std::max<int64_t>(N - 1, 0)) : 0;
  p.tau_sep = tau_sep;
  p.tau_coh = tau_coh;
  p.alpha_align = alpha_align;
  p.alpha_coh = alpha_coh;
  p.scale = scale;
  p.is_causal = is_causal ? 1 : 0;
  p.mask_stats = mask_stats ? 1 : 0;
  return in;
}

asc_fwd_args make_args(const Inputs& in) {
  asc_fwd_args a{};
  a.q = in.q.data_ptr();
  a.k = in.k.data_ptr();
  a.v = in.v.data_ptr();
  a.z = in.z.data_ptr();
  a.h = in.h.data_ptr();
  a.lambda_align = in.scalars[0].data_ptr();
  a.lambda_sep = in.scalars[1].data_ptr();
  a.lambda_coh = in.scalars[2].data_ptr();
  a.omega_align = in.scalars[3].data_ptr();
  a.omega_sep = in.scalars[4].data_ptr();
  a.omega_coh = in.scalars[5].data_ptr();
  a.score_temp = in.scalars[6].data_ptr();
  a.delta = in.scalars[7].data_ptr();
  a.kappa = in.scalars[8].data_ptr();
  a.key_padding_mask =
      in.key_padding_mask.has_value() ? reinterpret_cast<const uint8_t*>(in.key_padding_mask->data_ptr()) : nullptr;
  a.attn_mask = in.attn_mask.has_value() ? reinterpret_cast<const uint8_t*>(in.attn_mask->data_ptr()) : nullptr;
  a.attn_bias = in.attn_bias.has_value() ? in.attn_bias->data_ptr() : nullptr;
  a.alibi_slopes = in.alibi_slopes.has_value() ? in.alibi_slopes->data_ptr() : nullptr;
  return a;
}

#ifdef ASCENDER_WITH_CUDA
int cuda_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ASC_CUDA_F32;
    case at::kDouble: return ASC_CUDA_F64;
    case at::kHalf: return ASC_CUDA_F16;
    default: return ASC_CUDA_BF16;  // check_inputs admits nothing else
  }
}

void check_cuda(int rc, const char* what) {
  TORCH_CHECK(rc == 0, "ascender: the CUDA ", what, " failed: ", cudaGetErrorString(static_cast<cudaError_t>(rc)),
              " (error ", rc, ")");
}
#endif

void run_fwd(const Inputs& in, const asc_fwd_args& a) {
#ifdef ASCENDER_WITH_CUDA
  if (in.q.is_cuda()) {
    const c10::cuda::CUDAGuard guard(in.q.device());
    check_cuda(ascender_cuda_fwd(&in.p, &a, cuda_dtype(in.q.scalar_type()), c10::cuda::getCurrentCUDAStream()),
               "forward");
    return;
  }
#endif
  const int rc = in.q.scalar_type() == at::kFloat ? ascender_fwd_f32(&in.p, &a) : ascender_fwd_f64(&in.p, &a);
  TORCH_CHECK(rc == 0, "ascender: the CPU kernel could not allocate its O(N) scratch memory (N = ", in.p.N, ")");
}

#define ASC_OP_ARGS                                                                                   \
  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &z, const at::Tensor &h, \
      const at::Tensor &lambda_align, const at::Tensor &lambda_sep, const at::Tensor &lambda_coh,           \
      const at::Tensor &omega_align, const at::Tensor &omega_sep, const at::Tensor &omega_coh,              \
      const at::Tensor &score_temp, const at::Tensor &delta, const at::Tensor &kappa,                       \
      const c10::optional<at::Tensor>&key_padding_mask, const c10::optional<at::Tensor>&attn_mask,          \
      c10::string_view variant, int64_t k_neighbors, double tau_sep, double tau_coh, double alpha_align,    \
      double alpha_coh, double scale, bool is_causal, bool mask_stats,                                      \
      const c10::optional<at::Tensor>&attn_bias, const c10::optional<at::Tensor>&alibi_slopes

#define ASC_CHECK_INPUTS                                                                                  \
  check_inputs(q, k, v, z, h,                                                                             \
               {lambda_align, lambda_sep, lambda_coh, omega_align, omega_sep, omega_coh, score_temp, delta, \
                kappa},                                                                                   \
               key_padding_mask, attn_mask, variant, k_neighbors, tau_sep, tau_coh, alpha_align, alpha_coh, \
               scale, is_causal, mask_stats, attn_bias, alibi_slopes)

using Tensor5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Tensor6 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Allocates the forward's outputs (out, stats, u, c, nbr, aux) and points the kernel at them.
Tensor6 alloc_fwd_outputs(const Inputs& in, asc_fwd_args& a) {
  const asc_params& p = in.p;
  at::Tensor out = at::empty({p.B, p.H, p.Nq, p.dv}, in.q.options());
  at::Tensor stats = at::empty({p.B, p.H, p.Nq, ASC_NSTAT}, in.q.options());
  at::Tensor u = at::empty({p.B, p.H, p.Nq, p.d}, in.q.options());
  at::Tensor c = at::empty({p.B, p.H, p.Nq, p.dz}, in.q.options());
  at::Tensor nbr = at::empty({p.B, p.H, p.Nq, p.n_nbr}, in.q.options().dtype(at::kLong));
  at::Tensor aux = at::empty({p.B, p.H, p.Nq, 2}, in.q.options());
  a.out = out.data_ptr();
  a.stats = stats.data_ptr();
  a.u = u.data_ptr();
  a.c = c.data_ptr();
  a.nbr = nbr.data_ptr<int64_t>();
  a.aux = aux.data_ptr();
  return {out, stats, u, c, nbr, aux};
}

Tensor6 ascender_fwd_op(ASC_OP_ARGS) {
  const Inputs in = ASC_CHECK_INPUTS;
  asc_fwd_args a = make_args(in);
  Tensor6 outputs = alloc_fwd_outputs(in, a);
  run_fwd(in, a);
  return outputs;
}

// The same kernel with the inspection maps switched on; returns only the maps.
Tensor5 ascender_maps_op(ASC_OP_ARGS) {
  const Inputs in = ASC_CHECK_INPUTS;
  const asc_params& p = in.p;
  asc_fwd_args a = make_args(in);
  const Tensor6 unused = alloc_fwd_outputs(in, a);
  std::vector<at::Tensor> m;
  for (int t = 0; t < 5; t++) m.push_back(at::empty({p.B, p.H, p.Nq, p.N}, in.q.options()));
  a.map_sbase = m[0].data_ptr();
  a.map_align = m[1].data_ptr();
  a.map_sep = m[2].data_ptr();
  a.map_coh = m[3].data_ptr();
  a.map_attn = m[4].data_ptr();
  run_fwd(in, a);
  return {m[0], m[1], m[2], m[3], m[4]};
}

using Tensor7 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// An optional incoming gradient of a forward output: `shape` of q's dtype and device, made contiguous.
c10::optional<at::Tensor> check_output_grad(const c10::optional<at::Tensor>& g, const char* name,
                                            std::vector<int64_t> shape, const at::Tensor& q) {
  if (!g.has_value()) return c10::nullopt;
  TORCH_CHECK(g->sizes() == at::IntArrayRef(shape), "ascender: ", name, " must have shape ", at::IntArrayRef(shape),
              ", got shape ", shape_str(*g));
  TORCH_CHECK(g->scalar_type() == q.scalar_type(), "ascender: ", name, " must have the dtype of q (",
              q.scalar_type(), "), got ", g->scalar_type());
  TORCH_CHECK(g->device() == q.device(), "ascender: ", name, " must be on the device of q (", q.device(), "), got ",
              g->device());
  return g->contiguous();
}

// A saved output of the forward handed back to the backward: `shape` and `dtype` on q's device.
c10::optional<at::Tensor> check_saved(const c10::optional<at::Tensor>& t, const char* name, std::vector<int64_t> shape,
                                      at::ScalarType dtype, const at::Tensor& q) {
  if (!t.has_value()) return c10::nullopt;
  TORCH_CHECK(t->sizes() == at::IntArrayRef(shape), "ascender: the saved forward output ", name, " must have shape ",
              at::IntArrayRef(shape), ", got shape ", shape_str(*t));
  TORCH_CHECK(t->scalar_type() == dtype && t->device() == q.device(), "ascender: the saved forward output ", name,
              " must be ", dtype, " on ", q.device(), ", got ", t->scalar_type(), " on ", t->device());
  return t->contiguous();
}

// Gradients of the fused forward; dscalars [9, H] in SPEC order and, with attn_bias_grad,
// dattn_bias [B, H, Nq, N] (else empty); Python sums them over broadcast dimensions.
// grad_aux and grad_u are the optional incoming gradients of the forward's aux and u outputs.
// out, stats, u, c, nbr, aux: the forward's outputs (the CPU backward reads them instead of
// recomputing the statistics, docs/tiling.md; without them it runs the forward itself).
Tensor7 ascender_bwd_op(const at::Tensor& grad_out, ASC_OP_ARGS, bool attn_bias_grad,
                         const c10::optional<at::Tensor>& grad_aux, const c10::optional<at::Tensor>& grad_u,
                         const c10::optional<at::Tensor>& out, const c10::optional<at::Tensor>& stats,
                         const c10::optional<at::Tensor>& u, const c10::optional<at::Tensor>& c,
                         const c10::optional<at::Tensor>& nbr, const c10::optional<at::Tensor>& aux) {
  const Inputs in = ASC_CHECK_INPUTS;
  const asc_params& p = in.p;
  TORCH_CHECK(grad_out.dim() == 4 && grad_out.size(0) == p.B && grad_out.size(1) == p.H &&
                  grad_out.size(2) == p.Nq && grad_out.size(3) == p.dv,
              "ascender: grad_out must have the shape of the output [B, H, Nq, dv] = [", p.B, ", ", p.H, ", ",
              p.Nq, ", ", p.dv, "], got shape ", shape_str(grad_out));
  TORCH_CHECK(grad_out.scalar_type() == in.q.scalar_type(), "ascender: grad_out must have the dtype of q (",
              in.q.scalar_type(), "), got ", grad_out.scalar_type());
  TORCH_CHECK(grad_out.device() == in.q.device(), "ascender: grad_out must be on the device of q (", in.q.device(),
              "), got ", grad_out.device());
  const at::Tensor dy = grad_out.contiguous();
  const auto gaux = check_output_grad(grad_aux, "grad_aux", {p.B, p.H, p.Nq, 2}, in.q);
  const auto gu = check_output_grad(grad_u, "grad_u", {p.B, p.H, p.Nq, p.d}, in.q);
  const at::ScalarType st = in.q.scalar_type();
  const auto s_out = check_saved(out, "out", {p.B, p.H, p.Nq, p.dv}, st, in.q);
  const auto s_stats = check_saved(stats, "stats", {p.B, p.H, p.Nq, ASC_NSTAT}, st, in.q);
  const auto s_u = check_saved(u, "u", {p.B, p.H, p.Nq, p.d}, st, in.q);
  const auto s_c = check_saved(c, "c", {p.B, p.H, p.Nq, p.dz}, st, in.q);
  const auto s_nbr = check_saved(nbr, "nbr", {p.B, p.H, p.Nq, p.n_nbr}, at::kLong, in.q);
  const auto s_aux = check_saved(aux, "aux", {p.B, p.H, p.Nq, 2}, st, in.q);
  at::Tensor dq = at::empty_like(in.q), dk = at::empty_like(in.k), dv = at::empty_like(in.v);
  at::Tensor dz = at::empty_like(in.z), dh = at::empty_like(in.h);
  at::Tensor dscalars = at::empty({ASC_NSCALAR, p.H}, in.q.options());
  const bool want_dbias = attn_bias_grad && in.attn_bias.has_value();  // O(N^2): only when asked for
  at::Tensor dbias = at::empty({want_dbias ? p.B * p.H * p.Nq * p.N : 0}, in.q.options());
  asc_bwd_args a{};
  a.in = make_args(in);
  if (s_out && s_stats && s_u && s_c && s_nbr) {  // all or none: the kernel checks nothing
    a.in.out = s_out->data_ptr();
    a.in.stats = s_stats->data_ptr();
    a.in.u = s_u->data_ptr();
    a.in.c = s_c->data_ptr();
    a.in.nbr = s_nbr->data_ptr<int64_t>();
    a.in.aux = s_aux ? s_aux->data_ptr() : nullptr;
  }
  a.grad_out = dy.data_ptr();
  a.grad_aux = gaux.has_value() ? gaux->data_ptr() : nullptr;
  a.grad_u = gu.has_value() ? gu->data_ptr() : nullptr;
  a.dq = dq.data_ptr();
  a.dk = dk.data_ptr();
  a.dv = dv.data_ptr();
  a.dz = dz.data_ptr();
  a.dh = dh.data_ptr();
  a.dscalars = dscalars.data_ptr();
  a.dattn_bias = want_dbias ? dbias.data_ptr() : nullptr;
  if (want_dbias) dbias = dbias.view({p.B, p.H, p.Nq, p.N});
#ifdef ASCENDER_WITH_CUDA
  if (in.q.is_cuda()) {
    const c10::cuda::CUDAGuard guard(in.q.device());
    check_cuda(ascender_cuda_bwd(&p, &a, cuda_dtype(in.q.scalar_type()), c10::cuda::getCurrentCUDAStream()),
               "backward");
    return {dq, dk, dv, dz, dh, dscalars, dbias};
  }
#endif
  const int rc = in.q.scalar_type() == at::kFloat ? ascender_bwd_f32(&p, &a) : ascender_bwd_f64(&p, &a);
  TORCH_CHECK(rc == 0, "ascender: the CPU backward could not allocate its O(threads x N) scratch memory (N = ",
              p.N, ")");
  return {dq, dk, dv, dz, dh, dscalars, dbias};
}


// ---------------------------------------------------------------- Magnitude Attention

struct MagInputs {
  at::Tensor q, k, v, t_raw, beta, gamma;
  c10::optional<at::Tensor> key_padding_mask;
  mag_params p;
};

MagInputs check_magnitude_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& t_raw, const at::Tensor& beta, const at::Tensor& gamma,
                                 const c10::optional<at::Tensor>& key_padding_mask, int64_t n_iter, double eps,
                                 double scale) {
  TORCH_CHECK(q.dim() == 4, "magnitude: q must be a 4-D tensor [B, H, N, d], got shape ", shape_str(q));
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "magnitude: q must be float32 or float64, got ", q.scalar_type());
  TORCH_CHECK(q.device().is_cpu(), "magnitude: the fused kernel runs on CPU tensors, q is on ", q.device());
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2);
  check_feature_tensor(k, "k", q, N, "d");
  TORCH_CHECK(k.size(3) == q.size(3), "magnitude: k must have the shape of q ", shape_str(q), ", got ",
              shape_str(k));
  check_feature_tensor(v, "v", q, N, "dv");
  MagInputs in;
  in.q = q.contiguous();
  in.k = k.contiguous();
  in.v = v.contiguous();
  in.t_raw = per_head(t_raw, "t_raw", q, H);
  in.beta = per_head(beta, "beta", q, H);
  in.gamma = per_head(gamma, "gamma", q, H);
  if (key_padding_mask.has_value()) {
    const at::Tensor& m = *key_padding_mask;
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 2 && m.size(0) == B && m.size(1) == N &&
                    m.device() == q.device(),
                "magnitude: key_padding_mask must be a bool tensor [B, N] = [", B, ", ", N, "] on ", q.device(),
                " (True = padding), got ", m.scalar_type(), " ", shape_str(m), " on ", m.device());
    in.key_padding_mask = m.contiguous();
  }
  TORCH_CHECK(n_iter >= 0, "magnitude: n_iter must be >= 0, got ", n_iter);
  TORCH_CHECK(std::isfinite(eps) && eps > 0, "magnitude: eps must be a finite number > 0, got ", eps);
  TORCH_CHECK(std::isfinite(scale), "magnitude: scale must be finite, got ", scale);
  in.p = mag_params{B, H, N, q.size(3), v.size(3), n_iter, eps, scale};
  return in;
}

mag_fwd_args make_mag_args(const MagInputs& in) {
  mag_fwd_args a{};
  a.q = in.q.data_ptr();
  a.k = in.k.data_ptr();
  a.v = in.v.data_ptr();
  a.t_raw = in.t_raw.data_ptr();
  a.beta = in.beta.data_ptr();
  a.gamma = in.gamma.data_ptr();
  a.key_padding_mask = in.key_padding_mask.has_value()
                           ? reinterpret_cast<const uint8_t*>(in.key_padding_mask->data_ptr())
                           : nullptr;
  return a;
}

#define MAG_OP_ARGS                                                                                    \
  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &t_raw,               \
      const at::Tensor &beta, const at::Tensor &gamma, const c10::optional<at::Tensor>&key_padding_mask, \
      int64_t n_iter, double eps, double scale

std::tuple<at::Tensor, at::Tensor> magnitude_fwd_cpu(MAG_OP_ARGS) {
  const MagInputs in = check_magnitude_inputs(q, k, v, t_raw, beta, gamma, key_padding_mask, n_iter, eps, scale);
  const mag_params& p = in.p;
  at::Tensor out = at::empty({p.B, p.H, p.N, p.dv}, in.q.options());
  at::Tensor mu = at::empty({p.B, p.H, p.N}, in.q.options());
  mag_fwd_args a = make_mag_args(in);
  a.out = out.data_ptr();
  a.mu = mu.data_ptr();
  const int rc = in.q.scalar_type() == at::kFloat ? magnitude_fwd_f32(&p, &a) : magnitude_fwd_f64(&p, &a);
  TORCH_CHECK(rc == 0, "magnitude: the CPU kernel could not allocate its O(N) scratch memory (N = ", p.N, ")");
  return {out, mu};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> magnitude_bwd_cpu(const at::Tensor& grad_out,
                                                                             MAG_OP_ARGS,
                                                                             const c10::optional<at::Tensor>& grad_mu) {
  const MagInputs in = check_magnitude_inputs(q, k, v, t_raw, beta, gamma, key_padding_mask, n_iter, eps, scale);
  const mag_params& p = in.p;
  TORCH_CHECK(grad_out.dim() == 4 && grad_out.size(0) == p.B && grad_out.size(1) == p.H &&
                  grad_out.size(2) == p.N && grad_out.size(3) == p.dv && grad_out.scalar_type() == in.q.scalar_type(),
              "magnitude: grad_out must be [B, H, N, dv] = [", p.B, ", ", p.H, ", ", p.N, ", ", p.dv, "] of ",
              in.q.scalar_type(), ", got ", grad_out.scalar_type(), " ", shape_str(grad_out));
  const at::Tensor dy = grad_out.contiguous();
  at::Tensor dmu;
  if (grad_mu.has_value()) {
    TORCH_CHECK(grad_mu->dim() == 3 && grad_mu->size(0) == p.B && grad_mu->size(1) == p.H &&
                    grad_mu->size(2) == p.N && grad_mu->scalar_type() == in.q.scalar_type(),
                "magnitude: grad_mu must be [B, H, N] = [", p.B, ", ", p.H, ", ", p.N, "] of ", in.q.scalar_type(),
                ", got ", grad_mu->scalar_type(), " ", shape_str(*grad_mu));
    dmu = grad_mu->contiguous();
  }
  at::Tensor dq = at::empty_like(in.q), dk = at::empty_like(in.k), dv = at::empty_like(in.v);
  at::Tensor dparams = at::empty({3, p.H}, in.q.options());
  mag_bwd_args a{};
  a.in = make_mag_args(in);
  a.grad_out = dy.data_ptr();
  a.grad_mu = grad_mu.has_value() ? dmu.data_ptr() : nullptr;
  a.dq = dq.data_ptr();
  a.dk = dk.data_ptr();
  a.dv = dv.data_ptr();
  a.dparams = dparams.data_ptr();
  const int rc = in.q.scalar_type() == at::kFloat ? magnitude_bwd_f32(&p, &a) : magnitude_bwd_f64(&p, &a);
  TORCH_CHECK(rc == 0, "magnitude: the CPU backward could not allocate its scratch memory (N = ", p.N, ")");
  return {dq, dk, dv, dparams};
}

}  // namespace

#define MAG_SCHEMA_ARGS                                                                                \
  "Tensor q, Tensor k, Tensor v, Tensor t_raw, Tensor beta, Tensor gamma, Tensor? key_padding_mask, " \
  "int n_iter, float eps, float scale"

#define ASC_SCHEMA_ARGS                                                                                   \
  "Tensor q, Tensor k, Tensor v, Tensor z, Tensor h, Tensor lambda_align, Tensor lambda_sep, "             \
  "Tensor lambda_coh, Tensor omega_align, Tensor omega_sep, Tensor omega_coh, Tensor score_temp, "          \
  "Tensor delta, Tensor kappa, Tensor? key_padding_mask, Tensor? attn_mask, str variant, int k_neighbors, " \
  "float tau_sep, float tau_coh, float alpha_align, float alpha_coh, float scale, bool is_causal, "         \
  "bool mask_stats, Tensor? attn_bias=None, Tensor? alibi_slopes=None"

TORCH_LIBRARY(ascender, m) {
  m.def("ascender_fwd(" ASC_SCHEMA_ARGS ") -> (Tensor out, Tensor stats, Tensor u, Tensor c, Tensor nbr, Tensor aux)");
  m.def("ascender_maps(" ASC_SCHEMA_ARGS
        ") -> (Tensor S_base, Tensor b_align, Tensor b_sep, Tensor b_coh, Tensor A)");
  m.def("magnitude_fwd(" MAG_SCHEMA_ARGS ") -> (Tensor out, Tensor mu)");
  m.def("magnitude_bwd(Tensor grad_out, " MAG_SCHEMA_ARGS
        ", Tensor? grad_mu=None) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dparams)");
  m.def("ascender_bwd(Tensor grad_out, " ASC_SCHEMA_ARGS
        ", bool attn_bias_grad=False, Tensor? grad_aux=None, Tensor? grad_u=None, Tensor? out=None, "
        "Tensor? stats=None, Tensor? u=None, Tensor? c=None, Tensor? nbr=None, Tensor? aux=None) -> (Tensor dq, Tensor dk, "
        "Tensor dv, Tensor dz, Tensor dh, Tensor dscalars, Tensor dattn_bias)");
}

TORCH_LIBRARY_IMPL(ascender, CPU, m) {
  m.impl("ascender_fwd", &ascender_fwd_op);
  m.impl("ascender_maps", &ascender_maps_op);
  m.impl("ascender_bwd", &ascender_bwd_op);
  m.impl("magnitude_fwd", &magnitude_fwd_cpu);
  m.impl("magnitude_bwd", &magnitude_bwd_cpu);
}

#ifdef ASCENDER_WITH_CUDA
// The same entry points: check_inputs admits CUDA tensors and run_fwd / ascender_bwd_op hand
// them to the launchers of csrc/cuda/ascender_cuda.h on the current stream.
TORCH_LIBRARY_IMPL(ascender, CUDA, m) {
  m.impl("ascender_fwd", &ascender_fwd_op);
  m.impl("ascender_maps", &ascender_maps_op);
  m.impl("ascender_bwd", &ascender_bwd_op);
}
#endif

// A Python module only so that `import ascender_torch._C` loads the library and runs
// the registrations above.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  PyObject* module = PyModule_Create(&module_def);
#ifdef ASCENDER_WITH_CUDA
  const long cuda_built = 1;
#else
  const long cuda_built = 0;
#endif
  // CUDA_BUILT: whether the ascender ops have CUDA kernels (ascender_torch._ops.CUDA_BUILT)
  if (module && PyModule_AddIntConstant(module, "CUDA_BUILT", cuda_built) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
