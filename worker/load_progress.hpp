// Progress of long work at load (prefaulting a stage's weights): a bar redrawn in place
// on a terminal, a log line every tenth otherwise; and what --mem locked.
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

inline std::function<void(uint64_t, uint64_t)> load_progress(std::string what) {
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  auto last = std::make_shared<int>(-1);  // the last tenth logged (or percent drawn)
  return [what = std::move(what), terminal, last](uint64_t done, uint64_t total) {
    if (total == 0) return;
    const int percent = static_cast<int>(done * 100 / total);
    const auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
    if (terminal) {
      if (percent == *last) return;
      *last = percent;
      const int filled = percent / 4;
      std::fprintf(stderr, "\r%s [%s%s] %3d%% %.0f/%.0f MiB%s", what.c_str(), std::string(filled, '#').c_str(),
                   std::string(25 - filled, ' ').c_str(), percent, mib(done), mib(total), done >= total ? "\n" : "");
      std::fflush(stderr);
      return;
    }
    if (percent / 10 == *last && done < total) return;
    *last = percent / 10;
    spdlog::info("{}: {}% ({:.0f} of {:.0f} MiB)", what, percent, mib(done), mib(total));
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
