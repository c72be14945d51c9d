// ascender_op.cpp -- checks, outputs and kernel arguments of the ascender ops (ascender_op.h).
// Arguments are read by their names in ascender_torch/_spec.py.
#include "ascender_op.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <utility>
#include <string>

#include "op_call.h"

namespace asc_binding {
namespace {

constexpr const char* kWho = "ascender";
const char* const kScalarNames[ASC_NSCALAR] = {
#define ASC_SCALAR_NAME_(name) #name,
    ASC_SCALARS(ASC_SCALAR_NAME_)
#undef ASC_SCALAR_NAME_
};

// attn_mask and attn_bias broadcast to [B, H, Nq, N]: checks that and writes the element strides
// of the expanded view (0 where they broadcast).
void broadcast_strides(const at::Tensor& m, const char* name, const at::Tensor& q, const asc_params& p,
                       int64_t* strides) {
  bool ok = m.dim() <= 4;
  const int64_t target[4] = {p.B, p.H, p.Nq, p.N};
  for (int64_t a = 0; ok && a < m.dim(); a++) {
    const int64_t sz = m.size(m.dim() - 1 - a), want = target[3 - a];
    ok = sz == want || sz == 1;
  }
  TORCH_CHECK(ok, "ascender: ", name, " must be broadcastable to [B, H, Nq, N] = [", p.B, ", ", p.H, ", ", p.Nq,
              ", ", p.N, "], got shape ", shape_str(m));
  TORCH_CHECK(m.device() == q.device(), "ascender: ", name, " must be on the device of q (", q.device(), "), got ",
              m.device());
  const at::Tensor e = m.expand({p.B, p.H, p.Nq, p.N});
  for (int a = 0; a < 4; a++) strides[a] = e.stride(a);
}

// sinks: a 0-dim or [H] tensor (per head), or a 3-D one broadcastable to [B, H, Nq] (per row, docs/backward.md):
// checks that and writes the element strides of the contiguous sinks' [B, H, Nq] view (0 where they broadcast).
void sink_strides(const at::Tensor& s, const at::Tensor& q, asc_params& p) {
  const bool rows = s.dim() == 3 && (s.size(0) == p.B || s.size(0) == 1) && (s.size(1) == p.H || s.size(1) == 1) &&
                    (s.size(2) == p.Nq || s.size(2) == 1);
  TORCH_CHECK(rows || s.dim() == 0 || (s.dim() == 1 && s.size(0) == p.H), "ascender: sinks must be a 0-dim tensor or ",
              "have shape [H] = [", p.H, "] (per head), or be 3-D and broadcastable to [B, H, Nq] = [", p.B, ", ", p.H,
              ", ", p.Nq, "] (per row), got shape ", shape_str(s));
  TORCH_CHECK(s.scalar_type() == q.scalar_type(), "ascender: sinks must have the dtype of q (", q.scalar_type(),
              "), got ", s.scalar_type());
  TORCH_CHECK(s.device() == q.device(), "ascender: sinks must be on the device of q (", q.device(), "), got ",
              s.device());
  if (!rows) {  // per head: [H] (a 0-dim one expanded to it)
    p.sk_sb = 0, p.sk_sh = 1, p.sk_si = 0;
    return;
  }
  const int64_t nh = s.size(1), ni = s.size(2);
  p.sk_sb = s.size(0) == 1 ? 0 : nh * ni;
  p.sk_sh = nh == 1 ? 0 : ni;
  p.sk_si = ni == 1 ? 0 : 1;
}

int variant_id(const std::string& variant) {
  if (variant == "seed" || variant == "reference") return ASC_VARIANT_SEED;
  if (variant == "paper") return ASC_VARIANT_PAPER;
  TORCH_CHECK(false, "ascender: variant must be 'seed' (or its alias 'reference') or 'paper', got '", variant, "'");
}

// The kernel's params from the arguments' metadata (shapes, dtypes, devices, options): every check
// of the op, no data read. device: the backend's device (nullopt: any); half_types: float16 and
// bfloat16 admitted besides float32 and float64.
asc_params check_arguments(const OpCall& args, c10::optional<c10::DeviceType> device, bool half_types) {
  const at::Tensor& q = args.tensor("q");
  const at::Tensor& k = args.tensor("k");
  TORCH_CHECK(q.dim() == 4, "ascender: q must be a 4-D tensor [B, H, Nq, d], got shape ", shape_str(q));
  TORCH_CHECK(!device.has_value() || q.device().type() == *device, "ascender: the fused kernel runs on ",
              c10::DeviceTypeName(device.value_or(q.device().type())), " tensors, q is on ", q.device());
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble || (half_types && half),
              "ascender: q must be ", half_types ? "float32, float64, float16 or bfloat16" : "float32 or float64",
              ", got ", q.scalar_type());
  // the queries are the last Nq of the N tokens (Nq = N for self-attention)
  TORCH_CHECK(k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3) &&
                  k.size(2) >= q.size(2),
              "ascender: k must have shape [B, H, N, d] with the B, H, d of q ", shape_str(q), " and N >= Nq = ",
              q.size(2), ", got ", shape_str(k));
  const int64_t N = k.size(2);
  check_feature_tensor(kWho, k, "k", q, N, "d");
  check_feature_tensor(kWho, args.tensor("v"), "v", q, N, "dv");
  check_feature_tensor(kWho, args.tensor("z"), "z", q, N, "dz");
  check_feature_tensor(kWho, args.tensor("h"), "h", q, N, "da");
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2);
  for (const char* name : kScalarNames) check_per_head(kWho, args.tensor(name), name, q, H);

  asc_params p{};
  p.B = B;
  p.H = H;
  p.N = N;
  p.Nq = Nq;
  p.d = q.size(3);
  p.dv = args.tensor("v").size(3);
  p.dz = args.tensor("z").size(3);
  p.da = args.tensor("h").size(3);

  if (const auto m = args.optional_tensor("key_padding_mask")) {
    TORCH_CHECK(m->scalar_type() == at::kBool, "ascender: key_padding_mask must be a bool tensor ",
                "(True = padding), got ", m->scalar_type());
    TORCH_CHECK(m->device() == q.device(), "ascender: key_padding_mask must be on the device of q (", q.device(),
                "), got ", m->device());
    TORCH_CHECK(m->dim() == 2 && m->size(0) == B && m->size(1) == N, "ascender: key_padding_mask must have shape [B, N] = [",
                B, ", ", N, "], got shape ", shape_str(*m));
  }
  if (const auto m = args.optional_tensor("attn_mask")) {
    TORCH_CHECK(m->scalar_type() == at::kBool, "ascender: attn_mask must be a bool tensor ",
                "(True = may attend), got ", m->scalar_type());
    int64_t st[4];
    broadcast_strides(*m, "attn_mask", q, p, st);
    p.am_sb = st[0], p.am_sh = st[1], p.am_si = st[2], p.am_sj = st[3];
  }
  if (const auto bias = args.optional_tensor("attn_bias")) {
    TORCH_CHECK(bias->scalar_type() == q.scalar_type(), "ascender: attn_bias must have the dtype of q (",
                q.scalar_type(), "), got ", bias->scalar_type());
    int64_t st[4];
    broadcast_strides(*bias, "attn_bias", q, p, st);
    p.ab_sb = st[0], p.ab_sh = st[1], p.ab_si = st[2], p.ab_sj = st[3];
  }
  if (const auto slopes = args.optional_tensor("alibi_slopes")) {  // per head, or per (batch, head)
    TORCH_CHECK(slopes->dim() == 0 || (slopes->dim() == 1 && slopes->size(0) == H) ||
                    (slopes->dim() == 2 && slopes->size(0) == B && slopes->size(1) == H),
                "ascender: alibi_slopes must be a 0-dim tensor or have shape [H] = [", H, "] or [B, H] = [", B, ", ",
                H, "], got shape ", shape_str(*slopes));
    TORCH_CHECK(slopes->scalar_type() == q.scalar_type(), "ascender: alibi_slopes must have the dtype of q (",
                q.scalar_type(), "), got ", slopes->scalar_type());
    TORCH_CHECK(slopes->device() == q.device(), "ascender: alibi_slopes must be on the device of q (", q.device(),
                "), got ", slopes->device());
  }
  if (const auto sinks = args.optional_tensor("sinks")) sink_strides(*sinks, q, p);

  p.variant = variant_id(args.text("variant"));
  p.k_neighbors = args.integer("k_neighbors");
  TORCH_CHECK(p.k_neighbors >= 0, "ascender: k_neighbors must be >= 0, got ", p.k_neighbors);
  p.n_nbr = p.variant == ASC_VARIANT_PAPER ? std::min<int64_t>(p.k_neighbors, std::max<int64_t>(N - 1, 0)) : 0;
  p.tau_sep = args.real("tau_sep");
  TORCH_CHECK(std::isfinite(p.tau_sep) && p.tau_sep > 0, "ascender: tau_sep must be a finite number > 0, got ",
              p.tau_sep);
  p.tau_coh = args.real("tau_coh");
  TORCH_CHECK(std::isfinite(p.tau_coh) && p.tau_coh > 0, "ascender: tau_coh must be a finite number > 0, got ",
              p.tau_coh);
  p.alpha_align = args.real("alpha_align");
  TORCH_CHECK(std::isfinite(p.alpha_align), "ascender: alpha_align must be finite, got ", p.alpha_align);
  p.alpha_coh = args.real("alpha_coh");
  TORCH_CHECK(std::isfinite(p.alpha_coh), "ascender: alpha_coh must be finite, got ", p.alpha_coh);
  p.scale = args.real("scale");
  TORCH_CHECK(std::isfinite(p.scale), "ascender: scale must be finite, got ", p.scale);
  // the kernels compute in q's dtype (float32 for the half types): every option must be finite there
  const double largest = q.scalar_type() == at::kDouble ? DBL_MAX : FLT_MAX;
  for (const auto& [name, value] : {std::pair<const char*, double>{"tau_sep", p.tau_sep}, {"tau_coh", p.tau_coh},
                                    {"alpha_align", p.alpha_align}, {"alpha_coh", p.alpha_coh}, {"scale", p.scale}}) {
    TORCH_CHECK(std::abs(value) <= largest, "ascender: ", name, " overflows the compute dtype of q (",
                q.scalar_type(), "): ", value);
  }
  p.is_causal = args.flag("is_causal") ? 1 : 0;
  p.mask_stats = args.flag("mask_stats") ? 1 : 0;
  if (const auto softcap = args.optional_real("softcap")) {
    TORCH_CHECK(std::isfinite(*softcap) && *softcap > 0 && *softcap <= largest,
                "ascender: softcap must be None or a finite number > 0 in the compute dtype of q (", q.scalar_type(),
                "), got ", *softcap);
    p.softcap = *softcap;
  }
  p.window_left = p.window_right = -1;
  if (const auto window = args.optional_integers("window_size")) {
    TORCH_CHECK(window->size() == 2 && (*window)[0] >= -1 && (*window)[1] >= -1,
                "ascender: window_size must be (left, right) with each >= -1 (-1: unbounded), got ",
                at::IntArrayRef(*window));
    p.window_left = (*window)[0];
    p.window_right = (*window)[1];
  }
  if (const auto first = args.optional_integer("query_offset")) {
    TORCH_CHECK(*first >= 0 && *first <= N - Nq, "ascender: query_offset must be None or in [0, N - Nq] = [0, ",
                N - Nq, "] (the Nq = ", Nq, " query rows are tokens query_offset .. query_offset + Nq - 1 of the N = ",
                N, " keys), got ", *first);
    p.keys_after = N - Nq - *first;
  }
  p.n_global = args.integer("global_tokens");
  TORCH_CHECK(p.n_global >= 0 && p.n_global <= N, "ascender: global_tokens must be in [0, N] = [0, ", N, "], got ",
              p.n_global);
  if (const auto g = args.optional_tensor("global_mask")) {
    TORCH_CHECK(g->scalar_type() == at::kBool && g->dim() == 2 && g->size(0) == B && g->size(1) == N &&
                    g->device() == q.device(),
                "ascender: global_mask must be a bool tensor [B, N] = [", B, ", ", N, "] on ", q.device(),
                " (True = global), got ", g->scalar_type(), " ", shape_str(*g), " on ", g->device());
  }
  if (const auto ids = args.optional_tensor("document_ids")) {
    TORCH_CHECK(!at::isFloatingType(ids->scalar_type()) && !at::isComplexType(ids->scalar_type()) &&
                    ids->scalar_type() != at::kBool && ids->dim() == 2 && ids->size(0) == B && ids->size(1) == N &&
                    ids->device() == q.device(),
                "ascender: document_ids must be an integer tensor [B, N] = [", B, ", ", N, "] on ", q.device(),
                ", got ", ids->scalar_type(), " ", shape_str(*ids), " on ", ids->device());
  }
  const std::string neighbours = args.text("neighbours");
  TORCH_CHECK(neighbours == "semantic" || neighbours == "scores",
              "ascender: neighbours must be 'semantic' or 'scores', got '", neighbours, "'");
  p.neighbours = neighbours == "scores" ? ASC_NEIGHBOURS_SCORES : ASC_NEIGHBOURS_SEMANTIC;
  const std::string softcap_bias = args.text("softcap_bias");
  TORCH_CHECK(softcap_bias == "inside" || softcap_bias == "outside",
              "ascender: softcap_bias must be 'inside' or 'outside', got '", softcap_bias, "'");
  // without beta^(other) (attn_bias, ALiBi) the two orders are one function: one flag, so one kernel path
  p.softcap_outside = softcap_bias == "outside" && (args.optional_tensor("attn_bias").has_value() ||
                                                    args.optional_tensor("alibi_slopes").has_value()) ? 1 : 0;
  const double dropout_p = args.real("dropout_p");
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "ascender: dropout_p must be in [0, 1), got ", dropout_p);
  p.dropout_scale = 1.0;
  if (dropout_p > 0.0) {
    const auto seed = args.optional_tensor("dropout_seed");
    TORCH_CHECK(seed.has_value(), "ascender: dropout_p = ", dropout_p, " > 0 needs dropout_seed, the int64 [2] (seed, ",
                "offset) of its Philox stream (ascender_attention draws it), got None");
    TORCH_CHECK(seed->scalar_type() == at::kLong && seed->dim() == 1 && (seed->size(0) == 2 || seed->size(0) == 3) &&
                    seed->device() == q.device(),
                "ascender: dropout_seed must be an int64 tensor [2] (seed, offset) or [3] (seed, offset, token offset) "
                "on ", q.device(), ", got ", seed->scalar_type(), " ", shape_str(*seed), " on ", seed->device());
    TORCH_CHECK(N < (int64_t(1) << 32), "ascender: dropout draws its mask from the tokens' indices as 32-bit words: ",
                "N must be below 2^32, got ", N);
    p.dropout_threshold = (uint32_t)(dropout_p * 4294967296.0);  // floor(p 2^32): p 2^32 is exact, below 2^32
    p.dropout_scale = 1.0 / (1.0 - dropout_p);
  }
  const bool structured = p.window_left >= 0 || p.window_right >= 0 || p.n_global > 0 ||
                          args.optional_tensor("global_mask").has_value() ||
                          args.optional_tensor("document_ids").has_value();
  TORCH_CHECK(!structured || p.mask_stats, "ascender: window_size, global_tokens, global_mask and document_ids ",
              "define which keys each row sees for every statistic (SPEC section 8): they need mask_stats=True");
  return p;
}

// The checked call of a backend: params and contiguous inputs (a 0-dim scalar read by every head, not copied to [H]:
// on CUDA that would be a kernel a call).
AscenderCall check_inputs(const OpCall& args, const AscenderBackend& backend) {
  AscenderCall call;
  call.p = check_arguments(args, backend.device, backend.half_types);
  const int64_t H = call.p.H;
  call.q = args.tensor("q").contiguous();
  call.k = args.tensor("k").contiguous();
  call.v = args.tensor("v").contiguous();
  call.z = args.tensor("z").contiguous();
  call.h = args.tensor("h").contiguous();
  for (int s = 0; s < ASC_NSCALAR; s++) {
    const at::Tensor& t = args.tensor(kScalarNames[s]);
    call.scalars.push_back(t.contiguous());
    if (t.dim() == 0) call.scalars_shared |= 1u << s;
  }
  if (const auto m = args.optional_tensor("key_padding_mask")) call.key_padding_mask = m->contiguous();
  const asc_params& p = call.p;
  if (const auto m = args.optional_tensor("attn_mask")) call.attn_mask = m->expand({p.B, p.H, p.Nq, p.N});
  if (const auto bias = args.optional_tensor("attn_bias")) call.attn_bias = bias->expand({p.B, p.H, p.Nq, p.N});
  if (const auto slopes = args.optional_tensor("alibi_slopes"))  // [B, H]
    call.alibi_slopes = slopes->dim() == 2 ? slopes->contiguous() : per_head(*slopes, H).expand({p.B, H}).contiguous();
  if (args.real("dropout_p") > 0.0) {  // the kernels read three words: (seed, offset) alone has token offset 0
    const at::Tensor seed = *args.optional_tensor("dropout_seed");
    call.dropout_seed = seed.size(0) == 3 ? seed.contiguous() : at::cat({seed, at::zeros({1}, seed.options())});
  }
  if (const auto sinks = args.optional_tensor("sinks")) call.sinks = sinks->dim() == 3 ? sinks->contiguous() : per_head(*sinks, H);
  if (const auto g = args.optional_tensor("global_mask")) call.global_mask = g->contiguous();
  if (const auto ids = args.optional_tensor("document_ids")) call.document_ids = ids->to(at::kLong).contiguous();
  return call;
}

const uint8_t* bytes(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? reinterpret_cast<const uint8_t*>(t->data_ptr()) : nullptr;
}

asc_fwd_args input_args(const AscenderCall& call) {
  asc_fwd_args a{};
  a.q = call.q.data_ptr();
  a.k = call.k.data_ptr();
  a.v = call.v.data_ptr();
  a.z = call.z.data_ptr();
  a.h = call.h.data_ptr();
  int s = 0;
#define ASC_SCALAR_ARG_(name) a.name = call.scalars[s++].data_ptr();
  ASC_SCALARS(ASC_SCALAR_ARG_)
#undef ASC_SCALAR_ARG_
  a.scalars_shared = call.scalars_shared;
  a.key_padding_mask = bytes(call.key_padding_mask);
  a.attn_mask = bytes(call.attn_mask);
  a.attn_bias = call.attn_bias.has_value() ? call.attn_bias->data_ptr() : nullptr;
  a.alibi_slopes = call.alibi_slopes.has_value() ? call.alibi_slopes->data_ptr() : nullptr;
  a.global_mask = bytes(call.global_mask);
  a.document_ids = call.document_ids.has_value() ? call.document_ids->data_ptr<int64_t>() : nullptr;
  a.sinks = call.sinks.has_value() ? call.sinks->data_ptr() : nullptr;
  a.dropout_seed = call.dropout_seed.has_value() ? call.dropout_seed->data_ptr<int64_t>() : nullptr;
  return a;
}

// Columns of the rows32 output: the float32 stats, c and u of float16 / bfloat16 (the dtypes whose own bits the
// backward cannot use, csrc/ascender.h), none for the others. Only the C++ backends that take half types see them.
int64_t rows32_width(const asc_params& p, at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16 ? ASC_ROWS32_WIDTH(&p) : 0;
}

// The forward's outputs (out, stats, u, c, nbr, aux, rows32), with the kernel pointed at them; `backward`: a
// backward will read them (rows32 gets its columns; else it has none).
std::vector<at::Tensor> forward_outputs(const AscenderCall& call, asc_fwd_args& a, bool backward) {
  const asc_params& p = call.p;
  const auto opts = call.q.options();
  const int64_t w32 = backward ? rows32_width(p, call.q.scalar_type()) : 0;
  std::vector<at::Tensor> out = {
      at::empty({p.B, p.H, p.Nq, p.dv}, opts), at::empty({p.B, p.H, p.Nq, ASC_NSTAT}, opts),
      at::empty({p.B, p.H, p.Nq, p.d}, opts),  at::empty({p.B, p.H, p.Nq, p.dz}, opts),
      at::empty({p.B, p.H, p.Nq, p.n_nbr}, opts.dtype(at::kLong)), at::empty({p.B, p.H, p.Nq, 2}, opts),
      at::empty({p.B, p.H, p.Nq, w32}, opts.dtype(at::kFloat))};
  a.out = out[0].data_ptr();
  a.stats = out[1].data_ptr();
  a.u = out[2].data_ptr();
  a.c = out[3].data_ptr();
  a.nbr = out[4].data_ptr<int64_t>();
  a.aux = out[5].data_ptr();
  a.rows32 = w32 > 0 ? out[6].data_ptr<float>() : nullptr;
  return out;
}

// An optional tensor shaped like a forward output (an incoming gradient, or a saved output handed
// back to the backward): `shape` and `dtype` on q's device, made contiguous.
c10::optional<at::Tensor> check_like_output(const c10::optional<at::Tensor>& g, const char* name,
                                            std::vector<int64_t> shape, at::ScalarType dtype, const at::Tensor& q) {
  if (!g.has_value()) return c10::nullopt;
  TORCH_CHECK(g->sizes() == at::IntArrayRef(shape), "ascender: ", name, " must have shape ", at::IntArrayRef(shape),
              ", got shape ", shape_str(*g));
  TORCH_CHECK(g->scalar_type() == dtype, "ascender: ", name, " must have dtype ", dtype, ", got ", g->scalar_type());
  TORCH_CHECK(g->device() == q.device(), "ascender: ", name, " must be on the device of q (", q.device(), "), got ",
              g->device());
  return g->contiguous();
}

// The forward's outputs handed back to the backward (all or none): the CPU and tiled CUDA backwards read
// them instead of running the forward again (docs/tiling.md); the tensors keep the pointers alive.
std::vector<at::Tensor> saved_outputs(const OpCall& args, const AscenderCall& call, asc_fwd_args& a) {
  const asc_params& p = call.p;
  const at::ScalarType st = call.q.scalar_type();
  const std::vector<std::pair<const char*, std::vector<int64_t>>> want = {
      {"out", {p.B, p.H, p.Nq, p.dv}}, {"stats", {p.B, p.H, p.Nq, ASC_NSTAT}}, {"u", {p.B, p.H, p.Nq, p.d}},
      {"c", {p.B, p.H, p.Nq, p.dz}},   {"nbr", {p.B, p.H, p.Nq, p.n_nbr}},     {"aux", {p.B, p.H, p.Nq, 2}},
      {"rows32", {p.B, p.H, p.Nq, rows32_width(p, st)}}};
  std::vector<at::Tensor> saved;
  for (const auto& [name, shape] : want) {
    const std::string n = name;
    const auto t = check_like_output(args.optional_tensor(name), name, shape,
                                     n == "nbr" ? at::kLong : n == "rows32" ? at::kFloat : st, call.q);
    if (t.has_value()) saved.push_back(*t);
  }
  if (saved.empty()) return saved;
  TORCH_CHECK(saved.size() == want.size(), "ascender: the backward takes all of the forward's saved outputs ",
              "(out, stats, u, c, nbr, aux, rows32) or none, got ", saved.size(), " of ", want.size());
  // nbr: per row, key indices in [0, N), then only -1 (the forward's lists). Checked on the CPU, whose backward
  // indexes keys with them; the CUDA backward reads a row's list up to its first entry outside [0, N) instead
  // (checking it there would synchronize the stream).
  if (saved[4].device().is_cpu()) {
    const int64_t* nb = saved[4].data_ptr<int64_t>();
    for (int64_t r = 0; r < p.B * p.H * p.Nq; r++) {
      bool ended = false;
      for (int64_t s = 0; s < p.n_nbr; s++) {
        const int64_t v = nb[r * p.n_nbr + s];
        TORCH_CHECK(v == -1 || (!ended && v >= 0 && v < p.N), "ascender: nbr must list, per row, key indices in ",
                    "[0, N) = [0, ", p.N, ") followed only by -1 (the forward's neighbour lists), got ", v,
                    " at [", r / (p.H * p.Nq), ", ", r / p.Nq % p.H, ", ", r % p.Nq, ", ", s, "]");
        ended |= v == -1;
      }
    }
  }
  a.out = saved[0].data_ptr();
  a.stats = saved[1].data_ptr();
  a.u = saved[2].data_ptr();
  a.c = saved[3].data_ptr();
  a.nbr = saved[4].data_ptr<int64_t>();
  a.aux = saved[5].data_ptr();
  a.rows32 = saved[6].numel() > 0 ? saved[6].data_ptr<float>() : nullptr;
  return saved;
}

}  // namespace

void ascender_check(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall args(op, stack);
  check_arguments(args, c10::nullopt, /*half_types=*/true);
  args.finish();
}

namespace {

void run_forward(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 void (*kernel)(const AscenderCall&, const asc_fwd_args&), bool backward) {
  OpCall args(op, stack);
  const AscenderCall call = check_inputs(args, backend);
  asc_fwd_args a = input_args(call);
  std::vector<at::Tensor> out = forward_outputs(call, a, backward);
  kernel(call, a);
  args.finish(out[0], out[1], out[2], out[3], out[4], out[5], out[6]);
}

}  // namespace

void ascender_fwd(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_forward(backend, op, stack, backend.forward, /*backward=*/true);
}

// ascender_fwd for a result nothing differentiates (the op has no autograd rule; Python calls it
// only then): the backend's inference kernel, the decode paths; its rows32 has no columns.
void ascender_infer(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_forward(backend, op, stack, backend.infer, /*backward=*/false);
}

// The same kernel with the inspection maps switched on; returns only the maps.
void ascender_maps(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall args(op, stack);
  const AscenderCall call = check_inputs(args, backend);
  const asc_params& p = call.p;
  asc_fwd_args a = input_args(call);
  const std::vector<at::Tensor> unused = forward_outputs(call, a, /*backward=*/false);
  std::vector<at::Tensor> m;
  for (int t = 0; t < 5; t++) m.push_back(at::empty({p.B, p.H, p.Nq, p.N}, call.q.options()));
  a.map_sbase = m[0].data_ptr();
  a.map_align = m[1].data_ptr();
  a.map_sep = m[2].data_ptr();
  a.map_coh = m[3].data_ptr();
  a.map_attn = m[4].data_ptr();
  backend.forward(call, a);
  args.finish(m[0], m[1], m[2], m[3], m[4]);
}

// Gradients of the fused forward: dq, dk, dv, dz, dh, dscalars [9, H] in SPEC order, with
// attn_bias_grad, dattn_bias [B, H, Nq, N] (else empty; Python sums it over broadcast dimensions), and
// with sinks dsinks [H] (per-row sinks: their shape; else empty).
// grad_aux and grad_u are the optional incoming gradients of the forward's aux and u outputs;
// out .. rows32 the forward's outputs (optional, all or none).
void ascender_bwd(const AscenderBackend& backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall args(op, stack);
  const AscenderCall call = check_inputs(args, backend);
  const asc_params& p = call.p;
  const at::Tensor& q = call.q;
  const at::Tensor& grad_out = args.tensor("grad_out");
  TORCH_CHECK(grad_out.dim() == 4 && grad_out.size(0) == p.B && grad_out.size(1) == p.H && grad_out.size(2) == p.Nq &&
                  grad_out.size(3) == p.dv,
              "ascender: grad_out must have the shape of the output [B, H, Nq, dv] = [", p.B, ", ", p.H, ", ", p.Nq,
              ", ", p.dv, "], got shape ", shape_str(grad_out));
  TORCH_CHECK(grad_out.scalar_type() == q.scalar_type(), "ascender: grad_out must have the dtype of q (",
              q.scalar_type(), "), got ", grad_out.scalar_type());
  TORCH_CHECK(grad_out.device() == q.device(), "ascender: grad_out must be on the device of q (", q.device(),
              "), got ", grad_out.device());
  const at::Tensor dy = grad_out.contiguous();
  const auto gaux = check_like_output(args.optional_tensor("grad_aux"), "grad_aux", {p.B, p.H, p.Nq, 2},
                                      q.scalar_type(), q);
  const auto gu = check_like_output(args.optional_tensor("grad_u"), "grad_u", {p.B, p.H, p.Nq, p.d},
                                    q.scalar_type(), q);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(call.k), dv = at::empty_like(call.v);
  at::Tensor dz = at::empty_like(call.z), dh = at::empty_like(call.h);
  at::Tensor dscalars = at::empty({ASC_NSCALAR, p.H}, q.options());
  const bool want_dbias = args.flag("attn_bias_grad") && call.attn_bias.has_value();  // O(N^2): only when asked for
  at::Tensor dbias = want_dbias ? at::empty({p.B, p.H, p.Nq, p.N}, q.options()) : at::empty({0}, q.options());
  at::Tensor dsinks = call.sinks.has_value() && call.sinks->dim() == 3 ? at::empty(call.sinks->sizes(), q.options())
                                                                      : at::empty({call.sinks.has_value() ? p.H : 0}, q.options());
  asc_bwd_args a{};
  a.in = input_args(call);
  const std::vector<at::Tensor> saved = saved_outputs(args, call, a.in);
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
  a.dsinks = call.sinks.has_value() ? dsinks.data_ptr() : nullptr;
  backend.backward(call, a);
  args.finish(dq, dk, dv, dz, dh, dscalars, dbias, dsinks);
}

}  // namespace asc_binding

// The argument check reads no data: one kernel for every device, Meta (fake tensors) included.
TORCH_LIBRARY_IMPL(ascender, CompositeExplicitAutograd, m) {
  m.impl("ascender_check", torch::CppFunction::makeFromBoxedFunction<&asc_binding::ascender_check>());
}
