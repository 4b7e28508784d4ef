#include "protocol.hpp"

#include <gtest/gtest.h>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cmath>

namespace pico::protocol {
namespace {

TEST(Protocol, ForwardRoundTrip) {
  Builder b;
  auto f = b.envelope().getBody().initForward();
  f.setStepId(42);
  auto seqs = f.initSeqIds(2);
  seqs.set(0, 7);
  seqs.set(1, 9);
  auto pos = f.initPositions(2);
  pos.set(0, 0);
  pos.set(1, 5);
  f.setRows(2);
  f.setWidth(64);
  f.setDtype(DType::F16);
  const auto bytes = b.encode();
  Decoded d(bytes);
  ASSERT_EQ(d.which(), Envelope::Body::FORWARD);
  const auto r = d.envelope().getBody().getForward();
  EXPECT_EQ(r.getStepId(), 42u);
  EXPECT_EQ(r.getSeqIds()[1], 9);
  EXPECT_EQ(r.getPositions()[1], 5);
  EXPECT_EQ(r.getWidth(), 64u);
  EXPECT_EQ(r.getDtype(), DType::F16);
}

TEST(Protocol, ErrorRoundTrip) {
  Decoded d(make_error(ErrorCode::FORWARD_FAILED, "boom", 3));
  ASSERT_EQ(d.which(), Envelope::Body::ERROR);
  EXPECT_EQ(d.envelope().getBody().getError().getCode(), ErrorCode::FORWARD_FAILED);
  EXPECT_STREQ(d.envelope().getBody().getError().getText().cStr(), "boom");
  EXPECT_EQ(d.envelope().getBody().getError().getStepId(), 3u);
}

ErrorCode code_of(std::span<const uint8_t> bytes) {
  try {
    Decoded d(bytes);
  } catch (const ProtocolError& e) {
    return e.code();
  }
  ADD_FAILURE() << "decoded";
  return ErrorCode::INTERNAL;
}

TEST(Protocol, RefusesWrongVersion) {
  Builder b;
  b.envelope().setVersion(kVersion + 1);
  b.envelope().getBody().initHeartbeat();
  EXPECT_EQ(code_of(b.encode()), ErrorCode::WRONG_VERSION);
}

TEST(Protocol, RefusesGarbageAndTruncation) {
  EXPECT_EQ(code_of({}), ErrorCode::MALFORMED);
  const std::vector<uint8_t> odd{1, 2, 3};
  EXPECT_EQ(code_of(odd), ErrorCode::MALFORMED);
  std::vector<uint8_t> garbage(64, 0xff);
  EXPECT_EQ(code_of(garbage), ErrorCode::MALFORMED);
  auto bytes = make_error(ErrorCode::INTERNAL, std::string(200, 'x'));
  bytes.resize(bytes.size() / 2 / 8 * 8);  // truncated, still whole words
  EXPECT_EQ(code_of(bytes), ErrorCode::MALFORMED);
}

TEST(Protocol, RefusesMessagesBeyondTheTraversalLimit) {
  capnp::MallocMessageBuilder m;
  auto e = m.initRoot<Envelope>();
  e.setVersion(kVersion);
  auto f = e.getBody().initForward();
  f.initTokens(static_cast<unsigned>(kTraversalLimitWords * 2 + 16));
  const auto words = capnp::messageToFlatArray(m);
  const auto bytes = words.asBytes();
  // The envelope opens; reading the oversized list hits the limit (a kj::Exception,
  // which the worker answers as malformed).
  Decoded d(std::span<const uint8_t>(bytes.begin(), bytes.size()));
  EXPECT_THROW(d.envelope().getBody().getForward().getTokens(), kj::Exception);
}

TEST(Protocol, PayloadCodecs) {
  std::vector<float> v(2 * 64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i)) * 3.0f;
  const auto f32 = encode_payload(DType::F32, v.data(), 2, 64);
  EXPECT_EQ(f32.size(), 2u * 64 * 4);
  EXPECT_EQ(decode_payload(DType::F32, f32, 2, 64), v);
  const auto f16 = encode_payload(DType::F16, v.data(), 2, 64);
  EXPECT_EQ(f16.size(), 2u * 64 * 2);
  const auto back16 = decode_payload(DType::F16, f16, 2, 64);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(back16[i], v[i], 2e-3f);
  const auto q8 = encode_payload(DType::Q80, v.data(), 2, 64);
  EXPECT_EQ(q8.size(), 2u * 2 * 34);
  const auto back8 = decode_payload(DType::Q80, q8, 2, 64);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(back8[i], v[i], 3.0f / 127 + 1e-3f);
  EXPECT_THROW(decode_payload(DType::F32, f16, 2, 64), ProtocolError);
  EXPECT_THROW(parse_dtype("bf8"), std::invalid_argument);
}

// A received frame may start at an odd address: a Q8_0 payload there decodes as it
// does aligned (under UBSan, a misaligned read of a block's scale fails this test).
TEST(Protocol, Q8PayloadAtAnOddAddress) {
  std::vector<float> v(2 * 32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(static_cast<float>(i)) * 2.0f;
  const auto q8 = encode_payload(DType::Q80, v.data(), 2, 32);
  std::vector<uint8_t> shifted(q8.size() + 1);
  std::copy(q8.begin(), q8.end(), shifted.begin() + 1);
  const std::span<const uint8_t> odd(shifted.data() + 1, q8.size());
  ASSERT_EQ(reinterpret_cast<uintptr_t>(odd.data()) % 2, 1u);
  EXPECT_EQ(decode_payload(DType::Q80, odd, 2, 32), decode_payload(DType::Q80, q8, 2, 32));
}

// F32 payloads are read in place when aligned; otherwise (or for F16) decoded into the
// scratch vector; a wrong size is refused either way.
TEST(Protocol, PayloadFloatsReadsAlignedF32InPlace) {
  std::vector<float> v(3 * 32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 40.5f;
  const auto bytes = encode_payload(DType::F32, v.data(), 3, 32);
  std::vector<float> scratch;
  const float* in_place = payload_floats(DType::F32, bytes, 3, 32, scratch);
  EXPECT_EQ(static_cast<const void*>(in_place), static_cast<const void*>(bytes.data()));
  EXPECT_TRUE(scratch.empty());
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
  const std::span<const uint8_t> misaligned(shifted.data() + 1, bytes.size());
  const float* copied = payload_floats(DType::F32, misaligned, 3, 32, scratch);
  EXPECT_EQ(copied, scratch.data());
  EXPECT_EQ(scratch, v);
  const auto f16 = encode_payload(DType::F16, v.data(), 3, 32);
  const float* decoded = payload_floats(DType::F16, f16, 3, 32, scratch);
  EXPECT_EQ(decoded, scratch.data());
  EXPECT_EQ(scratch, decode_payload(DType::F16, f16, 3, 32));
  EXPECT_THROW(payload_floats(DType::F32, std::span<const uint8_t>(bytes).first(bytes.size() - 4), 3, 32, scratch),
               ProtocolError);
}

// A header's rows x width whose byte count wraps around to a frame's size (2^31 x 2^31
// F32 values are 2^64 bytes, i.e. 0) is refused, not read past the frame.
TEST(Protocol, PayloadShapesThatOverflowAreRefused) {
  std::vector<float> scratch;
  alignas(4) static const uint8_t nothing[4] = {};
  const std::span<const uint8_t> empty(nothing, 0);
  const size_t huge = size_t{1} << 31;
  EXPECT_THROW(payload_floats(DType::F32, empty, huge, huge, scratch), ProtocolError);
  EXPECT_THROW(decode_payload(DType::F32, empty, huge, huge), ProtocolError);
  EXPECT_THROW(decode_payload(DType::F16, empty, size_t{1} << 32, size_t{1} << 31), ProtocolError);
  EXPECT_THROW(payload_bytes(DType::Q80, SIZE_MAX, 64), ProtocolError);
}

// A dtype the schema does not name (any 16-bit value travels) is refused: it has no
// byte size, so an empty frame must not pass for rows x width of it.
TEST(Protocol, UnknownPayloadDtypeIsRefused) {
  std::vector<float> scratch;
  alignas(4) static const uint8_t nothing[4] = {};
  const std::span<const uint8_t> empty(nothing, 0);
  const auto unknown = static_cast<DType>(7);
  EXPECT_THROW(payload_floats(unknown, empty, 2, 64, scratch), ProtocolError);
  EXPECT_THROW(decode_payload(unknown, empty, 2, 64), ProtocolError);
}

TEST(Protocol, HeartbeatEchoesTheSendersClock) {
  const uint64_t before = steady_nanos();
  Decoded d(make_heartbeat(4242));
  ASSERT_EQ(d.which(), Envelope::Body::HEARTBEAT);
  EXPECT_EQ(d.envelope().getBody().getHeartbeat().getEchoNanos(), 4242u);
  EXPECT_GE(d.envelope().getBody().getHeartbeat().getSentNanos(), before);
}

}  // namespace
}  // namespace pico::protocol
