#include "protocol.hpp"

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "gguf/reader.hpp"
#include "quant/float_convert.hpp"
#include "quant/type_traits.hpp"

namespace pico::protocol {

static_assert(std::endian::native == std::endian::little, "payloads are little-endian; add a byte swap here");

Builder::Builder() : root_(message_.initRoot<Envelope>()) { root_.setVersion(kVersion); }

std::vector<uint8_t> Builder::encode() {
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(message_);
  const auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

Decoded::Decoded(std::span<const uint8_t> frame) {
  if (frame.empty() || frame.size() % sizeof(capnp::word) != 0) {
    throw ProtocolError(ErrorCode::MALFORMED,
                        "envelope of " + std::to_string(frame.size()) + " bytes is not a whole number of words");
  }
  words_ = kj::heapArray<capnp::word>(frame.size() / sizeof(capnp::word));
  std::memcpy(words_.begin(), frame.data(), frame.size());
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = kTraversalLimitWords;
    options.nestingLimit = 16;
    const kj::ArrayPtr<const capnp::word> words(words_.begin(), words_.size());
    reader_ = std::make_unique<capnp::FlatArrayMessageReader>(words, options);
    root_ = reader_->getRoot<Envelope>();
    if (root_.getVersion() != kVersion) {
      throw ProtocolError(ErrorCode::WRONG_VERSION, "protocol version " + std::to_string(root_.getVersion()) +
                                                        " (this build speaks " + std::to_string(kVersion) + ")");
    }
    which_ = root_.getBody().which();
  } catch (const kj::Exception& e) {
    throw ProtocolError(ErrorCode::MALFORMED, std::string("malformed envelope: ") + e.getDescription().cStr());
  }
}

const char* body_name(Envelope::Body::Which which) {
  using W = Envelope::Body::Which;
  switch (which) {
    case W::HELLO: return "hello";
    case W::CAPABILITIES: return "capabilities";
    case W::PLAN: return "plan";
    case W::PLAN_ACK: return "planAck";
    case W::OPEN: return "open";
    case W::TRUNCATE: return "truncate";
    case W::CLOSE: return "close";
    case W::FORWARD: return "forward";
    case W::LOGITS: return "logits";
    case W::STATS_REQUEST: return "statsRequest";
    case W::STATS: return "stats";
    case W::ERROR: return "error";
    case W::HEARTBEAT: return "heartbeat";
    case W::SNAPSHOT_REQUEST: return "snapshotRequest";
    case W::SNAPSHOT: return "snapshot";
    case W::RESTORE: return "restore";
    case W::RESTORED: return "restored";
    case W::ASSIGN: return "assign";
    case W::ASSIGNED: return "assigned";
    case W::LINK_PROBE: return "linkProbe";
    case W::LINK_MEASURED: return "linkMeasured";
    case W::SLOT_SAVE: return "slotSave";
    case W::SLOT_RESTORE: return "slotRestore";
    case W::SLOT_DONE: return "slotDone";
  }
  return "unknown";
}

std::vector<uint8_t> make_error(ErrorCode code, const std::string& text, uint64_t step_id, uint64_t session) {
  Builder b;
  b.envelope().setSession(session);
  auto e = b.envelope().getBody().initError();
  e.setCode(code);
  e.setText(text);
  e.setStepId(step_id);
  return b.encode();
}

uint64_t steady_nanos() {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
}

std::vector<uint8_t> make_heartbeat(uint64_t echo_nanos, uint64_t probe_bytes) {
  Builder b;
  auto h = b.envelope().getBody().initHeartbeat();
  h.setEchoNanos(echo_nanos);
  h.setProbeBytes(probe_bytes);
  h.setSentNanos(steady_nanos());
  return b.encode();
}

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::vector<uint8_t> make_heartbeat_request(uint64_t sent_nanos, uint64_t probe_bytes) {
  Builder b;
  auto h = b.envelope().getBody().initHeartbeat();
  h.setSentNanos(sent_nanos);
  h.setProbeBytes(probe_bytes);
  return b.encode();
}

namespace {

// FNV-1a, 64 bits.
struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(std::span<const uint8_t> bytes) {
    for (uint8_t b : bytes) {
      h ^= b;
      h *= 0x100000001b3ull;
    }
  }
};

uint32_t meta_u32(const gguf::Metadata& m, const std::string& key) {
  const auto v = m.get_int(key);
  return v ? static_cast<uint32_t>(*v) : 0;
}

}  // namespace

ModelIdentity model_identity(const gguf::Model& file) {
  Fnv fnv;
  // Each file's header: metadata and tensor infos, everything before its data section.
  for (size_t f = 0; f < file.file_count(); ++f) {
    const auto bytes = file.file(f).bytes();
    uint64_t data_start = bytes.size();
    for (const auto& t : file.tensors()) {
      if (t.file_index == f) data_start = std::min(data_start, t.file_offset - t.data_offset);
    }
    fnv.add(bytes.subspan(0, std::min<uint64_t>(data_start, bytes.size())));
  }
  // A prefix of every tensor's data: files with the same shapes but other weights differ.
  for (const auto& t : file.tensors()) {
    const auto bytes = file.file(t.file_index).bytes();
    if (t.file_offset >= bytes.size()) continue;
    const uint64_t n = std::min<uint64_t>({t.bytes, 256, bytes.size() - t.file_offset});
    fnv.add(bytes.subspan(t.file_offset, n));
  }
  ModelIdentity id;
  id.hash = fnv.h;
  const auto& m = file.metadata();
  id.arch = std::string(m.get_string("general.architecture").value_or(""));
  id.n_layer = meta_u32(m, id.arch + ".block_count");
  id.n_embd = meta_u32(m, id.arch + ".embedding_length");
  if (const auto* tokens = m.get_array("tokenizer.ggml.tokens")) {
    id.n_vocab = static_cast<uint32_t>(tokens->items.size());
  }
  return id;
}

void write_identity(const ModelIdentity& id, schema::ModelIdentity::Builder out) {
  out.setHash(id.hash);
  out.setArch(id.arch);
  out.setNLayer(id.n_layer);
  out.setNEmbd(id.n_embd);
  out.setNVocab(id.n_vocab);
}

ModelIdentity read_identity(schema::ModelIdentity::Reader in) {
  ModelIdentity id;
  id.hash = in.getHash();
  id.arch = in.getArch().cStr();
  id.n_layer = in.getNLayer();
  id.n_embd = in.getNEmbd();
  id.n_vocab = in.getNVocab();
  return id;
}

std::string to_string(const ModelIdentity& id) {
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(id.hash));
  return id.arch + " " + std::to_string(id.n_layer) + " layers, embd " + std::to_string(id.n_embd) + ", vocab " +
         std::to_string(id.n_vocab) + ", hash " + hash;
}

size_t payload_bytes(DType dtype, size_t rows, size_t width) {
  // rows and width come from a received header: a product that wraps around would
  // match a short frame and let the reader run past it.
  size_t per_row = 0, bytes = 0;
  switch (dtype) {
    case DType::F32: per_row = width * 4; break;
    case DType::F16: per_row = width * 2; break;
    case DType::Q80: {
      const auto& t = type_traits(GgmlType::Q8_0);
      per_row = (width / t.block_size) * t.block_bytes;
      break;
    }
    default:  // a dtype from a newer schema, or noise: no size fits it
      throw ProtocolError(ErrorCode::BAD_REQUEST,
                          "unknown payload dtype " + std::to_string(static_cast<unsigned>(dtype)));
  }
  if (width > SIZE_MAX / 4 || __builtin_mul_overflow(rows, per_row, &bytes)) {
    throw ProtocolError(ErrorCode::BAD_REQUEST, "payload of " + std::to_string(rows) + " x " +
                                                    std::to_string(width) + " values: too large");
  }
  return bytes;
}

std::vector<uint8_t> encode_payload(DType dtype, const float* values, size_t rows, size_t width) {
  const size_t n = rows * width;
  std::vector<uint8_t> out(payload_bytes(dtype, rows, width));
  switch (dtype) {
    case DType::F32:
      if (n) std::memcpy(out.data(), values, n * 4);
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(values[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      break;
    case DType::Q80: {
      const auto& t = type_traits(GgmlType::Q8_0);
      if (width % t.block_size != 0) {
        throw ProtocolError(ErrorCode::BAD_REQUEST, "q8_0 payloads need a width that is a multiple of 32");
      }
      if (n) t.quantize(values, out.data(), static_cast<int64_t>(n));
      break;
    }
  }
  return out;
}

std::vector<float> decode_payload(DType dtype, std::span<const uint8_t> bytes, size_t rows, size_t width) {
  if (dtype == DType::Q80 && width % type_traits(GgmlType::Q8_0).block_size != 0) {
    throw ProtocolError(ErrorCode::BAD_REQUEST, "q8_0 payload width is not a multiple of 32");
  }
  const size_t expected = payload_bytes(dtype, rows, width);
  if (bytes.size() != expected) {
    throw ProtocolError(ErrorCode::BAD_REQUEST, "payload of " + std::to_string(bytes.size()) + " bytes, expected " +
                                                    std::to_string(expected) + " for " + std::to_string(rows) +
                                                    " x " + std::to_string(width));
  }
  const size_t n = rows * width;
  std::vector<float> out(n);
  switch (dtype) {
    case DType::F32:
      if (n) std::memcpy(out.data(), bytes.data(), n * 4);
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = fp16_to_fp32(h);
      }
      break;
    case DType::Q80: {
      if (!n) break;
      // Q8_0 blocks start with an F16 scale read as a uint16_t: a received frame may sit
      // at any address (ZeroMQ hands out slices of its receive buffer), so an odd one
      // is copied to an aligned buffer first.
      std::vector<uint16_t> aligned;
      const void* blocks = bytes.data();
      if (reinterpret_cast<uintptr_t>(blocks) % alignof(uint16_t) != 0) {
        aligned.resize((bytes.size() + 1) / 2);
        std::memcpy(aligned.data(), bytes.data(), bytes.size());
        blocks = aligned.data();
      }
      type_traits(GgmlType::Q8_0).dequantize(blocks, out.data(), static_cast<int64_t>(n));
      break;
    }
  }
  return out;
}

const float* payload_floats(DType dtype, std::span<const uint8_t> bytes, size_t rows, size_t width,
                            std::vector<float>& scratch) {
  if (dtype == DType::F32 && reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0) {
    if (bytes.size() != payload_bytes(dtype, rows, width)) {
      throw ProtocolError(ErrorCode::BAD_REQUEST, "payload of " + std::to_string(bytes.size()) +
                                                      " bytes, expected " +
                                                      std::to_string(payload_bytes(dtype, rows, width)) + " for " +
                                                      std::to_string(rows) + " x " + std::to_string(width));
    }
    return reinterpret_cast<const float*>(bytes.data());
  }
  scratch = decode_payload(dtype, bytes, rows, width);
  return scratch.data();
}

DType parse_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  if (name == "q8_0") return DType::Q80;
  throw std::invalid_argument("unknown activation type '" + name + "' (f32, f16, q8_0)");
}

}  // namespace pico::protocol
