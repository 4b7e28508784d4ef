// C++ helpers around pico.capnp: envelope encoding and checked decoding, the model
// identity, and the activation payload codecs (F32, F16, Q8_0).
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "pico.capnp.h"

namespace pico::gguf {
class Model;
}

namespace pico::protocol {

using schema::DType;
using schema::Envelope;
using schema::ErrorCode;
using schema::LogitsOutput;

constexpr uint32_t kVersion = schema::PROTOCOL_VERSION;
// The most words a received envelope may make the reader traverse (8 MiB): headers
// are small, payloads travel in their own frames.
constexpr uint64_t kTraversalLimitWords = 1u << 20;

// A message that cannot be served, with the code the error reply carries.
class ProtocolError : public std::runtime_error {
 public:
  ProtocolError(ErrorCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// A builder whose root envelope has the current version set.
class Builder {
 public:
  Builder();
  Envelope::Builder envelope() { return root_; }
  // The envelope as one flat frame (unpacked words).
  std::vector<uint8_t> encode();

 private:
  capnp::MallocMessageBuilder message_;
  Envelope::Builder root_;
};

// A received envelope, checked: readable within the traversal limit, and of the
// current version. Throws ProtocolError (malformed, wrongVersion).
class Decoded {
 public:
  explicit Decoded(std::span<const uint8_t> frame);
  Decoded(const Decoded&) = delete;
  Decoded& operator=(const Decoded&) = delete;
  Envelope::Reader envelope() const { return root_; }
  Envelope::Body::Which which() const { return which_; }

 private:
  kj::Array<capnp::word> words_;  // an aligned copy of the frame
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
  Envelope::Reader root_;
  Envelope::Body::Which which_;
};

// Name of a body kind, for logs and errors.
const char* body_name(Envelope::Body::Which which);

// One-call builders of the small messages. `session`: Envelope.session (a worker
// stamps the session of the message it answers).
std::vector<uint8_t> make_error(ErrorCode code, const std::string& text, uint64_t step_id = 0, uint64_t session = 0);
// A heartbeat stamped with steady_nanos(); an answer echoes the request's stamp.
std::vector<uint8_t> make_heartbeat(uint64_t echo_nanos = 0, uint64_t probe_bytes = 0);
// A heartbeat request stamped `sent_nanos`, announcing a probe payload of probe_bytes
// (sent as one frame after it; 0: none).
// A session id or hash as 16 hexadecimal digits (logs and error texts).
std::string hex(uint64_t value);
std::vector<uint8_t> make_heartbeat_request(uint64_t sent_nanos, uint64_t probe_bytes = 0);
// This host's steady clock in nanoseconds (the clock of every *Nanos field).
uint64_t steady_nanos();

// What identifies a model file: a hash of its metadata, tensor table and the first
// bytes of each tensor's data (so that two files that differ only in their weights
// differ), plus a few readable fields.
struct ModelIdentity {
  uint64_t hash = 0;
  std::string arch;
  uint32_t n_layer = 0;
  uint32_t n_embd = 0;
  uint32_t n_vocab = 0;
  bool operator==(const ModelIdentity&) const = default;
};
ModelIdentity model_identity(const gguf::Model& file);
void write_identity(const ModelIdentity& id, schema::ModelIdentity::Builder out);
ModelIdentity read_identity(schema::ModelIdentity::Reader in);
std::string to_string(const ModelIdentity& id);

// Activation payloads: rows x width floats as raw little-endian bytes of `dtype`
// (Q8_0 needs width to be a multiple of 32).
size_t payload_bytes(DType dtype, size_t rows, size_t width);
std::vector<uint8_t> encode_payload(DType dtype, const float* values, size_t rows, size_t width);
// Throws ProtocolError (badRequest) when the byte count does not match the shape.
std::vector<float> decode_payload(DType dtype, std::span<const uint8_t> bytes, size_t rows, size_t width);
// The payload as floats without a copy when it can be (F32 in a 4-byte aligned frame),
// else decoded into `scratch`; the pointer lives as long as both. Checks the size as
// decode_payload does.
const float* payload_floats(DType dtype, std::span<const uint8_t> bytes, size_t rows, size_t width,
                            std::vector<float>& scratch);
// "f32", "f16", "q8_0" (throws std::invalid_argument otherwise).
DType parse_dtype(const std::string& name);

}  // namespace pico::protocol
