// Slots on disk (llama-server's /slots/{id}?action=save|restore, PicoLM's persistent
// KV): each stage writes the state of a sequence on its own layers (KV, recurrent
// state, checkpoints: StageEngine::snapshot) to its own disk with the sequence's tokens,
// and reads it back into a sequence; the state never travels. A file names the model
// (its hash) and the layers it covers, and one of another model or range is refused.
//   "PICOSLOT" u32 version, u64 model hash, i32 first layer, i32 last layer (exclusive),
//   u64 tokens, tokens (i32), u64 state bytes, state; little-endian.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "stage_engine.hpp"

namespace pico::worker {

// `name` inside `dir`: std::invalid_argument unless it is a plain file name (no
// directory part, not "." or "..", printable, at most 255 bytes) and dir is set.
std::filesystem::path slot_file_path(const std::string& dir, const std::string& name);

// Writes the sequence's state and its tokens (one per position it holds; the stage may
// hold one more) to `path`, through a temporary file renamed. Returns the state's
// bytes. std::invalid_argument when the sequence is not open here or holds fewer
// positions than tokens; std::runtime_error naming the file when it cannot be written.
uint64_t save_slot(const StageEngine& engine, int32_t seq_id, const std::filesystem::path& path,
                   std::span<const int32_t> tokens);

// Reads `path` into sequence seq_id (replacing any state it had) and returns its
// tokens. std::invalid_argument naming what is wrong (no such file, not a slot file,
// another model's or layer range's, truncated, a state this stage refuses);
// LimitError for one beyond the stage's limits.
std::vector<int32_t> restore_slot(StageEngine& engine, int32_t seq_id, const std::filesystem::path& path);

}  // namespace pico::worker
