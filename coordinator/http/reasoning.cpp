#include "http/reasoning.hpp"

#include <algorithm>

namespace pico::coordinator::http_api {

namespace {

struct NamedReasoningFormat {
  std::string_view name;
  ReasoningFormat format;
};

constexpr NamedReasoningFormat kReasoningFormats[] = {
    {"none", ReasoningFormat::None},
    {"auto", ReasoningFormat::Auto},
    {"deepseek", ReasoningFormat::Deepseek},
    {"deepseek-legacy", ReasoningFormat::DeepseekLegacy},
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

size_t leading_spaces(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && is_space(s[n])) ++n;
  return n;
}

std::string_view without_trailing_spaces(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The length of the longest suffix of `text` that is a proper prefix of `tag` (text that
// may become the tag once more arrives).
size_t partial_tag_at_end(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name) {
  for (const auto& f : kReasoningFormats) {
    if (f.name == name) return f.format;
  }
  return std::nullopt;
}

std::string_view reasoning_format_name(ReasoningFormat format) {
  for (const auto& f : kReasoningFormats) {
    if (f.format == format) return f.name;
  }
  return "unknown";
}

ReasoningSplitter::ReasoningSplitter(std::string open_tag, std::string close_tag, bool starts_inside,
                                     bool inline_reasoning)
    : open_(std::move(open_tag)), close_(std::move(close_tag)), inline_(inline_reasoning) {
  if (open_.empty() || close_.empty()) return;  // nothing to look for: content only
  state_ = starts_inside ? State::Reasoning : State::Start;
}

ReasoningSplitter ReasoningSplitter::for_reply(const ReplyReasoning& reply, bool stream) {
  if (!reply.separates()) return ReasoningSplitter();
  return ReasoningSplitter(reply.open_tag, reply.close_tag, reply.starts_inside,
                           stream && reply.format == ReasoningFormat::DeepseekLegacy);
}

ReasoningSplitter::Split ReasoningSplitter::feed(std::string_view piece) {
  Split out;
  if (state_ == State::Content) {  // the common case, without copies
    out.content = piece;
    return out;
  }
  pending_ += piece;
  run(out, false);
  return out;
}

ReasoningSplitter::Split ReasoningSplitter::finish() {
  Split out;
  run(out, true);
  return out;
}

void ReasoningSplitter::run(Split& out, bool final) {
  while (true) {
    switch (state_) {
      case State::Start: {
        // Optional whitespace, then the opening tag: anything else makes it all content.
        const size_t spaces = leading_spaces(pending_);
        const std::string_view rest = std::string_view(pending_).substr(spaces);
        if (rest.starts_with(open_)) {
          pending_.erase(0, spaces + open_.size());
          state_ = State::Reasoning;
          continue;
        }
        if (!final && std::string_view(open_).starts_with(rest)) return;  // may still become the tag
        state_ = State::Content;
        continue;
      }
      case State::Reasoning: {
        const size_t end = pending_.find(close_);
        if (end != std::string::npos) {
          emit_reasoning(out, std::string_view(pending_).substr(0, end), true);
          pending_.erase(0, end + close_.size());
          close_block(out);
          state_ = State::AfterReasoning;
          continue;
        }
        if (final) {  // never closed: reasoning to the end
          emit_reasoning(out, pending_, true);
          pending_.clear();
          close_block(out);
          state_ = State::Content;
          return;
        }
        // Send all but a possible start of the closing tag and the whitespace before it.
        const std::string_view text = pending_;
        const size_t held_tag = partial_tag_at_end(text, close_);
        const std::string_view ready = without_trailing_spaces(text.substr(0, text.size() - held_tag));
        emit_reasoning(out, ready, false);
        pending_.erase(0, ready.size());
        return;
      }
      case State::AfterReasoning:
        pending_.erase(0, leading_spaces(pending_));
        if (pending_.empty()) return;
        state_ = State::Content;
        continue;
      case State::Content:
        out.content += pending_;
        pending_.clear();
        return;
    }
  }
}

// `text` of the block; ends: nothing of the block follows it (its trailing whitespace goes).
void ReasoningSplitter::emit_reasoning(Split& out, std::string_view text, bool ends) {
  if (!reasoning_begun_) text.remove_prefix(leading_spaces(text));
  if (ends) text = without_trailing_spaces(text);
  if (text.empty()) return;
  if (inline_ && !reasoning_begun_) out.content += open_;
  (inline_ ? out.content : out.reasoning) += text;
  reasoning_begun_ = true;
}

void ReasoningSplitter::close_block(Split& out) {
  if (inline_ && reasoning_begun_) out.content += close_;
}

}  // namespace pico::coordinator::http_api
