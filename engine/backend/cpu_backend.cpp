// The CPU backend: matmul through engine/cpu, the other ops written here, each row on
// its own (batch invariance). Built with -ffp-contract=off (see CMakeLists.txt).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "backend/backend.hpp"
#include "cpu/matmul.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/float_convert.hpp"
#include "quant/quantize.hpp"

namespace pico::backend {
namespace {

size_t row_bytes(GgmlType type, int64_t n) {
  const auto bytes = bytes_of(type_traits(type), static_cast<uint64_t>(n));
  if (!bytes) throw std::invalid_argument("row length is not whole blocks of its type");
  return static_cast<size_t>(*bytes);
}

// ggml's GELU table: gelu of every F16 value, stored as F16.
const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536);
    constexpr float kCoefA = 0.044715f;
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    for (uint32_t i = 0; i < 65536; ++i) {
      const float x = fp16_to_fp32(static_cast<uint16_t>(i));
      const float g = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoefA * x * x)));
      t[i] = fp32_to_fp16(g);
    }
    return t;
  }();
  return table;
}

float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) * std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

float yarn_ramp(float low, float high, int64_t i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {}

  const char* name() const override { return "cpu"; }

  bool supports(Op op, GgmlType type) const override {
    if (op == Op::matmul) {
      try {
        return type_traits(type).dot_partner.has_value();
      } catch (const std::exception&) {
        return false;
      }
    }
    if (op == Op::get_rows) return has_dequantizer(type) || type == GgmlType::F32;
    return type == GgmlType::F32;
  }

  void matmul(const Weight& w, const float* x, int64_t tokens, float* y) override {
    cpu::matmul(pool_, w.type, w.data, w.rows, w.cols, x, tokens, y);
  }

  void matmul_many(std::span<const Weight> ws, const float* x, int64_t tokens, std::span<float* const> ys) override {
    if (ws.size() != ys.size()) throw std::invalid_argument("matmul_many: weights and outputs differ in count");
    for (size_t i = 0; i < ws.size(); ++i) {
      const Weight& w = ws[i];
      const GgmlType a_type = cpu::activation_type(w.type);
      bool shared = a_type != GgmlType::F32;
      for (size_t j = 0; j < i && shared; ++j) {
        if (cpu::activation_type(ws[j].type) == a_type && ws[j].cols == w.cols) shared = false;  // done already
      }
      if (!shared) {
        if (a_type == GgmlType::F32) cpu::matmul(pool_, w.type, w.data, w.rows, w.cols, x, tokens, ys[i]);
        continue;
      }
      // Quantize once for every weight of this activation type and width.
      const size_t bytes = cpu::activation_row_bytes(w.type, w.cols) * static_cast<size_t>(tokens);
      if (scratch_.size() < bytes) scratch_.resize(bytes);
      cpu::quantize_activations(pool_, w.type, x, w.cols, tokens, scratch_.data());
      for (size_t j = i; j < ws.size(); ++j) {
        if (cpu::activation_type(ws[j].type) == a_type && ws[j].cols == w.cols) {
          cpu::matmul_quantized(pool_, ws[j].type, ws[j].data, ws[j].rows, ws[j].cols, scratch_.data(), tokens, ys[j]);
        }
      }
    }
  }

  void get_rows(const Weight& table, const int32_t* ids, int64_t count, float* out) override {
    const size_t bytes = row_bytes(table.type, table.cols);
    const auto* base = static_cast<const uint8_t*>(table.data);
    for (int64_t i = 0; i < count; ++i) {
      if (ids[i] < 0 || ids[i] >= table.rows) throw std::out_of_range("get_rows: id " + std::to_string(ids[i]) + " out of range");
      const uint8_t* row = base + static_cast<size_t>(ids[i]) * bytes;
      if (table.type == GgmlType::F32) {
        std::memcpy(out + i * table.cols, row, static_cast<size_t>(table.cols) * 4);
      } else {
        dequantize_row(table.type, row, out + i * table.cols, table.cols);
      }
    }
  }

  void rms_norm(const float* x, const float* w, int64_t n, int64_t rows, float eps, float* y) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
      const float mean = static_cast<float>(sum / static_cast<double>(n));
      const float scale = 1.0f / std::sqrt(mean + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
    }
  }

  void layer_norm(const float* x, const float* w, const float* b, int64_t n, int64_t rows, float eps,
                  float* y) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]);
      const float mean = static_cast<float>(sum) / static_cast<float>(n);
      double var = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        yr[i] = xr[i] - mean;
        var += static_cast<double>(yr[i] * yr[i]);
      }
      const float variance = static_cast<float>(var / static_cast<double>(n));
      const float scale = 1.0f / std::sqrt(variance + eps);
      for (int64_t i = 0; i < n; ++i) {
        float v = yr[i] * scale;
        if (w) v = v * w[i];
        if (b) v = v + b[i];
        yr[i] = v;
      }
    }
  }

  void rope(float* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, const int32_t* pos,
            const RopeParams& p) override {
    const int64_t n_dims = p.n_dims;
    if (n_dims <= 0 || n_dims > head_dim || n_dims % 2 != 0) throw std::invalid_argument("rope: bad n_dims");
    const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(n_dims));
    float corr[2] = {0.0f, 0.0f};
    if (p.ext_factor != 0.0f) {
      const float start = std::floor(yarn_corr_dim(static_cast<int>(n_dims), p.n_ctx_orig, p.beta_fast, p.freq_base));
      const float end = std::ceil(yarn_corr_dim(static_cast<int>(n_dims), p.n_ctx_orig, p.beta_slow, p.freq_base));
      corr[0] = std::max(0.0f, start);
      corr[1] = std::min(static_cast<float>(n_dims - 1), end);
    }
    std::vector<float> cache(static_cast<size_t>(n_dims));
    for (int64_t t = 0; t < tokens; ++t) {
      float theta = static_cast<float>(pos[t]);
      for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
        const float theta_extrap = theta;
        const float theta_interp = p.freq_scale * theta_extrap;
        float th = theta_interp;
        float mscale = p.attn_factor;
        if (p.ext_factor != 0.0f) {
          const float ramp_mix = yarn_ramp(corr[0], corr[1], i0) * p.ext_factor;
          th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
          mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
        }
        cache[static_cast<size_t>(i0)] = std::cos(th) * mscale;
        cache[static_cast<size_t>(i0) + 1] = std::sin(th) * mscale;
        theta *= theta_scale;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + t * row_stride + h * head_dim;
        for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
          const float c = cache[static_cast<size_t>(i0)], s = cache[static_cast<size_t>(i0) + 1];
          const int64_t a = p.neox ? i0 / 2 : i0;
          const int64_t b = p.neox ? i0 / 2 + n_dims / 2 : i0 + 1;
          const float x0 = v[a], x1 = v[b];
          v[a] = x0 * c - x1 * s;
          v[b] = x0 * s + x1 * c;
        }
      }
    }
  }

  void attention(const float* q, int64_t q_row_stride, std::span<const AttentionQuery> queries,
                 const AttentionParams& p, float* out) override {
    if (p.n_head_kv <= 0 || p.n_head % p.n_head_kv != 0) throw std::invalid_argument("attention: bad head counts");
    const int64_t group = p.n_head / p.n_head_kv;
    const int64_t dk = p.head_dim_k, dv = p.head_dim_v;
    const int64_t n_tasks = static_cast<int64_t>(queries.size()) * p.n_head_kv;
    pool_.parallel_for(n_tasks, [&](int64_t task, int) {
      const int64_t t = task / p.n_head_kv;
      const int64_t kvh = task % p.n_head_kv;
      const AttentionQuery& query = queries[static_cast<size_t>(t)];
      const state::KvLayerView& kv = query.kv;
      const int64_t last = std::min<int64_t>(query.pos, kv.n_pos - 1);
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, query.pos - p.window + 1) : 0;
      thread_local std::vector<float> scores, kbuf, vbuf, qbuf, acc;
      const int64_t n_keys = std::max<int64_t>(0, last - first + 1);
      scores.resize(static_cast<size_t>(group * std::max<int64_t>(n_keys, 1)));
      kbuf.resize(static_cast<size_t>(dk));
      vbuf.resize(static_cast<size_t>(dv));
      qbuf.resize(static_cast<size_t>(group * dk));
      acc.resize(static_cast<size_t>(group * dv));
      // Q as the K dot sees it: llama.cpp converts Q to F16 for an F16 K.
      for (int64_t g = 0; g < group; ++g) {
        const float* qh = q + t * q_row_stride + (kvh * group + g) * dk;
        for (int64_t i = 0; i < dk; ++i) {
          qbuf[static_cast<size_t>(g * dk + i)] = kv.k_type == GgmlType::F16 ? fp16_to_fp32(fp32_to_fp16(qh[i])) : qh[i];
        }
      }
      for (int64_t j = 0; j < n_keys; ++j) {
        state::read_k(kv, first + j, kvh, kbuf.data());
        for (int64_t g = 0; g < group; ++g) {
          const float* qh = qbuf.data() + g * dk;
          double dot = 0.0;
          for (int64_t i = 0; i < dk; ++i) dot += static_cast<double>(qh[i] * kbuf[static_cast<size_t>(i)]);
          float s = static_cast<float>(dot) * p.scale;
          if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
          scores[static_cast<size_t>(g * n_keys + j)] = s;
        }
      }
      // Softmax per head (max, exp, sum in double, one scale), as ggml's soft_max.
      for (int64_t g = 0; g < group; ++g) {
        float* sg = scores.data() + g * n_keys;
        float max = -INFINITY;
        for (int64_t j = 0; j < n_keys; ++j) max = std::max(max, sg[j]);
        double sum = 0.0;
        for (int64_t j = 0; j < n_keys; ++j) {
          sg[j] = std::exp(sg[j] - max);
          sum += static_cast<double>(sg[j]);
        }
        const float inv = n_keys > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
        for (int64_t j = 0; j < n_keys; ++j) {
          const float pj = sg[j] * inv;
          // llama.cpp multiplies F16 V by the probabilities converted to F16.
          sg[j] = kv.v_type == GgmlType::F16 ? fp16_to_fp32(fp32_to_fp16(pj)) : pj;
        }
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < n_keys; ++j) {
        state::read_v(kv, first + j, kvh, vbuf.data());
        for (int64_t g = 0; g < group; ++g) {
          const float pj = scores[static_cast<size_t>(g * n_keys + j)];
          float* a = acc.data() + g * dv;
          for (int64_t i = 0; i < dv; ++i) a[i] = a[i] + pj * vbuf[static_cast<size_t>(i)];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        std::memcpy(out + t * p.n_head * dv + (kvh * group + g) * dv, acc.data() + g * dv, static_cast<size_t>(dv) * 4);
      }
    });
  }

  void add(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* br = b + (b_rows == 1 ? 0 : r * n);
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = a[r * n + i] + br[i];
    }
  }

  void mul(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* br = b + (b_rows == 1 ? 0 : r * n);
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = a[r * n + i] * br[i];
    }
  }

  void scale(float* x, int64_t count, float factor) override {
    for (int64_t i = 0; i < count; ++i) x[i] *= factor;
  }

  void silu(const float* x, int64_t count, float* y) override {
    for (int64_t i = 0; i < count; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
  }

  void gelu(const float* x, int64_t count, float* y) override {
    const std::vector<uint16_t>& table = gelu_table();
    for (int64_t i = 0; i < count; ++i) {
      if (x[i] <= -10.0f) {
        y[i] = 0.0f;
      } else if (x[i] >= 10.0f) {
        y[i] = x[i];
      } else {
        y[i] = fp16_to_fp32(table[fp32_to_fp16(x[i])]);
      }
    }
  }

  void gelu_erf(const float* x, int64_t count, float* y) override {
    constexpr float kSqrt2Inv = 0.70710678118654752440084436210484f;
    for (int64_t i = 0; i < count; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kSqrt2Inv));
  }

  void softmax(float* x, int64_t n, int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r) {
      float* xr = x + r * n;
      float max = -INFINITY;
      for (int64_t i = 0; i < n; ++i) max = std::max(max, xr[i]);
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        xr[i] = std::exp(xr[i] - max);
        sum += static_cast<double>(xr[i]);
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t i = 0; i < n; ++i) xr[i] *= inv;
    }
  }

 private:
  cpu::ThreadPool pool_;
  std::vector<uint8_t> scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace pico::backend
