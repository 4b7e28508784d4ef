// Replicas and failover with stages whose answers the test writes: the Pipeline puts a
// live replica in place of a lost worker, and the Engine replays every sequence on it
// so that each request ends with the tokens it would have had without the failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "cluster_control.hpp"
#include "engine.hpp"
#include "fake_stage_test.hpp"

namespace pico::coordinator {
namespace {

using testing::FakeStage;
using testing::fake_identity;
using testing::tiny_tokenizer;

// Stage 0 on one worker, stage 1 on two: "a" active, "b" standing by.
struct ReplicatedPipeline {
  FakeStage* first = nullptr;
  FakeStage* a = nullptr;
  FakeStage* b = nullptr;
  std::unique_ptr<Pipeline> pipeline;
  ReplicatedPipeline() {
    std::vector<std::unique_ptr<Stage>> stages;
    auto s0 = std::make_unique<FakeStage>(model::LayerRange{0, 2}, fake_identity(), 0, "w0");
    auto s1 = std::make_unique<FakeStage>(model::LayerRange{2, 4}, fake_identity(), 0, "w1a");
    auto s2 = std::make_unique<FakeStage>(model::LayerRange{2, 4}, fake_identity(), 0, "w1b");
    first = s0.get(), a = s1.get(), b = s2.get();
    stages.push_back(std::move(s0));
    stages.push_back(std::move(s1));
    stages.push_back(std::move(s2));
    pipeline = std::make_unique<Pipeline>(std::move(stages), fake_identity());
  }
};

const std::vector<model::BatchToken> kBatch{{1, 0, 5, false}, {1, 1, 6, true}};

TEST(Replicas, WorkersWithTheSameLayersAreOnePosition) {
  ReplicatedPipeline r;
  EXPECT_EQ(r.pipeline->size(), 2u);
  EXPECT_EQ(r.pipeline->replicas(0), 0u);
  EXPECT_EQ(r.pipeline->replicas(1), 1u);
  EXPECT_EQ(&r.pipeline->stage(1), r.a);
  EXPECT_EQ(r.pipeline->all_stages().size(), 3u);
  EXPECT_EQ(r.a->plans, 1);
  EXPECT_EQ(r.b->plans, 0);  // standing by: planned when it takes over
}

TEST(Replicas, ALiveReplicaTakesTheLostWorkersPlace) {
  ReplicatedPipeline r;
  EXPECT_FALSE(r.pipeline->fail_over());  // nothing lost
  r.pipeline->submit(kBatch);
  r.a->is_up = false;
  r.a->comes_back = false;
  // A lost worker with a live replica is not waited for: submit fails at once.
  EXPECT_THROW(r.pipeline->submit(kBatch), StageError);
  EXPECT_EQ(r.a->rejoins.load(), 0);
  EXPECT_TRUE(r.pipeline->fail_over());
  EXPECT_EQ(&r.pipeline->stage(1), r.b);
  EXPECT_EQ(r.b->plans, 1);
  EXPECT_EQ(r.first->plans, 2);  // stage 0 now sends to the replica
  EXPECT_EQ(r.first->chain_to, nullptr);
  EXPECT_EQ(r.b->chain_to, r.first);
  EXPECT_EQ(r.pipeline->timings().failovers, 1u);
  EXPECT_EQ(r.pipeline->lost_stage(), "");
  r.pipeline->submit(kBatch);
  // A close reaches the active workers and the lost one (told when it rejoins).
  r.pipeline->close(9);
  EXPECT_EQ(r.first->closes, std::vector<int32_t>{9});
  EXPECT_EQ(r.b->closes, std::vector<int32_t>{9});
  EXPECT_EQ(r.a->closes, std::vector<int32_t>{9});
  // Back, it stands by; the replica lost in turn hands the layers back to it.
  r.a->comes_back = true;
  r.pipeline->rejoin_standbys();
  EXPECT_TRUE(r.a->is_up);
  EXPECT_EQ(&r.pipeline->stage(1), r.b);
  r.b->is_up = false;
  EXPECT_TRUE(r.pipeline->fail_over());
  EXPECT_EQ(&r.pipeline->stage(1), r.a);
}

// Workers that took other ranges (POST /cluster/replan {"layers"}): their new
// connections replace them, positions follow the ranges in layer order, a worker active
// before stays active, every stage is planned again.
TEST(Replicas, RegroupedByTheRangesTheWorkersTook) {
  ReplicatedPipeline r;
  auto moved = [](model::LayerRange layers, const char* name) {
    return std::make_unique<FakeStage>(layers, fake_identity(), 0, name);
  };
  // Refused, changing nothing: a worker not in the pipeline; ranges that overlap.
  {
    std::vector<std::unique_ptr<Stage>> stranger;
    stranger.push_back(moved({0, 2}, "nobody"));
    EXPECT_THROW(r.pipeline->regroup(std::move(stranger), fake_identity()), StageError);
    std::vector<std::unique_ptr<Stage>> overlap;
    overlap.push_back(moved({0, 3}, "w0"));  // w1a and w1b still hold 2-4
    EXPECT_THROW(r.pipeline->regroup(std::move(overlap), fake_identity()), StageError);
    EXPECT_EQ(r.pipeline->size(), 2u);
    EXPECT_EQ(&r.pipeline->stage(0), r.first);
    EXPECT_EQ(&r.pipeline->stage(1), r.a);
  }
  // w0 takes layer 0 only, the standing-by w1b layers 1-3 and w1a too: w1a (active
  // before) stays active, w1b stands by for it.
  std::vector<std::unique_ptr<Stage>> fresh;
  fresh.push_back(moved({1, 4}, "w1b"));
  fresh.push_back(moved({0, 1}, "w0"));
  fresh.push_back(moved({1, 4}, "w1a"));
  std::vector<FakeStage*> now;
  for (auto& f : fresh) now.push_back(static_cast<FakeStage*>(f.get()));
  r.pipeline->regroup(std::move(fresh), fake_identity());
  ASSERT_EQ(r.pipeline->size(), 2u);
  EXPECT_EQ(&r.pipeline->stage(0), now[1]);
  EXPECT_EQ(&r.pipeline->stage(1), now[2]);
  EXPECT_EQ(r.pipeline->replicas(1), 1u);
  EXPECT_EQ(r.pipeline->workers(1)[1], now[0]);
  EXPECT_EQ(now[1]->plans, 1);
  EXPECT_EQ(now[2]->plans, 1);
  EXPECT_EQ(now[0]->plans, 0);  // standing by
  EXPECT_EQ(now[2]->chain_to, now[1]);
  const PipelineTimings t = r.pipeline->timings();
  ASSERT_EQ(t.stages.size(), 2u);
  EXPECT_EQ(t.stages[1].layers.first, 1);
  r.pipeline->submit(kBatch);
  EXPECT_EQ(now[1]->submitted.size(), 1u);
}

// A new placement without some workers: the lost active w1a and its replica w1b
// leave, w0 takes every layer; naming a worker that is not there changes nothing.
TEST(Replicas, RegroupedWithoutTheWorkersThatLeave) {
  ReplicatedPipeline r;
  r.a->is_up = false;
  {
    std::vector<std::unique_ptr<Stage>> whole;
    whole.push_back(std::make_unique<FakeStage>(model::LayerRange{0, 4}, fake_identity(), 0, "w0"));
    EXPECT_THROW(r.pipeline->regroup(std::move(whole), fake_identity(), {"w1a", "nobody"}), StageError);
    std::vector<std::unique_ptr<Stage>> overlap;
    overlap.push_back(std::make_unique<FakeStage>(model::LayerRange{0, 4}, fake_identity(), 0, "w0"));
    EXPECT_THROW(r.pipeline->regroup(std::move(overlap), fake_identity(), {"w1a"}), StageError);  // w1b holds 2-4
    EXPECT_EQ(r.pipeline->size(), 2u);
    EXPECT_EQ(r.pipeline->all_stages().size(), 3u);
  }
  std::vector<std::unique_ptr<Stage>> whole;
  whole.push_back(std::make_unique<FakeStage>(model::LayerRange{0, 4}, fake_identity(), 0, "w0"));
  auto* w0 = static_cast<FakeStage*>(whole.back().get());
  FakeStage* b = r.b;  // up: it leaves holding the sequences, so the replay's closes reach it
  r.pipeline->regroup(std::move(whole), fake_identity(), {"w1a", "w1b"});
  ASSERT_EQ(r.pipeline->size(), 1u);
  ASSERT_EQ(r.pipeline->all_stages().size(), 1u);
  EXPECT_EQ(&r.pipeline->stage(0), w0);
  EXPECT_EQ(w0->plans, 1);
  EXPECT_EQ(b->plans, 0);
  EXPECT_EQ(r.pipeline->lost_stage(), "");
  r.pipeline->close(7);
  EXPECT_EQ(w0->closes, std::vector<int32_t>{7});
  EXPECT_EQ(b->closes, std::vector<int32_t>{7});
  r.pipeline->submit(kBatch);
  EXPECT_EQ(w0->submitted.size(), 1u);
  EXPECT_TRUE(b->submitted.empty());
  // Back with every layer, w1b replicates the stage and no longer takes closes twice.
  r.pipeline->add_replica(std::make_unique<FakeStage>(model::LayerRange{0, 4}, fake_identity(), 0, "w1b"),
                          fake_identity());
  EXPECT_EQ(r.pipeline->replicas(0), 1u);
}

TEST(Replicas, NoLiveReplicaChangesNothing) {
  ReplicatedPipeline r;
  r.a->is_up = false;
  r.b->is_up = false;
  EXPECT_FALSE(r.pipeline->fail_over());
  EXPECT_EQ(&r.pipeline->stage(1), r.a);
  EXPECT_EQ(r.pipeline->timings().failovers, 0u);
  // Stage 0 has no replica at all.
  ReplicatedPipeline q;
  q.first->is_up = false;
  EXPECT_FALSE(q.pipeline->fail_over());
  EXPECT_EQ(q.first->plans, 1);
}

void answer_step(FakeStage* last, uint64_t step, std::span<const model::BatchToken> batch,
                 std::map<int32_t, std::vector<int32_t>>& kv, size_t& computed);
std::vector<std::string> run_six(Pipeline& pipeline, SchedulerOptions options, std::function<void(Engine&)> meanwhile,
                                 EngineMetrics* metrics);

// A fake worker's state as its snapshots and restores carry it: the tokens it holds of
// each sequence (`kv`), 4 bytes each; as a worker, its first plan from this session
// drops whatever it held. before_snapshot runs first on each snapshot (it may throw).
void hold_state_as_tokens(FakeStage* w, std::map<int32_t, std::vector<int32_t>>& kv,
                          std::function<void()> before_snapshot = {}) {
  w->on_snapshot = [&kv, before_snapshot](int32_t seq) -> std::optional<std::vector<uint8_t>> {
    if (before_snapshot) before_snapshot();
    const auto held = kv.find(seq);
    if (held == kv.end()) return std::nullopt;
    std::vector<uint8_t> bytes(held->second.size() * sizeof(int32_t));
    std::memcpy(bytes.data(), held->second.data(), bytes.size());
    return bytes;
  };
  w->on_restore = [&kv](int32_t seq, std::span<const uint8_t> state) {
    std::vector<int32_t>& held = kv[seq];
    held.resize(state.size() / sizeof(int32_t));
    std::memcpy(held.data(), state.data(), state.size());
  };
  w->on_plan = [&kv, w] {
    if (w->plans == 1) kv.clear();
  };
}

// A fake model over the replicated pipeline. Each worker of stage 1 holds its own KV
// (the tokens of each sequence's positions, which must arrive without a gap, as a
// worker refuses a gap, and are cut where a token comes below them, as a worker cuts
// on arrival); a row's logits depend on every token before it, so a replay
// that left a token out, or added one, shows in what is sampled next. kill_at: the
// submit at which the active worker of stage 1 is lost.
struct FakeModel {
  ReplicatedPipeline r;
  std::map<FakeStage*, std::map<int32_t, std::vector<int32_t>>> kv;
  std::map<FakeStage*, size_t> computed;  // positions each worker of stage 1 computed
  EngineMetrics metrics;                  // the engine's at the end of run()
  std::atomic<int> submits = 0;
  int kill_at = 0;
  // The submit at which the engine thread waits until `resume` (a test queues work
  // for the engine meanwhile, so that it lands mid-run).
  int pause_at = 0;
  std::atomic<bool> resume = false;
  FakeModel() {
    r.first->on_submit = [this](uint64_t step, std::span<const model::BatchToken> batch) {
      FakeStage* last = static_cast<FakeStage*>(&r.pipeline->stage(1));
      if (++submits == pause_at) {
        while (!resume) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (submits == kill_at) {
        r.a->is_up = false;
        r.a->comes_back = false;
        r.a->answers.push_front([]() -> StepOutput { throw StageError("worker w1a: connection lost"); });
        return;
      }
      answer_step(last, step, batch, kv[last], computed[last]);
    };
    // Stage 1's state as its snapshots carry it.
    for (FakeStage* w : {r.a, r.b}) {
      hold_state_as_tokens(w, kv[w], [this, w] {
        ++snapshots;
        if (fail_snapshots) throw StageError("worker " + w->info().name + ": no answer to a snapshot request");
      });
    }
  }
  std::atomic<int> snapshots = 0;
  bool fail_snapshots = false;
  std::vector<std::string> run(SchedulerOptions options, std::function<void(Engine&)> meanwhile = {}) {
    return run_six(*r.pipeline, options, std::move(meanwhile), &metrics);
  }
};

// The fake model's answer to a step, queued at the last worker `last`, which holds
// the sequences `kv`: each token at its position (a gap is refused; a token below what
// is held cuts the rest, as a worker does); a row's logits hash every token held.
void answer_step(FakeStage* last, uint64_t step, std::span<const model::BatchToken> batch,
                 std::map<int32_t, std::vector<int32_t>>& kv, size_t& computed) {
  StepOutput o;
  o.step = step;
  o.n_vocab = 4;
  std::vector<float> values;
  for (const auto& t : batch) {
    auto& held = kv[t.seq_id];
    if (t.pos > static_cast<int32_t>(held.size())) {
      last->answers.push_back([step]() -> StepOutput { throw StageError("worker: a position gap", step); });
      return;
    }
    held.resize(static_cast<size_t>(t.pos));
    held.push_back(t.token);
    ++computed;
    if (!t.logits) continue;
    uint32_t h = 2166136261u;
    for (int32_t tok : held) h = (h ^ static_cast<uint32_t>(tok)) * 16777619u;
    o.seq_ids.push_back(t.seq_id);
    o.positions.push_back(t.pos);
    const float lean = static_cast<float>(h % 7) - 3.0f;
    values.insert(values.end(), {lean, -30.0f, -30.0f, -lean});
  }
  o.logits = std::move(values);
  auto shared = std::make_shared<StepOutput>(std::move(o));
  last->answers.push_back([shared] { return std::move(*shared); });
}

// Runs 6 requests (3 greedy, 3 seeded at temperature 1) to the end; their tokens,
// or "error: ..." for a failed one.
std::vector<std::string> run_six(Pipeline& pipeline, SchedulerOptions options, std::function<void(Engine&)> meanwhile,
                                 EngineMetrics* metrics) {
  const auto tok = tiny_tokenizer();
  Engine engine(pipeline, *tok, options);
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::string> out(6);
  int ended = 0;
  for (int i = 0; i < 6; ++i) {
    OnlineRequest q;
    q.prompt = std::vector<int32_t>(static_cast<size_t>(3 + i), 3);
    q.prompt[0] = static_cast<int32_t>(i % 2) * 3;
    q.max_tokens = 24;
    q.ignore_eos = true;
    q.sampling = sample::SamplingParams::greedy();
    if (i % 2) {
      q.sampling.temperature = 1.0f;
      q.sampling.seed = static_cast<uint32_t>(40 + i);
    }
    Callbacks cb;
    cb.on_sampled = [&, i](int32_t id, std::span<const float>) { out[static_cast<size_t>(i)] += std::to_string(id); };
    cb.on_done = [&](const std::string&, const Usage&) {
      std::lock_guard lock(mutex);
      ++ended;
      cv.notify_all();
    };
    cb.on_error = [&, i](const std::string& message) {
      std::lock_guard lock(mutex);
      out[static_cast<size_t>(i)] = "error: " + message;
      ++ended;
      cv.notify_all();
    };
    engine.submit(std::move(q), std::move(cb));
  }
  if (meanwhile) meanwhile(engine);
  std::unique_lock lock(mutex);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return ended == 6; }));
  *metrics = engine.metrics();
  return out;
}

SchedulerOptions small_steps() {
  SchedulerOptions o;
  o.micro_batch = 2;  // prompts in several steps, so that a failure can come mid-prompt
  o.max_inflight = 4;
  return o;
}

TEST(Failover, EveryRequestEndsWithTheTokensOfAnUndisturbedRun) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  for (const auto& tokens : expected) ASSERT_EQ(tokens.size(), 24u) << tokens;
  EXPECT_NE(expected[1], expected[3]);  // the fake model tells sequences apart
  // Lost in the prompts, then at several points of decoding.
  for (int kill_at : {2, 5, 9, 14, 30}) {
    FakeModel m;
    m.kill_at = kill_at;
    EXPECT_EQ(m.run(small_steps()), expected) << "lost at submit " << kill_at;
    EXPECT_EQ(m.r.pipeline->timings().failovers, 1u);
    EXPECT_EQ(&m.r.pipeline->stage(1), m.r.b);
    EXPECT_FALSE(m.kv[m.r.b].empty());
  }
}

TEST(Failover, WithoutALiveReplicaEveryRequestFails) {
  FakeModel m;
  m.kill_at = 9;
  m.r.b->is_up = false;
  m.r.b->comes_back = false;
  for (const auto& outcome : m.run(small_steps())) {
    EXPECT_EQ(outcome.rfind("error: ", 0), 0u) << outcome;
    EXPECT_NE(outcome.find("w1a"), std::string::npos) << outcome;
  }
}

// Moving a stage to another worker while requests run (POST /cluster/replan): the
// engine lets the steps in flight finish, the replica takes the layers, and every
// sequence is replayed there.
TEST(Failover, AStageMovedWhileRequestsRunKeepsEveryToken) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  FakeModel m;
  m.pause_at = 12;
  bool moved = false;
  const auto got = m.run(small_steps(), [&](Engine& engine) {
    while (m.submits < m.pause_at) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto done = engine.with_pipeline([&](Pipeline& p) { return p.activate(1, 1); }, true);
    m.resume = true;
    moved = done.get();
  });
  EXPECT_GT(m.submits, 12);
  EXPECT_TRUE(moved);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(&m.r.pipeline->stage(1), m.r.b);
  // The worker moved away from keeps no sequence: each one it held was closed there.
  ASSERT_FALSE(m.kv[m.r.a].empty());
  for (const auto& [seq, tokens] : m.kv[m.r.a]) {
    EXPECT_NE(std::find(m.r.a->closes.begin(), m.r.a->closes.end(), seq), m.r.a->closes.end()) << seq;
  }
  EXPECT_FALSE(m.kv[m.r.b].empty());
  EXPECT_EQ(m.r.pipeline->timings().failovers, 0u);
  // A worker that is not up cannot take a stage; nothing moves.
  m.r.a->is_up = false;
  EXPECT_THROW(m.r.pipeline->activate(1, 0), StageError);
  EXPECT_EQ(&m.r.pipeline->stage(1), m.r.b);
}

// The same move with the sequences' state handed over (snapshot on the worker moved
// away from, restore on the replica): nothing is replayed, and every token is as
// undisturbed.
TEST(Failover, AStageHandedOverWhileRequestsRunReplaysNothing) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  FakeModel m;
  m.pause_at = 12;
  size_t sequences = 0;
  const auto got = m.run(small_steps(), [&](Engine& engine) {
    while (m.submits < m.pause_at) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto done = engine.with_pipeline(
        [&](Pipeline& p) {
          const auto held = engine.sequences_on_stages();
          EXPECT_TRUE(held.has_value());
          sequences = held->size();
          EXPECT_TRUE(p.hand_over(1, 1, *held));
          return false;
        },
        true);
    m.resume = true;
    EXPECT_FALSE(done.get());
  });
  EXPECT_EQ(got, expected);
  EXPECT_EQ(&m.r.pipeline->stage(1), m.r.b);
  EXPECT_EQ(sequences, 6u);  // every request was running
  EXPECT_EQ(m.r.pipeline->timings().handed_over_sequences, 6u);
  EXPECT_GE(m.snapshots, 6);
  // Moved, not replayed: every position computed once (the calm run's count), and the
  // old worker closed each sequence.
  size_t calm_positions = 0, positions = 0;
  for (const auto& [seq, tokens] : calm.kv[calm.r.a]) calm_positions += tokens.size();
  for (const auto& [seq, tokens] : m.kv[m.r.b]) positions += tokens.size();
  EXPECT_EQ(positions, calm_positions);
  for (const auto& [seq, tokens] : m.kv[m.r.a]) {
    EXPECT_NE(std::find(m.r.a->closes.begin(), m.r.a->closes.end(), seq), m.r.a->closes.end()) << seq;
  }
  EXPECT_EQ(m.r.pipeline->timings().failovers, 0u);
}

// Standby copies: the engine copies every sequence to the standby mid-run, then the
// active worker dies; the standby resumes each sequence from its copy under the same
// id and computes only the positions after it. Every token is as undisturbed.
TEST(Failover, AReplicaResumesFromItsStandbyCopy) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  size_t calm_positions = 0;
  for (const auto& [seq, tokens] : calm.kv[calm.r.a]) calm_positions += tokens.size();
  FakeModel m;
  m.pause_at = 12;
  m.kill_at = 24;
  Pipeline::CopyRound copied;
  const auto got = m.run(small_steps(), [&](Engine& engine) {
    while (m.submits < m.pause_at) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto done = engine.with_pipeline(
        [&](Pipeline& p) {
          EXPECT_TRUE(p.copies_due(engine.sequence_lengths()));
          copied = p.copy_to_standbys(engine.sequence_lengths());
          EXPECT_FALSE(p.copies_due(engine.sequence_lengths()));  // nothing changed since
          return false;
        },
        true);
    m.resume = true;
    EXPECT_FALSE(done.get());
  });
  EXPECT_EQ(got, expected);
  EXPECT_EQ(m.r.pipeline->timings().failovers, 1u);
  EXPECT_EQ(&m.r.pipeline->stage(1), m.r.b);
  EXPECT_EQ(copied.sequences, 6u);  // every request was running, each copied once
  EXPECT_EQ(m.r.pipeline->timings().standby_copies, 6u);
  EXPECT_EQ(m.metrics.resumed_sequences, 6u);
  EXPECT_GT(m.metrics.resumed_tokens, 0u);
  // The same ids to the end, each with every token of the undisturbed run, and the
  // standby computed only what its copies lacked: nothing twice, nothing missing.
  EXPECT_EQ(m.kv[m.r.b], calm.kv[calm.r.a]);
  EXPECT_EQ(m.computed[m.r.b] + m.metrics.resumed_tokens, calm_positions);
}

// The pipeline's side of standby copies: what is copied where, what a close, a cut, a
// lost standby and a takeover do with them.
TEST(Replicas, StandbyCopiesFollowTheirSequences) {
  ReplicatedPipeline r;
  std::map<int32_t, size_t> restored;  // on b: seq -> bytes
  r.a->on_snapshot = [](int32_t seq) -> std::optional<std::vector<uint8_t>> {
    if (seq == 3) return std::nullopt;  // not open there
    return std::vector<uint8_t>(static_cast<size_t>(seq) * 10, 1);
  };
  r.b->on_restore = [&](int32_t seq, std::span<const uint8_t> state) { restored[seq] = state.size(); };
  const std::vector<SequenceLength> held{{1, 5}, {2, 0}, {3, 4}};
  EXPECT_TRUE(r.pipeline->copies_due(held));
  const auto round = r.pipeline->copy_to_standbys(held);
  EXPECT_EQ(round.sequences, 1u);  // seq 2 holds nothing, seq 3 is not open on a
  EXPECT_EQ(round.bytes, 10u);
  EXPECT_EQ(restored, (std::map<int32_t, size_t>{{1, 10}}));
  EXPECT_EQ(r.b->plans, 1);  // planned before its first restore
  EXPECT_EQ(r.first->closes.size(), 0u);
  // Only what changed is copied again.
  const std::vector<SequenceLength> same{{1, 5}};
  EXPECT_FALSE(r.pipeline->copies_due(same));
  EXPECT_EQ(r.pipeline->copy_to_standbys(same).sequences, 0u);
  const std::vector<SequenceLength> longer{{1, 6}, {4, 2}};
  EXPECT_TRUE(r.pipeline->copies_due(longer));
  EXPECT_EQ(r.pipeline->copy_to_standbys(longer).sequences, 2u);
  // A close reaches the standby that holds a copy; then there is none to keep.
  r.pipeline->close(4);
  EXPECT_EQ(r.b->closes, std::vector<int32_t>{4});
  EXPECT_TRUE(r.pipeline->copies_due(longer));
  r.pipeline->copy_to_standbys(longer);
  // A reuse cuts seq 1 to 2 positions; then the active worker is lost and b takes over.
  r.pipeline->cut_copies(1, 2);
  r.a->is_up = false;
  ASSERT_TRUE(r.pipeline->fail_over());
  EXPECT_EQ(r.pipeline->copied_prefix(1), 2);
  EXPECT_EQ(r.pipeline->copied_prefix(4), 2);
  EXPECT_EQ(r.pipeline->copied_prefix(9), 0);  // never copied
  r.pipeline->close_on_replaced(1);
  // The replaced worker only (it was active when 4 closed).
  EXPECT_EQ(r.a->closes, (std::vector<int32_t>{4, 1}));
  EXPECT_EQ(r.b->closes, std::vector<int32_t>{4});
  EXPECT_EQ(r.first->closes, std::vector<int32_t>{4});
  r.pipeline->forget_taken_over();
  EXPECT_EQ(r.pipeline->copied_prefix(1), 0);
  // Active now, b keeps no copy records; a, lost, gets none and is not due any.
  EXPECT_FALSE(r.pipeline->copies_due(longer));
  // a back (restarted): planned and given copies afresh, once b answers snapshots (a
  // failed snapshot ends the round, and nothing is recorded).
  r.a->is_up = true;
  r.a->on_restore = [&](int32_t, std::span<const uint8_t>) {};
  r.b->on_snapshot = [](int32_t) -> std::optional<std::vector<uint8_t>> { throw StageError("b: no answer"); };
  const uint64_t copies_before = r.pipeline->timings().standby_copies;
  EXPECT_EQ(r.pipeline->copy_to_standbys(longer).sequences, 0u);
  EXPECT_EQ(r.pipeline->timings().standby_copies, copies_before);
  EXPECT_TRUE(r.pipeline->copies_due(longer));
  r.b->on_snapshot = [](int32_t seq) -> std::optional<std::vector<uint8_t>> {
    return std::vector<uint8_t>(static_cast<size_t>(seq));
  };
  EXPECT_EQ(r.pipeline->copy_to_standbys(longer).sequences, 2u);
  // Lost while standing by: its copies are forgotten, each closed there (sent when it
  // rejoins), and it is given them again once back.
  r.a->is_up = false;
  r.a->comes_back = true;
  const size_t closes_before = r.a->closes.size();
  r.pipeline->rejoin_standbys();
  EXPECT_EQ(r.a->closes.size(), closes_before + 2);
  EXPECT_TRUE(r.pipeline->copies_due(longer));
}

TEST(Replicas, AJoiningWorkerReplicatesAStagesRange) {
  ReplicatedPipeline r;
  EXPECT_EQ(r.pipeline->add_replica(std::make_unique<FakeStage>(model::LayerRange{0, 2}, fake_identity(), 0, "w0b"),
                                    fake_identity()),
            0u);
  EXPECT_EQ(r.pipeline->replicas(0), 1u);
  EXPECT_THROW(r.pipeline->add_replica(std::make_unique<FakeStage>(model::LayerRange{1, 3}, fake_identity(), 0, "odd"),
                                       fake_identity()),
               StageError);
  EXPECT_THROW(r.pipeline->add_replica(std::make_unique<FakeStage>(model::LayerRange{0, 2}, fake_identity(), 0, "w0b"),
                                       fake_identity()),
               StageError);  // already there
  protocol::ModelIdentity other = fake_identity();
  other.hash = 78;
  EXPECT_THROW(
      r.pipeline->add_replica(std::make_unique<FakeStage>(model::LayerRange{0, 2}, other, 0, "w0c"), fake_identity()),
      StageError);
}

// A profile whose every layer takes `decode` seconds for one token (and a tenth of that
// per token of a batch).
worker::WorkerProfile uniform_profile(double decode) {
  worker::WorkerProfile p;
  p.batch = 64;
  p.batches = {64};
  p.layers.assign(4, {decode, {decode / 10}});
  p.head = {decode, {decode / 10}};
  return p;
}

// Replans choose by the workers' profiles: a stage moves to a worker at least 10 %
// faster, a drained worker's stage to its fastest live replica.
TEST(ClusterControl, MovesStagesToFasterWorkersByTheirProfiles) {
  FakeModel m;
  m.r.first->info_for_test().profile = uniform_profile(1e-3);
  m.r.a->info_for_test().profile = uniform_profile(1e-3);
  m.r.b->info_for_test().profile = uniform_profile(0.95e-3);  // 5 % faster: not worth a move
  const auto tok = tiny_tokenizer();
  Engine engine(*m.r.pipeline, *tok, small_steps());
  ClusterControl control(engine, fake_identity(), {});
  bool moved = true;
  ClusterView view = control.replan(std::nullopt, &moved);
  EXPECT_FALSE(moved);
  ASSERT_EQ(view.stages.size(), 2u);
  ASSERT_EQ(view.stages[1].workers.size(), 2u);
  EXPECT_TRUE(view.stages[1].workers[0].active);
  // Stage 1 is the last: its time counts the head (2 layers + head, 3 ms).
  EXPECT_DOUBLE_EQ(*view.stages[1].workers[0].decode_seconds, 3e-3);
  EXPECT_DOUBLE_EQ(*view.stages[0].workers[0].decode_seconds, 2e-3);
  m.r.b->info_for_test().profile = uniform_profile(0.8e-3);
  view = control.replan(std::nullopt, &moved);
  EXPECT_TRUE(moved);
  EXPECT_TRUE(view.stages[1].workers[1].active);
  EXPECT_EQ(&m.r.pipeline->stage(1), m.r.b);
  // Draining: the stage goes back to "w1a"; draining it again has no replica left
  // alive, and nothing moves.
  view = control.replan(std::string("w1b"), &moved);
  EXPECT_TRUE(moved);
  EXPECT_EQ(&m.r.pipeline->stage(1), m.r.a);
  m.r.b->is_up = false;
  m.r.b->comes_back = false;
  EXPECT_THROW(control.replan(std::string("w1a")), StageError);
  EXPECT_THROW(control.replan(std::string("w9")), StageError);
  EXPECT_EQ(&m.r.pipeline->stage(1), m.r.a);
  EXPECT_FALSE(control.view().stages[1].workers[1].up);
}

// A snapshot that fails: the move falls back to a replay (ClusterControl::move_stage),
// and nothing is lost either.
TEST(Failover, AFailedHandOverFallsBackToAReplay) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  FakeModel m;
  m.pause_at = 12;
  m.fail_snapshots = true;
  m.r.a->info_for_test().profile = uniform_profile(1e-3);
  m.r.b->info_for_test().profile = uniform_profile(0.5e-3);
  bool moved = false;
  const auto got = m.run(small_steps(), [&](Engine& engine) {
    while (m.submits < m.pause_at) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto replanned = std::async(std::launch::async, [&] {
      ClusterControl control(engine, fake_identity(), {});
      control.replan(std::nullopt, &moved);
    });
    // The replan waits for the engine thread, which is paused mid-step until resumed.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    m.resume = true;
    replanned.get();
  });
  EXPECT_TRUE(moved);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(&m.r.pipeline->stage(1), m.r.b);
  EXPECT_EQ(m.r.pipeline->timings().handed_over_sequences, 0u);
  EXPECT_GE(m.snapshots, 1);
}

}  // namespace
}  // namespace pico::coordinator

namespace pico::coordinator {
namespace {

// The slow-worker rule (ClusterControl's watch), on windows of 3 s.
TEST(SlowPosition, ASlowStageAgainstTheOthersAndItsProfile) {
  const double factor = 3, window = 3;
  // Stage 1 took 2 s where its profile said 0.1 s; the others did as predicted.
  std::vector<StageWindow> w = {{true, 0.10, 0.10}, {true, 2.0, 0.10}, {true, 0.2, 0.2}};
  EXPECT_EQ(slow_position(w, factor, window), std::optional<size_t>(1));
  // Every stage 20 times its profile (a loaded machine, a small model's fixed costs).
  w = {{true, 2.0, 0.10}, {true, 2.0, 0.10}, {true, 4.0, 0.2}};
  EXPECT_EQ(slow_position(w, factor, window), std::nullopt);
  // 20 times its profile but only 0.19 s late in 3 s: a few slow steps of a quiet cluster.
  w = {{true, 0.01, 0.01}, {true, 0.2, 0.01}};
  EXPECT_EQ(slow_position(w, factor, window), std::nullopt);
  // Below the factor against the others' median (5, 6 -> 5.5): 15 / 1 < 3 x 5.5.
  w = {{true, 5, 1}, {true, 15, 1}, {true, 6, 1}};
  EXPECT_EQ(slow_position(w, factor, window), std::nullopt);
  // Stages not judged (no steps, no profile, just moved) are no reference and never slow.
  w = {{false, 100, 0.1}, {true, 2.0, 0.1}};
  EXPECT_EQ(slow_position(w, factor, window), std::optional<size_t>(1));
  w = {{false, 100, 0.1}};
  EXPECT_EQ(slow_position(w, factor, window), std::nullopt);
  // A single stage: against its profile alone. Two slow ones: the slower.
  w = {{true, 1.0, 0.1}};
  EXPECT_EQ(slow_position(w, factor, window), std::optional<size_t>(0));
  w = {{true, 1.0, 0.1}, {true, 0.1, 0.1}, {true, 3.0, 0.1}, {true, 0.1, 0.1}};
  EXPECT_EQ(slow_position(w, factor, window), std::optional<size_t>(2));
}

// How much slower than the others (what placing anew scales the slow worker's times by).
TEST(SlowPosition, SlowdownIsTheRatioAgainstTheOthersMedian) {
  std::vector<StageWindow> w = {{true, 0.10, 0.10}, {true, 2.0, 0.10}, {true, 0.2, 0.2}};
  EXPECT_DOUBLE_EQ(slowdown(w, 1), 20.0);
  w = {{true, 5, 1}, {true, 15, 1}, {true, 6, 1}};
  EXPECT_DOUBLE_EQ(slowdown(w, 1), 15 / 5.5);
  w = {{true, 0.5, 1}, {true, 3, 1}};  // the others faster than their profile: against 1
  EXPECT_DOUBLE_EQ(slowdown(w, 1), 3.0);
  w = {{false, 100, 0.1}, {true, 2.0, 0.1}};  // nothing judged to compare with
  EXPECT_DOUBLE_EQ(slowdown(w, 1), 20.0);
}

// A step's prediction: per layer, the line through the profile's neighbouring measures.
TEST(SlowPosition, PredictedStepLiesBetweenTheProfilesMeasures) {
  StageInfo info;
  info.profile.emplace();
  info.profile->batch = 64;
  info.profile->batches = {8, 64};
  // Per token at 8 and at 64 tokens.
  info.profile->layers = {{0.010, {0.002, 0.001}}, {0.020, {0.004, 0.001}}, {0.030, {0.005, 0.004}}};
  info.profile->head = {0.005, {0.001, 0.002}};
  EXPECT_EQ(predicted_step_seconds(StageInfo{}, {0, 2}, false, 1), std::nullopt);  // no profile
  EXPECT_EQ(predicted_step_seconds(info, {0, 4}, false, 1), std::nullopt);        // past it
  EXPECT_DOUBLE_EQ(*predicted_step_seconds(info, {1, 3}, false, 1), 0.050);
  EXPECT_DOUBLE_EQ(*predicted_step_seconds(info, {1, 3}, true, 1), 0.055);
  // At a measured batch: its tokens x its time per token.
  EXPECT_DOUBLE_EQ(*predicted_step_seconds(info, {1, 3}, true, 8), 0.032 + 0.040 + 0.008);
  // 64 tokens and more: tokens x the largest batch's time per token.
  EXPECT_DOUBLE_EQ(*predicted_step_seconds(info, {1, 3}, true, 64), 0.064 + 0.256 + 0.128);
  EXPECT_DOUBLE_EQ(*predicted_step_seconds(info, {1, 3}, true, 100), 0.100 + 0.400 + 0.200);
  // 4 tokens, 3/7 of the way from 1 to 8: as far from each decode time to its 8 tokens'
  // (layer 1: 0.020 to 0.032, layer 2: 0.030 to 0.040, head: 0.005 to 0.008).
  EXPECT_NEAR(*predicted_step_seconds(info, {1, 3}, true, 4),
              (0.020 + 0.012 * 3 / 7) + (0.030 + 0.010 * 3 / 7) + (0.005 + 0.003 * 3 / 7), 1e-12);
  // 36 tokens, half way from 8 to 64 (layer 1: 0.032 to 0.064, layer 2: 0.040 to
  // 0.256, head: 0.008 to 0.128).
  EXPECT_NEAR(*predicted_step_seconds(info, {1, 3}, true, 36), 0.048 + 0.148 + 0.068, 1e-12);
  // A decode slower than its batch's tokens: never below one token's time.
  info.profile->layers[1] = {0.200, {0.001, 0.001}};
  EXPECT_DOUBLE_EQ(*predicted_step_seconds(info, {1, 2}, false, 22), 0.200);
}


// Two workers at each of two positions, plus `standbys` more at position 1; with
// spread on, w0a-w1a and w0b-w1b are lanes. The fake model's answers (answer_step)
// come from the last worker of the lane a step was given to.
struct SpreadModel {
  FakeStage *w0a = nullptr, *w0b = nullptr, *w1a = nullptr, *w1b = nullptr;
  std::vector<FakeStage*> spare;  // at position 1
  std::unique_ptr<Pipeline> pipeline;
  std::map<FakeStage*, std::map<int32_t, std::vector<int32_t>>> kv;
  std::map<FakeStage*, size_t> computed;  // positions each last worker computed
  std::map<FakeStage*, int> steps;        // steps each first worker was given
  EngineMetrics metrics;
  std::atomic<int> submits = 0;
  int kill_at = 0;  // the submit at which `victim` is lost
  FakeStage* victim = nullptr;
  // The submit at which the engine thread waits until `resume` (as FakeModel's).
  int pause_at = 0;
  std::atomic<bool> resume = false;
  // Closed, the first submit waits until a test opens it once every request is queued
  // (run_six's `meanwhile`): no request then ends before the others are placed on a
  // lane, however the threads are timed (the lanes' shares are then always the same).
  std::atomic<bool> gate = true;
  explicit SpreadModel(bool spread = true, int standbys = 0) {
    std::vector<std::unique_ptr<Stage>> stages;
    auto add = [&](model::LayerRange layers, const char* name) {
      stages.push_back(std::make_unique<FakeStage>(layers, fake_identity(), 0, name));
      return static_cast<FakeStage*>(stages.back().get());
    };
    w0a = add({0, 2}, "w0a");
    w0b = add({0, 2}, "w0b");
    w1a = add({2, 4}, "w1a");
    w1b = add({2, 4}, "w1b");
    for (int k = 0; k < standbys; ++k) spare.push_back(add({2, 4}, k == 0 ? "w1c" : "w1d"));
    pipeline = std::make_unique<Pipeline>(std::move(stages), fake_identity());
    pipeline->set_spread(spread);
    for (FakeStage* first : {w0a, w0b}) {
      first->on_submit = [this, first](uint64_t step, std::span<const model::BatchToken> batch) {
        ++steps[first];
        auto* last = static_cast<FakeStage*>(first->next);
        const int submit = ++submits;
        while (!gate) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (submit == pause_at) {
          while (!resume) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        // The first worker's KV too, cut and extended as a worker does.
        for (const auto& t : batch) {
          auto& held = kv[first][t.seq_id];
          held.resize(std::min(held.size(), static_cast<size_t>(t.pos)));
          held.push_back(t.token);
        }
        if (submit == kill_at) {
          victim->is_up = false;
          victim->comes_back = false;
          victim->answers.push_front([this]() -> StepOutput {
            throw StageError("worker " + victim->info().name + ": connection lost");
          });
          if (last == victim) return;  // a step of the other lane is answered
        }
        answer_step(last, step, batch, kv[last], computed[last]);
      };
    }
    // Each worker's state as its snapshots carry it.
    for (FakeStage* w : {w0a, w0b, w1a, w1b}) hold_state_as_tokens(w, kv[w]);
    for (FakeStage* w : spare) hold_state_as_tokens(w, kv[w]);
  }
};

TEST(Lanes, StandbysAtEveryPositionFormALane) {
  SpreadModel m;
  m.w0a->on_submit = m.w0b->on_submit = nullptr;  // the test answers
  const std::vector<uint32_t> lanes = m.pipeline->lanes();
  ASSERT_EQ(lanes.size(), 2u);
  EXPECT_EQ(&m.pipeline->stage(1), m.w1a);
  EXPECT_EQ(&m.pipeline->stage(1, lanes[1]), m.w1b);
  EXPECT_EQ(m.pipeline->lane_of(0, 1), lanes[1]);
  // Each lane a chain of its own, the last stage chaining to its lane's first.
  EXPECT_EQ(m.w0a->next, m.w1a);
  EXPECT_EQ(m.w0b->next, m.w1b);
  EXPECT_EQ(m.w1b->next, nullptr);
  EXPECT_EQ(m.w1a->chain_to, m.w0a);
  EXPECT_EQ(m.w1b->chain_to, m.w0b);
  // Steps go to their lane; lanes answer in any order, each in the order submitted.
  const uint64_t s1 = m.pipeline->submit(kBatch, {}, {}, lanes[0]);
  const uint64_t s2 = m.pipeline->submit(kBatch, {}, {}, lanes[1]);
  const uint64_t s3 = m.pipeline->submit(kBatch, {}, {}, lanes[1]);
  EXPECT_EQ(m.w0a->submitted, std::vector<uint64_t>{s1});
  EXPECT_EQ(m.w0b->submitted, (std::vector<uint64_t>{s2, s3}));
  EXPECT_EQ(m.pipeline->in_flight(lanes[1]), 2u);
  EXPECT_THROW(m.pipeline->submit(kBatch, {}, {}, 999), std::logic_error);
  auto answer = [](FakeStage* last, uint64_t step) {
    last->answers.push_back([step] {
      StepOutput o;
      o.step = step;
      return o;
    });
  };
  answer(m.w1b, s2);
  EXPECT_EQ(m.pipeline->wait(1000).step, s2);
  answer(m.w1a, s1);
  answer(m.w1b, s3);
  std::vector<uint64_t> got{m.pipeline->wait(1000).step, m.pipeline->wait(1000).step};
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<uint64_t>{s1, s3}));
  // A lane that answers nothing within the timeout is an error, while the other answers.
  const uint64_t s4 = m.pipeline->submit(kBatch, {}, {}, lanes[0]);
  m.pipeline->submit(kBatch, {}, {}, lanes[1]);
  answer(m.w1a, s4);
  EXPECT_EQ(m.pipeline->wait(200).step, s4);
  EXPECT_THROW(m.pipeline->wait(200), StageError);
  EXPECT_EQ(m.pipeline->in_flight(lanes[1]), 0u);  // abandoned
  // A close reaches every lane.
  m.pipeline->close(9);
  for (FakeStage* w : {m.w0a, m.w0b, m.w1a, m.w1b}) EXPECT_EQ(w->closes, std::vector<int32_t>{9}) << w->info().name;
  // Spread off: one lane.
  m.pipeline->set_spread(false);
  EXPECT_EQ(m.pipeline->lanes(), std::vector<uint32_t>{lanes[0]});
  EXPECT_FALSE(m.pipeline->lane_of(1, 1).has_value());
}

TEST(Lanes, ALaneThatLosesAWorkerTakesAStandbyOrEnds) {
  {
    // No standby: the lane ends, its live worker stands by and hears the replay's closes.
    SpreadModel m;
    const std::vector<uint32_t> lanes = m.pipeline->lanes();
    const uint64_t first = m.pipeline->submit(kBatch, {}, {}, lanes[0]);
    m.pipeline->submit(kBatch, {}, {}, lanes[1]);
    auto later = std::move(m.w1a->answers);  // the first lane's answer comes after the loss
    m.w1a->answers.clear();
    m.w1b->is_up = false;
    m.w1b->comes_back = false;
    m.w1b->answers.push_front([]() -> StepOutput { throw StageError("worker w1b: connection lost"); });
    // Only the lost lane's steps are abandoned; the first lane's is still in flight.
    try {
      m.pipeline->wait(1000);
      ADD_FAILURE() << "a lost worker went unnoticed";
    } catch (const LanesLost& e) {
      EXPECT_EQ(e.lanes(), std::vector<uint32_t>{lanes[1]});
    }
    EXPECT_EQ(m.pipeline->in_flight(lanes[0]), 1u);
    EXPECT_EQ(m.pipeline->in_flight(lanes[1]), 0u);
    // A submit looks at its own lane's workers only.
    EXPECT_THROW(m.pipeline->submit(kBatch, {}, {}, lanes[1]), LanesLost);
    EXPECT_EQ(m.pipeline->in_flight(lanes[0]), 1u);
    // Mending that lane alone: the first lane is not planned again, and its step answers.
    const int plans = m.w0a->plans + m.w1a->plans;
    EXPECT_TRUE(m.pipeline->fail_over(std::vector<uint32_t>{lanes[1]}));
    EXPECT_EQ(m.w0a->plans + m.w1a->plans, plans);
    EXPECT_EQ(m.pipeline->lanes(), std::vector<uint32_t>{lanes[0]});
    m.w1a->answers = std::move(later);
    EXPECT_EQ(m.pipeline->wait(1000).step, first);
    EXPECT_EQ(m.pipeline->lost_stage(), "");
    EXPECT_EQ(m.pipeline->copied_prefix(5, lanes[1]), 0);
    m.pipeline->close(7);
    EXPECT_EQ(m.w0b->closes, std::vector<int32_t>{7});
    EXPECT_EQ(m.w1b->closes, std::vector<int32_t>{7});  // told when it rejoins
    // Back, it forms a lane again, under a new id.
    m.w1b->comes_back = true;
    m.pipeline->rejoin_standbys();
    const std::vector<uint32_t> again = m.pipeline->lanes();
    ASSERT_EQ(again.size(), 2u);
    EXPECT_NE(again[1], lanes[1]);
    EXPECT_EQ(&m.pipeline->stage(1, again[1]), m.w1b);
    EXPECT_EQ(m.w0b->next, m.w1b);
    // The first lane losing its worker: the second becomes the first.
    m.w0a->is_up = false;
    EXPECT_TRUE(m.pipeline->fail_over());
    EXPECT_EQ(m.pipeline->lanes(), std::vector<uint32_t>{again[1]});
    EXPECT_EQ(&m.pipeline->stage(0), m.w0b);
    EXPECT_EQ(&m.pipeline->stage(1), m.w1b);
    // The last lane losing a worker with no live standby: nothing changes.
    m.w1a->is_up = false;
    m.w1b->is_up = false;
    EXPECT_FALSE(m.pipeline->fail_over());
    EXPECT_EQ(m.pipeline->lanes(), std::vector<uint32_t>{again[1]});
  }
  {
    // A standby at that position takes the lost worker's place in its lane.
    SpreadModel m(true, 1);
    const std::vector<uint32_t> lanes = m.pipeline->lanes();
    ASSERT_EQ(lanes.size(), 2u);
    EXPECT_FALSE(m.pipeline->lane_of(1, 4).has_value());  // w1c stands by
    m.w1b->is_up = false;
    EXPECT_TRUE(m.pipeline->fail_over());
    EXPECT_EQ(m.pipeline->lanes(), lanes);
    EXPECT_EQ(&m.pipeline->stage(1, lanes[1]), m.spare[0]);
    EXPECT_EQ(m.w0b->next, m.spare[0]);
    EXPECT_EQ(&m.pipeline->stage(1), m.w1a);
    EXPECT_EQ(m.pipeline->timings().failovers, 1u);
    m.pipeline->forget_taken_over();
  }
}

// Standby copies with lanes: each lane's sequences are copied to the other lane's
// workers mid-run; then a worker of one lane dies, the lane ends, and its sequences go
// on in the other lane from those copies, under the same ids. Every token is as
// undisturbed, and each worker of the lane left holds every sequence as the other.
TEST(Lanes, ASequenceWhoseLaneEndsGoesOnFromTheOtherLanesCopies) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  for (int lane : {0, 1}) {
    SpreadModel m;
    m.victim = lane == 0 ? m.w1a : m.w1b;
    m.pause_at = 12;
    m.kill_at = 24;
    m.gate = false;
    Pipeline::CopyRound copied;
    bool due_after = true;
    const auto got = run_six(*m.pipeline, small_steps(), [&](Engine& engine) {
      m.gate = true;
      while (m.submits < m.pause_at) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      auto done = engine.with_pipeline(
          [&](Pipeline& p) {
            copied = p.copy_to_standbys(engine.sequence_lengths());
            due_after = p.copies_due(engine.sequence_lengths());
            return false;
          },
          true);
      m.resume = true;
      done.get();
    }, &m.metrics);
    EXPECT_EQ(got, expected) << "lane " << lane << " lost";
    EXPECT_FALSE(due_after);
    // Every request was running: each copied to the other lane's two workers.
    EXPECT_EQ(copied.sequences, 12u);
    EXPECT_EQ(m.pipeline->lanes().size(), 1u);
    // The lost lane's three sequences went on from the copies, nothing else replayed.
    EXPECT_EQ(m.metrics.resumed_sequences, 3u) << "lane " << lane << " lost";
    EXPECT_GT(m.metrics.resumed_tokens, 0u);
    FakeStage* first = lane == 0 ? m.w0b : m.w0a;
    FakeStage* last = lane == 0 ? m.w1b : m.w1a;
    EXPECT_EQ(m.kv[first], m.kv[last]);
    EXPECT_EQ(m.kv[last].size(), 6u);  // the same ids to the end
  }
}

// New sequences go to the lane whose workers' profiles predict the shorter step with
// one more sequence: a lane much faster takes them all, a somewhat faster one more;
// lanes alike (within a tenth) take turns. The tokens are the same wherever they run.
TEST(Lanes, ANewSequenceGoesWhereItsStepIsShortest) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  struct Case {
    double slow;  // the second lane's per-layer time; the first lane's is 0.2 ms
    size_t first_min, first_max;  // sequences the first lane takes (of 6)
  };
  for (const Case c : {Case{1e-3, 6, 6}, Case{0.25e-3, 4, 5}, Case{0.21e-3, 3, 3}}) {
    SpreadModel m;
    for (FakeStage* w : {m.w0a, m.w1a}) w->info_for_test().profile = uniform_profile(0.2e-3);
    for (FakeStage* w : {m.w0b, m.w1b}) w->info_for_test().profile = uniform_profile(c.slow);
    m.gate = false;
    EXPECT_EQ(run_six(*m.pipeline, small_steps(), [&](Engine&) { m.gate = true; }, &m.metrics), expected) << c.slow;
    EXPECT_GE(m.kv[m.w1a].size(), c.first_min) << c.slow;
    EXPECT_LE(m.kv[m.w1a].size(), c.first_max) << c.slow;
    EXPECT_EQ(m.kv[m.w1a].size() + m.kv[m.w1b].size(), 6u) << c.slow;
  }
}

// A lane's links count as the placement counts them: of two lanes of like profiles, the
// one behind slow links takes the new sequences only when its step, links and all, is
// no longer than the other's. A greedy sequence's rows come back as their arg max, so
// a narrow link back costs it little. Links known for only some lanes count for none.
TEST(Lanes, ALaneBehindSlowLinksTakesFewerSequences) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  struct Case {
    double latency, bandwidth;    // the second lane's links (one way); the first lane's: 0, 1e12 B/s
    bool every_lane;              // every lane's links measured
    size_t first_min, first_max;  // sequences the first lane takes (of 6)
  };
  // The third: 10 ms a row of logits back from the second lane; run_six's three greedy
  // sequences (0, 2, 4) cost it 8 bytes a row, and two of them go there.
  for (const Case c : {Case{0.005, 1e12, true, 6, 6}, Case{0.0001, 1e12, true, 4, 5}, Case{0, 1e8, true, 4, 4},
                       Case{0.005, 1e12, false, 3, 3}}) {
    SpreadModel m;
    for (FakeStage* w : {m.w0a, m.w1a, m.w0b, m.w1b}) w->info_for_test().profile = uniform_profile(0.2e-3);
    LinkBook links;
    links.hidden_bytes_per_token = 1000;
    links.logits_bytes_per_token = 1000000;
    links.coordinator["w0a"] = links.coordinator["w1a"] = {0, 1e12};
    links.coordinator["w0b"] = {c.latency, c.bandwidth};
    if (c.every_lane) links.coordinator["w1b"] = {c.latency, c.bandwidth};
    m.pipeline->set_links(links);
    m.gate = false;
    EXPECT_EQ(run_six(*m.pipeline, small_steps(), [&](Engine&) { m.gate = true; }, &m.metrics), expected) << c.latency;
    EXPECT_GE(m.kv[m.w1a].size(), c.first_min) << c.latency << " " << c.every_lane;
    EXPECT_LE(m.kv[m.w1a].size(), c.first_max) << c.latency << " " << c.every_lane;
    EXPECT_EQ(m.kv[m.w1a].size() + m.kv[m.w1b].size(), 6u) << c.latency;
  }
}

// A drain hands the layers to a worker standing by rather than to a faster one of
// another lane (whose lane would end).
TEST(Lanes, ADrainPrefersAWorkerInNoLane) {
  SpreadModel m(true, 1);
  m.w1a->info_for_test().profile = uniform_profile(1e-3);
  m.w1b->info_for_test().profile = uniform_profile(0.5e-3);
  m.spare[0]->info_for_test().profile = uniform_profile(1e-3);
  const std::vector<uint32_t> lanes = m.pipeline->lanes();
  ASSERT_EQ(lanes.size(), 2u);
  const auto tok = tiny_tokenizer();
  Engine engine(*m.pipeline, *tok, small_steps());
  ClusterControl control(engine, fake_identity(), {});
  bool moved = false;
  control.replan(std::string("w1a"), &moved);
  EXPECT_TRUE(moved);
  EXPECT_EQ(&m.pipeline->stage(1), m.spare[0]);
  EXPECT_EQ(m.pipeline->lanes(), lanes);
  EXPECT_EQ(&m.pipeline->stage(1, lanes[1]), m.w1b);
  // The drained one stopped: with no worker standing by left, the other lane's takes
  // the layers, and its lane ends.
  m.w1a->is_up = false;
  m.w1a->comes_back = false;
  control.replan(std::string("w1c"), &moved);
  EXPECT_TRUE(moved);
  EXPECT_EQ(&m.pipeline->stage(1), m.w1b);
  EXPECT_EQ(m.pipeline->lanes().size(), 1u);
}

// A drained (or slow) worker leaves its lane and forms none again until it is lost and
// back; the first lane's worker is only kept out (moving it is the caller's).
TEST(Lanes, AWorkerKeptOutOfTheLanesFormsNoneAgain) {
  SpreadModel m;
  const std::vector<uint32_t> lanes = m.pipeline->lanes();
  EXPECT_TRUE(m.pipeline->keep_out_of_lanes("w1b"));
  EXPECT_EQ(m.pipeline->lanes(), std::vector<uint32_t>{lanes[0]});
  m.pipeline->rejoin_standbys();
  m.pipeline->set_spread(true);
  EXPECT_EQ(m.pipeline->lanes().size(), 1u);
  m.pipeline->close(4);
  EXPECT_EQ(m.w1b->closes, std::vector<int32_t>{4});  // it held that lane's sequences
  // Lost and back (restarted, maybe mended): it forms a lane again.
  m.w1b->is_up = false;
  m.pipeline->rejoin_standbys();
  EXPECT_EQ(m.pipeline->lanes().size(), 2u);
  EXPECT_EQ(m.w0b->next, m.w1b);
  // The first lane's worker: no lane ends.
  EXPECT_FALSE(m.pipeline->keep_out_of_lanes("w1a"));
  EXPECT_EQ(m.pipeline->lanes().size(), 2u);
  EXPECT_FALSE(m.pipeline->keep_out_of_lanes("nobody"));
}

// The engine spreads its requests over the lanes, and a lane that loses a worker ends
// mid-run: its sequences replay on the other lane. Every token is as in the undisturbed
// run on one chain.
TEST(Lanes, RequestsSpreadOverTheLanesAndSurviveALaneEnding) {
  FakeModel calm;
  const std::vector<std::string> expected = calm.run(small_steps());
  {
    SpreadModel m;
    m.gate = false;
    EXPECT_EQ(run_six(*m.pipeline, small_steps(), [&](Engine&) { m.gate = true; }, &m.metrics), expected);
    EXPECT_GT(m.steps[m.w0a], 0);
    EXPECT_GT(m.steps[m.w0b], 0);
    // Three sequences on each lane: each last worker computed about half.
    EXPECT_GT(m.computed[m.w1a], 0u);
    EXPECT_GT(m.computed[m.w1b], 0u);
    EXPECT_EQ(m.kv[m.w1a].size() + m.kv[m.w1b].size(), 6u);
    EXPECT_EQ(m.kv[m.w1a].size(), 3u);
  }
  for (int lane : {0, 1}) {
    for (int kill_at : {3, 12, 30}) {
      SpreadModel m;
      m.victim = lane == 0 ? m.w1a : m.w1b;
      m.kill_at = kill_at;
      m.gate = false;
      EXPECT_EQ(run_six(*m.pipeline, small_steps(), [&](Engine&) { m.gate = true; }, &m.metrics), expected)
          << "lane " << lane << " lost at submit " << kill_at;
      EXPECT_EQ(m.pipeline->lanes().size(), 1u);
      EXPECT_EQ(m.pipeline->timings().failovers, 1u);
      EXPECT_GT(m.metrics.replayed_tokens, 0u);
      // The other lane's sequences went on with their steps in flight: none of them
      // replayed or resumed (the lost lane's start again on it, from position 0).
      EXPECT_EQ(m.metrics.resumed_sequences, 0u) << "lane " << lane << " lost at submit " << kill_at;
    }
  }
  {
    // Spread off: one chain, as before.
    SpreadModel m(false);
    EXPECT_EQ(run_six(*m.pipeline, small_steps(), {}, &m.metrics), expected);
    EXPECT_EQ(m.steps[m.w0b], 0);
  }
}

// Kept sequences (prompt-prefix reuse) live through a loss. Six requests end and stay
// kept, three on each lane; a round of copies; then a worker of one lane dies while
// another request runs. Every kept sequence stays kept: those of a lane that ended on
// the other lane, from its copies; with a standby taking the place, as far as the
// standby's copies. A request continuing the longest one reuses all of it, as in an
// undisturbed run, and every token is as undisturbed.
TEST(Lanes, KeptSequencesLiveThroughALoss) {
  struct Case {
    const char* what;
    int victim_lane;  // -1: undisturbed
    int standbys;
  };
  struct Outcome {
    std::vector<std::vector<int32_t>> tokens;  // the six, the request during the loss, the one continuing
    uint64_t cached = 0;                       // the prompt tokens the last request reused
  };
  std::optional<Outcome> calm;
  for (const Case c : {Case{"undisturbed", -1, 0}, Case{"the first lane ends", 0, 0},
                       Case{"the second lane ends", 1, 0}, Case{"a standby takes the second lane's place", 1, 1}}) {
    SpreadModel m(true, c.standbys);
    const auto tok = tiny_tokenizer();
    SchedulerOptions options = small_steps();
    options.cache_sequences = 8;
    Engine engine(*m.pipeline, *tok, options);
    // The requests run at once (each placed on a lane before any step) to their end.
    auto run = [&](const std::vector<std::vector<int32_t>>& prompts) {
      std::mutex mutex;
      std::condition_variable cv;
      size_t ended = 0;
      std::vector<std::vector<int32_t>> out(prompts.size());
      m.gate = false;
      for (size_t i = 0; i < prompts.size(); ++i) {
        OnlineRequest q;
        q.prompt = prompts[i];
        q.max_tokens = 24;
        q.ignore_eos = true;
        q.sampling = sample::SamplingParams::greedy();
        Callbacks cb;
        cb.on_sampled = [&, i](int32_t id, std::span<const float>) { out[i].push_back(id); };
        cb.on_done = [&](const std::string&, const Usage&) {
          std::lock_guard lock(mutex);
          ++ended;
          cv.notify_all();
        };
        cb.on_error = [&](const std::string& message) {
          ADD_FAILURE() << c.what << ": " << message;
          std::lock_guard lock(mutex);
          ++ended;
          cv.notify_all();
        };
        engine.submit(std::move(q), std::move(cb));
      }
      m.gate = true;
      std::unique_lock lock(mutex);
      EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return ended == prompts.size(); })) << c.what;
      return out;
    };
    std::vector<std::vector<int32_t>> six;
    for (int i = 0; i < 6; ++i) {
      six.emplace_back(static_cast<size_t>(3 + i), 3);
      six.back()[0] = static_cast<int32_t>(i % 2) * 3;
    }
    // The sequences the engine holds on the stages once no step is in flight (the last
    // step of a request may come back after its end is told).
    auto held = [&] {
      size_t n = 0;
      engine.with_pipeline([&](Pipeline&) {
              n = engine.sequence_lengths().size();
              return false;
            },
            true).get();
      return n;
    };
    Outcome got;
    got.tokens = run(six);
    EXPECT_EQ(held(), 6u) << c.what;
    EXPECT_EQ(m.kv[m.w1a].size(), 3u) << c.what;  // three on each lane
    Pipeline::CopyRound copied;
    engine.with_pipeline([&](Pipeline& p) {
            copied = p.copy_to_standbys(engine.sequence_lengths());
            return false;
          },
          true).get();
    // Each to the other lane's worker at each position, and to the standby at position 1.
    EXPECT_EQ(copied.sequences, 12u + 6u * static_cast<uint64_t>(c.standbys)) << c.what;
    if (c.victim_lane >= 0) {
      m.victim = c.victim_lane == 0 ? m.w1a : m.w1b;
      m.kill_at = m.submits + 1;
    }
    got.tokens.push_back(run({std::vector<int32_t>(12, 2)}).front());  // continues no kept one
    EXPECT_EQ(held(), 7u) << c.what;
    EXPECT_EQ(m.pipeline->timings().failovers, c.victim_lane >= 0 ? 1u : 0u) << c.what;
    EXPECT_EQ(m.pipeline->lanes().size(), c.victim_lane >= 0 && c.standbys == 0 ? 1u : 2u) << c.what;
    // The longest kept sequence (the sixth request's) continued by one more token.
    std::vector<int32_t> longer = six[5];
    longer.insert(longer.end(), got.tokens[5].begin(), got.tokens[5].end());
    longer.push_back(2);
    const uint64_t cached_before = engine.metrics().prompt_tokens_cached;
    got.tokens.push_back(run({longer}).front());
    got.cached = engine.metrics().prompt_tokens_cached - cached_before;
    if (!calm) {
      // Its prompt and every token it computed (the last sampled one was never sent).
      EXPECT_EQ(got.cached, six[5].size() + got.tokens[5].size() - 1);
      calm = got;
      continue;
    }
    EXPECT_EQ(got.tokens, calm->tokens) << c.what;
    EXPECT_EQ(got.cached, calm->cached) << c.what;
  }
}

}  // namespace
}  // namespace pico::coordinator
