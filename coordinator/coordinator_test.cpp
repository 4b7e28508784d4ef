#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <cmath>
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "sample/argmax.hpp"
#include "cluster_config.hpp"
#include "engine.hpp"
#include "pipeline.hpp"
#include "gguf/value.hpp"
#include "protocol.hpp"
#include "tokenizer/tokenizer.hpp"
#include "fake_stage_test.hpp"

namespace pico::coordinator {
namespace {

using testing::FakeStage;
using testing::fake_identity;
using testing::tiny_tokenizer;

std::vector<StageInfo> stages(std::initializer_list<std::pair<int, int>> ranges) {
  std::vector<StageInfo> out;
  int k = 0;
  for (auto [a, b] : ranges) {
    StageInfo s;
    s.name = "w" + std::to_string(k++);
    s.layers = {a, b};
    out.push_back(s);
  }
  return out;
}

std::string coverage_error(const std::vector<StageInfo>& s, int n_layer) {
  try {
    check_coverage(s, n_layer);
  } catch (const StageError& e) {
    return e.what();
  }
  return "";
}

TEST(Coverage, AcceptsATiling) {
  EXPECT_EQ(coverage_error(stages({{0, 16}}), 16), "");
  EXPECT_EQ(coverage_error(stages({{0, 5}, {5, 6}, {6, 16}}), 16), "");
}

TEST(Coverage, NamesGapsAndOverlaps) {
  EXPECT_NE(coverage_error(stages({{0, 5}, {4, 16}}), 16).find("w1 (layers 4-15) overlaps worker w0"),
            std::string::npos);
  EXPECT_NE(coverage_error(stages({{0, 5}, {6, 16}}), 16).find("no stage holds layers 5-5"), std::string::npos);
  EXPECT_NE(coverage_error(stages({{1, 16}}), 16).find("no stage holds layers 0-0"), std::string::npos);
  EXPECT_NE(coverage_error(stages({{0, 8}}), 16).find("no stage holds layers 8-15"), std::string::npos);
  EXPECT_NE(coverage_error({}, 16), "");
}

TEST(ClusterConfig, ReadsWorkersAndScheduler) {
  const auto path = std::filesystem::temp_directory_path() / "pico-cluster-config-test.toml";
  {
    std::ofstream out(path);
    out << "[scheduler]\nmicro_batch = 8\nactivations = \"f16\"\nchain_steps = 3\n\n"
           "[[worker]]\naddress = \"tcp://10.0.0.2:7701\"\nlayers = \"0-15\"\n\n"
           "[[worker]]\naddress = \"ipc:///tmp/w1\"\n";
  }
  const ClusterConfig c = load_cluster_config(path.string());
  ASSERT_EQ(c.workers.size(), 2u);
  EXPECT_EQ(c.workers[0].address, "tcp://10.0.0.2:7701");
  ASSERT_TRUE(c.workers[0].layers.has_value());
  EXPECT_EQ(c.workers[0].layers->first, 0);
  EXPECT_EQ(c.workers[0].layers->last, 16);
  EXPECT_FALSE(c.workers[1].layers.has_value());
  EXPECT_EQ(c.micro_batch.value_or(0), 8);
  EXPECT_EQ(c.activations.value_or(""), "f16");
  EXPECT_EQ(c.chain_steps.value_or(-1), 3);
  {
    std::ofstream out(path);
    out << "[[worker]]\nlayers = \"0-1\"\n";
  }
  EXPECT_THROW(load_cluster_config(path.string()), std::runtime_error);
  {
    std::ofstream out(path);
    out << "[[worker]\n";
  }
  EXPECT_THROW(load_cluster_config(path.string()), std::runtime_error);
  {
    std::ofstream out(path);
    out << "[scheduler]\nchain_steps = -1\n";
  }
  EXPECT_THROW(load_cluster_config(path.string()), std::runtime_error);
  std::filesystem::remove(path);
}

TEST(LayerRange, ParsesInclusiveRanges) {
  const auto r = worker::parse_layers("0-15");
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.last, 16);
  EXPECT_THROW(worker::parse_layers("3-1"), std::invalid_argument);
  EXPECT_THROW(worker::parse_layers("a-b"), std::invalid_argument);
  EXPECT_THROW(worker::parse_layers("3"), std::invalid_argument);
  EXPECT_THROW(worker::parse_layers("1-2x"), std::invalid_argument);
}

// Stop strings: matched across pushes, never released, text that may begin one held back.
TEST(StopMatcher, HoldsBackAndCuts) {
  StopMatcher m({"</end>", "STOP"});
  EXPECT_EQ(m.push("Hello <"), "Hello ");
  EXPECT_EQ(m.push("/e"), "");
  EXPECT_EQ(m.push("x"), "</ex");  // no longer a prefix
  EXPECT_EQ(m.push(" ST"), " ");
  EXPECT_EQ(m.push("OP and more"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.push("later"), "");
}

TEST(StopMatcher, FlushReleasesAPartialPrefix) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xxab"), "xx");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.flush(), "ab");
  StopMatcher none({});
  EXPECT_EQ(none.push("anything"), "anything");
  StopMatcher empty({""});
  EXPECT_EQ(empty.push("text"), "text");
  EXPECT_FALSE(empty.matched());
}

TEST(StopMatcher, EarliestMatchWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_TRUE(m.matched());
}

struct FakePipeline {
  FakeStage* first;
  FakeStage* last;
  std::unique_ptr<Pipeline> pipeline;
};
FakePipeline fake_pipeline(int64_t offset0, int64_t offset1) {
  std::vector<std::unique_ptr<Stage>> stages;
  auto a = std::make_unique<FakeStage>(model::LayerRange{0, 2}, fake_identity(), offset0);
  auto b = std::make_unique<FakeStage>(model::LayerRange{2, 4}, fake_identity(), offset1);
  FakePipeline f{a.get(), b.get(), nullptr};
  stages.push_back(std::move(a));
  stages.push_back(std::move(b));
  f.pipeline = std::make_unique<Pipeline>(std::move(stages), fake_identity());
  return f;
}

const std::vector<model::BatchToken> kBatch{{1, 0, 5, false}, {1, 1, 6, true}};

// Compute, queueing and transfer of each stage, mapped onto the coordinator's clock
// with each stage's offset: the numbers below are what the stamps say.
TEST(PipelineTimings, SplitsEachHopIntoQueueAndTransfer) {
  auto f = fake_pipeline(500, -300);
  EXPECT_EQ(f.first->plans, 1);
  const uint64_t step = f.pipeline->submit(kBatch);
  f.last->answers.push_back([&] {
    // Coordinator clock: base = now, so that every stamp comes after wait() began.
    const int64_t base = static_cast<int64_t>(protocol::steady_nanos());
    auto at = [&](int64_t coord_time, int64_t offset) { return static_cast<uint64_t>(base + coord_time + offset); };
    StepOutput o;
    o.step = step;
    o.seq_ids = {1};
    o.positions = {1};
    o.logits = std::vector<float>(8, 0.0f);
    o.n_vocab = 8;
    o.sent_nanos = static_cast<uint64_t>(base + 1000);
    // Stage 0 (clock +500): idle before the batch was sent, got it 100 ns later,
    // computed 1000 ns, sent at 2200.
    o.stamps.push_back({0, at(1100, 500), at(900, 500), at(1150, 500), at(2150, 500), at(2200, 500)});
    // Stage 1 (clock -300): still busy until 2500 (300 ns of queueing), got it at 2600
    // (100 ns in transit after it was free), computed 2000 ns, sent at 4650.
    o.stamps.push_back({1, at(2600, -300), at(2500, -300), at(2600, -300), at(4600, -300), at(4650, -300)});
    o.received_nanos = static_cast<uint64_t>(base + 5000);  // 350 ns back to the coordinator
    return o;
  });
  const StepOutput out = f.pipeline->wait(1000);
  EXPECT_EQ(out.step, step);
  const PipelineTimings t = f.pipeline->timings();
  ASSERT_EQ(t.stages.size(), 2u);
  EXPECT_NEAR(t.stages[0].compute_seconds, 1000e-9, 1e-15);
  EXPECT_NEAR(t.stages[0].transfer_seconds, 100e-9, 1e-15);
  EXPECT_NEAR(t.stages[0].queue_seconds, 0.0, 1e-15);
  EXPECT_NEAR(t.stages[1].compute_seconds, 2000e-9, 1e-15);
  EXPECT_NEAR(t.stages[1].queue_seconds, 300e-9, 1e-15);
  EXPECT_NEAR(t.stages[1].transfer_seconds, 100e-9, 1e-15);
  EXPECT_NEAR(t.logits_transfer_seconds, 350e-9, 1e-15);
  EXPECT_EQ(t.stages[1].batches, 1u);
  EXPECT_EQ(t.stages[1].tokens, 2u);
  EXPECT_EQ(t.stages[1].layers.first, 2);
}

// Late answers of abandoned steps (logits, errors) are dropped; the current one comes
// through.
TEST(PipelineSteps, DropsAnswersOfAbandonedSteps) {
  auto f = fake_pipeline(0, 0);
  const uint64_t first = f.pipeline->submit(kBatch);
  f.last->answers.push_back([&]() -> StepOutput { throw StageError("lost", 0); });
  EXPECT_THROW(f.pipeline->wait(1000), StageError);  // abandons `first`
  const uint64_t second = f.pipeline->submit(kBatch);
  auto answer = [](uint64_t step) {
    return [step] {
      StepOutput o;
      o.step = step;
      return o;
    };
  };
  f.last->answers.push_back(answer(first));  // late
  f.last->answers.push_back([first]() -> StepOutput { throw StageError("late error", first); });
  f.last->answers.push_back(answer(second));
  EXPECT_EQ(f.pipeline->wait(1000).step, second);
  EXPECT_TRUE(f.last->answers.empty());
  // An error about the step in flight fails it.
  const uint64_t third = f.pipeline->submit(kBatch);
  f.last->answers.push_back([third]() -> StepOutput { throw StageError("forward failed", third); });
  EXPECT_THROW(f.pipeline->wait(1000), StageError);
}

// A lost stage: submit tries to get it back; while it is not, steps fail; once it is,
// every stage gets its plan again.
TEST(PipelineSteps, RejoinsALostStageAndPlansAgain) {
  auto f = fake_pipeline(0, 0);
  f.last->is_up = false;
  f.last->comes_back = false;
  EXPECT_THROW(f.pipeline->submit(kBatch), StageError);
  EXPECT_EQ(f.last->rejoins.load(), 1);
  EXPECT_TRUE(f.first->submitted.empty());
  f.last->comes_back = true;
  f.pipeline->submit(kBatch);
  EXPECT_EQ(f.last->rejoins.load(), 2);
  EXPECT_EQ(f.first->plans, 2);
  EXPECT_EQ(f.last->plans, 2);
  EXPECT_EQ(f.first->submitted.size(), 1u);
}

// Plans go out last stage first: a CURVE stage must know its predecessor's key before
// the predecessor connects (a refused handshake is not retried).
TEST(PipelineSteps, PlansTheLastStageFirst) {
  FakeStage::plan_order.clear();
  auto f = fake_pipeline(0, 0);
  EXPECT_EQ(FakeStage::plan_order, (std::vector<std::string>{f.last->info().name, f.first->info().name}));
}

// With remote stages the next step goes out as soon as the sampled tokens are known:
// a token's text and callbacks come after the step that carries it was submitted (they
// run while the stages compute), except for the last token, which submits nothing.
TEST(EngineSteps, SubmitsTheNextStepBeforeATokensText) {
  auto f = fake_pipeline(0, 0);
  const auto tok = tiny_tokenizer();
  std::vector<std::string> events;  // engine thread only, until on_done
  f.first->on_submit = [&](uint64_t step, std::span<const model::BatchToken> batch) {
    events.push_back("submit");
    std::vector<int32_t> seqs, positions;
    for (const auto& t : batch) {
      if (!t.logits) continue;
      seqs.push_back(t.seq_id);
      positions.push_back(t.pos);
    }
    f.last->answers.push_back([step, seqs, positions] {
      StepOutput o;
      o.step = step;
      o.seq_ids = seqs;
      o.positions = positions;
      o.n_vocab = 4;
      o.logits = std::vector<float>{0.0f, 0.0f, 0.0f, 5.0f};  // "a"
      return o;
    });
  };
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::string text;
  {
    Engine engine(*f.pipeline, *tok, SchedulerOptions{});
    OnlineRequest r;
    r.prompt = {1, 3};
    r.max_tokens = 3;
    r.sampling.temperature = 0.0f;
    Callbacks cb;
    cb.on_token = [&](const TokenEvent& ev) {
      if (ev.id >= 0) events.push_back("token");
      text += ev.text;
    };
    cb.on_done = [&](const std::string&, const Usage&) {
      events.push_back("done");
      std::lock_guard lock(mutex);
      done = true;
      cv.notify_all();
    };
    cb.on_error = [&](const std::string& message) {
      events.push_back("error: " + message);
      std::lock_guard lock(mutex);
      done = true;
      cv.notify_all();
    };
    engine.submit(std::move(r), std::move(cb));
    std::unique_lock lock(mutex);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
  }
  // The prompt, then each token's text after the step with that token went out (the
  // third and last token submits nothing).
  EXPECT_EQ(events, (std::vector<std::string>{"submit", "submit", "token", "submit", "token", "token", "done"}));
  EXPECT_EQ(text, "aaa");
}

// The heatmap's traces: steps are traced only while someone watches, and each stage's
// trace of a step reaches the watchers merged per token, one value per layer of the model.
TEST(LayerTrace, OnlyWhileWatchedAndMergedAcrossStages) {
  auto f = fake_pipeline(0, 0);
  const auto tok = tiny_tokenizer();
  std::mutex mutex;
  std::vector<bool> traced_steps;  // per submitted step: were its tokens traced
  f.first->on_submit = [&](uint64_t step, std::span<const model::BatchToken> batch) {
    const bool traced = std::all_of(batch.begin(), batch.end(), [](const model::BatchToken& t) { return t.trace; });
    EXPECT_TRUE(traced || std::none_of(batch.begin(), batch.end(), [](const model::BatchToken& t) { return t.trace; }));
    {
      std::lock_guard lock(mutex);
      traced_steps.push_back(traced);
    }
    std::vector<int32_t> seqs, positions;
    for (const auto& t : batch) {
      if (!t.logits) continue;
      seqs.push_back(t.seq_id);
      positions.push_back(t.pos);
    }
    StepOutput o;
    o.step = step;
    o.seq_ids = seqs;
    o.positions = positions;
    o.n_vocab = 4;
    o.logits = std::vector<float>{0.0f, 0.0f, 0.0f, 5.0f};
    if (traced) {  // each stage's own layers: 0-1 on the first, 2-3 on the last
      for (int32_t first : {0, 2}) {
        StageTrace t{first, 2, {}, {}, {}};
        for (const auto& b : batch) {
          t.seq_ids.push_back(b.seq_id);
          t.positions.push_back(b.pos);
          t.rms.push_back(static_cast<float>(100 * b.pos + first));
          t.rms.push_back(static_cast<float>(100 * b.pos + first + 1));
        }
        o.traces.push_back(std::move(t));
      }
    }
    auto answer = std::make_shared<StepOutput>(std::move(o));
    f.last->answers.push_back([answer] { return std::move(*answer); });
  };
  Engine engine(*f.pipeline, *tok, SchedulerOptions{});
  auto run = [&](int max_tokens) {
    std::promise<void> finished;
    OnlineRequest r;
    r.prompt = {1, 3};
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0.0f;
    Callbacks cb;
    cb.on_done = [&](const std::string&, const Usage&) { finished.set_value(); };
    cb.on_error = [&](const std::string&) { finished.set_value(); };
    engine.submit(std::move(r), std::move(cb));
    ASSERT_EQ(finished.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  };
  run(2);
  {
    std::lock_guard lock(mutex);
    EXPECT_TRUE(std::none_of(traced_steps.begin(), traced_steps.end(), [](bool b) { return b; })) << "nobody watches";
    traced_steps.clear();
  }
  auto watcher = engine.layer_trace().watch();
  EXPECT_TRUE(engine.layer_trace().watched());
  run(3);
  {
    std::lock_guard lock(mutex);
    EXPECT_TRUE(!traced_steps.empty() && std::all_of(traced_steps.begin(), traced_steps.end(), [](bool b) { return b; }));
    traced_steps.clear();
  }
  const std::vector<TracedToken> tokens = watcher->take();
  ASSERT_EQ(tokens.size(), 4u);  // the prompt's two tokens, then two generated ones
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(tokens[i].pos, static_cast<int32_t>(i));
    const float p = static_cast<float>(100 * tokens[i].pos);
    EXPECT_EQ(tokens[i].rms, (std::vector<float>{p, p + 1, p + 2, p + 3}));
  }
  watcher.reset();
  EXPECT_FALSE(engine.layer_trace().watched());
  run(2);
  std::lock_guard lock(mutex);
  EXPECT_TRUE(std::none_of(traced_steps.begin(), traced_steps.end(), [](bool b) { return b; })) << "no one watches again";
}

// SamplingParams::argmax_suffices says yes only where the sampler's pick is the arg max of the raw
// logits (the first of equal maxima): checked against the sampler on rows with ties.
TEST(ArgmaxOutput, SufficesExactlyWhereTheSamplerPicksTheArgmax) {
  std::vector<float> logits(64);
  uint32_t state = 12345;
  for (float& v : logits) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 24) / 16.0f;  // few distinct values: ties
  }
  const int32_t argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  sample::SamplingParams greedy = sample::SamplingParams::greedy();
  greedy.seed = 1;
  EXPECT_TRUE(greedy.argmax_suffices());
  std::vector<int32_t> history;  // accepted tokens: the penalties see them
  for (int32_t t = 0; t < 64; t += 3) history.push_back(t);
  auto picks = [&](const sample::SamplingParams& p) {
    sample::Sampler s(p);
    for (int32_t t : history) s.accept(t);
    return s.sample(logits);
  };
  EXPECT_EQ(picks(greedy), argmax);
  auto top_k = greedy;  // filters that keep the best candidate change nothing
  top_k.top_k = 5;
  top_k.top_p = 0.5f;
  top_k.min_p = 0.2f;
  EXPECT_TRUE(top_k.argmax_suffices());
  EXPECT_EQ(picks(top_k), argmax);
  auto warm = greedy;
  warm.temperature = 0.8f;
  EXPECT_FALSE(warm.argmax_suffices());
  auto biased = greedy;
  biased.logit_bias = {{argmax, -INFINITY}};
  EXPECT_FALSE(biased.argmax_suffices());
  EXPECT_NE(picks(biased), argmax);
  auto penalised = greedy;
  penalised.repeat_penalty = 1.5f;
  penalised.penalty_last_n = 64;
  EXPECT_FALSE(penalised.argmax_suffices());
  penalised.penalty_last_n = 0;  // a window of nothing: no penalty
  EXPECT_TRUE(penalised.argmax_suffices());
  auto typical = greedy;
  typical.typical_p = 0.5f;
  EXPECT_FALSE(typical.argmax_suffices());
  auto xtc = greedy;  // excludes the top choices: the best goes
  xtc.xtc_probability = 1.0f;
  xtc.xtc_threshold = 0.0f;
  EXPECT_FALSE(xtc.argmax_suffices());
  EXPECT_NE(picks(xtc), argmax);
  auto dynamic = greedy;
  dynamic.dynatemp_range = 1.0f;
  EXPECT_FALSE(dynamic.argmax_suffices());
  auto mirostat = greedy;
  mirostat.mirostat = 1;
  EXPECT_FALSE(mirostat.argmax_suffices());
  auto sigma = greedy;  // keeps the best
  sigma.top_n_sigma = 0.5f;
  EXPECT_TRUE(sigma.argmax_suffices());
  EXPECT_EQ(picks(sigma), argmax);
}

// The last stage's arg max is std::max_element's pick (which the greedy sampler makes):
// on rows with ties, NaNs, signed zeros and infinities, of every length around the
// lane and chunk sizes.
TEST(ArgmaxOutput, FirstArgmaxIsMaxElement) {
  uint32_t state = 7;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  const float specials[] = {NAN, 0.0f, -0.0f, INFINITY, -INFINITY};
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<float> row(1 + next() % 300);
    for (float& v : row) {
      const uint32_t r = next();
      v = (r >> 28) < 5 ? specials[r >> 28] : static_cast<float>((r >> 16) % 7) - 3.0f;
    }
    const auto expected = static_cast<size_t>(std::max_element(row.begin(), row.end()) - row.begin());
    ASSERT_EQ(sample::first_argmax(row.data(), row.size()), expected) << "trial " << trial;
  }
  std::vector<float> logits(32000);
  for (float& v : logits) v = static_cast<float>(next() >> 8) * 1e-5f;
  EXPECT_EQ(sample::first_argmax(logits.data(), logits.size()),
            static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
}

// Runs one request through an engine on the fake pipeline, whose last stage answers
// every step with arg max rows where they were asked for (token 3, "a") and full rows
// otherwise; returns the outputs asked for at each step.
std::vector<std::vector<protocol::LogitsOutput>> outputs_asked(const OnlineRequest& request, std::string* text,
                                                               std::vector<size_t>* sampled_rows = nullptr) {
  auto f = fake_pipeline(0, 0);
  const auto tok = tiny_tokenizer();
  f.first->on_submit = [&](uint64_t step, std::span<const model::BatchToken> batch) {
    const auto asked = f.first->submitted_outputs.back();
    StepOutput o;
    o.step = step;
    o.n_vocab = 4;
    std::vector<float> full;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!batch[i].logits) continue;
      o.seq_ids.push_back(batch[i].seq_id);
      o.positions.push_back(batch[i].pos);
      const bool argmax = !asked.empty() && asked[i] == protocol::LogitsOutput::ARGMAX;
      o.argmax.push_back(argmax ? 3 : -1);
      o.argmax_logits.push_back(argmax ? 5.0f : 0.0f);
      if (!argmax) full.insert(full.end(), {0.0f, 0.0f, 0.0f, 5.0f});
    }
    o.logits = std::move(full);
    auto answer = std::make_shared<StepOutput>(std::move(o));  // std::function needs a copyable target
    f.last->answers.push_back([answer] { return std::move(*answer); });
  };
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  {
    Engine engine(*f.pipeline, *tok, SchedulerOptions{});
    Callbacks cb;
    cb.on_sampled = [&](int32_t, std::span<const float> logits) {
      if (sampled_rows) sampled_rows->push_back(logits.size());
    };
    cb.on_token = [&](const TokenEvent& ev) { *text += ev.text; };
    cb.on_done = [&](const std::string&, const Usage&) {
      std::lock_guard lock(mutex);
      done = true;
      cv.notify_all();
    };
    cb.on_error = [&](const std::string& message) {
      std::lock_guard lock(mutex);
      *text += "error: " + message;
      done = true;
      cv.notify_all();
    };
    engine.submit(request, std::move(cb));
    std::unique_lock lock(mutex);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
  }
  return f.first->submitted_outputs;
}

// Greedy requests without logprobs ask the last stage for the arg max of each row
// they sample from; sampling at a temperature, logprobs and full_logits get full rows.
TEST(ArgmaxOutput, AskedOnlyByRequestsThatNeedNoMore) {
  using protocol::LogitsOutput;
  OnlineRequest r;
  r.prompt = {1, 3, 3};
  r.max_tokens = 3;
  r.sampling = sample::SamplingParams::greedy();
  r.sampling.seed = 1;
  std::string text;
  std::vector<size_t> rows;
  const auto greedy = outputs_asked(r, &text, &rows);
  ASSERT_EQ(greedy.size(), 3u);  // the prompt, then the first two tokens
  // The prompt's last token only wants logits: the others' output does not matter.
  EXPECT_EQ(greedy[0].size(), 3u);
  EXPECT_EQ(greedy[0].back(), LogitsOutput::ARGMAX);
  EXPECT_EQ(greedy[1], std::vector<LogitsOutput>{LogitsOutput::ARGMAX});
  EXPECT_EQ(text, "aaa");
  EXPECT_EQ(rows, (std::vector<size_t>{0, 0, 0}));  // on_sampled: no full row

  for (int variant = 0; variant < 3; ++variant) {
    OnlineRequest full = r;
    if (variant == 0) full.sampling.temperature = 0.8f;
    if (variant == 1) full.logprobs = 2;
    if (variant == 2) full.full_logits = true;
    text.clear();
    rows.clear();
    const auto asked = outputs_asked(full, &text, &rows);
    ASSERT_EQ(asked.size(), 3u) << "variant " << variant;
    for (const auto& step : asked) EXPECT_TRUE(step.empty()) << "variant " << variant;  // full rows
    EXPECT_EQ(text, "aaa") << "variant " << variant;
    EXPECT_EQ(rows, (std::vector<size_t>{4, 4, 4})) << "variant " << variant;
  }
}

// A step whose rows are partly arg max only: each full row is found in order.
TEST(ArgmaxOutput, FullRowsOfAMixedStep) {
  StepOutput o;
  o.n_vocab = 2;
  o.argmax = {-1, 7, -1};
  o.argmax_logits = {0.0f, 1.5f, 0.0f};
  o.logits = std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f};
  EXPECT_EQ(std::vector<float>(o.row_logits(0).begin(), o.row_logits(0).end()), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_TRUE(o.is_argmax(1));
  EXPECT_TRUE(o.row_logits(1).empty());
  EXPECT_EQ(std::vector<float>(o.row_logits(2).begin(), o.row_logits(2).end()), (std::vector<float>{3.0f, 4.0f}));
  StepOutput plain;
  plain.n_vocab = 2;
  plain.logits = std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f};
  EXPECT_FALSE(plain.is_argmax(1));
  EXPECT_EQ(plain.row_logits(1)[0], 3.0f);
}

// ---- Greedy chains ------------------------------------------------------------

// A pipeline whose last stage chains as a pico-worker does: after a step whose rows
// all want their arg max only, none of them a stop token, it "sends" the next step
// itself (the answers of the whole chain are queued at once). `model(pos)` is the
// token the model picks after position pos, whatever the sequence.
struct ChainingPipeline {
  FakePipeline f = fake_pipeline(0, 0);
  std::function<int32_t(int32_t pos)> model = [](int32_t) { return 3; };
  int steps_computed = 0;
  ChainingPipeline() {
    f.first->on_submit = [this](uint64_t step, std::span<const model::BatchToken> batch) {
      const ChainGrant grant = f.first->grants.back();
      const auto& outputs = f.first->submitted_outputs.back();
      std::vector<int32_t> seqs, positions;
      bool all_argmax = !outputs.empty();
      for (size_t i = 0; i < batch.size(); ++i) {
        all_argmax = all_argmax && batch[i].logits && outputs[i] == protocol::LogitsOutput::ARGMAX;
        if (!batch[i].logits) continue;
        seqs.push_back(batch[i].seq_id);
        positions.push_back(batch[i].pos);
      }
      for (uint32_t left = grant.steps;; --left) {
        ++steps_computed;
        StepOutput o;
        o.step = step++;
        o.seq_ids = seqs;
        o.positions = positions;
        o.n_vocab = 4;
        o.sent_by_last = left != grant.steps;
        std::vector<float> full;
        for (int32_t pos : positions) {
          const int32_t id = model(pos);
          if (all_argmax) {
            o.argmax.push_back(id);
            o.argmax_logits.push_back(5.0f);
          } else {
            for (int32_t v = 0; v < 4; ++v) full.push_back(v == id ? 5.0f : 0.0f);
          }
        }
        o.logits = std::move(full);
        const bool stop = std::any_of(o.argmax.begin(), o.argmax.end(), [&](int32_t id) {
          return std::find(grant.stop_tokens.begin(), grant.stop_tokens.end(), id) != grant.stop_tokens.end();
        });
        o.chained = all_argmax && left > 0 && !stop;
        const bool more = o.chained;
        auto shared = std::make_shared<StepOutput>(std::move(o));  // std::function wants a copyable callable
        f.last->answers.push_back([shared] { return std::move(*shared); });
        if (!more) break;
        for (auto& p : positions) ++p;  // the chained step: each row's next position
      }
    };
  }
};

struct Outcome {
  std::string text, reason, error;
  int tokens = 0;
};
// Runs one request to its end; on_second_token (optional) gets the request's handle at
// its second token.
Outcome run_request(Pipeline& pipeline, const tokenizer::Tokenizer& tok, OnlineRequest r,
                    std::function<void(Engine::Handle&)> on_second_token = {}) {
  Outcome out;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  Engine engine(pipeline, tok, SchedulerOptions{});
  Engine::Handle handle;
  bool submitted = false;
  Callbacks cb;
  cb.on_token = [&](const TokenEvent& ev) {
    out.text += ev.text;
    if (ev.id < 0 || out.tokens++ != 1 || !on_second_token) return;
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return submitted; });  // the handle is assigned
    on_second_token(handle);
  };
  cb.on_done = [&](const std::string& reason, const Usage&) {
    std::lock_guard lock(mutex);
    out.reason = reason;
    done = true;
    cv.notify_all();
  };
  cb.on_error = [&](const std::string& message) {
    std::lock_guard lock(mutex);
    out.error = message;
    done = true;
    cv.notify_all();
  };
  {
    Engine::Handle h = engine.submit(std::move(r), std::move(cb));
    std::lock_guard lock(mutex);
    handle = h;
    submitted = true;
    cv.notify_all();
  }
  std::unique_lock lock(mutex);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
  return out;
}

// A greedy request runs in chains of up to chain_steps steps the coordinator does not
// submit; the chain stops at an end-of-generation token, and the request with it.
TEST(GreedyChain, RunsStepsWithoutTheCoordinatorUntilEndOfGeneration) {
  ChainingPipeline c;
  c.model = [](int32_t pos) { return pos == 13 ? 2 : 3; };  // </s> after position 13
  const auto tok = tiny_tokenizer();
  OnlineRequest r;
  r.prompt = {1, 3};
  r.max_tokens = 100;
  r.sampling = sample::SamplingParams::greedy();
  const Outcome out = run_request(*c.f.pipeline, *tok, r);
  EXPECT_EQ(out.error, "");
  EXPECT_EQ(out.reason, "stop");
  EXPECT_EQ(out.text, std::string(12, 'a'));  // after positions 1..12
  // The prompt; position 2 with a chain through 10 (8 steps); 11, chained to 13 (</s>).
  const std::vector<uint64_t> expected_steps{1, 2, 11};
  EXPECT_EQ(c.f.first->submitted, expected_steps);
  ASSERT_EQ(c.f.first->grants.size(), 3u);
  EXPECT_EQ(c.f.first->grants[0].steps, 0u);  // a prompt step does not chain
  EXPECT_EQ(c.f.first->grants[1].steps, 8u);
  EXPECT_EQ(c.f.first->grants[2].steps, 8u);
  EXPECT_EQ(c.f.first->grants[1].stop_tokens, tok->vocab().eog_tokens());
  EXPECT_EQ(c.steps_computed, 13);  // positions 1 (the prompt's) to 13: no step past the end
  EXPECT_EQ(c.f.pipeline->timings().chained_steps, 10u);
  EXPECT_TRUE(c.f.last->answers.empty());
}

// A chain never runs past max_tokens (nor the context): exactly the tokens asked for
// are computed.
TEST(GreedyChain, StopsAtMaxTokensWithoutAStepTooMany) {
  for (int max_tokens : {1, 2, 5, 9, 10, 11, 30}) {
    ChainingPipeline c;
    const auto tok = tiny_tokenizer();
    OnlineRequest r;
    r.prompt = {1, 3};
    r.max_tokens = max_tokens;
    r.sampling = sample::SamplingParams::greedy();
    r.ignore_eos = true;
    const Outcome out = run_request(*c.f.pipeline, *tok, r);
    EXPECT_EQ(out.reason, "length") << max_tokens;
    EXPECT_EQ(out.text, std::string(static_cast<size_t>(max_tokens), 'a')) << max_tokens;
    EXPECT_EQ(c.steps_computed, max_tokens) << max_tokens;  // the prompt's step gives the first token
    for (const auto& g : c.f.first->grants) EXPECT_TRUE(g.stop_tokens.empty()) << "ignore_eos: no stop tokens";
    EXPECT_TRUE(c.f.last->answers.empty()) << max_tokens;
  }
}

// No chain where another sequence would wait, or where the coordinator must see each
// row: sampling at a temperature, stop strings.
TEST(GreedyChain, OnlyForASingleBatchOfPlainGreedyRequests) {
  const auto tok = tiny_tokenizer();
  for (int variant = 0; variant < 2; ++variant) {
    ChainingPipeline c;
    OnlineRequest r;
    r.prompt = {1, 3};
    r.max_tokens = 6;
    r.sampling = sample::SamplingParams::greedy();
    if (variant == 0) r.sampling.temperature = 0.7f;
    if (variant == 1) r.stop = {"zz"};
    const Outcome out = run_request(*c.f.pipeline, *tok, r);
    EXPECT_EQ(out.text, "aaaaaa") << variant;
    for (const auto& g : c.f.first->grants) EXPECT_EQ(g.steps, 0u) << variant;
  }
  // Two sequences on two stages decode in two groups: neither chains. The first step
  // waits until both requests are queued: a lone first request would rightly chain
  // (the second arriving meanwhile waits for the chain's end).
  ChainingPipeline c;
  std::mutex mutex;
  std::condition_variable cv;
  int done = 0;
  bool both_queued = false;
  const auto compute = c.f.first->on_submit;
  c.f.first->on_submit = [&](uint64_t step, std::span<const model::BatchToken> batch) {
    {
      std::unique_lock lock(mutex);
      cv.wait(lock, [&] { return both_queued; });
    }
    compute(step, batch);
  };
  {
    Engine engine(*c.f.pipeline, *tok, SchedulerOptions{});
    for (int i = 0; i < 2; ++i) {
      OnlineRequest r;
      r.prompt = {1, 3};
      r.max_tokens = 6;
      r.sampling = sample::SamplingParams::greedy();
      Callbacks cb;
      cb.on_done = [&](const std::string&, const Usage&) {
        std::lock_guard lock(mutex);
        ++done;
        cv.notify_all();
      };
      cb.on_error = [&](const std::string& message) {
        ADD_FAILURE() << message;
        std::lock_guard lock(mutex);
        ++done;
        cv.notify_all();
      };
      engine.submit(std::move(r), std::move(cb));
    }
    std::unique_lock lock(mutex);
    both_queued = true;
    cv.notify_all();
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done == 2; }));
  }
  // The prompts (one step or two, as they arrive), then 5 decode steps per sequence,
  // every one submitted by the coordinator.
  EXPECT_GE(c.f.first->submitted.size(), 11u);
  EXPECT_EQ(static_cast<size_t>(c.steps_computed), c.f.first->submitted.size());
  for (size_t i = 0; i < c.f.first->grants.size(); ++i) {
    EXPECT_EQ(c.f.first->grants[i].steps, 0u) << "step " << c.f.first->submitted[i];
  }
}

// A request cancelled during a chain ends when the chain's last step is back: its
// sequence is closed only then, never while a step holding its tokens is in flight.
TEST(GreedyChain, ACancelledSequenceIsClosedAfterTheChainsLastStep) {
  ChainingPipeline c;
  const auto tok = tiny_tokenizer();
  bool closed_early = false;
  int closes = 0;
  c.f.last->on_close = [&](int32_t) {
    ++closes;
    if (!c.f.last->answers.empty()) closed_early = true;
  };
  OnlineRequest r;
  r.prompt = {1, 3};
  r.max_tokens = 100;
  r.sampling = sample::SamplingParams::greedy();
  r.ignore_eos = true;
  const Outcome out = run_request(*c.f.pipeline, *tok, r, [](Engine::Handle& h) { h.cancel(); });
  EXPECT_EQ(out.reason, "cancelled");
  EXPECT_EQ(closes, 1);
  EXPECT_FALSE(closed_early) << "closed while a chained step was in flight";
  EXPECT_LE(out.tokens, 10);  // the first token, then at most the rest of one chain
  EXPECT_EQ(c.f.first->submitted.size(), 2u);  // the prompt and the chain: nothing after the cancel
}

// The pipeline's side: chained steps finish right after the step that started them;
// nothing else may be submitted meanwhile; a chained answer without a grant is an error.
TEST(GreedyChain, PipelineKeepsTheChainedStepsInOrder) {
  auto f = fake_pipeline(0, 0);
  EXPECT_TRUE(f.pipeline->chains_possible());
  EXPECT_EQ(f.last->chain_to, f.first);  // planned: the last stage chains to the first
  EXPECT_EQ(f.first->chain_to, nullptr);
  ChainGrant grant;
  grant.steps = 2;
  const uint64_t step = f.pipeline->submit(kBatch, {}, grant);
  EXPECT_TRUE(f.pipeline->chain_running());
  EXPECT_THROW(f.pipeline->submit(kBatch), std::logic_error);
  auto answer = [](uint64_t id, bool chained) {
    return [id, chained] {
      StepOutput o;
      o.step = id;
      o.chained = chained;
      o.sent_by_last = id > 1;
      return o;
    };
  };
  f.last->answers.push_back(answer(step, true));
  f.last->answers.push_back(answer(step + 1, false));  // the chain ends early
  EXPECT_EQ(f.pipeline->wait(1000).step, step);
  EXPECT_TRUE(f.pipeline->chain_running());
  EXPECT_EQ(f.pipeline->wait(1000).step, step + 1);
  EXPECT_FALSE(f.pipeline->chain_running());
  // The ids the chain could have used are skipped.
  const uint64_t next = f.pipeline->submit(kBatch);
  EXPECT_EQ(next, step + 3);
  f.last->answers.push_back(answer(next, true));
  EXPECT_THROW(f.pipeline->wait(1000), StageError);  // chained without a grant
}

TEST(MedianTokenInterval, IsTheMiddleGap) {
  Result r;
  EXPECT_EQ(median_token_interval(r), 0.0);
  r.token_seconds = {1.0};
  EXPECT_EQ(median_token_interval(r), 0.0);
  r.token_seconds = {1.0, 1.5, 1.75, 5.0};  // gaps 0.5, 0.25, 3.25
  EXPECT_EQ(median_token_interval(r), 0.5);
  r.token_seconds = {0.0, 1.0, 3.0, 3.5, 7.5};  // gaps 1, 2, 0.5, 4
  EXPECT_EQ(median_token_interval(r), 1.5);
}


// ---- One request's failure is its own ----------------------------------------

// A fake pipeline whose last stage answers every step at once: for each row that wants
// logits, a full row picking "a" (3), unless `answer` (optional) says otherwise for a
// sequence: nullopt leaves it out, else the row it gives (any length; its n_vocab 4).
struct AnsweringPipeline {
  FakePipeline f = fake_pipeline(0, 0);
  std::function<bool(uint64_t step, std::span<const model::BatchToken> batch)> refuse;  // throw StageError(step)
  std::function<std::vector<float>(int32_t seq)> row = [](int32_t) { return std::vector<float>{0, 0, 0, 5}; };
  std::atomic<bool> answering = true;
  AnsweringPipeline() {
    f.first->on_submit = [this](uint64_t step, std::span<const model::BatchToken> batch) {
      if (!answering) return;
      if (refuse && refuse(step, batch)) {
        f.last->answers.push_back([step]() -> StepOutput { throw StageError("worker fake: exceeds a limit", step); });
        return;
      }
      StepOutput o;
      o.step = step;
      o.n_vocab = 4;
      std::vector<float> values;
      for (const auto& t : batch) {
        if (!t.logits) continue;
        o.seq_ids.push_back(t.seq_id);
        o.positions.push_back(t.pos);
        const auto r = row(t.seq_id);
        values.insert(values.end(), r.begin(), r.end());
      }
      o.logits = std::move(values);
      auto shared = std::make_shared<StepOutput>(std::move(o));
      f.last->answers.push_back([shared] { return std::move(*shared); });
    };
  }
};

// The outcomes of several requests on one engine.
struct Outcomes {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<int, Outcome> by_request;
  int finished = 0;
  Callbacks callbacks(int request) {
    Callbacks cb;
    cb.on_token = [this, request](const TokenEvent& ev) {
      std::lock_guard lock(mutex);
      by_request[request].text += ev.text;
      if (ev.id >= 0) ++by_request[request].tokens;
    };
    cb.on_done = [this, request](const std::string& reason, const Usage&) {
      std::lock_guard lock(mutex);
      by_request[request].reason = reason;
      ++finished;
      cv.notify_all();
    };
    cb.on_error = [this, request](const std::string& message) {
      std::lock_guard lock(mutex);
      by_request[request].error = message;
      ++finished;
      cv.notify_all();
    };
    return cb;
  }
  bool wait(int n) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return finished >= n; });
  }
};

OnlineRequest plain_request(std::vector<int32_t> prompt, int max_tokens) {
  OnlineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = sample::SamplingParams::greedy();
  r.sampling.temperature = 0.5f;  // full rows, sampled (the sampler runs)
  r.sampling.seed = 1;
  return r;
}

// The crash: a sampler that cannot be built (repeat_penalty 0 got past the HTTP
// checks) fails its request alone; the engine thread and the other request go on.
TEST(EngineFailures, ASamplerThatCannotBeBuiltFailsItsRequestAlone) {
  AnsweringPipeline p;
  const auto tok = tiny_tokenizer();
  Outcomes out;
  {
    Engine engine(*p.f.pipeline, *tok, SchedulerOptions{});
    OnlineRequest bad = plain_request({1, 3}, 3);
    bad.sampling.repeat_penalty = 0.0f;
    engine.submit(plain_request({1, 3}, 3), out.callbacks(0));
    engine.submit(std::move(bad), out.callbacks(1));
    ASSERT_TRUE(out.wait(2));
    // The engine still serves.
    engine.submit(plain_request({1, 3, 3}, 2), out.callbacks(2));
    ASSERT_TRUE(out.wait(3));
  }
  EXPECT_EQ(out.by_request[0].text, "aaa");
  EXPECT_EQ(out.by_request[0].reason, "length");
  EXPECT_NE(out.by_request[1].error.find("repeat_penalty"), std::string::npos) << out.by_request[1].error;
  EXPECT_EQ(out.by_request[1].tokens, 0);
  EXPECT_EQ(out.by_request[2].text, "aa");
}

// A logits row that does not fit (too short for its n_vocab, or picking a token
// outside the vocabulary) fails the request it was for; the other one in the same step
// goes on, and the failed sequence is closed on the stages.
TEST(EngineFailures, ARowThatDoesNotFitFailsItsRequestAlone) {
  for (int variant = 0; variant < 2; ++variant) {
    AnsweringPipeline p;
    const auto tok = tiny_tokenizer();
    Outcomes out;
    p.row = [variant](int32_t seq) {
      if (seq != 2) return std::vector<float>{0, 0, 0, 5};
      return variant == 0 ? std::vector<float>{0, 5} : std::vector<float>{0, 0, 0, 5};
    };
    if (variant == 1) {
      // An answer of 8 logits per row: the second sequence's row picks token 7 (the
      // tokenizer has 4). Rows of the first: "a".
      p.f.first->on_submit = [&p](uint64_t step, std::span<const model::BatchToken> batch) {
        StepOutput o;
        o.step = step;
        o.n_vocab = 8;
        std::vector<float> values;
        for (const auto& t : batch) {
          if (!t.logits) continue;
          o.seq_ids.push_back(t.seq_id);
          o.positions.push_back(t.pos);
          for (int v = 0; v < 8; ++v) values.push_back(v == (t.seq_id == 2 ? 7 : 3) ? 5.0f : 0.0f);
        }
        o.logits = std::move(values);
        auto shared = std::make_shared<StepOutput>(std::move(o));
        p.f.last->answers.push_back([shared] { return std::move(*shared); });
      };
    }
    {
      Engine engine(*p.f.pipeline, *tok, SchedulerOptions{});
      // Submitted before the engine's first step most of the time; either way each
      // request's own rows decide its fate.
      engine.submit(plain_request({1, 3}, 4), out.callbacks(0));
      engine.submit(plain_request({1, 3}, 4), out.callbacks(1));
      ASSERT_TRUE(out.wait(2));
    }
    EXPECT_EQ(out.by_request[0].text, "aaaa") << "variant " << variant;
    EXPECT_TRUE(out.by_request[0].error.empty()) << out.by_request[0].error;
    EXPECT_NE(out.by_request[1].error.find(variant == 0 ? "does not fit" : "outside the vocabulary"), std::string::npos)
        << "variant " << variant << ": " << out.by_request[1].error;
    EXPECT_NE(std::find(p.f.first->closes.begin(), p.f.first->closes.end(), 2), p.f.first->closes.end());
  }
}

// A step a stage refused while every stage is up fails only the requests of that step:
// the other step in flight comes back and its request completes.
TEST(PipelineSteps, ARefusedStepLeavesTheOtherStepsInFlight) {
  auto f = fake_pipeline(0, 0);
  const uint64_t first = f.pipeline->submit(kBatch);
  const uint64_t second = f.pipeline->submit(kBatch);
  f.last->answers.push_back([first]() -> StepOutput { throw StageError("refused: rows over the limit", first); });
  f.last->answers.push_back([second] {
    StepOutput o;
    o.step = second;
    return o;
  });
  try {
    f.pipeline->wait(1000);
    ADD_FAILURE() << "no error";
  } catch (const StepRefused& e) {
    EXPECT_EQ(e.step(), first);
  }
  EXPECT_EQ(f.pipeline->wait(1000).step, second);
  // With a stage lost, an error about one step abandons every step in flight.
  const uint64_t third = f.pipeline->submit(kBatch);
  const uint64_t fourth = f.pipeline->submit(kBatch);
  f.first->is_up = false;
  f.last->answers.push_back([third]() -> StepOutput { throw StageError("unavailable", third); });
  f.last->answers.push_back([fourth] {
    StepOutput o;
    o.step = fourth;
    return o;
  });
  bool refused_only = false;
  try {
    f.pipeline->wait(1000);
  } catch (const StepRefused&) {
    refused_only = true;
  } catch (const StageError&) {
  }
  EXPECT_FALSE(refused_only);
  EXPECT_THROW(f.pipeline->wait(200), StageError);  // the fourth's answer is dropped: no step is left
}

TEST(EngineFailures, ARefusedStepFailsOnlyItsRequests) {
  AnsweringPipeline p;
  const auto tok = tiny_tokenizer();
  Outcomes out;
  // Sequence 1's prompt step is refused; sequence 2's steps are not.
  p.refuse = [](uint64_t, std::span<const model::BatchToken> batch) {
    return std::any_of(batch.begin(), batch.end(), [](const model::BatchToken& t) { return t.seq_id == 1; });
  };
  SchedulerOptions options;
  options.max_batch_tokens = 2;  // one prompt per step: the two requests are in different steps
  {
    Engine engine(*p.f.pipeline, *tok, options);
    engine.submit(plain_request({1, 3}, 3), out.callbacks(0));
    engine.submit(plain_request({1, 3}, 3), out.callbacks(1));
    ASSERT_TRUE(out.wait(2));
  }
  EXPECT_NE(out.by_request[0].error.find("exceeds a limit"), std::string::npos) << out.by_request[0].error;
  EXPECT_TRUE(out.by_request[1].error.empty()) << out.by_request[1].error;
  EXPECT_EQ(out.by_request[1].text, "aaa");
  EXPECT_NE(std::find(p.f.first->closes.begin(), p.f.first->closes.end(), 1), p.f.first->closes.end());
}

// The queue is bounded: once max_queued requests wait, submit throws QueueFull.
TEST(EngineFailures, AFullQueueRefusesTheNextRequest) {
  AnsweringPipeline p;
  p.answering = false;  // the first request never finishes while the test looks
  const auto tok = tiny_tokenizer();
  Outcomes out;
  SchedulerOptions options;
  options.max_sequences = 1;
  options.step_timeout_ms = 2000;
  Engine engine(*p.f.pipeline, *tok, options, 1);
  engine.submit(plain_request({1, 3}, 3), out.callbacks(0));
  for (int i = 0; i < 1000 && engine.metrics().active == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(engine.metrics().active, 1);
  engine.submit(plain_request({1, 3}, 3), out.callbacks(1));  // waits
  EXPECT_THROW(engine.submit(plain_request({1, 3}, 3), out.callbacks(2)), QueueFull);
}

// max_tokens 0: the prompt is evaluated, nothing sampled, and its KV kept: the same
// prompt again reuses all but its last token.
TEST(EngineFailures, MaxTokensZeroEvaluatesThePromptOnly) {
  AnsweringPipeline p;
  const auto tok = tiny_tokenizer();
  SchedulerOptions options;
  options.cache_sequences = 1;
  Engine engine(*p.f.pipeline, *tok, options);
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Usage> usages;
  std::vector<std::string> reasons;
  int tokens = 0;
  auto run = [&](int max_tokens) {
    Callbacks cb;
    cb.on_token = [&](const TokenEvent& ev) { tokens += ev.id >= 0; };
    cb.on_done = [&](const std::string& reason, const Usage& u) {
      std::lock_guard lock(mutex);
      usages.push_back(u);
      reasons.push_back(reason);
      cv.notify_all();
    };
    cb.on_error = [&](const std::string& e) { ADD_FAILURE() << e; };
    const size_t before = usages.size();
    engine.submit(plain_request({1, 3, 3, 3}, max_tokens), std::move(cb));
    std::unique_lock lock(mutex);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return usages.size() > before; }));
  };
  run(0);
  ASSERT_EQ(usages.size(), 1u);
  EXPECT_EQ(usages[0].completion_tokens, 0);
  EXPECT_EQ(reasons[0], "length");
  EXPECT_EQ(tokens, 0);
  run(2);
  ASSERT_EQ(usages.size(), 2u);
  EXPECT_EQ(usages[1].cached_tokens, 3);
  EXPECT_EQ(usages[1].completion_tokens, 2);
}

// Runs one request on `engine` to its end; its usage (cached_tokens says whether it
// continued a kept sequence).
Usage run_to_end(Engine& engine, std::vector<int32_t> prompt, int max_tokens) {
  auto done = std::make_shared<std::promise<Usage>>();
  auto result = done->get_future();
  Callbacks cb;
  cb.on_done = [done](const std::string&, const Usage& u) { done->set_value(u); };
  cb.on_error = [done](const std::string& e) {
    ADD_FAILURE() << e;
    done->set_value(Usage{});
  };
  engine.submit(plain_request(std::move(prompt), max_tokens), std::move(cb));
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "the request did not end";
    return Usage{};
  }
  return result.get();
}

// Three prompts with nothing in common (first tokens 0, 1, 2) and room for two kept
// sequences: the least recently used one goes, the other two are reused.
TEST(EngineCache, KeepsAtMostCacheSlotsSequencesEvictingTheLeastRecentlyUsed) {
  AnsweringPipeline p;
  const auto tok = tiny_tokenizer();
  SchedulerOptions options;
  options.cache_sequences = 2;
  Engine engine(*p.f.pipeline, *tok, options);
  const std::vector<int32_t> a{0, 3, 3, 3}, b{1, 3, 3, 3}, c{2, 3, 3, 3};
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 0);
  EXPECT_EQ(run_to_end(engine, b, 1).cached_tokens, 0);
  EXPECT_EQ(run_to_end(engine, c, 1).cached_tokens, 0);  // a evicted: b and c kept
  EXPECT_EQ(run_to_end(engine, c, 1).cached_tokens, 3);
  EXPECT_EQ(run_to_end(engine, b, 1).cached_tokens, 3);
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 0);  // gone; c (least recent) evicted now
  EXPECT_EQ(run_to_end(engine, b, 1).cached_tokens, 3);
  EXPECT_EQ(run_to_end(engine, c, 1).cached_tokens, 0);
}

// --cache-tokens: the kept sequences hold at most that many positions together; one
// sequence (4 or 5 positions) fits under 6, two do not, so each new one evicts the other.
TEST(EngineCache, KeepsAtMostCacheTokensPositions) {
  AnsweringPipeline p;
  const auto tok = tiny_tokenizer();
  SchedulerOptions options;
  options.cache_sequences = 8;
  options.cache_tokens = 6;
  Engine engine(*p.f.pipeline, *tok, options);
  const std::vector<int32_t> a{0, 3, 3, 3}, b{1, 3, 3, 3};
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 0);
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 3);  // one kept sequence fits
  EXPECT_EQ(run_to_end(engine, b, 1).cached_tokens, 0);  // b kept: a evicted
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 0);
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 3);
}

// With max_sequences, kept sequences never crowd out running ones: a full batch of
// running sequences leaves no kept one behind.
TEST(EngineCache, KeptSequencesMakeRoomForRunningOnes) {
  AnsweringPipeline p;
  const auto tok = tiny_tokenizer();
  SchedulerOptions options;
  options.cache_sequences = 4;
  options.max_sequences = 1;
  Engine engine(*p.f.pipeline, *tok, options);
  const std::vector<int32_t> a{0, 3, 3, 3}, b{1, 3, 3, 3};
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 0);
  EXPECT_EQ(run_to_end(engine, b, 1).cached_tokens, 0);  // running b: a must go
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 0);
  EXPECT_EQ(run_to_end(engine, a, 1).cached_tokens, 3);
}

// A stage lost while the engine is idle shows in lost_stage() (for /health) without any
// request, and goes once it rejoins.
TEST(EngineFailures, NoticesALostStageWhileIdle) {
  AnsweringPipeline p;
  const auto tok = tiny_tokenizer();
  Engine engine(*p.f.pipeline, *tok, SchedulerOptions{});
  EXPECT_EQ(engine.lost_stage(), "");
  p.f.last->comes_back = false;
  p.f.last->is_up = false;
  std::string lost;
  for (int i = 0; i < 1000 && lost.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    lost = engine.lost_stage();
  }
  EXPECT_EQ(lost, "stage 1 (fake-2)");
  p.f.last->comes_back = true;
  for (int i = 0; i < 1000 && !lost.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    lost = engine.lost_stage();
  }
  EXPECT_EQ(lost, "");
  EXPECT_GE(p.f.last->rejoins.load(), 1);
}

}  // namespace
}  // namespace pico::coordinator
