// libFuzzer target: one received message (envelope + payload frames, fuzz_frames.hpp)
// through protocol::Decoded and then everything its receivers read.
//
// Every field of the decoded envelope is visited (Cap'n Proto's dynamic API walks the
// schema, so a field added later is covered without touching this file). Then, per
// body kind, the checks and payload decoding the receivers do: a worker's forward
// (list lengths against rows, the hidden states by the header's dtype, rows and width),
// the coordinator's logits (arg max lists, the full rows' payload), snapshot / restore
// sizes, capabilities with the worker's limits. ProtocolError and kj::Exception (Cap'n
// Proto's pointer checks, which pico's receivers answer as malformed) are the refusals
// wanted; anything else thrown, a sanitizer report or a crash is a finding.
//   scripts/fuzz protocol_decoder [SECONDS]
#include <capnp/dynamic.h>
#include <capnp/schema.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_frames.hpp"
#include "protocol.hpp"

namespace {

using namespace pico;
using protocol::DType;
using protocol::Envelope;

volatile uint64_t g_sink;

void visit(const capnp::DynamicValue::Reader& value, uint64_t& sum) {
  switch (value.getType()) {
    case capnp::DynamicValue::BOOL: sum += value.as<bool>(); break;
    case capnp::DynamicValue::INT: sum += static_cast<uint64_t>(value.as<int64_t>()); break;
    case capnp::DynamicValue::UINT: sum += value.as<uint64_t>(); break;
    case capnp::DynamicValue::FLOAT: sum += value.as<double>() > 0; break;
    case capnp::DynamicValue::TEXT: {
      const auto text = value.as<capnp::Text>();
      sum += text.size() + (text.size() ? static_cast<uint8_t>(text.cStr()[text.size() - 1]) : 0);
      break;
    }
    case capnp::DynamicValue::DATA: sum += value.as<capnp::Data>().size(); break;
    case capnp::DynamicValue::ENUM: sum += value.as<capnp::DynamicEnum>().getRaw(); break;
    case capnp::DynamicValue::LIST:
      for (const auto element : value.as<capnp::DynamicList>()) visit(element, sum);
      break;
    case capnp::DynamicValue::STRUCT: {
      const auto s = value.as<capnp::DynamicStruct>();
      for (const auto field : s.getSchema().getNonUnionFields()) visit(s.get(field), sum);
      KJ_IF_MAYBE (active, s.which()) {
        visit(s.get(*active), sum);
      }
      break;
    }
    default: break;
  }
}

// Reads every float, so that ASan checks each byte the pointer claims.
uint64_t touch(const float* values, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, 4);
    sum += bits;
  }
  return sum;
}

// The worker's forward: the checks of Server::handle_forward, then the hidden states.
uint64_t forward(protocol::schema::Forward::Reader f, const std::vector<std::span<const uint8_t>>& payloads) {
  const size_t rows = f.getRows();
  if (rows == 0 || f.getSeqIds().size() != rows || f.getPositions().size() != rows ||
      f.getWantLogits().size() != rows || (f.getTokens().size() != 0 && f.getTokens().size() != rows) ||
      (f.getLogitsOutput().size() != 0 && f.getLogitsOutput().size() != rows)) {
    return 0;
  }
  if (payloads.size() != 1 || f.getWidth() == 0) return 1;
  std::vector<float> scratch;
  const float* hidden = protocol::payload_floats(f.getDtype(), payloads[0], rows, f.getWidth(), scratch);
  uint64_t sum = touch(hidden, rows * f.getWidth());
  // The copying decoder too (the in-place path above skips it for aligned F32).
  const std::vector<float> copy = protocol::decode_payload(f.getDtype(), payloads[0], rows, f.getWidth());
  if (copy.size() != rows * f.getWidth()) __builtin_trap();
  return sum + touch(copy.data(), copy.size());
}

// The coordinator's logits: the checks of RemoteStage::poll, then the full rows.
uint64_t logits(protocol::schema::Logits::Reader l, const std::vector<std::span<const uint8_t>>& payloads) {
  if (payloads.size() != 1 || l.getSeqIds().size() != l.getRows()) return 0;
  const auto ids = l.getArgmaxIds();
  const auto values = l.getArgmaxLogits();
  size_t full_rows = l.getRows();
  uint64_t sum = 0;
  if (ids.size() != 0) {
    if (ids.size() != l.getRows() || values.size() != l.getRows()) return 0;
    full_rows = 0;
    for (unsigned i = 0; i < ids.size(); ++i) {
      if (ids[i] >= static_cast<int64_t>(l.getNVocab())) return 0;
      full_rows += ids[i] < 0;
      sum += values[i] > 0;
    }
  }
  std::vector<float> scratch;
  const float* rows = protocol::payload_floats(DType::F32, payloads[0], full_rows, l.getNVocab(), scratch);
  return sum + touch(rows, full_rows * l.getNVocab());
}

uint64_t capabilities(protocol::schema::Capabilities::Reader caps) {
  const protocol::ModelIdentity id = protocol::read_identity(caps.getModel());
  const auto limits = caps.getLimits();
  return protocol::to_string(id).size() + caps.getIsa().size() + caps.getBackend().size() + limits.getMaxRows() +
         limits.getMaxPositions() + limits.getMaxSequences() + limits.getStateBudgetBytes() +
         limits.getKvBytesPerPosition() + limits.getPagePositions() + limits.getMaxMessageBytes() +
         (caps.getFirstLayer() < caps.getLastLayer());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto frames = fuzz::split_frames(data, size);
  if (frames.empty()) return -1;  // not a message: keep it out of the corpus
  const std::vector<std::span<const uint8_t>> payloads(frames.begin() + 1, frames.end());
  uint64_t sum = 0;
  try {
    const protocol::Decoded decoded(frames[0]);
    const auto body = decoded.envelope().getBody();
    sum += std::strlen(protocol::body_name(decoded.which()));
    visit(capnp::toDynamic(decoded.envelope()), sum);
    switch (decoded.which()) {
      case Envelope::Body::FORWARD: sum += forward(body.getForward(), payloads); break;
      case Envelope::Body::LOGITS: sum += logits(body.getLogits(), payloads); break;
      case Envelope::Body::CAPABILITIES: sum += capabilities(body.getCapabilities()); break;
      case Envelope::Body::SNAPSHOT:
        sum += payloads.size() == 1 && payloads[0].size() == body.getSnapshot().getBytes();
        break;
      case Envelope::Body::RESTORE:
        sum += payloads.size() == 1 && payloads[0].size() == body.getRestore().getBytes();
        break;
      case Envelope::Body::ERROR:
        sum += static_cast<uint64_t>(body.getError().getCode()) + body.getError().getText().size();
        break;
      default: break;
    }
  } catch (const protocol::ProtocolError&) {
    // Refused with a code: what a receiver answers.
  } catch (const kj::Exception&) {
    // A pointer out of bounds or past the traversal limit: answered as malformed.
  }
  g_sink = sum;
  return 0;
}
