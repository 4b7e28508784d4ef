// Per-sequence model state behind one interface: the attention KV cache now, the
// recurrent (SSM) state of hybrid models later. A state holds positions [0, n_pos)
// of one sequence for the layers of one stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace pico::state {

class SequenceState {
 public:
  virtual ~SequenceState() = default;
  // Positions held: [0, n_pos).
  virtual int64_t n_pos() const = 0;
  // Forgets positions >= pos (no-op when pos >= n_pos).
  virtual void truncate(int64_t pos) = 0;
  // Bytes of state for the positions held.
  virtual size_t bytes_used() const = 0;
  // An opaque copy of the state that restore() takes back (same configuration).
  virtual std::vector<uint8_t> snapshot() const = 0;
  // Throws std::invalid_argument for a snapshot of another configuration.
  virtual void restore(std::span<const uint8_t> snapshot) = 0;
};

}  // namespace pico::state
