// PyTorch binding of the attattr attention / attribution kernels (attattr_attn.cu).
//
// Registers two functional ops (torch.compile friendly; their fake implementations
// are registered from Python with torch.library.register_fake):
//
//   attattr::attn_forward(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale,
//                         bool causal, int stream=-1) -> (Tensor o, Tensor stats)
//   attattr::attr_from_grad(Tensor q, Tensor k, Tensor v, Tensor g, Tensor? mask,
//                           Tensor? stats, float scale, bool causal, bool want_maps,
//                           int stream=-1) -> (Tensor maps, Tensor head_sum, Tensor head_max)
//   attattr::attr_key_sums(Tensor q, Tensor k, Tensor v, Tensor g, Tensor? mask, Tensor? stats,
//                          float scale, bool causal, int read_from, int stream=-1)
//                          -> (Tensor key_sums, Tensor head_max)
//
// q, g: [B, H, n_q, d]; k, v: [B, H, n_k, d]; all float32, float16 or bfloat16 (one
// dtype; or bfloat16 q, k, v with a float32 g), on one CUDA device, 1 <= d <= 128.  Any strides work for the first three
// dimensions; the last must be contiguous (a copy is made otherwise).
// mask: additive key-padding mask [B or 1, n_k] (converted to float32).
// stats: [B, H, n_q, 2] float32 softmax row statistics (m, l) from attn_forward on the
//      same q, k, mask, scale and causal (p_ij = exp(s_ij - m_i) / l_i; the row
//      log-sum-exp is m + log l); computed here when absent.
// stream: a cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream);
//      -1 means the current stream of q's device.
// Outputs: o [B, H, n_q, d] in q's dtype, stats [B, H, n_q, 2] float32 ((-inf, 0) for a
// row with no allowed key, whose o row is 0); maps [B, H, n_q, n_k] float32 (shape [0] when
// want_maps is false), head_sum [B, n_q, n_k] float32, head_max [B, H] float32;
// key_sums [B, 2, n_k] float32: [b, 0, j] the attribution summed over heads and all query
// rows, [b, 1, j] over the query rows i >= read_from (zeros when read_from >= n_q), without
// any n_q x n_k array (the sources' quantity).
//
// float16 / bfloat16 inputs run their tile products on tensor cores (mma.sync, fp32
// accumulation); ATTATTR_TENSOR_CORES=0 in the environment (read at every call) selects the
// fp32 CUDA-core path instead, the path float32 inputs always take.
//
// Only torch headers here; the CUDA code is reached through the extern "C" launchers.

#include <torch/extension.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>

extern "C" {
int attattr_attn_forward(int dtype, const void* q, const void* k, const void* v,
                         const float* mask, void* o, float* stats, int B, int H, int n_q, int n_k,
                         int d, const long long* q_str, const long long* k_str,
                         const long long* v_str, const long long* o_str, long long mask_sb,
                         float scale, int causal, int tensor_cores, void* stream);
int attattr_attr_plan(int B, int H, int n_q, int n_k, int sms, int* heads_per_group,
                      long long* workspace_floats, long long* partial_floats);
int attattr_attr_from_grad(int dtype, int g_dtype, const void* q, const void* k, const void* v,
                           const void* g, const float* mask, const float* stats, float* maps,
                           float* head_sum, float* head_max, float* workspace, float* partials,
                           int heads_per_group, int B, int H, int n_q, int n_k, int d,
                           const long long* q_str, const long long* k_str,
                           const long long* v_str, const long long* g_str, long long mask_sb,
                           float scale, int causal, int tensor_cores, void* stream);
int attattr_attr_key_sums(int dtype, int g_dtype, const void* q, const void* k, const void* v,
                          const void* g, const float* mask, const float* stats, float* key_sums,
                          float* head_max, float* col_partials, float* partials, int read_from,
                          int heads_per_group, int B, int H, int n_q, int n_k, int d,
                          const long long* q_str, const long long* k_str,
                          const long long* v_str, const long long* g_str, long long mask_sb,
                          float scale, int causal, int tensor_cores, void* stream);
const char* attattr_error_string(int code);
}

namespace {

constexpr int64_t kMaxHeadDim = 128;
constexpr int64_t kMaxGrid = 65535;
constexpr int64_t kTile = 64;

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return 0;
    case at::kHalf:
      return 1;
    case at::kBFloat16:
      return 2;
    default:
      TORCH_CHECK(false, "attattr kernels support float32, float16 and bfloat16, got ", t);
  }
  return -1;
}

// Last dimension contiguous, the others arbitrary.
at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.stride(3) == 1 ? t : t.contiguous();
}

struct Strides3 {
  long long s[3];
};

Strides3 strides_of(const at::Tensor& t) {
  return Strides3{{static_cast<long long>(t.stride(0)), static_cast<long long>(t.stride(1)),
                   static_cast<long long>(t.stride(2))}};
}

void check_operand(const at::Tensor& t, const char* name, const at::Tensor& q,
                   bool same_dtype = true) {
  TORCH_CHECK(t.defined(), "attattr: ", name, " is undefined");
  TORCH_CHECK(t.is_cuda(), "attattr: ", name, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 4, "attattr: ", name, " must be 4-D [batch, head, pos, d_head], got ",
              t.sizes());
  TORCH_CHECK(t.device() == q.device(), "attattr: ", name, " is on ", t.device(), ", q on ",
              q.device());
  TORCH_CHECK(!same_dtype || t.scalar_type() == q.scalar_type(), "attattr: ", name,
              " has dtype ", t.scalar_type(), ", q has ", q.scalar_type());
}

struct Dims {
  int B, H, n_q, n_k, d;
};

Dims check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_operand(q, "q", q);
  check_operand(k, "k", q);
  check_operand(v, "v", q);
  dtype_code(q.scalar_type());
  const int64_t B = q.size(0), H = q.size(1), n_q = q.size(2), d = q.size(3);
  const int64_t n_k = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(1) == H && k.size(3) == d,
              "attattr: k must be [batch, head, key_pos, d_head] matching q ", q.sizes(),
              ", got ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "attattr: v must have k's shape ", k.sizes(), ", got ",
              v.sizes());
  TORCH_CHECK(d >= 1 && d <= kMaxHeadDim, "attattr kernels support head dims 1..", kMaxHeadDim,
              ", got ", d);
  TORCH_CHECK(B <= kMaxGrid && H <= kMaxGrid && (n_q + kTile - 1) / kTile <= kMaxGrid,
              "attattr: sizes too large for the kernel grid: ", q.sizes());
  TORCH_CHECK(n_q <= std::numeric_limits<int>::max() && n_k <= std::numeric_limits<int>::max(),
              "attattr: sequence too long");
  return Dims{static_cast<int>(B), static_cast<int>(H), static_cast<int>(n_q),
              static_cast<int>(n_k), static_cast<int>(d)};
}

// Returns (mask as float32 [Bm, n_k] with a contiguous last dim or undefined, batch stride).
std::pair<at::Tensor, long long> prepare_mask(const std::optional<at::Tensor>& mask,
                                              const at::Tensor& q, const Dims& dims) {
  if (!mask.has_value() || !mask->defined()) return {at::Tensor(), 0};
  at::Tensor m = *mask;
  TORCH_CHECK(m.device() == q.device(), "attattr: mask is on ", m.device(), ", q on ",
              q.device());
  TORCH_CHECK(m.dim() == 2 && (m.size(0) == dims.B || m.size(0) == 1) && m.size(1) == dims.n_k,
              "attattr kernels take an additive key-padding mask [batch, key_pos] = [", dims.B,
              ", ", dims.n_k, "], got ", m.sizes());
  m = m.to(at::kFloat);
  if (m.stride(1) != 1) m = m.contiguous();
  const long long sb = m.size(0) == 1 ? 0 : static_cast<long long>(m.stride(0));
  return {m, sb};
}

void* resolve_stream(const at::Tensor& q, int64_t stream) {
  if (stream != -1) return reinterpret_cast<void*>(static_cast<intptr_t>(stream));
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return impl.getStream(q.device()).native_handle();
}

// 1 unless ATTATTR_TENSOR_CORES is "0": half inputs on tensor cores.
int tensor_cores() {
  const char* env = std::getenv("ATTATTR_TENSOR_CORES");
  return (env != nullptr && std::strcmp(env, "0") == 0) ? 0 : 1;
}

void check_launch(int code, const char* what) {
  TORCH_CHECK(code == 0, "attattr: ", what, " kernel launch failed: ",
              attattr_error_string(code));
}

std::tuple<at::Tensor, at::Tensor> attn_forward_cuda(const at::Tensor& q_in,
                                                     const at::Tensor& k_in,
                                                     const at::Tensor& v_in,
                                                     const std::optional<at::Tensor>& mask,
                                                     double scale, bool causal, int64_t stream) {
  const Dims dims = check_qkv(q_in, k_in, v_in);
  c10::DeviceGuard guard(q_in.device());
  const at::Tensor q = last_dim_contiguous(q_in);
  const at::Tensor k = last_dim_contiguous(k_in);
  const at::Tensor v = last_dim_contiguous(v_in);
  auto [m, mask_sb] = prepare_mask(mask, q, dims);

  at::Tensor o = at::empty({dims.B, dims.H, dims.n_q, dims.d}, q.options());
  at::Tensor stats = at::empty({dims.B, dims.H, dims.n_q, 2}, q.options().dtype(at::kFloat));
  if (q.numel() == 0) return {o, stats};
  if (dims.n_k == 0) {
    o.zero_();
    stats.select(3, 0).fill_(-std::numeric_limits<float>::infinity());
    stats.select(3, 1).zero_();
    return {o, stats};
  }
  const Strides3 sq = strides_of(q), sk = strides_of(k), sv = strides_of(v), so = strides_of(o);
  const int code = attattr_attn_forward(
      dtype_code(q.scalar_type()), q.data_ptr(), k.data_ptr(), v.data_ptr(),
      m.defined() ? m.data_ptr<float>() : nullptr, o.data_ptr(), stats.data_ptr<float>(), dims.B,
      dims.H, dims.n_q, dims.n_k, dims.d, sq.s, sk.s, sv.s, so.s, mask_sb,
      static_cast<float>(scale), causal ? 1 : 0, tensor_cores(), resolve_stream(q, stream));
  check_launch(code, "attn_forward");
  return {o, stats};
}

// Both attribution ops: the maps / head sum (read_from < 0) or the per-key sums (read_from
// >= 0, returned in head_sum's place as [B, 2, n_k]; maps is then [0]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attribution_cuda(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& g_in, const std::optional<at::Tensor>& mask,
    const std::optional<at::Tensor>& stats_in, double scale, bool causal, bool want_maps,
    int64_t read_from, int64_t stream) {
  const bool key_mode = read_from >= 0;
  const Dims dims = check_qkv(q_in, k_in, v_in);
  // g has q's dtype, or is float32 beside bfloat16 q, k, v (the engine's bf16 scoring sums
  // the integral in float32): on tensor cores the kernel splits g into three bfloat16 parts
  // (exact); without them q, k, v are upcast to float32 and take the fp32 path.
  const bool mixed = q_in.scalar_type() == at::kBFloat16 && g_in.scalar_type() == at::kFloat;
  check_operand(g_in, "g", q_in, !mixed);
  TORCH_CHECK(g_in.sizes() == q_in.sizes(), "attattr: g must have q's shape ", q_in.sizes(),
              ", got ", g_in.sizes());
  c10::DeviceGuard guard(q_in.device());
  const int tc = tensor_cores();
  const bool upcast = mixed && !tc;
  const at::Tensor q = last_dim_contiguous(upcast ? q_in.to(at::kFloat) : q_in);
  const at::Tensor k = last_dim_contiguous(upcast ? k_in.to(at::kFloat) : k_in);
  const at::Tensor v = last_dim_contiguous(upcast ? v_in.to(at::kFloat) : v_in);
  const at::Tensor g = last_dim_contiguous(g_in);
  auto [m, mask_sb] = prepare_mask(mask, q, dims);
  void* st = resolve_stream(q, stream);

  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor maps = want_maps && !key_mode ? at::empty({dims.B, dims.H, dims.n_q, dims.n_k}, f32)
                                           : at::empty({0}, f32);
  at::Tensor head_sum = key_mode ? at::empty({dims.B, 2, dims.n_k}, f32)
                                 : at::empty({dims.B, dims.n_q, dims.n_k}, f32);
  at::Tensor head_max = at::empty({dims.B, dims.H}, f32);
  if (dims.B == 0 || dims.H == 0 || dims.n_q == 0 || dims.n_k == 0) {
    maps.zero_();
    head_sum.zero_();
    head_max.fill_(-std::numeric_limits<float>::infinity());
    return {maps, head_sum, head_max};
  }

  const Strides3 sq = strides_of(q), sk = strides_of(k), sv = strides_of(v), sg = strides_of(g);
  at::Tensor stats;
  if (stats_in.has_value() && stats_in->defined()) {
    stats = *stats_in;
    TORCH_CHECK(stats.device() == q.device() && stats.scalar_type() == at::kFloat &&
                    stats.dim() == 4 && stats.size(0) == dims.B && stats.size(1) == dims.H &&
                    stats.size(2) == dims.n_q && stats.size(3) == 2,
                "attattr: stats must be float32 [batch, head, query_pos, 2] = [", dims.B, ", ",
                dims.H, ", ", dims.n_q, ", 2] on q's device (from attn_forward), got ",
                stats.scalar_type(), " ", stats.sizes());
    stats = stats.contiguous();
  } else {
    stats = at::empty({dims.B, dims.H, dims.n_q, 2}, f32);
    const int code = attattr_attn_forward(
        dtype_code(q.scalar_type()), q.data_ptr(), k.data_ptr(), v.data_ptr(),
        m.defined() ? m.data_ptr<float>() : nullptr, nullptr, stats.data_ptr<float>(), dims.B,
        dims.H, dims.n_q, dims.n_k, dims.d, sq.s, sk.s, sv.s, nullptr, mask_sb,
        static_cast<float>(scale), causal ? 1 : 0, tc, st);
    check_launch(code, "attention statistics");
  }

  // Heads per block and scratch sizes for this device (see attattr_attr_plan).
  int heads_per_group = 0;
  long long workspace_floats = 0, partial_floats = 0;
  check_launch(attattr_attr_plan(dims.B, dims.H, dims.n_q, dims.n_k, 0, &heads_per_group,
                                 &workspace_floats, &partial_floats),
               "attribution plan");
  at::Tensor partials = at::empty({static_cast<int64_t>(partial_floats)}, f32);
  if (key_mode) {
    const int64_t groups = (dims.H + heads_per_group - 1) / heads_per_group;
    const int64_t q_tiles = (dims.n_q + kTile - 1) / kTile;
    at::Tensor col_partials = at::empty({dims.B * groups * q_tiles * 2 * dims.n_k}, f32);
    const int from = static_cast<int>(std::min<int64_t>(read_from, dims.n_q));
    const int code = attattr_attr_key_sums(
        dtype_code(q.scalar_type()), dtype_code(g.scalar_type()), q.data_ptr(), k.data_ptr(),
        v.data_ptr(), g.data_ptr(), m.defined() ? m.data_ptr<float>() : nullptr,
        stats.data_ptr<float>(), head_sum.data_ptr<float>(), head_max.data_ptr<float>(),
        col_partials.data_ptr<float>(), partials.data_ptr<float>(), from, heads_per_group,
        dims.B, dims.H, dims.n_q, dims.n_k, dims.d, sq.s, sk.s, sv.s, sg.s, mask_sb,
        static_cast<float>(scale), causal ? 1 : 0, tc, st);
    check_launch(code, "attribution key sums");
    return {maps, head_sum, head_max};
  }
  at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_floats)}, f32);
  const int code = attattr_attr_from_grad(
      dtype_code(q.scalar_type()), dtype_code(g.scalar_type()), q.data_ptr(), k.data_ptr(),
      v.data_ptr(), g.data_ptr(),
      m.defined() ? m.data_ptr<float>() : nullptr, stats.data_ptr<float>(),
      want_maps ? maps.data_ptr<float>() : nullptr, head_sum.data_ptr<float>(),
      head_max.data_ptr<float>(), workspace_floats > 0 ? workspace.data_ptr<float>() : nullptr,
      partials.data_ptr<float>(), heads_per_group, dims.B, dims.H, dims.n_q, dims.n_k, dims.d,
      sq.s, sk.s, sv.s, sg.s, mask_sb, static_cast<float>(scale), causal ? 1 : 0, tc, st);
  check_launch(code, "attribution");
  return {maps, head_sum, head_max};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attr_from_grad_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& stats, double scale,
    bool causal, bool want_maps, int64_t stream) {
  return attribution_cuda(q, k, v, g, mask, stats, scale, causal, want_maps, -1, stream);
}

std::tuple<at::Tensor, at::Tensor> attr_key_sums_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& stats, double scale,
    bool causal, int64_t read_from, int64_t stream) {
  TORCH_CHECK(read_from >= 0, "attattr: read_from must be >= 0, got ", read_from);
  auto out = attribution_cuda(q, k, v, g, mask, stats, scale, causal, false, read_from, stream);
  return {std::get<1>(out), std::get<2>(out)};
}

}  // namespace

TORCH_LIBRARY(attattr, m) {
  m.def(
      "attn_forward(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal, "
      "int stream=-1) -> (Tensor, Tensor)");
  m.def(
      "attr_from_grad(Tensor q, Tensor k, Tensor v, Tensor g, Tensor? mask, Tensor? stats, "
      "float scale, bool causal, bool want_maps, int stream=-1) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attr_key_sums(Tensor q, Tensor k, Tensor v, Tensor g, Tensor? mask, Tensor? stats, "
      "float scale, bool causal, int read_from, int stream=-1) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attattr, CUDA, m) {
  m.impl("attn_forward", &attn_forward_cuda);
  m.impl("attr_from_grad", &attr_from_grad_cuda);
  m.impl("attr_key_sums", &attr_key_sums_cuda);
}
