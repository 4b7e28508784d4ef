// Forward-pass properties on small generated models: batch invariance (one batch,
// micro-batches, token by token, two sequences mixed in one batch all give
// bit-identical logits), layer-range split equal to the whole model, KV truncation.
#include "model/model.hpp"
#include "model/residency.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "backend/devices.hpp"
#include "backend/recording_backend.hpp"
#include "gguf/writer.hpp"
#include "quant/float_convert.hpp"
#include "quant/quantize.hpp"
#include "sample/argmax.hpp"

namespace pico::model {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 96, kEmbd = 64, kFf = 128, kHead = 4, kHeadKv = 2, kLayers = 3, kCtx = 64;
constexpr int64_t kExperts = 6, kExpertsUsed = 2, kExpertFf = 32;  // qwen3moe
// Hybrids (qwen35, qwen35moe, qwen3next): layers 0 and 2 Gated DeltaNet, layer 1 gated attention.
constexpr int64_t kSsmState = 16, kSsmGroups = 2, kSsmValueHeads = 4, kSsmConv = 4, kSharedFf = 32;

bool is_hybrid(const std::string& arch) { return arch == "qwen35" || arch == "qwen35moe" || arch == "qwen3next"; }

struct Gen {
  gguf::Writer w;
  GgmlType type;
  uint64_t state = 12345;

  float next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  void tensor(const std::string& name, std::vector<uint64_t> shape, float scale, float mean, GgmlType t) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (float& x : v) x = mean + scale * next();
    const size_t bytes = *bytes_of(type_traits(t), n);
    std::vector<uint8_t> data(bytes);
    if (t == GgmlType::F32) {
      std::memcpy(data.data(), v.data(), bytes);
    } else {
      quantize_row(t, v.data(), data.data(), static_cast<int64_t>(n));
    }
    w.add_tensor(name, t, std::move(shape), std::move(data));
  }
  void mat(const std::string& name, int64_t cols, int64_t rows) {
    tensor(name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, 1.7f / std::sqrt(static_cast<float>(cols)), 0, type);
  }
  void vec(const std::string& name, int64_t n, float mean = 1.0f) {
    tensor(name, {static_cast<uint64_t>(n)}, 0.1f, mean, GgmlType::F32);
  }
};

fs::path write_model(const std::string& arch, GgmlType type) {
  Gen g{{}, type};
  auto& md = g.w.metadata();
  const std::string a = arch;
  const int64_t hd = 16;
  md.set("general.architecture", a);
  md.set(a + ".block_count", static_cast<uint32_t>(kLayers));
  md.set(a + ".context_length", static_cast<uint32_t>(kCtx));
  md.set(a + ".embedding_length", static_cast<uint32_t>(kEmbd));
  md.set(a + ".feed_forward_length", static_cast<uint32_t>(kFf));
  md.set(a + ".attention.head_count", static_cast<uint32_t>(kHead));
  md.set(a + ".attention.head_count_kv", static_cast<uint32_t>(arch == "gpt2" ? kHead : kHeadKv));
  md.set(a + (arch == "gpt2" ? ".attention.layer_norm_epsilon" : ".attention.layer_norm_rms_epsilon"), 1e-5f);
  md.set(a + ".rope.freq_base", 10000.0f);
  if (arch == "gemma3") md.set(a + ".attention.sliding_window", uint32_t{5});
  const bool hybrid = is_hybrid(arch);
  const bool moe = arch == "qwen3moe" || arch == "qwen35moe" || arch == "qwen3next";
  if (hybrid) {
    md.set(a + ".ssm.conv_kernel", static_cast<uint32_t>(kSsmConv));
    md.set(a + ".ssm.state_size", static_cast<uint32_t>(kSsmState));
    md.set(a + ".ssm.group_count", static_cast<uint32_t>(kSsmGroups));
    md.set(a + ".ssm.time_step_rank", static_cast<uint32_t>(kSsmValueHeads));
    md.set(a + ".ssm.inner_size", static_cast<uint32_t>(kSsmState * kSsmValueHeads));
    md.set(a + ".full_attention_interval", uint32_t{2});
    md.set(a + ".attention.key_length", uint32_t{16});
    md.set(a + ".attention.value_length", uint32_t{16});
    md.set(a + ".rope.dimension_count", uint32_t{8});  // partial: half of each head
    md.set(a + ".rope.dimension_sections", gguf::make_array(gguf::ValueType::Int32, {int32_t{2}, int32_t{1}, int32_t{1}, int32_t{0}}));
    if (moe) md.set(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(kSharedFf));
  }
  if (moe) {
    md.set(a + ".expert_count", static_cast<uint32_t>(kExperts));
    md.set(a + ".expert_used_count", static_cast<uint32_t>(kExpertsUsed));
    md.set(a + ".expert_feed_forward_length", static_cast<uint32_t>(kExpertFf));
  }
  const int64_t nkv = (arch == "gpt2" ? kHead : kHeadKv) * hd;
  g.mat("token_embd.weight", kEmbd, kVocab);
  if (arch == "gpt2") g.mat("position_embd.weight", kEmbd, kCtx);
  for (int64_t il = 0; il < kLayers; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    g.vec(b + "attn_norm.weight", kEmbd);
    g.vec(b + (hybrid ? "post_attention_norm.weight" : "ffn_norm.weight"), kEmbd);
    if (hybrid && moe) {
      g.tensor(b + "ffn_gate_inp_shexp.weight", {static_cast<uint64_t>(kEmbd)}, 2.0f / std::sqrt(static_cast<float>(kEmbd)), 0,
               GgmlType::F32);
      g.mat(b + "ffn_gate_shexp.weight", kEmbd, kSharedFf);
      g.mat(b + "ffn_up_shexp.weight", kEmbd, kSharedFf);
      g.mat(b + "ffn_down_shexp.weight", kSharedFf, kEmbd);
    }
    if (hybrid && il % 2 == 0) {  // a Gated DeltaNet layer
      const int64_t key = kSsmGroups * kSsmState, value = kSsmValueHeads * kSsmState, conv = 2 * key + value;
      g.mat(b + "attn_qkv.weight", kEmbd, conv);
      g.mat(b + "attn_gate.weight", kEmbd, value);
      if (arch == "qwen3next") {
        g.mat(b + "ssm_ba.weight", kEmbd, 2 * kSsmValueHeads);
      } else {
        g.mat(b + "ssm_beta.weight", kEmbd, kSsmValueHeads);
        g.mat(b + "ssm_alpha.weight", kEmbd, kSsmValueHeads);
      }
      g.tensor(b + "ssm_conv1d.weight", {static_cast<uint64_t>(kSsmConv), static_cast<uint64_t>(conv)}, 0.5f, 0, GgmlType::F32);
      g.vec(b + "ssm_dt.bias", kSsmValueHeads, 0.0f);
      g.tensor(b + "ssm_a", {static_cast<uint64_t>(kSsmValueHeads)}, 0.5f, -1.0f, GgmlType::F32);
      g.vec(b + "ssm_norm.weight", kSsmState);
      g.mat(b + "ssm_out.weight", value, kEmbd);
    }
    if (moe) {
      const auto e = static_cast<uint64_t>(kEmbd), f = static_cast<uint64_t>(kExpertFf), n = static_cast<uint64_t>(kExperts);
      g.tensor(b + "ffn_gate_inp.weight", {e, n}, 3.0f / std::sqrt(static_cast<float>(kEmbd)), 0, GgmlType::F32);
      g.tensor(b + "ffn_gate_exps.weight", {e, f, n}, 1.7f / std::sqrt(static_cast<float>(kEmbd)), 0, type);
      g.tensor(b + "ffn_up_exps.weight", {e, f, n}, 1.7f / std::sqrt(static_cast<float>(kEmbd)), 0, type);
      g.tensor(b + "ffn_down_exps.weight", {f, e, n}, 1.7f / std::sqrt(static_cast<float>(kExpertFf)), 0, type);
    } else {
      g.mat(b + "ffn_up.weight", kEmbd, kFf);
      g.mat(b + "ffn_down.weight", kFf, kEmbd);
      g.mat(b + "ffn_gate.weight", kEmbd, kFf);
    }
    if (hybrid && il % 2 == 0) continue;
    if (!hybrid) g.mat(b + "attn_output.weight", kHead * hd, kEmbd);
    if (hybrid) {  // gated attention: query and gate per head
      g.mat(b + "attn_q.weight", kEmbd, 2 * kHead * hd);
      g.mat(b + "attn_k.weight", kEmbd, nkv);
      g.mat(b + "attn_v.weight", kEmbd, nkv);
      g.mat(b + "attn_output.weight", kHead * hd, kEmbd);
      g.vec(b + "attn_q_norm.weight", hd);
      g.vec(b + "attn_k_norm.weight", hd);
      continue;
    }
    if (arch == "gpt2") {
      g.vec(b + "attn_norm.bias", kEmbd, 0);
      g.vec(b + "ffn_norm.bias", kEmbd, 0);
      g.mat(b + "attn_qkv.weight", kEmbd, kHead * hd + 2 * nkv);
      g.vec(b + "attn_qkv.bias", kHead * hd + 2 * nkv, 0);
      g.vec(b + "attn_output.bias", kEmbd, 0);
      g.vec(b + "ffn_up.bias", kFf, 0);
      g.vec(b + "ffn_down.bias", kEmbd, 0);
      continue;
    }
    g.mat(b + "attn_q.weight", kEmbd, kHead * hd);
    g.mat(b + "attn_k.weight", kEmbd, nkv);
    g.mat(b + "attn_v.weight", kEmbd, nkv);
    if (arch == "qwen2") {
      g.vec(b + "attn_q.bias", kHead * hd, 0);
      g.vec(b + "attn_k.bias", nkv, 0);
      g.vec(b + "attn_v.bias", nkv, 0);
    }
    if (arch == "qwen3" || moe || arch == "gemma3") {
      g.vec(b + "attn_q_norm.weight", hd);
      g.vec(b + "attn_k_norm.weight", hd);
    }
    if (arch == "gemma3") {
      g.vec(b + "post_attention_norm.weight", kEmbd);
      g.vec(b + "post_ffw_norm.weight", kEmbd);
    }
  }
  g.vec("output_norm.weight", kEmbd);
  if (arch == "gpt2") g.vec("output_norm.bias", kEmbd, 0);
  if (arch != "gemma3") g.mat("output.weight", kEmbd, kVocab);  // gemma3: tied
  const fs::path path = fs::temp_directory_path() /
                        ("pico_model_test_" + arch + "_" + std::to_string(static_cast<int>(type)) + "_" +
                         std::to_string(getpid()) + ".gguf");
  g.w.write(path);
  return path;
}

struct Loaded {
  fs::path path;
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<backend::Backend> be;
  std::string no_backend;  // why `be` is null: the backend is not in this build or has no device

  Loaded(const std::string& arch, GgmlType type, const std::string& backend_name = "cpu")
      : path(write_model(arch, type)) {
    file = gguf::Model::open(path);
    model = Model::load(*file);
    // No device: `be` stays null and the test skips saying why; a device that is
    // there and does not open throws, failing the test.
    no_backend = backend::missing_device(backend_name, 0);
    if (no_backend.empty()) be = backend::open_backend(backend_name, 0, 2);
  }
  ~Loaded() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  state::KvCache cache(LayerRange r) const {
    return state::KvCache(model->kv_config(r), model->recurrent_config(r), backend::state_stores_of(*be));
  }
};

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + salt * 11 + 5) % static_cast<int>(kVocab));
  return ids;
}

// Logits of `ids` for sequence `seq`, fed in chunks of `chunk`.
std::vector<float> run(Loaded& m, const std::vector<int32_t>& ids, size_t chunk) {
  state::KvCache cache = m.cache(m.model->all_layers());
  std::vector<float> all;
  for (size_t s = 0; s < ids.size(); s += chunk) {
    std::vector<BatchToken> batch;
    for (size_t i = s; i < std::min(ids.size(), s + chunk); ++i) batch.push_back({0, static_cast<int32_t>(i), ids[i]});
    const auto logits = m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), cache);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

struct Param {
  std::string arch;
  GgmlType type;
  std::string backend = "cpu";
};

void PrintTo(const Param& p, std::ostream* os) { *os << p.arch << "/" << type_traits(p.type).name << "/" << p.backend; }

// The same properties on every backend: on a device, batch invariance is the device's.
class ModelTest : public ::testing::TestWithParam<Param> {};

#define LOAD_OR_SKIP(m)                                                   \
  Loaded m(GetParam().arch, GetParam().type, GetParam().backend);         \
  if (!m.be) GTEST_SKIP() << "no " << GetParam().backend << " backend: " << m.no_backend  // reason: backend not built or no device

TEST_P(ModelTest, BatchInvariance) {
  LOAD_OR_SKIP(m);
  const auto ids = prompt(23, 1);
  const auto whole = run(m, ids, ids.size());
  ASSERT_EQ(whole.size(), ids.size() * kVocab);
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(run(m, ids, 7), whole);
  EXPECT_EQ(run(m, ids, 1), whole);

  // Two sequences interleaved in one batch, the second one starting later.
  const auto other = prompt(9, 2);
  const auto other_alone = run(m, other, 4);
  state::KvCache cache = m.cache(m.model->all_layers());
  std::vector<float> a, b;
  size_t ia = 0, ib = 0;
  while (ia < ids.size() || ib < other.size()) {
    std::vector<BatchToken> batch;
    std::vector<int> which;
    for (int k = 0; k < 3 && ia < ids.size(); ++k, ++ia) {
      batch.push_back({0, static_cast<int32_t>(ia), ids[ia]});
      which.push_back(0);
    }
    for (int k = 0; k < 2 && ib < other.size(); ++k, ++ib) {
      batch.push_back({5, static_cast<int32_t>(ib), other[ib]});
      which.push_back(1);
    }
    const auto logits = m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), cache);
    for (size_t t = 0; t < batch.size(); ++t) {
      auto& dst = which[t] == 0 ? a : b;
      dst.insert(dst.end(), logits.begin() + static_cast<ptrdiff_t>(t * kVocab),
                 logits.begin() + static_cast<ptrdiff_t>((t + 1) * kVocab));
    }
  }
  EXPECT_EQ(a, whole);
  EXPECT_EQ(b, other_alone);
}

TEST_P(ModelTest, LogitsOnlyForFlaggedTokens) {
  LOAD_OR_SKIP(m);
  const auto ids = prompt(9, 5);
  const auto whole = run(m, ids, ids.size());
  state::KvCache cache = m.cache(m.model->all_layers());
  std::vector<BatchToken> batch;
  std::vector<float> want;
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool flag = i % 3 == 1;
    batch.push_back({0, static_cast<int32_t>(i), ids[i], flag});
    if (flag) want.insert(want.end(), whole.begin() + static_cast<ptrdiff_t>(i * kVocab), whole.begin() + static_cast<ptrdiff_t>((i + 1) * kVocab));
  }
  EXPECT_EQ(m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), cache), want);
}

// Rows asked as arg max only come back as the arg max of the row they would have been
// (the first of equal maxima) and its logit, the others whole and in order; a caller
// that takes no ReducedRows gets every flagged row whole.
TEST_P(ModelTest, ArgmaxOnlyRowsComeBackAsTheirArgMax) {
  LOAD_OR_SKIP(m);
  const auto ids = prompt(9, 5);
  const auto whole = run(m, ids, ids.size());
  std::vector<BatchToken> batch;
  std::vector<float> want_rows, want_logits, every_row;
  std::vector<int32_t> want_ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    BatchToken t{0, static_cast<int32_t>(i), ids[i], i % 3 != 0};
    t.argmax_only = i % 3 == 2 || i == 7;
    batch.push_back(t);
    if (!t.logits) continue;
    const float* row = whole.data() + i * kVocab;
    every_row.insert(every_row.end(), row, row + kVocab);
    if (t.argmax_only) {
      const size_t best = sample::first_argmax(row, kVocab);
      want_ids.push_back(static_cast<int32_t>(best));
      want_logits.push_back(row[best]);
    } else {
      want_ids.push_back(-1);
      want_logits.push_back(0.0f);
      want_rows.insert(want_rows.end(), row, row + kVocab);
    }
  }
  state::KvCache cache = m.cache(m.model->all_layers());
  ReducedRows argmax;
  EXPECT_EQ(m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), cache, &argmax), want_rows);
  EXPECT_EQ(argmax.ids, want_ids);
  EXPECT_EQ(argmax.logits, want_logits);
  state::KvCache again = m.cache(m.model->all_layers());
  EXPECT_EQ(m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), again), every_row);
}

// A traced row's trace is the RMS of its residual stream after each layer of the range:
// that of the hidden state a range ending at that layer returns; tracing changes no
// result, and a later range reports its own layers only.
TEST_P(ModelTest, TracedRowsReportTheResidualRmsAfterEachLayer) {
  LOAD_OR_SKIP(m);
  const auto ids = prompt(7, 11);
  const std::vector<int32_t> traced = {1, 4, 6};
  auto batch_of = [&](bool trace) {
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < ids.size(); ++i) {
      BatchToken t{0, static_cast<int32_t>(i), ids[i], true};
      t.trace = trace && std::find(traced.begin(), traced.end(), static_cast<int32_t>(i)) != traced.end();
      batch.push_back(t);
    }
    return batch;
  };
  // want[r][l]: the RMS of row traced[r]'s hidden state after layer l.
  std::vector<std::vector<double>> want(traced.size());
  for (int32_t k = 1; k <= kLayers; ++k) {
    if (k == kLayers) break;  // the last layer's state: from the whole model's trace below, checked by splits
    state::KvCache cache = m.cache({0, k});
    const auto hidden = m.model->forward(*m.be, batch_of(false), nullptr, {0, k}, cache);
    for (size_t r = 0; r < traced.size(); ++r) {
      double sum = 0;
      for (int64_t i = 0; i < kEmbd; ++i) {
        const double v = hidden[static_cast<size_t>(traced[r] * kEmbd + i)];
        sum += v * v;
      }
      want[r].push_back(std::sqrt(sum / kEmbd));
    }
  }
  state::KvCache plain = m.cache(m.model->all_layers()), with_trace = m.cache(m.model->all_layers());
  ReducedRows none, rows;
  const auto logits = m.model->forward(*m.be, batch_of(false), nullptr, m.model->all_layers(), plain, &none);
  EXPECT_TRUE(none.trace_rows.empty() && none.trace.empty());
  EXPECT_EQ(m.model->forward(*m.be, batch_of(true), nullptr, m.model->all_layers(), with_trace, &rows), logits);
  ASSERT_EQ(rows.trace_rows, traced);
  ASSERT_EQ(rows.trace.size(), traced.size() * kLayers);
  for (size_t r = 0; r < traced.size(); ++r) {
    for (size_t l = 0; l < want[r].size(); ++l) {
      EXPECT_NEAR(rows.trace[r * kLayers + l], want[r][l], 1e-5 * want[r][l]) << "row " << traced[r] << " layer " << l;
    }
    EXPECT_GT(rows.trace[r * kLayers + kLayers - 1], 0.0f);
  }
  // A stage of the later layers: its own layers' values, the same as the whole model's.
  state::KvCache head = m.cache({0, 1}), tail = m.cache({1, static_cast<int32_t>(kLayers)});
  const auto hidden = m.model->forward(*m.be, batch_of(false), nullptr, {0, 1}, head);
  ReducedRows later;
  m.model->forward(*m.be, batch_of(true), hidden.data(), {1, static_cast<int32_t>(kLayers)}, tail, &later);
  ASSERT_EQ(later.trace_rows, traced);
  ASSERT_EQ(later.trace.size(), traced.size() * (kLayers - 1));
  for (size_t r = 0; r < traced.size(); ++r) {
    for (int64_t l = 1; l < kLayers; ++l) {
      EXPECT_NEAR(later.trace[r * (kLayers - 1) + static_cast<size_t>(l - 1)], rows.trace[r * kLayers + static_cast<size_t>(l)],
                  1e-5 * rows.trace[r * kLayers + static_cast<size_t>(l)]);
    }
  }
  // A traced row needs somewhere to put its trace.
  state::KvCache bare = m.cache(m.model->all_layers());
  EXPECT_THROW(m.model->forward(*m.be, batch_of(true), nullptr, m.model->all_layers(), bare), std::invalid_argument);
}

TEST_P(ModelTest, LayerSplitEqualsWholeModel) {
  LOAD_OR_SKIP(m);
  const auto ids = prompt(12, 3);
  const auto whole = run(m, ids, 5);
  for (int32_t k = 1; k < kLayers; ++k) {
    const LayerRange first{0, k}, second{k, static_cast<int32_t>(kLayers)};
    state::KvCache c1 = m.cache(first), c2 = m.cache(second);
    std::vector<float> all;
    for (size_t s = 0; s < ids.size(); s += 5) {
      std::vector<BatchToken> batch;
      for (size_t i = s; i < std::min(ids.size(), s + 5); ++i) batch.push_back({0, static_cast<int32_t>(i), ids[i]});
      const auto hidden = m.model->forward(*m.be, batch, nullptr, first, c1);
      ASSERT_EQ(hidden.size(), batch.size() * kEmbd);
      const auto logits = m.model->forward(*m.be, batch, hidden.data(), second, c2);
      all.insert(all.end(), logits.begin(), logits.end());
    }
    EXPECT_EQ(all, whole) << "split at " << k;
  }
}

TEST_P(ModelTest, TruncateAndReevaluate) {
  LOAD_OR_SKIP(m);
  const auto ids = prompt(10, 4);
  const auto whole = run(m, ids, ids.size());
  state::KvCache cache = m.cache(m.model->all_layers());
  auto feed = [&](size_t from, size_t to) {
    std::vector<BatchToken> batch;
    for (size_t i = from; i < to; ++i) batch.push_back({0, static_cast<int32_t>(i), ids[i]});
    // A hybrid's recurrent state goes back only to a checkpoint: one after 4 tokens
    // (ignored by models without recurrent layers).
    if (from == 0) batch[3].checkpoint_keep = 2;
    return m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), cache);
  };
  EXPECT_EQ(feed(0, 10), whole);  // a checkpoint inside the batch changes nothing
  if (is_hybrid(GetParam().arch)) {
    EXPECT_FALSE(cache.can_truncate(0, 5));
    EXPECT_THROW(cache.truncate(0, 5), std::invalid_argument);
    EXPECT_EQ(cache.recurrent(0).checkpoint_positions(), std::vector<int64_t>{4});
  }
  cache.truncate(0, 4);
  const auto again = feed(4, 10);
  EXPECT_EQ(again, std::vector<float>(whole.begin() + 4 * kVocab, whole.end()));
}

std::vector<Param> every_arch(const std::string& backend_name) {
  std::vector<Param> params = {{"llama", GgmlType::F32},     {"llama", GgmlType::Q8_0},    {"qwen2", GgmlType::F16},
                               {"qwen3", GgmlType::BF16},    {"gpt2", GgmlType::F32},      {"gemma3", GgmlType::Q8_0},
                               {"qwen3moe", GgmlType::F32},  {"qwen3moe", GgmlType::Q8_0}, {"qwen35", GgmlType::F32},
                               {"qwen35", GgmlType::Q8_0},   {"qwen35moe", GgmlType::F16}, {"qwen3next", GgmlType::F32},
                               {"qwen3next", GgmlType::Q8_0}};
  for (Param& p : params) p.backend = backend_name;
  return params;
}

std::string param_name(const ::testing::TestParamInfo<Param>& param_info) {
  return param_info.param.arch + "_" + std::string(type_traits(param_info.param.type).name);
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelTest, ::testing::ValuesIn(every_arch("cpu")), param_name);
INSTANTIATE_TEST_SUITE_P(ArchsOnVulkan, ModelTest, ::testing::ValuesIn(every_arch("vulkan")), param_name);

// A device stage records a step's ops and waits only where the host needs a result:
// the K and V the host-side cache stores (attention and the recurrent ops run on the
// CPU until state storage moves to the device), and the output. The experts' routing
// stays on the device.
TEST(DeviceStep, WaitsOnlyWhereTheHostNeedsAResult) {
  for (const std::string arch : {"llama", "qwen3moe", "qwen35moe"}) {
    Loaded m(arch, arch == "qwen35moe" ? GgmlType::F16 : GgmlType::Q8_0, "vulkan");
    if (!m.be) GTEST_SKIP() << "no vulkan backend: " << m.no_backend;  // reason: built without Vulkan or no device
    const auto ids = prompt(6, 7);
    run(m, ids, ids.size());  // weights uploaded, activation memory grown
    state::KvCache cache = m.cache(m.model->all_layers());
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < ids.size(); ++i) batch.push_back({0, static_cast<int32_t>(i), ids[i]});
    const uint64_t before = m.be->submissions();
    m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), cache);
    // The KV cache and the recurrent state are device memory, read and updated there:
    // the one wait is for the logits.
    EXPECT_EQ(m.be->submissions() - before, 1u) << arch;
    // Then decoding token by token, the context growing a position a step: still one
    // wait a step, past the prompt step's 6 x 6 attention scores (the scratch grows; a
    // buffer released while a step is recorded goes after its submission, no wait).
    for (int32_t pos = static_cast<int32_t>(ids.size()); pos < static_cast<int32_t>(ids.size()) + 40; ++pos) {
      const std::vector<BatchToken> one = {{0, pos, ids[static_cast<size_t>(pos) % ids.size()]}};
      const uint64_t step_before = m.be->submissions();
      m.model->forward(*m.be, one, nullptr, m.model->all_layers(), cache);
      EXPECT_EQ(m.be->submissions() - step_before, 1u) << arch << " at position " << pos;
    }
  }
}

// Model::load_weights hands a stage's every weight to the backend at load, so a step
// uploads none (a weight the list missed would be uploaded by the first step).
TEST(DeviceStep, WeightsGoToTheDeviceAtLoadNotInAStep) {
  for (const std::string arch : {"llama", "gpt2", "qwen3moe", "qwen35moe", "qwen3next"}) {
    Loaded m(arch, arch == "qwen35moe" ? GgmlType::F16 : GgmlType::Q8_0, "vulkan");
    if (!m.be) GTEST_SKIP() << "no vulkan backend: " << m.no_backend;  // reason: built without Vulkan or no device
    m.model->load_weights(*m.be, m.model->all_layers());
    const uint64_t loaded = m.be->weight_bytes();
    EXPECT_GT(loaded, m.file->tensor_data(m.file->tensors().front()).size()) << arch;
    run(m, prompt(6, 3), 6);
    EXPECT_EQ(m.be->weight_bytes(), loaded) << arch;
  }
}

TEST(WeightResidency, ClassesOrderTheWeightsByWhatTheyAreWorth) {
  EXPECT_EQ(weight_class("output.weight"), WeightClass::Head);
  EXPECT_EQ(weight_class("output_norm.weight"), WeightClass::Head);
  EXPECT_EQ(weight_class("blk.0.attn_norm.weight"), WeightClass::Norm);
  EXPECT_EQ(weight_class("blk.3.attn_q.weight"), WeightClass::Attention);
  EXPECT_EQ(weight_class("blk.3.ssm_a"), WeightClass::Attention);
  EXPECT_EQ(weight_class("blk.1.ffn_gate_inp.weight"), WeightClass::Router);
  EXPECT_EQ(weight_class("blk.1.ffn_up_shexp.weight"), WeightClass::Router);
  EXPECT_EQ(weight_class("blk.2.ffn_down.weight"), WeightClass::Ffn);
  EXPECT_EQ(weight_class("blk.2.ffn_gate_exps.weight"), WeightClass::RoutedExperts);
  EXPECT_EQ(weight_class("token_embd.weight"), WeightClass::Embedding);
  EXPECT_LT(WeightClass::Head, WeightClass::Norm);
  EXPECT_LT(WeightClass::Router, WeightClass::RoutedExperts);
  EXPECT_EQ(weight_layer("blk.12.attn_q.weight"), 12);
  EXPECT_EQ(weight_layer("output.weight"), -1);
  EXPECT_EQ(weight_layer("blk.x"), -1);
}

// --mem locks within its budget, most valuable first; a range beyond it streams, which
// changes no result; --prefault reports its progress up to the whole.
TEST(WeightResidency, LocksWithinTheBudgetAndStreamsTheRest) {
  Loaded m("qwen3moe", GgmlType::F32);
  ASSERT_TRUE(m.be) << m.no_backend;
  m.model->load_weights(*m.be, m.model->all_layers());
  const auto ids = prompt(6, 2);
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < ids.size(); ++i) batch.push_back({0, static_cast<int32_t>(i), ids[i], true});
  state::KvCache plain = m.cache(m.model->all_layers());
  const auto want = m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), plain);

  const gguf::TensorInfo* head = m.file->find_tensor("output.weight");
  ASSERT_NE(head, nullptr);
  // Room for the head and a little more: the head (the most valuable) is locked first.
  const uint64_t budget = head->bytes + 64 * 1024;
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  {
    WeightResidency residency(*m.file, m.model->all_layers(), kLayers, {budget, true, {}},
                              [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); });
    const ResidencyReport& r = residency.report();
    EXPECT_GT(r.range_bytes, budget);
    EXPECT_TRUE(r.streaming);
    EXPECT_LE(r.locked_bytes, budget);
    if (r.lock_failed_bytes == 0) {
      EXPECT_GE(r.locked_bytes, head->bytes);  // the head, page-rounded
    } else {
      EXPECT_FALSE(r.lock_error.empty());  // refused (no CAP_IPC_LOCK, a low ulimit -l): said so
    }
    ASSERT_FALSE(progress.empty());
    for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i].first, progress[i - 1].first);
    EXPECT_EQ(progress.back().first, progress.back().second);
    m.model->set_layer_observer(&residency);
    state::KvCache streamed = m.cache(m.model->all_layers());
    EXPECT_EQ(m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), streamed), want);
    m.model->set_layer_observer(nullptr);
  }
  {
    // No memory left at all: every read-ahead gives back what it lacks first; the
    // results are the same.
    ResidencyOptions none{budget, false, [] { return uint64_t{0}; }};
    WeightResidency residency(*m.file, m.model->all_layers(), kLayers, none);
    m.model->set_layer_observer(&residency);
    state::KvCache streamed = m.cache(m.model->all_layers());
    EXPECT_EQ(m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), streamed), want);
    m.model->set_layer_observer(nullptr);
  }
  // A budget beyond the range: everything locked that can be, nothing streamed.
  WeightResidency all(*m.file, m.model->all_layers(), kLayers, {uint64_t{1} << 40, false, {}});
  EXPECT_FALSE(all.report().streaming);
  EXPECT_GT(anonymous_resident_bytes(), 0u);
}

TEST(Hparams, ReadsMetadata) {
  Loaded m("gemma3", GgmlType::F32);
  const Hparams& hp = m.model->hparams();
  EXPECT_EQ(hp.n_layer, kLayers);
  EXPECT_EQ(hp.head_dim_k, 16);
  EXPECT_TRUE(hp.rope_neox);
  EXPECT_EQ(hp.n_swa, 5);
  EXPECT_TRUE(hp.is_swa(0));
  EXPECT_TRUE(hp.is_swa(1));
  EXPECT_EQ(m.model->weights().output.data, m.model->weights().tok_embd.data);  // tied
}

// A decode step hands the backend the attention and router matrices, one token
// embedding row, the head, and per layer only the chosen experts' slices (moe_test
// proves the CPU op reads no others): bytes per step = the dense part + layers x
// experts used x one expert's gate, up and down, far below the file's matrices.
TEST(Moe, DecodeStepReadsOnlyTheChosenExperts) {
  for (const char* arch : {"qwen3moe", "qwen35moe"}) {
    SCOPED_TRACE(arch);
    Loaded m(arch, GgmlType::Q8_0);
    state::KvCache cache = m.cache(m.model->all_layers());
    const auto ids = prompt(8, 6);
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < ids.size(); ++i) batch.push_back({0, static_cast<int32_t>(i), ids[i]});
    m.model->forward(*m.be, batch, nullptr, m.model->all_layers(), cache);
    backend::RecordingBackend recording(*m.be);
    const BatchToken step[1] = {{0, static_cast<int32_t>(ids.size()), 17}};
    m.model->forward(recording, step, nullptr, m.model->all_layers(), cache);

    uint64_t dense = 0, experts_all = 0, one_expert = 0;
    for (const gguf::TensorInfo& t : m.file->tensors()) {
      const uint64_t bytes = m.file->tensor_data(t).size();
      if (t.name.find("_exps.") != std::string::npos) {
        experts_all += bytes;
        if (t.name.starts_with("blk.0.")) one_expert += bytes / static_cast<uint64_t>(kExperts);
      } else if (t.name == "token_embd.weight") {
        dense += bytes / static_cast<uint64_t>(kVocab);  // one row
      } else if ((t.shape.size() == 2 && t.name.find("ssm_conv1d") == std::string::npos) ||
                 t.name.find("ffn_gate_inp_shexp") != std::string::npos) {
        // Attention and linear-attention projections, routers, the shared expert and its
        // gate, the head (norm vectors and the conv's taps are not matmul weights).
        dense += bytes;
      }
    }
    const uint64_t want = dense + static_cast<uint64_t>(kLayers * kExpertsUsed) * one_expert;
    EXPECT_EQ(recording.weight_bytes, want);
    ASSERT_EQ(recording.routes.size(), static_cast<size_t>(kLayers));
    for (const auto& route : recording.routes) {
      EXPECT_EQ(std::set<int32_t>(route.begin(), route.end()).size(), static_cast<size_t>(kExpertsUsed));
    }
    EXPECT_LT(recording.weight_bytes, dense + experts_all / 2);
    std::printf("%s decode step: %llu weight bytes, of which experts %llu of their %llu\n", arch,
                static_cast<unsigned long long>(recording.weight_bytes), static_cast<unsigned long long>(want - dense),
                static_cast<unsigned long long>(experts_all));
  }
}

TEST(Hparams, ReadsQwen3MoeExperts) {
  Loaded m("qwen3moe", GgmlType::F32);
  const Hparams& hp = m.model->hparams();
  EXPECT_EQ(hp.arch, Arch::qwen3moe);
  EXPECT_EQ(hp.n_expert, kExperts);
  EXPECT_EQ(hp.n_expert_used, kExpertsUsed);
  EXPECT_EQ(hp.n_ff_exp, kExpertFf);
  EXPECT_TRUE(hp.expert_weights_norm);  // llama.cpp always renormalises qwen3moe's routing
  EXPECT_TRUE(hp.rope_neox);
  const LayerWeights& l = m.model->weights().layers[1];
  EXPECT_EQ(l.ffn_exps.down.cols, kExpertFf);
  EXPECT_EQ(l.ffn_exps.down.rows, kEmbd);
  // Expert slices are views into the mapping, one matrix after another.
  EXPECT_EQ(static_cast<const uint8_t*>(l.ffn_exps.gate.expert(2).data),
            static_cast<const uint8_t*>(l.ffn_exps.gate.data) + 2 * kEmbd * kExpertFf * 4);
  EXPECT_FALSE(l.ffn_gate);  // no dense FFN
}

// The expert width defaults to feed_forward_length / expert_used_count (llama.cpp).
TEST(Hparams, Qwen3MoeExpertWidthDefault) {
  gguf::Metadata md;
  md.set("general.architecture", std::string("qwen3moe"));
  md.set("qwen3moe.block_count", uint32_t{2});
  md.set("qwen3moe.embedding_length", uint32_t{64});
  md.set("qwen3moe.feed_forward_length", uint32_t{96});
  md.set("qwen3moe.attention.head_count", uint32_t{4});
  md.set("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
  md.set("qwen3moe.expert_count", uint32_t{8});
  md.set("qwen3moe.expert_used_count", uint32_t{3});
  EXPECT_EQ(read_hparams(md, 100).n_ff_exp, 32);
  md.set("qwen3moe.expert_used_count", uint32_t{0});
  EXPECT_THROW(read_hparams(md, 100), std::invalid_argument);
}

}  // namespace
}  // namespace pico::model
