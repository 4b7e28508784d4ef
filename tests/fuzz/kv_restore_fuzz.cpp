// libFuzzer target: state::KvState::restore on arbitrary bytes (a restore message's
// payload, as a worker hands it to its cache).
//
// The first input byte picks one of the cache configurations below (element types,
// layer ranges, head shapes), the rest is the snapshot. A refused snapshot must throw
// std::invalid_argument and leave the state as it was; an accepted one must read back:
// every K and V head of every held position dequantizes within the state's bytes (ASan
// checks each read), and snapshot() -> restore() -> snapshot() is stable. Seeds:
// kv_restore_fuzz_seeds (valid snapshots of each configuration).
//   scripts/fuzz kv_restore [SECONDS]
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kv_fuzz_configs.hpp"

namespace {

volatile float g_sink;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return -1;
  const auto& configs = pico::fuzz::kv_configs();
  const pico::state::KvConfig& config = configs[data[0] % configs.size()];
  pico::state::KvState state(config);
  const std::vector<uint8_t> empty = state.snapshot();
  try {
    state.restore({data + 1, size - 1});
  } catch (const std::invalid_argument&) {
    // Refused: the state must be the empty one it was.
    if (state.n_pos() != 0 || state.bytes_used() != 0 || state.snapshot() != empty) __builtin_trap();
    return 0;
  }
  float sum = 0;
  std::vector<float> head(static_cast<size_t>(std::max(config.head_dim_k, config.head_dim_v)));
  for (int32_t layer = config.first_layer; layer < config.last_layer; ++layer) {
    const pico::state::KvLayerView view = state.layer(layer);
    if (layer == config.first_layer && view.n_pos < state.n_pos()) __builtin_trap();
    for (int64_t pos = 0; pos < view.n_pos; ++pos) {
      for (int64_t h = 0; h < view.n_kv_heads; ++h) {
        pico::state::read_k(view, pos, h, head.data());
        sum += head[0];
        pico::state::read_v(view, pos, h, head.data());
        sum += head[0];
      }
    }
  }
  const std::vector<uint8_t> again = state.snapshot();
  pico::state::KvState copy(config);
  copy.restore(again);
  if (copy.snapshot() != again || copy.n_pos() != state.n_pos() || copy.bytes_used() != state.bytes_used()) {
    __builtin_trap();
  }
  g_sink = sum;
  return 0;
}
