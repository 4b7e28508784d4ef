// In-process: a chain of LocalStages over split layer ranges reproduces the single
// stage bit for bit, with several sequences at once and micro-batched prefill.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "engine.hpp"
#include "gguf/reader.hpp"
#include "sample/argmax.hpp"
#include "pipeline.hpp"
#include "scheduler.hpp"

namespace pico::coordinator {
namespace {

class LocalPipeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* build = std::getenv("PICO_IT_BUILD");
    ASSERT_NE(build, nullptr);
    dir_ = std::filesystem::temp_directory_path() / ("pico-local-pipeline-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    model_ = (dir_ / "m.gguf").string();
    const std::string mk = std::string(build) + "/tools/pico/pico mkmodel --arch qwen3 --vocab qwen3 --layers 4 "
                           "--embd 64 --ff 128 --heads 4 --kv-heads 2 --head-dim 32 --seed 7 -o " + model_ +
                           " > /dev/null";
    ASSERT_EQ(std::system(mk.c_str()), 0);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  std::vector<Result> run(const std::vector<std::pair<int, int>>& ranges, const std::vector<std::string>& prompts,
                          int micro_batch) {
    const auto file = gguf::Model::open(model_);
    const auto tok = tokenizer::Tokenizer::from_metadata(file->metadata());
    std::vector<std::unique_ptr<Stage>> stages;
    for (auto [a, b] : ranges) stages.push_back(std::make_unique<LocalStage>(model_, model::LayerRange{a, b}, 1));
    Pipeline pipeline(std::move(stages), protocol::model_identity(*file));
    SchedulerOptions o;
    o.micro_batch = micro_batch;
    o.keep_logits = true;
    Scheduler scheduler(pipeline, *tok, o);
    std::vector<Request> requests;
    for (const auto& p : prompts) {
      Request r;
      r.prompt = tok->encode(p, true, true);
      r.n_predict = 12;
      r.sampling = sample::SamplingParams::greedy();
      requests.push_back(r);
    }
    return scheduler.run(requests);
  }

  static inline std::filesystem::path dir_;
  static inline std::string model_;
};

TEST_F(LocalPipeline, SplitsAndConcurrencyAreBitIdentical) {
  const std::vector<std::string> prompts{"a", "The quick brown fox jumps over the lazy dog",
                                         "Once upon a time, in a land far away, there lived"};
  std::vector<Result> alone;
  for (const auto& p : prompts) alone.push_back(run({{0, 4}}, {p}, 64).at(0));
  for (const auto& ranges : std::vector<std::vector<std::pair<int, int>>>{{{0, 4}}, {{0, 2}, {2, 4}},
                                                                         {{0, 1}, {1, 3}, {3, 4}}}) {
    const auto together = run(ranges, prompts, 3);
    ASSERT_EQ(together.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(together[i].tokens, alone[i].tokens) << "prompt " << i << ", " << ranges.size() << " stages";
      EXPECT_TRUE(together[i].logits == alone[i].logits) << "prompt " << i << ", " << ranges.size() << " stages";
    }
  }
}

// Per-stage timings of in-process stages: compute grows with every step, transfers
// stay 0 (nothing crosses a link).
TEST_F(LocalPipeline, TimingsGrowPerStage) {
  const auto file = gguf::Model::open(model_);
  const auto tok = tokenizer::Tokenizer::from_metadata(file->metadata());
  std::vector<std::unique_ptr<Stage>> stages;
  stages.push_back(std::make_unique<LocalStage>(model_, model::LayerRange{0, 1}, 1));
  stages.push_back(std::make_unique<LocalStage>(model_, model::LayerRange{1, 4}, 1));
  Pipeline pipeline(std::move(stages), protocol::model_identity(*file));
  PipelineTimings before = pipeline.timings();
  ASSERT_EQ(before.stages.size(), 2u);
  EXPECT_EQ(before.stages[1].layers.first, 1);
  EXPECT_EQ(before.stages[1].layers.last, 4);
  for (int round = 0; round < 2; ++round) {
    Scheduler scheduler(pipeline, *tok, SchedulerOptions{});
    Request r;
    r.prompt = tok->encode("Once upon a time", true, true);
    r.n_predict = 5;
    r.sampling = sample::SamplingParams::greedy();
    scheduler.run({r});
    const PipelineTimings now = pipeline.timings();
    for (size_t i = 0; i < 2; ++i) {
      const auto &a = before.stages[i], &b = now.stages[i];
      EXPECT_GT(b.compute_seconds, a.compute_seconds) << "stage " << i;
      EXPECT_EQ(b.batches, a.batches + 5) << "stage " << i;  // the prompt in one step, then 4 decode steps
      EXPECT_EQ(b.tokens, a.tokens + r.prompt.size() + 4) << "stage " << i;
      EXPECT_EQ(b.transfer_seconds, 0.0);
      EXPECT_EQ(b.queue_seconds, 0.0);
    }
    EXPECT_EQ(now.logits_transfer_seconds, 0.0);
    before = now;
  }
}

// A sequence's state taken from a stage, dropped, and put back: decoding continues with
// bit-identical logits.
TEST_F(LocalPipeline, SnapshotRestoreContinuesBitIdentical) {
  LocalStage stage(model_, std::nullopt, 1);
  stage.plan(nullptr, nullptr, 0, 1);
  const std::vector<int32_t> prompt{5, 17, 230, 99};
  auto run = [&](int32_t seq, int32_t pos, const std::vector<int32_t>& tokens) {
    std::vector<model::BatchToken> batch;
    for (size_t i = 0; i < tokens.size(); ++i) {
      batch.push_back({seq, pos + static_cast<int32_t>(i), tokens[i], i + 1 == tokens.size()});
    }
    stage.submit(1, batch, {}, {});
    auto out = stage.poll(0);
    EXPECT_TRUE(out.has_value());
    return out ? std::vector<float>(out->logits.begin(), out->logits.end()) : std::vector<float>();
  };
  run(1, 0, prompt);
  const auto reference = run(1, 4, {42});
  run(2, 0, prompt);
  const auto state = stage.snapshot(2);
  ASSERT_TRUE(state.has_value());
  stage.close(2);
  EXPECT_FALSE(stage.snapshot(2).has_value());
  EXPECT_THROW(stage.submit(1, std::vector<model::BatchToken>{{2, 4, 42, true}}, {}, {}), StageError);  // a gap now
  auto damaged = *state;
  damaged.pop_back();
  EXPECT_THROW(stage.restore(2, damaged), StageError);
  stage.restore(2, *state);
  EXPECT_TRUE(run(2, 4, {42}) == reference);
}

// Rows asked as arg max only come back from an in-process last stage as the arg max
// of the row (reduced by its backend) and its logit; the other rows whole, in order.
TEST_F(LocalPipeline, ReducedRowsComeBackAsTheirArgMax) {
  LocalStage whole(model_, std::nullopt, 1), reduced(model_, std::nullopt, 1);
  whole.plan(nullptr, nullptr, 0, 1);
  reduced.plan(nullptr, nullptr, 0, 1);
  const std::vector<model::BatchToken> batch{{1, 0, 5, true}, {2, 0, 17, true}, {3, 0, 230, true}};
  const std::vector<protocol::LogitsOutput> outputs{protocol::LogitsOutput::ARGMAX, protocol::LogitsOutput::FULL,
                                                    protocol::LogitsOutput::ARGMAX};
  whole.submit(1, batch, {}, {});
  reduced.submit(1, batch, outputs, {});
  const auto all = whole.poll(0), some = reduced.poll(0);
  ASSERT_TRUE(all && some);
  ASSERT_EQ(some->argmax.size(), 3u);
  for (size_t row = 0; row < 3; ++row) {
    const std::span<const float> logits = all->row_logits(row);
    if (outputs[row] == protocol::LogitsOutput::ARGMAX) {
      const size_t best = sample::first_argmax(logits.data(), logits.size());
      EXPECT_EQ(some->argmax[row], static_cast<int32_t>(best));
      EXPECT_EQ(some->argmax_logits[row], logits[best]);
      EXPECT_TRUE(some->row_logits(row).empty());
    } else {
      EXPECT_EQ(some->argmax[row], -1);
      const std::span<const float> kept = some->row_logits(row);
      EXPECT_TRUE(std::equal(kept.begin(), kept.end(), logits.begin(), logits.end()));
    }
  }
  EXPECT_EQ(some->logits.size(), all->logits.size() / 3);
}

// Embedding requests through the online engine: the hidden states after the output
// norm, pooled per request (none: every token's; mean, cls, last by their definition
// from those), bit-identical whatever the split of the layers, the prompt's steps
// (micro-batches of 3 tokens) or the generation requests beside them.
TEST_F(LocalPipeline, EmbeddingsPoolTheHiddenStatesWhateverTheSplit) {
  const auto file = gguf::Model::open(model_);
  const auto tok = tokenizer::Tokenizer::from_metadata(file->metadata());
  const std::vector<int32_t> prompt = tok->encode("Embeddings are pooled hidden states of a prompt", true, true);
  const size_t n = prompt.size();
  using Rows = std::vector<std::vector<float>>;
  // Per pooling (none, mean, cls, last): the rows the request returned.
  const auto embed = [&](const std::vector<std::pair<int, int>>& ranges, int micro_batch, bool with_traffic) {
    std::vector<std::unique_ptr<Stage>> stages;
    for (auto [a, b] : ranges) stages.push_back(std::make_unique<LocalStage>(model_, model::LayerRange{a, b}, 1));
    Pipeline pipeline(std::move(stages), protocol::model_identity(*file));
    SchedulerOptions o;
    o.micro_batch = micro_batch;
    Engine engine(pipeline, *tok, o);
    std::mutex mutex;
    std::condition_variable cv;
    int pending = 0;
    std::vector<Rows> out(4);
    std::vector<std::string> errors;
    const auto submit = [&](OnlineRequest r, Rows* rows) {
      Callbacks cb;
      cb.on_embedding = [&, rows](Rows got) {
        std::lock_guard lock(mutex);
        if (rows) *rows = std::move(got);
      };
      cb.on_done = [&](const std::string&, const Usage&) {
        std::lock_guard lock(mutex);
        --pending;
        cv.notify_all();
      };
      cb.on_error = [&](const std::string& message) {
        std::lock_guard lock(mutex);
        errors.push_back(message);
        --pending;
        cv.notify_all();
      };
      {
        std::lock_guard lock(mutex);
        ++pending;
      }
      engine.submit(std::move(r), std::move(cb));
    };
    if (with_traffic) {
      OnlineRequest text;
      text.prompt = tok->encode("Some text is generated meanwhile", true, true);
      text.max_tokens = 16;
      text.sampling = sample::SamplingParams::greedy();
      submit(text, nullptr);
    }
    const Pooling poolings[] = {Pooling::none, Pooling::mean, Pooling::cls, Pooling::last};
    for (size_t k = 0; k < 4; ++k) {
      OnlineRequest r;
      r.prompt = prompt;
      r.max_tokens = 0;
      r.embedding = poolings[k];
      submit(r, &out[k]);
    }
    std::unique_lock lock(mutex);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return pending == 0; }));
    EXPECT_TRUE(errors.empty()) << errors.front();
    return out;
  };
  const std::vector<Rows> alone = embed({{0, 4}}, 64, false);
  const Rows& rows = alone[0];
  ASSERT_EQ(rows.size(), n);
  for (const auto& row : rows) ASSERT_EQ(row.size(), 64u);
  std::vector<double> sum(64, 0.0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < 64; ++i) sum[i] += row[i];
  }
  std::vector<float> mean(64);
  for (size_t i = 0; i < 64; ++i) mean[i] = static_cast<float>(sum[i] / static_cast<double>(n));
  EXPECT_EQ(alone[1], Rows{mean});
  EXPECT_EQ(alone[2], Rows{rows.front()});
  EXPECT_EQ(alone[3], Rows{rows.back()});
  for (const auto& ranges : std::vector<std::vector<std::pair<int, int>>>{{{0, 2}, {2, 4}}, {{0, 1}, {1, 3}, {3, 4}}}) {
    const std::vector<Rows> split = embed(ranges, 3, true);
    for (size_t k = 0; k < 4; ++k) EXPECT_EQ(split[k], alone[k]) << "pooling " << k << ", " << ranges.size() << " stages";
  }
}

TEST_F(LocalPipeline, RefusesAnotherModel) {
  const auto file = gguf::Model::open(model_);
  protocol::ModelIdentity other = protocol::model_identity(*file);
  other.hash ^= 1;
  std::vector<std::unique_ptr<Stage>> stages;
  stages.push_back(std::make_unique<LocalStage>(model_, std::nullopt, 1));
  EXPECT_THROW(Pipeline(std::move(stages), other), StageError);
}

}  // namespace
}  // namespace pico::coordinator
