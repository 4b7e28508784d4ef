// Valid messages of every kind, for the seed corpora of protocol_decoder_fuzz and
// worker_message_fuzz: shaped for the tiny fuzz model's stages (fuzz_model.hpp), each
// with the payload frames its receiver expects.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_model.hpp"
#include "protocol.hpp"

namespace pico::fuzz {

struct SeedMessage {
  std::string name;
  int stage = 0;  // the worker target's stage it is meant for: 0 layers [0, 1), 1 layers [1, 2)
  std::vector<std::vector<uint8_t>> frames;  // envelope, payloads
};

// Where the worker target's stages send what goes on (next stage, chained steps).
inline const char* kSinkAddress = "ipc://fuzz-sink";

inline std::vector<float> fuzz_hidden(size_t rows) {
  std::vector<float> h(rows * kModelEmbd);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(static_cast<int>(i % 13) - 6) * 0.25f;
  return h;
}

// `snapshots[s]`: a valid state of one sequence on stage s (restore seeds).
inline std::vector<SeedMessage> seed_messages(const std::vector<uint8_t> (&snapshots)[2]) {
  using protocol::DType;
  using protocol::LogitsOutput;
  std::vector<SeedMessage> out;
  auto add = [&](std::string name, int stage, protocol::Builder& b, std::vector<std::vector<uint8_t>> payloads = {}) {
    SeedMessage m{std::move(name), stage, {b.encode()}};
    for (auto& p : payloads) m.frames.push_back(std::move(p));
    out.push_back(std::move(m));
  };
  for (int stage = 0; stage < 2; ++stage) {
    const std::string s = std::to_string(stage);
    {
      protocol::Builder b;
      b.envelope().getBody().initHello().setRole("coordinator");
      add("hello-" + s, stage, b);
    }
    {
      protocol::Builder b;
      auto plan = b.envelope().getBody().initPlan();
      plan.setNext(stage == 0 ? kSinkAddress : "");
      plan.setChainTo(stage == 1 ? kSinkAddress : "");
      plan.setStageIndex(static_cast<uint32_t>(stage));
      plan.setStageCount(2);
      add("plan-" + s, stage, b);
    }
    for (const char* kind : {"close", "open", "snapshot-request"}) {
      protocol::Builder b;
      auto body = b.envelope().getBody();
      (std::string(kind) == "close" ? body.initClose() : std::string(kind) == "open" ? body.initOpen()
                                                                                      : body.initSnapshotRequest())
          .setSeqId(1);
      add(std::string(kind) + "-" + s, stage, b);
    }
    {
      protocol::Builder b;
      auto t = b.envelope().getBody().initTruncate();
      t.setSeqId(1);
      t.setPos(1);
      add("truncate-" + s, stage, b);
    }
    {
      protocol::Builder b;
      b.envelope().getBody().setStatsRequest();
      add("stats-request-" + s, stage, b);
    }
    {
      protocol::Builder b;
      b.envelope().getBody().initHeartbeat().setSentNanos(12345);
      add("heartbeat-" + s, stage, b);
    }
    {
      protocol::Builder b;
      auto r = b.envelope().getBody().initRestore();
      r.setSeqId(3);
      r.setNPos(2);
      r.setFirstLayer(static_cast<uint32_t>(stage));
      r.setLastLayer(static_cast<uint32_t>(stage + 1));
      r.setBytes(snapshots[stage].size());
      add("restore-" + s, stage, b, {snapshots[stage]});
    }
    for (const bool save : {true, false}) {  // slot files (the fuzzed worker keeps none: refused)
      protocol::Builder b;
      auto r = save ? b.envelope().getBody().initSlotSave() : b.envelope().getBody().initSlotRestore();
      r.setSeqId(3);
      r.setName("slot.bin");
      if (save) r.initTokens(2).set(1, 7);
      add(std::string(save ? "slot-save-" : "slot-restore-") + s, stage, b);
    }
  }
  // Forwards: tokens into the first stage; hidden states (each dtype) into the last,
  // full rows, arg max rows and a greedy chain.
  {
    protocol::Builder b;
    auto f = b.envelope().getBody().initForward();
    f.setStepId(1);
    f.setSeqIds({1, 1, 2});
    f.setPositions({0, 1, 0});
    f.setTokens({5, 6, 7});
    f.setWantLogits({false, true, true});
    f.setLogitsOutput({LogitsOutput::FULL, LogitsOutput::ARGMAX, LogitsOutput::FULL});
    f.setRows(3);
    f.setOutputDtype(DType::F16);
    add("forward-tokens", 0, b);
  }
  for (const DType dtype : {DType::F32, DType::F16, DType::Q80}) {
    const std::vector<float> hidden = fuzz_hidden(3);
    protocol::Builder b;
    auto f = b.envelope().getBody().initForward();
    f.setStepId(2);
    f.setSeqIds({1, 1, 2});
    f.setPositions({0, 1, 0});
    f.setTokens({5, 6, 7});
    f.setWantLogits({false, true, true});
    f.setLogitsOutput({LogitsOutput::FULL, LogitsOutput::ARGMAX, LogitsOutput::FULL});
    f.setRows(3);
    f.setWidth(kModelEmbd);
    f.setDtype(dtype);
    add("forward-hidden-" + std::to_string(static_cast<int>(dtype)), 1, b,
        {protocol::encode_payload(dtype, hidden.data(), 3, kModelEmbd)});
  }
  {
    const std::vector<float> hidden = fuzz_hidden(2);
    protocol::Builder b;
    auto f = b.envelope().getBody().initForward();
    f.setStepId(3);
    f.setSeqIds({4, 5});
    f.setPositions({0, 0});
    f.setWantLogits({true, true});
    f.setLogitsOutput({LogitsOutput::ARGMAX, LogitsOutput::ARGMAX});
    f.setRows(2);
    f.setWidth(kModelEmbd);
    f.setChainSteps(3);
    f.setStopTokens({2});
    auto t = f.initTimings(1);
    t[0].setStage(0);
    t[0].setComputeEndNanos(7);
    add("forward-chain", 1, b, {protocol::encode_payload(DType::F32, hidden.data(), 2, kModelEmbd)});
  }
  // What workers send back (the coordinator's side; the decoder target reads them).
  {
    protocol::Builder b;
    auto caps = b.envelope().getBody().initCapabilities();
    caps.setIsa("avx2");
    caps.setBackend("cpu");
    caps.setLastLayer(2);
    caps.setSession(99);
    auto id = caps.initModel();
    id.setArch("llama");
    id.setNVocab(kModelVocab);
    auto limits = caps.initLimits();
    limits.setMaxRows(512);
    limits.setMaxPositions(64);
    limits.setMaxSequences(4);
    limits.setStateBudgetBytes(1 << 20);
    limits.setKvBytesPerPosition(64);
    limits.setPagePositions(16);
    limits.setMaxMessageBytes(1 << 20);
    add("capabilities", 1, b);
  }
  {
    std::vector<float> rows(2 * kModelVocab, 0.5f);
    protocol::Builder b;
    auto l = b.envelope().getBody().initLogits();
    l.setStepId(2);
    l.setSeqIds({1, 2, 3});
    l.setPositions({1, 0, 4});
    l.setRows(3);
    l.setNVocab(kModelVocab);
    l.setArgmaxIds({-1, 9, -1});
    l.setArgmaxLogits({0, 1.5f, 0});
    add("logits-mixed", 1, b, {protocol::encode_payload(DType::F32, rows.data(), 2, kModelVocab)});
  }
  {
    protocol::Builder b;
    auto s = b.envelope().getBody().initSnapshot();
    s.setSeqId(3);
    s.setNPos(2);
    s.setLastLayer(1);
    s.setBytes(snapshots[0].size());
    add("snapshot", 0, b, {snapshots[0]});
  }
  {
    protocol::Builder b;
    auto s = b.envelope().getBody().initStats();
    s.setKvBytes(1024);
    s.setSequences(2);
    add("stats", 0, b);
  }
  out.push_back({"error", 0, {protocol::make_error(protocol::ErrorCode::LIMIT, "rows per forward: 9 > 8", 4)}});
  {
    protocol::Builder b;
    b.envelope().getBody().initRestored().setSeqId(3);
    add("restored", 0, b);
  }
  return out;
}

}  // namespace pico::fuzz
