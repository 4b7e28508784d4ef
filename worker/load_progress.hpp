// Progress of long work (prefaulting a stage's weights at load, a long prompt in `pico
// run`): a bar redrawn in place on a terminal, a log line every tenth otherwise; and what
// --mem locked.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "model/residency.hpp"

namespace pico::worker {

// What progress counts: bytes (shown in MiB) or tokens.
enum class ProgressUnit { Bytes, Tokens };

inline std::function<void(uint64_t, uint64_t)> progress_bar(std::string what, ProgressUnit unit = ProgressUnit::Bytes) {
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  auto last = std::make_shared<int>(-1);  // the last tenth logged (or percent drawn)
  return [what = std::move(what), terminal, last, unit](uint64_t done, uint64_t total) {
    if (total == 0) return;
    const int percent = static_cast<int>(done * 100 / total);
    const bool bytes = unit == ProgressUnit::Bytes;
    const auto amount = [bytes](uint64_t n) { return bytes ? static_cast<double>(n) / (1 << 20) : static_cast<double>(n); };
    const char* name = bytes ? "MiB" : "tokens";
    if (terminal) {
      if (percent == *last) return;
      *last = percent;
      const int filled = percent / 4;
      std::fprintf(stderr, "\r%s [%s%s] %3d%% %.0f/%.0f %s%s", what.c_str(), std::string(filled, '#').c_str(),
                   std::string(25 - filled, ' ').c_str(), percent, amount(done), amount(total), name,
                   done >= total ? "\n" : "");
      std::fflush(stderr);
      return;
    }
    if (percent / 10 == *last && done < total) return;
    *last = percent / 10;
    spdlog::info("{}: {}% ({:.0f} of {:.0f} {})", what, percent, amount(done), amount(total), name);
  };
}

inline void log_residency(const model::ResidencyReport& r) {
  const auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  spdlog::info("weights: {:.1f} MiB in this stage, {:.1f} MiB locked{}{}; anonymous memory {:.1f} MiB", mib(r.range_bytes),
               mib(r.locked_bytes), r.streaming ? ", the rest streamed layer by layer" : "",
               r.lock_failed_bytes ? fmt::format(" ({:.1f} MiB refused: {}; raise `ulimit -l` or run with CAP_IPC_LOCK)",
                                                 mib(r.lock_failed_bytes), r.lock_error)
                                   : std::string(),
               mib(model::anonymous_resident_bytes()));
}

}  // namespace pico::worker
