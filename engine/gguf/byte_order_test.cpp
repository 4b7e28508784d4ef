// Files of either byte order, read on a host of either order (this binary also runs
// on s390x under qemu): expectations come from std::endian, never from assuming a
// little-endian host.
#include <gtest/gtest.h>

#include <thread>

#include "gguf/reader.hpp"
#include "gguf/test_files.hpp"
#include "gguf/writer.hpp"

namespace pico::gguf {
namespace {

using testing::ByteBuilder;
using testing::host_bytes;
using testing::pattern_bytes;
using testing::TempDir;

constexpr bool kHostIsBig = std::endian::native == std::endian::big;

// Reverses each `width`-byte group at `offset` + k * `stride` (k = 0, 1, ...) for
// `count` groups per stride: an independent statement of where a type's numbers lie.
std::vector<uint8_t> reversed_groups(std::vector<uint8_t> bytes, size_t stride, size_t offset, size_t width,
                                     size_t count) {
  for (size_t block = 0; block + stride <= bytes.size(); block += stride) {
    for (size_t k = 0; k < count; ++k) {
      auto first = bytes.begin() + static_cast<std::ptrdiff_t>(block + offset + k * width);
      std::reverse(first, first + static_cast<std::ptrdiff_t>(width));
    }
  }
  return bytes;
}

struct OrderCase {
  const char* name;
  GgmlType type;
  std::vector<uint64_t> shape;
  size_t bytes;
  // In the file of the other order: blocks of `stride` bytes with `count` numbers of
  // `width` bytes from `offset` reversed (from ggml-common.h's block structs).
  size_t stride, offset, width, count;
};

const std::vector<OrderCase>& order_cases() {
  static const std::vector<OrderCase> cases = {
      {"f32", GgmlType::F32, {6}, 24, 4, 0, 4, 1},
      {"f16", GgmlType::F16, {2, 3}, 12, 2, 0, 2, 1},
      {"i32", GgmlType::I32, {5}, 20, 4, 0, 4, 1},
      {"i8", GgmlType::I8, {7}, 7, 1, 0, 1, 0},
      {"f64", GgmlType::F64, {2}, 16, 8, 0, 8, 1},
      {"q8_0", GgmlType::Q8_0, {64}, 68, 34, 0, 2, 1},       // d, qs[32]
      {"q4_0", GgmlType::Q4_0, {32, 2}, 36, 18, 0, 2, 1},    // d, qs[16]
      {"q4_k", GgmlType::Q4_K, {256, 2}, 288, 144, 0, 2, 2}, // d, dmin, scales[12], qs[128]
      {"q6_k", GgmlType::Q6_K, {256}, 210, 210, 208, 2, 1},  // ql, qh, scales, d
  };
  return cases;
}

Metadata sample_metadata() {
  Metadata m;
  m.set("general.architecture", "llama");
  m.set("u16", uint16_t{0x1234});
  m.set("i32", int32_t{-123456789});
  m.set("u64", uint64_t{0x0102030405060708});
  m.set("f32", -1.25f);
  m.set("f64", 6.02214076e23);
  m.set("bool", true);
  m.set("tokens", string_array({"a", "bb", "ccc"}));
  m.set("nested", make_array(ValueType::Array, {Value(make_array(ValueType::UInt32, {uint32_t{0xdeadbeef}}))}));
  return m;
}

Writer sample_writer() {
  Writer writer;
  writer.metadata() = sample_metadata();
  uint32_t seed = 50;
  for (const OrderCase& c : order_cases()) writer.add_tensor(c.name, c.type, c.shape, pattern_bytes(c.bytes, seed++));
  return writer;
}

TEST(ByteOrder, BothOrdersRoundTripToHostOrder) {
  TempDir dir;
  for (bool big : {false, true}) {
    SCOPED_TRACE(big ? "big-endian file" : "little-endian file");
    const auto path = dir / (big ? "be.gguf" : "le.gguf");
    sample_writer().write(path, {.big_endian = big});
    const auto bytes = testing::read_bytes(path);
    ASSERT_GE(bytes.size(), 24u);
    // The magic is the same four bytes either way; the version shows the order.
    EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "GGUF");
    EXPECT_EQ(bytes[big ? 7 : 4], 3);
    EXPECT_EQ(bytes[big ? 4 : 7], 0);

    const auto model = Model::open(path);
    EXPECT_EQ(model->big_endian(), big);
    EXPECT_EQ(model->foreign_byte_order(), big != kHostIsBig);
    const Metadata expected = sample_metadata();
    ASSERT_EQ(model->metadata().size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(model->metadata().entries()[i].second == expected.entries()[i].second) << expected.entries()[i].first;
    }
    uint32_t seed = 50;
    for (const OrderCase& c : order_cases()) {
      const TensorInfo* info = model->find_tensor(c.name);
      ASSERT_NE(info, nullptr) << c.name;
      const auto host = pattern_bytes(c.bytes, seed++);
      const auto data = model->tensor_data(*info);
      EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), host) << c.name;
      // In the file, the numbers inside each block are stored in the file's order.
      const std::vector<uint8_t> stored(bytes.begin() + static_cast<std::ptrdiff_t>(info->file_offset),
                                        bytes.begin() + static_cast<std::ptrdiff_t>(info->file_offset + c.bytes));
      const auto expected_stored =
          big == kHostIsBig ? host : reversed_groups(host, c.stride, c.offset, c.width, c.count);
      EXPECT_EQ(stored, expected_stored) << c.name;
    }
  }
}

// A big-endian file made byte by byte, without the Writer.
std::vector<uint8_t> hand_made_big_endian_file(uint64_t& data_start) {
  ByteBuilder b(std::endian::big);
  b.header(3, 3, 4);
  b.kv_string("general.architecture", "llama");
  b.key("llama.block_count", 4).u32(32);
  b.key("scores", 9).u32(6).u64(2).f32(0.5f).f32(-3.0f);
  b.key("ids", 9).u32(2).u64(3).u16(1).u16(0x0203).u16(0xfffe);
  b.tensor_info("weights", {3}, 0, 0);  // f32
  b.tensor_info("halves", {2}, 1, 32);  // f16
  b.tensor_info("block", {32}, 8, 64);  // q8_0
  data_start = (b.size() + 31) / 32 * 32;
  b.pad_to(32);
  b.f32(1.5f).f32(-2.0f).f32(3.25f).pad_to(32);
  b.u16(0x3c00).u16(0xc000).pad_to(32);
  b.u16(0x3800);  // q8_0 scale 0.5
  for (int i = 0; i < 32; ++i) b.u8(static_cast<uint8_t>(i - 16));
  return b.bytes();
}

TEST(ByteOrder, ReadsABigEndianFileMadeByHand) {
  TempDir dir;
  uint64_t data_start = 0;
  testing::write_bytes(dir / "be.gguf", hand_made_big_endian_file(data_start));
  const auto model = Model::open(dir / "be.gguf");
  EXPECT_TRUE(model->big_endian());
  EXPECT_EQ(model->foreign_byte_order(), !kHostIsBig);
  EXPECT_EQ(model->version(), 3u);
  const Metadata& m = model->metadata();
  EXPECT_EQ(m.get_string("general.architecture"), "llama");
  EXPECT_EQ(m.get_int("llama.block_count"), 32);
  EXPECT_EQ(*m.get_array("scores"), make_array(ValueType::Float32, {0.5f, -3.0f}));
  EXPECT_EQ(*m.get_array("ids"), make_array(ValueType::UInt16, {uint16_t{1}, uint16_t{0x0203}, uint16_t{0xfffe}}));

  const TensorInfo* weights = model->find_tensor("weights");
  ASSERT_NE(weights, nullptr);
  EXPECT_EQ(weights->file_offset, data_start);
  auto data = model->tensor_data(*weights);
  EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), host_bytes(std::vector<float>{1.5f, -2.0f, 3.25f}));
  data = model->tensor_data(*model->find_tensor("halves"));
  EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), host_bytes(std::vector<uint16_t>{0x3c00, 0xc000}));
  std::vector<uint8_t> block = host_bytes(std::vector<uint16_t>{0x3800});
  for (int i = 0; i < 32; ++i) block.push_back(static_cast<uint8_t>(i - 16));
  data = model->tensor_data(*model->find_tensor("block"));
  EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), block);
}

TEST(ByteOrder, SwappedTensorsAreCachedAndSafeToShareAcrossThreads) {
  uint64_t data_start = 0;
  const auto bytes = hand_made_big_endian_file(data_start);
  const auto model = Model::open_memory(bytes);
  const TensorInfo& weights = *model->find_tensor("weights");
  std::vector<const uint8_t*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        for (const TensorInfo& info : model->tensors()) (void)model->tensor_data(info);
      }
      seen[t] = model->tensor_data(weights).data();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const uint8_t* pointer : seen) EXPECT_EQ(pointer, seen[0]);  // one copy, or the mapping itself
  const auto data = model->tensor_data(weights);
  EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), host_bytes(std::vector<float>{1.5f, -2.0f, 3.25f}));
}

}  // namespace
}  // namespace pico::gguf
