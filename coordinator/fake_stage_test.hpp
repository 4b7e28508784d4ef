// Test doubles shared by the coordinator's tests: a stage whose answers the test
// writes, the model identity they serve, a 4-token tokenizer.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gguf/value.hpp"
#include "pipeline.hpp"
#include "tokenizer/tokenizer.hpp"

namespace pico::coordinator::testing {

// A stage in "another process" whose answers the test writes: its stamps are in a
// clock `offset` ns ahead of the coordinator's.
class FakeStage final : public Stage {
 public:
  FakeStage(model::LayerRange layers, const protocol::ModelIdentity& id, int64_t offset, std::string name = {})
      : offset_(offset) {
    info_.name = name.empty() ? "fake-" + std::to_string(layers.first) : std::move(name);
    info_.layers = layers;
    info_.identity = id;
  }
  const StageInfo& info() const override { return info_; }
  StageInfo& info_for_test() { return info_; }
  void plan(Stage* to, Stage* chain, size_t, size_t) override {
    ++plans;
    next = to;
    chain_to = chain;
    plan_order.push_back(info_.name);
    if (on_plan) on_plan();
  }
  void submit(uint64_t step, std::span<const model::BatchToken> batch,
              std::span<const protocol::LogitsOutput> outputs, const ChainGrant& chain) override {
    grants.push_back(chain);
    submitted.push_back(step);
    submitted_outputs.emplace_back(outputs.begin(), outputs.end());
    if (on_submit) on_submit(step, batch);
  }
  void close(int32_t seq) override {
    closes.push_back(seq);
    if (on_close) on_close(seq);
  }
  std::optional<StepOutput> poll(int) override {
    if (answers.empty()) return std::nullopt;
    auto answer = std::move(answers.front());
    answers.pop_front();
    return answer();
  }
  StageStats stats() override { return {}; }
  std::optional<std::vector<uint8_t>> snapshot(int32_t seq) override {
    return on_snapshot ? on_snapshot(seq) : std::nullopt;
  }
  void restore(int32_t seq, std::span<const uint8_t> state) override {
    if (on_restore) on_restore(seq, state);
  }
  bool remote() const override { return true; }
  int64_t clock_offset_nanos() const override { return offset_; }
  bool up() override { return is_up; }
  void rejoin() override {
    ++rejoins;
    // As RemoteStage::rejoin's errors, naming the worker: a request admitted after the
    // loss fails with this rather than with the step's error.
    if (!comes_back) throw StageError("worker " + info().name + ": not back yet");
    is_up = true;
  }

  std::deque<std::function<StepOutput()>> answers;  // run when polled
  std::vector<uint64_t> submitted;
  std::vector<std::vector<protocol::LogitsOutput>> submitted_outputs;
  std::vector<ChainGrant> grants;
  Stage* next = nullptr;      // where its output goes (the last plan's)
  Stage* chain_to = nullptr;
  std::function<void(uint64_t, std::span<const model::BatchToken>)> on_submit;
  std::vector<int32_t> closes;
  std::function<void(int32_t)> on_close;
  std::function<void()> on_plan;
  std::function<std::optional<std::vector<uint8_t>>(int32_t)> on_snapshot;  // default: not open
  std::function<void(int32_t, std::span<const uint8_t>)> on_restore;
  int plans = 0;
  std::atomic<int> rejoins = 0;
  std::atomic<bool> is_up = true, comes_back = true;  // set by a test while an engine runs
  static inline std::vector<std::string> plan_order;  // of every FakeStage

 private:
  StageInfo info_;
  int64_t offset_;
};

inline protocol::ModelIdentity fake_identity() {
  protocol::ModelIdentity id;
  id.hash = 77;
  id.arch = "llama";
  id.n_layer = 4;
  return id;
}

// A tokenizer of 4 tokens: <unk>, <s>, </s> and "a" (3).
inline std::unique_ptr<tokenizer::Tokenizer> tiny_tokenizer() {
  gguf::Metadata m;
  m.set("tokenizer.ggml.model", std::string("llama"));
  m.set("tokenizer.ggml.tokens", gguf::string_array({"<unk>", "<s>", "</s>", "a"}));
  std::vector<gguf::Value> scores(4, gguf::Value(0.0f));
  std::vector<gguf::Value> types{gguf::Value(int32_t{2}), gguf::Value(int32_t{3}), gguf::Value(int32_t{3}),
                                 gguf::Value(int32_t{1})};
  m.set("tokenizer.ggml.scores", gguf::make_array(gguf::ValueType::Float32, scores));
  m.set("tokenizer.ggml.token_type", gguf::make_array(gguf::ValueType::Int32, types));
  return std::make_unique<tokenizer::Tokenizer>(tokenizer::Vocabulary::from_metadata(m));
}

}  // namespace pico::coordinator::testing
