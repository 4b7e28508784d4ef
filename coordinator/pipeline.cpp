#include "pipeline.hpp"

#include <spdlog/spdlog.h>

#include <chrono>

namespace pico::coordinator {

namespace {
std::string layers_text(const StageInfo& s) {
  return std::to_string(s.layers.first) + "-" + std::to_string(s.layers.last - 1);
}
}  // namespace

void check_coverage(const std::vector<StageInfo>& stages, int32_t n_layer) {
  if (stages.empty()) throw StageError("no stages");
  int32_t expect = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const auto& s = stages[i];
    if (s.layers.first < expect) {
      throw StageError("worker " + s.name + " (layers " + layers_text(s) + ") overlaps " +
                       (i ? "worker " + stages[i - 1].name + " (layers " + layers_text(stages[i - 1]) + ")"
                          : std::string("the layers before it")));
    }
    if (s.layers.first > expect) {
      throw StageError("no stage holds layers " + std::to_string(expect) + "-" + std::to_string(s.layers.first - 1) +
                       " (gap before worker " + s.name + ")");
    }
    expect = s.layers.last;
  }
  if (expect != n_layer) {
    throw StageError("no stage holds layers " + std::to_string(expect) + "-" + std::to_string(n_layer - 1) +
                     " (after worker " + stages.back().name + ")");
  }
}

Pipeline::Pipeline(std::vector<std::unique_ptr<Stage>> stages, const protocol::ModelIdentity& expected)
    : stages_(std::move(stages)) {
  std::vector<StageInfo> infos;
  for (const auto& s : stages_) {
    const StageInfo& info = s->info();
    if (!(info.identity == expected)) {
      throw StageError("worker " + info.name + " serves another model: " + protocol::to_string(info.identity) +
                       "; expected " + protocol::to_string(expected));
    }
    infos.push_back(info);
  }
  check_coverage(infos, static_cast<int32_t>(expected.n_layer));
  for (size_t i = 0; i < stages_.size(); ++i) {
    stages_[i]->plan(i + 1 < stages_.size() ? stages_[i + 1].get() : nullptr, i, stages_.size());
    const StageInfo& info = stages_[i]->info();
    spdlog::info("stage {}: {} layers {} ({}{}{} threads)", i, info.name, layers_text(info),
                 info.isa.empty() ? "" : info.isa + ", ", info.backend.empty() ? "" : info.backend + ", ",
                 info.threads);
  }
}

uint64_t Pipeline::submit(std::span<const model::BatchToken> batch) {
  const uint64_t step = next_step_++;
  stages_.front()->submit(step, batch);
  return step;
}

StepOutput Pipeline::wait(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    // Errors and lost connections of the stages before the last one.
    for (size_t i = 0; i + 1 < stages_.size(); ++i) {
      if (stages_[i]->poll(0)) throw StageError("stage " + std::to_string(i) + " answered with logits");
    }
    if (auto out = stages_.back()->poll(20)) return std::move(*out);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw StageError("no logits within " + std::to_string(timeout_ms) + " ms");
    }
  }
}

void Pipeline::close(int32_t seq_id) {
  for (auto& s : stages_) s->close(seq_id);
}

void Pipeline::truncate(int32_t seq_id, int64_t pos) {
  for (auto& s : stages_) s->truncate(seq_id, pos);
}

}  // namespace pico::coordinator
