#include "cluster_measures.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#include "state/kv_cache.hpp"

namespace pico::coordinator {

PlacementProblem model_placement_problem(const gguf::Model& file, int64_t ctx, int parallel,
                                         protocol::DType activations) {
  const auto model = model::Model::load(file);
  const int32_t n_layer = static_cast<int32_t>(model->hparams().n_layer);
  PlacementProblem p;
  p.ctx = ctx;
  p.parallel = parallel;
  p.layers.resize(static_cast<size_t>(n_layer));
  // Where each tensor is read, as a stage reads it (worker/stage_engine.cpp): a layer's
  // by its stage, the embeddings by the first, the output norm and head by the last
  // (the embeddings too when the head is tied to them), the rest by the first.
  const bool tied = file.find_tensor("output.weight") == nullptr;
  for (const auto& t : file.tensors()) {
    if (t.name.rfind("blk.", 0) == 0) {
      const int layer = std::atoi(t.name.c_str() + 4);
      if (layer >= 0 && layer < n_layer) p.layers[static_cast<size_t>(layer)].weight_bytes += t.bytes;
    } else if (t.name.rfind("output", 0) == 0) {
      p.last_stage_bytes += t.bytes;
    } else {
      p.first_stage_bytes += t.bytes;
      if (tied && t.name.rfind("token_embd.", 0) == 0) p.last_stage_bytes += t.bytes;
    }
  }
  for (int32_t l = 0; l < n_layer; ++l) {
    const state::KvConfig kv = model->kv_config({l, l + 1});
    p.page_positions = kv.page_positions;
    p.layers[static_cast<size_t>(l)].kv_bytes_per_position = state::kv_bytes_per_position(kv);
    p.layers[static_cast<size_t>(l)].state_bytes_per_sequence =
        model->make_cache({l, l + 1})->fixed_bytes_per_sequence();
  }
  const uint64_t n_embd = static_cast<uint64_t>(model->hparams().n_embd);
  switch (activations) {
    case protocol::DType::F32: p.hidden_bytes_per_token = 4 * n_embd; break;
    case protocol::DType::F16: p.hidden_bytes_per_token = 2 * n_embd; break;
    case protocol::DType::Q80: p.hidden_bytes_per_token = (n_embd + 31) / 32 * 34; break;
  }
  p.logits_bytes_per_token = 4 * static_cast<uint64_t>(model->hparams().n_vocab);
  p.input_bytes_per_token = 4;
  return p;
}

std::vector<MeasuredWorker> measure_workers(const std::vector<WorkerEntry>& workers, const RemoteOptions& options,
                                            const std::optional<net::KeyPair>& own_keys, uint64_t probe_bytes) {
  std::vector<MeasuredWorker> out;
  for (const WorkerEntry& w : workers) {
    MeasuredWorker m;
    m.address = w.address;
    try {
      RemoteOptions ro = options;
      if (own_keys) ro.curve = net::Curve{*own_keys, w.public_key};
      RemoteStage stage(w.address, ro);
      const uint64_t bytes = std::min<uint64_t>(probe_bytes, stage.info().limits.max_message_bytes / 2);
      const double empty = stage.probe_round_trip(0, 4);
      const double loaded = stage.probe_round_trip(bytes, 3);
      m.link.latency_seconds = std::min(empty, stage.info().round_trip_seconds) / 2;
      // The probe's extra time is its bytes in transit (one way); a link faster than the
      // clock can tell is taken as 100 GB/s.
      m.link.bytes_per_second = static_cast<double>(bytes) / std::max(loaded - empty, static_cast<double>(bytes) / 1e11);
      if (!stage.info().profile) {
        m.error = "sent no profile";
      }
      m.info = stage.info();
    } catch (const std::exception& e) {
      m.error = e.what();
    }
    if (!m.error.empty()) spdlog::warn("{}: {}", w.address, m.error);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace pico::coordinator
