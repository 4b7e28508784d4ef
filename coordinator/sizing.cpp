#include "sizing.hpp"

#include <algorithm>

namespace pico::coordinator {

namespace {

std::string stage_name(const StageInfo& s) {
  return "stage " + s.name + " (layers " + model::to_string(s.layers) + ")";
}

int64_t whole_pages(int64_t positions, int64_t page) {
  if (page <= 0) return positions;
  return (positions + page - 1) / page * page;
}

}  // namespace

uint64_t sequence_bytes(const worker::StageLimits& l, int64_t ctx) {
  return static_cast<uint64_t>(whole_pages(ctx, l.page_positions)) * l.kv_bytes_per_position +
         l.state_bytes_per_sequence;
}

Sizing size_for_stages(const std::vector<StageInfo>& stages, const SizingRequest& request) {
  Sizing s;
  s.ctx = request.ctx > 0 ? request.ctx : (request.model_ctx > 0 ? request.model_ctx : 4096);
  s.parallel = std::max(request.parallel, 1);
  s.max_batch_tokens = std::max(request.max_batch_tokens, 1);
  // A limit of 0 is one the stage does not state.
  for (const StageInfo& st : stages) {
    const auto& l = st.limits;
    if (l.max_positions > 0 && l.max_positions < s.ctx) {
      s.notes.push_back("ctx " + std::to_string(s.ctx) + " cut to " + std::to_string(l.max_positions) + ": " +
                        stage_name(st) + " holds at most " + std::to_string(l.max_positions) +
                        " positions per sequence (its --ctx)");
      s.ctx = l.max_positions;
    }
  }
  for (const StageInfo& st : stages) {
    const auto& l = st.limits;
    if (l.max_sequences > 0 && l.max_sequences < s.parallel) {
      s.notes.push_back("parallel " + std::to_string(s.parallel) + " cut to " + std::to_string(l.max_sequences) + ": " +
                        stage_name(st) + " holds at most " + std::to_string(l.max_sequences) +
                        " sequences (its --max-sequences)");
      s.parallel = static_cast<int>(l.max_sequences);
    }
    if (l.max_rows > 0 && l.max_rows < s.max_batch_tokens) {
      s.notes.push_back("max batch tokens " + std::to_string(s.max_batch_tokens) + " cut to " +
                        std::to_string(l.max_rows) + ": " + stage_name(st) + " takes at most " +
                        std::to_string(l.max_rows) + " rows per forward (its --max-rows)");
      s.max_batch_tokens = static_cast<int>(l.max_rows);
    }
  }
  for (const StageInfo& st : stages) {
    const auto& l = st.limits;
    if (l.kv_bytes_per_position == 0 && l.state_bytes_per_sequence == 0) continue;
    const uint64_t one = sequence_bytes(l, s.ctx);
    if (one > l.state_budget_bytes) {
      // The longest context one sequence may have there, in whole pages.
      const uint64_t page_bytes =
          static_cast<uint64_t>(std::max<int64_t>(l.page_positions, 1)) * l.kv_bytes_per_position;
      const uint64_t room =
          l.state_budget_bytes > l.state_bytes_per_sequence ? l.state_budget_bytes - l.state_bytes_per_sequence : 0;
      const uint64_t fits =
          page_bytes ? room / page_bytes * static_cast<uint64_t>(std::max<int64_t>(l.page_positions, 1)) : 0;
      throw SizingError(stage_name(st) + ": one sequence of ctx " + std::to_string(s.ctx) + " takes " +
                        std::to_string(one) + " bytes of KV, more than its budget of " +
                        std::to_string(l.state_budget_bytes) + " bytes: use --ctx " + std::to_string(fits) +
                        " or less" + (fits == 0 ? " (nothing fits)" : "") + ", or give that worker --kv-memory " +
                        std::to_string(one) + " or more");
    }
    const uint64_t fit = l.state_budget_bytes / one;
    if (fit < static_cast<uint64_t>(s.parallel)) {
      s.notes.push_back("parallel " + std::to_string(s.parallel) + " cut to " + std::to_string(fit) + ": " +
                        stage_name(st) + " has a KV budget of " + std::to_string(l.state_budget_bytes) + " bytes, " +
                        std::to_string(one) + " per sequence of ctx " + std::to_string(s.ctx) +
                        " (raise its --kv-memory or lower --ctx for more)");
      s.parallel = static_cast<int>(fit);
    }
  }
  return s;
}

std::string rejoin_shortfall(const StageInfo& stage, const Sizing& sized) {
  SizingRequest request;
  request.ctx = sized.ctx;
  request.parallel = sized.parallel;
  request.max_batch_tokens = sized.max_batch_tokens;
  try {
    const Sizing again = size_for_stages({stage}, request);
    std::string why;
    for (const auto& note : again.notes) why += (why.empty() ? "" : "; ") + note;
    return why;
  } catch (const SizingError& e) {
    return e.what();
  }
}

uint64_t coordinator_max_message_bytes(int64_t max_batch_tokens, int64_t n_vocab, int64_t ctx,
                                       uint64_t bytes_per_position) {
  const uint64_t logits = static_cast<uint64_t>(std::max<int64_t>(max_batch_tokens, 1)) *
                          static_cast<uint64_t>(std::max<int64_t>(n_vocab, 1)) * 4;
  const uint64_t snapshot = static_cast<uint64_t>(std::max<int64_t>(ctx, 1)) * bytes_per_position;
  const uint64_t room = (uint64_t{1} << 20) + 64 * static_cast<uint64_t>(std::max<int64_t>(max_batch_tokens, 1));
  return std::max(logits, snapshot) + room;
}

}  // namespace pico::coordinator
