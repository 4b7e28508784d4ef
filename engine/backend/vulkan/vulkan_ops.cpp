#include "backend/vulkan/vulkan_ops.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>

#include "backend/vulkan/vulkan_shaders.hpp"
#include "quant/type_traits.hpp"

namespace pico::backend::vulkan {
namespace {

constexpr uint32_t kMaxGroups = 65535;  // per grid dimension (Vulkan's guaranteed minimum)
// Tokens per workgroup of the tiled matmul: matmul_body.glsl's TOKEN_TILE.
constexpr int64_t kMatmulTokenTile = 8;
// Lanes per row of the matmul shaders (matmul_body.glsl's LANES): a workgroup takes
// kWorkgroupSize / kMatmulLanes rows.
constexpr uint64_t kMatmulLanes = 32;
constexpr uint64_t kMatmulRowsPerGroup = kWorkgroupSize / kMatmulLanes;
static_assert(kWorkgroupSize % kMatmulLanes == 0);
// Rows per 32 lanes of the tiled matmul (matmul_body.glsl's ROW_TILE).
constexpr uint64_t kMatmulTiledRows = 4;

uint32_t checked_u32(int64_t v, const char* what) {
  if (v < 0 || v > static_cast<int64_t>(UINT32_MAX)) throw std::invalid_argument(std::string("vulkan: ") + what + " out of range");
  return static_cast<uint32_t>(v);
}

// `groups` workgroups as a grid of x <= 65535 by y.
std::array<uint32_t, 2> grid(uint64_t groups) {
  if (groups <= kMaxGroups) return {static_cast<uint32_t>(groups), 1};
  return {kMaxGroups, static_cast<uint32_t>((groups + kMaxGroups - 1) / kMaxGroups)};
}

// The matmul, get_rows and experts' matmul shaders of a weight type.
struct TypeShaders {
  Shader matmul, get_rows, matmul_id, matmul_tiled;
};
#define PICO_TYPE_SHADERS(type) TypeShaders{Shader::matmul_##type, Shader::get_rows_##type, Shader::matmul_id_##type, Shader::matmul_tiled_##type}
std::optional<TypeShaders> type_shaders(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return PICO_TYPE_SHADERS(f32);
    case GgmlType::F16: return PICO_TYPE_SHADERS(f16);
    case GgmlType::BF16: return PICO_TYPE_SHADERS(bf16);
    case GgmlType::Q8_0: return PICO_TYPE_SHADERS(q8_0);
    case GgmlType::Q4_0: return PICO_TYPE_SHADERS(q4_0);
    case GgmlType::Q4_1: return PICO_TYPE_SHADERS(q4_1);
    case GgmlType::Q5_0: return PICO_TYPE_SHADERS(q5_0);
    case GgmlType::Q5_1: return PICO_TYPE_SHADERS(q5_1);
    case GgmlType::IQ4_NL: return PICO_TYPE_SHADERS(iq4_nl);
    case GgmlType::Q2_K: return PICO_TYPE_SHADERS(q2_K);
    case GgmlType::Q3_K: return PICO_TYPE_SHADERS(q3_K);
    case GgmlType::Q4_K: return PICO_TYPE_SHADERS(q4_K);
    case GgmlType::Q5_K: return PICO_TYPE_SHADERS(q5_K);
    case GgmlType::Q6_K: return PICO_TYPE_SHADERS(q6_K);
    default: return std::nullopt;
  }
}
#undef PICO_TYPE_SHADERS

TypeShaders shaders_of(GgmlType type) {
  const auto s = type_shaders(type);
  if (!s) throw std::invalid_argument("vulkan: no shaders for " + std::string(type_traits(type).name));
  return *s;
}

// A whole buffer of floats from `float_offset`.
BufferRange floats(BufferRange r, int64_t float_offset, int64_t count) {
  return {r.buffer, r.offset + static_cast<size_t>(float_offset) * sizeof(float), static_cast<size_t>(count) * sizeof(float)};
}

}  // namespace

bool Ops::supports(Op op, GgmlType type) {
  switch (op) {
    case Op::matmul:
    case Op::get_rows: return type_shaders(type).has_value();
    case Op::rms_norm:
    case Op::add:
    case Op::mul:
    case Op::silu:
    case Op::sigmoid:
    case Op::softplus:
    case Op::gelu:
    case Op::gelu_erf:
    case Op::scale:
    case Op::layer_norm:
    case Op::l2_norm:
    case Op::softmax:
    case Op::rope: return type == GgmlType::F32;
    case Op::attention: return type == GgmlType::F16;  // the cache's type
    case Op::ssm_conv:
    case Op::delta_rule:
    case Op::moe_route: return type == GgmlType::F32;
    case Op::moe_ffn: return type_shaders(type).has_value();
    default: return false;
  }
}

DeviceWeight Ops::upload(const Weight& w) {
  return upload_rows(w.type, w.cols, w.rows, w.data);
}

DeviceExperts Ops::upload(const ExpertWeights& w) {
  const uint64_t range = device_.info().max_storage_range;
  auto stack = [&](const ExpertStack& s) {
    const uint64_t bytes = static_cast<uint64_t>(s.expert_bytes()) * static_cast<uint64_t>(s.n_expert);
    if (bytes > range)
      throw std::invalid_argument("vulkan: an expert stack of " + std::to_string(bytes) +
                                  " bytes is over one binding's range (" + std::to_string(range) +
                                  "): not supported yet");
    DeviceWeight d = upload_rows(s.type, s.cols, s.rows * s.n_expert, s.data);
    d.rows = s.rows;  // one expert's
    return d;
  };
  if (w.gate.n_expert != w.up.n_expert || w.gate.n_expert != w.down.n_expert || w.gate.rows != w.up.rows ||
      w.down.cols != w.gate.rows || w.up.cols != w.gate.cols || w.down.rows != w.gate.cols)
    throw std::invalid_argument("vulkan: expert gate, up and down shapes do not fit together");
  return DeviceExperts{stack(w.gate), stack(w.up), stack(w.down), w.gate.n_expert};
}

DeviceWeight Ops::upload_rows(GgmlType type, int64_t cols, int64_t rows, const void* data) {
  if (!supports(Op::matmul, type))
    throw std::invalid_argument(std::string("vulkan: weights of type ") + std::string(type_traits(type).name) + " are not supported yet");
  DeviceWeight d;
  d.type = type;
  d.cols = cols;
  d.rows = rows;
  const auto row = bytes_of(type_traits(type), static_cast<uint64_t>(cols));
  if (!row) throw std::invalid_argument("vulkan: a row is not whole blocks of its type");
  d.row_bytes = static_cast<size_t>(*row);
  const size_t bytes = d.row_bytes * static_cast<size_t>(rows);
  // Whole 32-bit words: shaders that read the weights as words (F32, F16, BF16) may touch
  // the last one's unused half.
  d.buffer = device_.allocate((bytes + 3) / 4 * 4);
  device_.upload(d.buffer, 0, data, bytes);
  return d;
}

void Ops::matmul(const DeviceWeight& w, BufferRange x, int64_t tokens, BufferRange y, int64_t y_stride) {
  // A batch goes through the tiled shader, a token alone through the plain one: the
  // same bits per output (matmul_body.glsl).
  const Shader shader = tokens > 1 ? shaders_of(w.type).matmul_tiled : shaders_of(w.type).matmul;
  const DeviceInfo& info = device_.info();
  // A matrix larger than one binding may span (lavapipe: 128 MiB) goes in chunks of
  // rows, each starting at an offset the device accepts.
  const uint64_t align = std::max<uint64_t>(info.storage_offset_alignment, 1);
  const uint64_t rows_per_align = align / std::gcd<uint64_t>(align, w.row_bytes);
  uint64_t chunk = std::max<uint64_t>(info.max_storage_range / w.row_bytes, 1);
  chunk = std::max<uint64_t>(chunk / rows_per_align * rows_per_align, rows_per_align);
  if (chunk * w.row_bytes > info.max_storage_range)
    throw std::invalid_argument("vulkan: a row of " + std::to_string(w.row_bytes) + " bytes does not fit one binding");
  const uint32_t token_groups = checked_u32(tokens > 1 ? (tokens + kMatmulTokenTile - 1) / kMatmulTokenTile : 1, "tokens");
  if (token_groups > kMaxGroups) throw std::invalid_argument("vulkan: too many tokens in one matmul");
  const BufferRange xs = floats(x, 0, tokens * w.cols);
  for (int64_t first = 0; first < w.rows; first += static_cast<int64_t>(chunk)) {
    const int64_t rows = std::min<int64_t>(static_cast<int64_t>(chunk), w.rows - first);
    const struct {
      uint32_t cols, rows, y_stride, row_offset, tokens;
    } push{checked_u32(w.cols, "cols"), static_cast<uint32_t>(rows), checked_u32(y_stride, "y stride"),
           static_cast<uint32_t>(first), checked_u32(tokens, "tokens")};
    const size_t offset = static_cast<size_t>(first) * w.row_bytes;
    const size_t range = std::min((static_cast<size_t>(rows) * w.row_bytes + 3) / 4 * 4, w.buffer.size() - offset);
    const BufferRange weights{&w.buffer, offset, range};
    const BufferRange out = floats(y, 0, (tokens - 1) * y_stride + w.rows);
    const BufferRange bindings[] = {weights, xs, out};
    const uint64_t rows_per_group = kMatmulRowsPerGroup * (tokens > 1 ? kMatmulTiledRows : 1);
    const auto [gx, gz] = grid((static_cast<uint64_t>(rows) + rows_per_group - 1) / rows_per_group);
    device_.dispatch(shader, bindings, &push, sizeof push, gx, token_groups, gz);
  }
}

void Ops::get_rows(const DeviceWeight& table, BufferRange ids, int64_t count, BufferRange out) {
  const struct {
    uint32_t cols, rows;
  } push{checked_u32(table.cols, "cols"), checked_u32(table.rows, "rows")};
  const BufferRange bindings[] = {{&table.buffer, 0, 0}, {ids.buffer, ids.offset, static_cast<size_t>(count) * 4},
                                  floats(out, 0, count * table.cols)};
  const auto [gx, gy] = grid(static_cast<uint64_t>(count));
  device_.dispatch(shaders_of(table.type).get_rows, bindings, &push, sizeof push, gx, gy);
}

void Ops::rms_norm(BufferRange x, BufferRange weight, int64_t n, int64_t rows, float eps, BufferRange y) {
  const struct {
    uint32_t n, has_weight;
    float eps;
  } push{checked_u32(n, "n"), weight.buffer ? 1u : 0u, eps};
  // Without a weight the binding still needs a buffer: x stands in, never read.
  const BufferRange w = weight.buffer ? floats(weight, 0, n) : floats(x, 0, n);
  const BufferRange bindings[] = {floats(x, 0, n * rows), w, floats(y, 0, n * rows)};
  const auto [gx, gy] = grid(static_cast<uint64_t>(rows));
  device_.dispatch(Shader::rms_norm, bindings, &push, sizeof push, gx, gy);
}

void Ops::elementwise(Shader shader, BufferRange a, BufferRange b, int64_t n, int64_t rows, int64_t b_rows, BufferRange y) {
  if (b_rows != 1 && b_rows != rows) throw std::invalid_argument("vulkan: b must have 1 row or as many as a");
  const int64_t count = n * rows;
  const struct {
    uint32_t n, count, b_rows, per_row;
  } push{checked_u32(n, "n"), checked_u32(count, "count"), checked_u32(b_rows, "b rows"), 0};
  const BufferRange bindings[] = {floats(a, 0, count), floats(b, 0, n * b_rows), floats(y, 0, count)};
  const auto [gx, gy] = grid((static_cast<uint64_t>(count) + kWorkgroupSize - 1) / kWorkgroupSize);
  device_.dispatch(shader, bindings, &push, sizeof push, gx, gy);
}

void Ops::scale_rows(BufferRange x, BufferRange factors, int64_t n, int64_t rows) {
  const int64_t count = n * rows;
  const struct {
    uint32_t n, count, b_rows, per_row;
  } push{checked_u32(n, "n"), checked_u32(count, "count"), checked_u32(rows, "rows"), 1};
  const BufferRange bindings[] = {floats(x, 0, count), floats(factors, 0, rows), floats(x, 0, count)};
  const auto [gx, gy] = grid((static_cast<uint64_t>(count) + kWorkgroupSize - 1) / kWorkgroupSize);
  device_.dispatch(Shader::mul, bindings, &push, sizeof push, gx, gy);
}

void Ops::add(BufferRange a, BufferRange b, int64_t n, int64_t rows, int64_t b_rows, BufferRange y) {
  elementwise(Shader::add, a, b, n, rows, b_rows, y);
}

void Ops::mul(BufferRange a, BufferRange b, int64_t n, int64_t rows, int64_t b_rows, BufferRange y) {
  elementwise(Shader::mul, a, b, n, rows, b_rows, y);
}

void Ops::unary(UnaryOp op, BufferRange x, int64_t count, BufferRange y, float factor) {
  const struct {
    uint32_t count, op;
    float factor;
  } push{checked_u32(count, "count"), static_cast<uint32_t>(op), factor};
  const BufferRange bindings[] = {floats(x, 0, count), floats(y, 0, count)};
  const auto [gx, gy] = grid((static_cast<uint64_t>(count) + kWorkgroupSize - 1) / kWorkgroupSize);
  device_.dispatch(Shader::unary, bindings, &push, sizeof push, gx, gy);
}

void Ops::silu(BufferRange x, int64_t count, BufferRange y) { unary(UnaryOp::silu, x, count, y); }
void Ops::sigmoid(BufferRange x, int64_t count, BufferRange y) { unary(UnaryOp::sigmoid, x, count, y); }
void Ops::softplus(BufferRange x, int64_t count, BufferRange y) { unary(UnaryOp::softplus, x, count, y); }
void Ops::gelu(BufferRange x, int64_t count, BufferRange y) { unary(UnaryOp::gelu, x, count, y); }
void Ops::gelu_erf(BufferRange x, int64_t count, BufferRange y) { unary(UnaryOp::gelu_erf, x, count, y); }
void Ops::scale(BufferRange x, int64_t count, float factor) { unary(UnaryOp::scale, x, count, x, factor); }

void Ops::layer_norm(BufferRange x, BufferRange weight, BufferRange bias, int64_t n, int64_t rows, float eps,
                     BufferRange y) {
  const struct {
    uint32_t n, has_weight, has_bias;
    float eps;
  } push{checked_u32(n, "n"), weight.buffer ? 1u : 0u, bias.buffer ? 1u : 0u, eps};
  // An absent weight or bias binds x in its place, never read.
  const BufferRange bindings[] = {floats(x, 0, n * rows), floats(weight.buffer ? weight : x, 0, n),
                                  floats(bias.buffer ? bias : x, 0, n), floats(y, 0, n * rows)};
  const auto [gx, gy] = grid(static_cast<uint64_t>(rows));
  device_.dispatch(Shader::layer_norm, bindings, &push, sizeof push, gx, gy);
}

void Ops::l2_norm(BufferRange x, int64_t n, int64_t rows, float eps, BufferRange y) {
  const struct {
    uint32_t n;
    float eps;
  } push{checked_u32(n, "n"), eps};
  const BufferRange bindings[] = {floats(x, 0, n * rows), floats(y, 0, n * rows)};
  const auto [gx, gy] = grid(static_cast<uint64_t>(rows));
  device_.dispatch(Shader::l2_norm, bindings, &push, sizeof push, gx, gy);
}

void Ops::round_rows(BufferRange x, int64_t n, int64_t rows, GgmlType weight_type, BufferRange y) {
  const auto partner = type_traits(weight_type).dot_partner;
  if (!partner) throw std::invalid_argument("vulkan: round_rows: type has no dot partner");
  enum RoundKind : uint32_t { kF16, kBF16, kQ8_0, kQ8_K, kF32 };  // round_rows.comp's kinds
  RoundKind kind;
  switch (*partner) {
    case GgmlType::F32: kind = kF32; break;
    case GgmlType::F16: kind = kF16; break;
    case GgmlType::BF16: kind = kBF16; break;
    case GgmlType::Q8_0:
    case GgmlType::Q8_1: kind = kQ8_0; break;  // the same codes; Q8_1's sum is not a value
    case GgmlType::Q8_K: kind = kQ8_K; break;
    default: throw std::invalid_argument("vulkan: round_rows: no rounding to " + std::string(type_traits(*partner).name));
  }
  const int64_t block = type_traits(*partner).block_size;
  if (n % block != 0) throw std::invalid_argument("vulkan: round_rows: rows of " + std::to_string(n) + " values are not whole blocks");
  constexpr uint64_t kRoundGroupValues = 256;  // round_rows.comp's values per workgroup: whole blocks
  const struct {
    uint32_t count, kind;
  } push{checked_u32(n * rows, "values"), kind};
  if (kind == kF32 && x.buffer == y.buffer && x.offset == y.offset) return;  // nothing to round or move
  const BufferRange bindings[] = {floats(x, 0, n * rows), floats(y, 0, n * rows)};
  const auto [gx, gy] = grid((static_cast<uint64_t>(n * rows) + kRoundGroupValues - 1) / kRoundGroupValues);
  device_.dispatch(Shader::round_rows, bindings, &push, sizeof push, gx, gy);
}

void Ops::store_kv_f16(BufferRange x, int64_t n, int64_t x_stride, BufferRange rows, int64_t count, const Buffer& pool) {
  if (n % 2 != 0) throw std::invalid_argument("vulkan: store_kv_f16: rows of an odd number of values");
  if (count <= 0) return;
  const int64_t pairs = count * (n / 2);
  const struct {
    uint32_t n, src_stride, count;
  } push{checked_u32(n, "row"), checked_u32(x_stride, "row stride"), checked_u32(pairs, "values")};
  const BufferRange bindings[] = {floats(x, 0, (count - 1) * x_stride + n),
                                  {rows.buffer, rows.offset, static_cast<size_t>(count) * sizeof(uint32_t)},
                                  {&pool, 0, 0}};
  const auto [gx, gy] = grid((static_cast<uint64_t>(pairs) + kWorkgroupSize - 1) / kWorkgroupSize);
  device_.dispatch(Shader::store_kv_f16, bindings, &push, sizeof push, gx, gy);
}

void Ops::argmax_rows(BufferRange x, int64_t n, int64_t x_rows, BufferRange rows, int64_t count, BufferRange out) {
  if (count <= 0) return;
  if (n <= 0) throw std::invalid_argument("vulkan: argmax_rows: empty rows");
  const struct {
    uint32_t n, count;
  } push{checked_u32(n, "row"), checked_u32(count, "rows")};
  const BufferRange bindings[] = {floats(x, 0, x_rows * n),
                                  {rows.buffer, rows.offset, static_cast<size_t>(count) * sizeof(uint32_t)},
                                  floats(out, 0, 2 * count)};
  const auto [gx, gy] = grid(static_cast<uint64_t>(count));
  device_.dispatch(Shader::argmax_rows, bindings, &push, sizeof push, gx, gy);
}

void Ops::softmax(BufferRange x, int64_t n, int64_t rows) {
  const struct {
    uint32_t n;
  } push{checked_u32(n, "n")};
  const BufferRange bindings[] = {floats(x, 0, n * rows)};
  const auto [gx, gy] = grid(static_cast<uint64_t>(rows));
  device_.dispatch(Shader::softmax, bindings, &push, sizeof push, gx, gy);
}

void Ops::attention(BufferRange q, int64_t q_row_stride, const DeviceKvLayer& kv, BufferRange queries,
                    BufferRange page_table, int64_t n_queries, int64_t max_keys, const AttentionParams& params,
                    BufferRange out) {
  if (params.n_head_kv <= 0 || params.n_head % params.n_head_kv != 0 || params.n_head_kv != kv.n_kv_heads ||
      params.head_dim_k != kv.head_dim_k || params.head_dim_v != kv.head_dim_v)
    throw std::invalid_argument("vulkan: attention: the heads do not match the cache's");
  if (n_queries <= 0) return;
  if (n_queries > kMaxGroups || params.n_head > kMaxGroups) throw std::invalid_argument("vulkan: attention: too many queries");
  const int64_t keys = std::max<int64_t>(max_keys, 1);
  const size_t scores_bytes = static_cast<size_t>(n_queries * params.n_head * keys) * sizeof(float);
  // Grown by half again at least: a context that grows a token a step reallocates
  // rarely (the old buffer lives until the recorded work has run; Device::free).
  if (scores_.size() < scores_bytes) scores_ = device_.allocate(std::max(scores_bytes, scores_.size() + scores_.size() / 2));
  const struct {
    uint32_t q_row_stride, n_head, n_head_kv, dk, dv, k_row, v_row, page_shift, max_keys, window;
    float scale, softcap;
  } push{checked_u32(q_row_stride, "q stride"),
         checked_u32(params.n_head, "heads"),
         checked_u32(params.n_head_kv, "kv heads"),
         checked_u32(params.head_dim_k, "head dim"),
         checked_u32(params.head_dim_v, "head dim"),
         checked_u32(kv.n_kv_heads * kv.head_dim_k, "k row"),
         checked_u32(kv.n_kv_heads * kv.head_dim_v, "v row"),
         checked_u32(kv.page_shift, "page shift"),
         static_cast<uint32_t>(keys),
         checked_u32(params.window, "window"),
         params.scale,
         params.softcap};
  const BufferRange bindings[] = {floats(q, 0, (n_queries - 1) * q_row_stride + params.n_head * params.head_dim_k),
                                  {kv.k, 0, 0},
                                  {kv.v, 0, 0},
                                  {queries.buffer, queries.offset, static_cast<size_t>(n_queries) * sizeof(DeviceQuery)},
                                  page_table,
                                  {&scores_, 0, scores_bytes},
                                  floats(out, 0, n_queries * params.n_head * params.head_dim_v)};
  device_.dispatch(Shader::attention_f16, bindings, &push, sizeof push, static_cast<uint32_t>(n_queries),
                   static_cast<uint32_t>(params.n_head));
}

void Ops::ssm_conv(BufferRange x, int64_t channels, BufferRange weights, int64_t taps, BufferRange sequences,
                   int64_t n_sequences, const Buffer& conv_states, int64_t rows, BufferRange y) {
  if (taps < 1 || taps > 8) throw std::invalid_argument("vulkan: ssm_conv takes 1 to 8 taps");
  if (n_sequences <= 0) return;
  const struct {
    uint32_t channels, taps;
  } push{checked_u32(channels, "channels"), static_cast<uint32_t>(taps)};
  const BufferRange bindings[] = {floats(x, 0, rows * channels), floats(weights, 0, taps * channels),
                                  {sequences.buffer, sequences.offset, static_cast<size_t>(n_sequences) * sizeof(DeviceSequence)},
                                  {&conv_states, 0, 0}, floats(y, 0, rows * channels)};
  device_.dispatch(Shader::ssm_conv, bindings, &push, sizeof push,
                   static_cast<uint32_t>((channels + kWorkgroupSize - 1) / kWorkgroupSize),
                   checked_u32(n_sequences, "sequences"));
}

void Ops::delta_rule(BufferRange q, BufferRange k, BufferRange v, int64_t row_stride, BufferRange log_decay,
                     BufferRange beta, BufferRange sequences, int64_t n_sequences, const Buffer& ssm_states,
                     const DeltaRuleParams& params, int64_t rows, BufferRange out) {
  if (params.n_k_heads <= 0 || params.n_v_heads % params.n_k_heads != 0 || params.head_dim <= 0)
    throw std::invalid_argument("vulkan: delta_rule: bad head counts");
  if (n_sequences <= 0) return;
  const struct {
    uint32_t row_stride, n_k_heads, n_v_heads, d, grouped;
    float scale;
  } push{checked_u32(row_stride, "row stride"), checked_u32(params.n_k_heads, "key heads"),
         checked_u32(params.n_v_heads, "value heads"), checked_u32(params.head_dim, "head dim"),
         params.grouped_heads ? 1u : 0u, 1.0f / std::sqrt(static_cast<float>(params.head_dim))};
  const int64_t heads = params.n_v_heads;
  const BufferRange bindings[] = {q, k, v, floats(log_decay, 0, rows * heads), floats(beta, 0, rows * heads),
                                  {sequences.buffer, sequences.offset, static_cast<size_t>(n_sequences) * sizeof(DeviceSequence)},
                                  {&ssm_states, 0, 0}, floats(out, 0, rows * heads * params.head_dim)};
  device_.dispatch(Shader::delta_rule, bindings, &push, sizeof push, checked_u32(n_sequences, "sequences"),
                   checked_u32(heads, "value heads"));
}

void Ops::rope(BufferRange x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, BufferRange pos,
               const RopeParams& params) {
  const int64_t n_dims = params.n_dims;
  if (n_dims <= 0 || n_dims > head_dim || n_dims % 2 != 0) throw std::invalid_argument("vulkan: rope: bad n_dims");
  // YaRN's correction range and magnitude, as the CPU backend computes them.
  float corr_low = 0.0f, corr_high = 0.0f, mscale = params.attn_factor;
  if (params.ext_factor != 0.0f) {
    const auto corr_dim = [&](float n_rot) {
      return static_cast<float>(n_dims) *
             std::log(static_cast<float>(params.n_ctx_orig) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
             (2.0f * std::log(params.freq_base));
    };
    corr_low = std::max(0.0f, std::floor(corr_dim(params.beta_fast)));
    corr_high = std::min(static_cast<float>(n_dims - 1), std::ceil(corr_dim(params.beta_slow)));
    mscale *= std::fma(0.1f, std::log(1.0f / params.freq_scale), 1.0f);
  }
  const struct {
    uint32_t row_stride, heads, head_dim, n_dims, neox;
    float theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale;
  } push{checked_u32(row_stride, "row stride"), checked_u32(heads, "heads"), checked_u32(head_dim, "head dim"),
         static_cast<uint32_t>(n_dims), params.neox ? 1u : 0u,
         std::pow(params.freq_base, -2.0f / static_cast<float>(n_dims)), params.freq_scale, params.ext_factor,
         corr_low, corr_high, mscale};
  const BufferRange bindings[] = {floats(x, 0, (tokens - 1) * row_stride + heads * head_dim),
                                  {pos.buffer, pos.offset, static_cast<size_t>(tokens) * 4}};
  // A workgroup per WG pairs of a token (a decode step's single token still spreads
  // over the device).
  const uint64_t pair_groups = (static_cast<uint64_t>(heads) * static_cast<uint64_t>(n_dims / 2) + kWorkgroupSize - 1) /
                               kWorkgroupSize;
  const auto [gx, gy] = grid(static_cast<uint64_t>(tokens) * pair_groups);
  device_.dispatch(Shader::rope, bindings, &push, sizeof push, gx, gy);
}

void Ops::moe_route(BufferRange logits, int64_t n_expert, int64_t tokens, int64_t k, bool normalize,
                    BufferRange experts, BufferRange weights) {
  if (k <= 0 || k > n_expert) throw std::invalid_argument("vulkan: moe_route needs 0 < k <= n_expert");
  const uint64_t groups = (static_cast<uint64_t>(tokens) + kWorkgroupSize - 1) / kWorkgroupSize;
  const auto [gx, gy] = grid(groups);
  const struct {
    uint32_t n_expert, tokens, k, normalize, groups_x;
  } push{checked_u32(n_expert, "n_expert"), checked_u32(tokens, "tokens"), checked_u32(k, "k"), normalize ? 1u : 0u, gx};
  const BufferRange bindings[] = {floats(logits, 0, n_expert * tokens), floats(experts, 0, k * tokens),
                                  floats(weights, 0, k * tokens)};
  device_.dispatch(Shader::moe_route, bindings, &push, sizeof push, gx, gy);
}

// The experts' intermediate rows inside a moe_ffn scratch buffer, each part starting at
// an offset this device accepts for a binding.
Ops::MoeParts Ops::moe_parts(const DeviceExperts& w, int64_t tokens, int64_t k) const {
  const size_t align = std::max<size_t>(device_.info().storage_offset_alignment, 1);
  const auto aligned = [align](size_t bytes) { return (bytes + align - 1) / align * align; };
  const size_t slots = static_cast<size_t>(tokens * k);
  const size_t hidden = slots * static_cast<size_t>(w.gate.rows) * sizeof(float);
  const size_t out = slots * static_cast<size_t>(w.down.rows) * sizeof(float);
  MoeParts p{};
  p.gate = 0;
  p.up = aligned(hidden);
  p.down = p.up + aligned(hidden);
  p.end = p.down + out;
  return p;
}

size_t Ops::moe_scratch_bytes(const DeviceExperts& w, int64_t tokens, int64_t k) const {
  return moe_parts(w, tokens, k).end;
}

void Ops::matmul_id(const DeviceWeight& w, int64_t n_expert, BufferRange x, bool x_per_slot, int64_t slots_per_token,
                    BufferRange ids, int64_t slots, BufferRange y) {
  const uint32_t slot_groups = checked_u32(slots, "slots");
  if (slot_groups > kMaxGroups) throw std::invalid_argument("vulkan: over 65535 expert slots in one call");
  const struct {
    uint32_t cols, rows, y_stride, row_offset, slots, x_per_slot, n_expert;
  } push{checked_u32(w.cols, "cols"), checked_u32(w.rows, "rows"), checked_u32(w.rows, "rows"), 0,
         checked_u32(slots_per_token, "k"), x_per_slot ? 1u : 0u, checked_u32(n_expert, "n_expert")};
  const int64_t x_rows = x_per_slot ? slots : slots / slots_per_token;
  const BufferRange bindings[] = {{&w.buffer, 0, 0}, floats(x, 0, x_rows * w.cols), floats(y, 0, slots * w.rows),
                                  floats(ids, 0, slots)};
  const auto [gx, gz] = grid((static_cast<uint64_t>(w.rows) + kMatmulRowsPerGroup - 1) / kMatmulRowsPerGroup);
  device_.dispatch(shaders_of(w.type).matmul_id, bindings, &push, sizeof push, gx, slot_groups, gz);
}

void Ops::moe_ffn(const DeviceExperts& w, BufferRange x, int64_t tokens, BufferRange experts, BufferRange weights,
                  int64_t k, const Buffer& scratch, BufferRange out) {
  const MoeParts parts = moe_parts(w, tokens, k);
  if (scratch.size() < parts.end) throw std::invalid_argument("vulkan: moe_ffn scratch smaller than moe_scratch_bytes");
  const int64_t slots = tokens * k, ff = w.gate.rows, embd = w.down.rows;
  const BufferRange gate{&scratch, parts.gate, static_cast<size_t>(slots * ff) * sizeof(float)};
  const BufferRange up{&scratch, parts.up, static_cast<size_t>(slots * ff) * sizeof(float)};
  const BufferRange down{&scratch, parts.down, static_cast<size_t>(slots * embd) * sizeof(float)};
  // Each chosen expert's FFN on its token: down(SiLU(gate x) * up x), then the weighted
  // sum over the token's experts in routing order.
  matmul_id(w.gate, w.n_expert, x, false, k, experts, slots, gate);
  matmul_id(w.up, w.n_expert, x, false, k, experts, slots, up);
  silu(gate, slots * ff, gate);
  mul(gate, up, ff, slots, slots, gate);
  // The down projection's input rounded as the CPU's matmul rounds it (llama.cpp's
  // MUL_MAT_ID quantizes it to the down weight's dot partner).
  round_rows(gate, ff, slots, w.down.type, gate);
  matmul_id(w.down, w.n_expert, gate, true, k, experts, slots, down);
  const struct {
    uint32_t n, k;
  } push{checked_u32(embd, "n_embd"), checked_u32(k, "k")};
  const BufferRange bindings[] = {down, floats(weights, 0, slots), floats(out, 0, tokens * embd)};
  const uint32_t column_groups = static_cast<uint32_t>((embd + kWorkgroupSize - 1) / kWorkgroupSize);
  if (tokens > kMaxGroups) throw std::invalid_argument("vulkan: over 65535 tokens in one moe_ffn");
  device_.dispatch(Shader::moe_combine, bindings, &push, sizeof push, column_groups, static_cast<uint32_t>(tokens));
}

}  // namespace pico::backend::vulkan
