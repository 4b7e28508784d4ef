// The KV cache configurations kv_restore_fuzz restores into (picked by the input's
// first byte) and its seed program writes snapshots of.
#pragma once

#include <vector>

#include "state/kv_cache.hpp"

namespace pico::fuzz {

inline const std::vector<state::KvConfig>& kv_configs() {
  using state::KvConfig;
  static const std::vector<KvConfig> configs = {
      {.first_layer = 0, .last_layer = 2, .n_kv_heads = 2, .head_dim_k = 4, .head_dim_v = 4},
      {.first_layer = 3, .last_layer = 4, .n_kv_heads = 1, .head_dim_k = 8, .head_dim_v = 8,
       .k_type = GgmlType::F32, .v_type = GgmlType::F32},
      {.first_layer = 1, .last_layer = 3, .n_kv_heads = 2, .head_dim_k = 32, .head_dim_v = 32,
       .k_type = GgmlType::Q8_0, .v_type = GgmlType::Q4_0},
      {.first_layer = 0, .last_layer = 1, .n_kv_heads = 1, .head_dim_k = 64, .head_dim_v = 32,
       .k_type = GgmlType::Q4_0, .v_type = GgmlType::F16},
      {.first_layer = 5, .last_layer = 5, .n_kv_heads = 1, .head_dim_k = 4, .head_dim_v = 4},  // no layers
  };
  return configs;
}

}  // namespace pico::fuzz
