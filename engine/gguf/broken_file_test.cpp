// Malformed files: each must raise FormatError naming the right field, never crash,
// never read outside the file, never allocate by an unchecked count.
#include <gtest/gtest.h>

#include <random>

#include "gguf/reader.hpp"
#include "gguf/test_files.hpp"
#include "gguf/writer.hpp"

namespace pico::gguf {
namespace {

using testing::ByteBuilder;
using testing::expect_format_error;
using testing::TempDir;

constexpr uint64_t kHuge = uint64_t{1} << 63;
constexpr uint32_t kF32 = 0, kQ4_0 = 2, kF64 = 28;
constexpr uint32_t kArray = 9, kString = 8;

void expect_broken(const ByteBuilder& b, std::string_view field, std::string_view message,
                   uint64_t offset = ~uint64_t{0}) {
  expect_format_error([&] { Model::open_memory(b.bytes(), "broken.gguf"); }, field, message, offset);
}

// A valid file touching every part of the reader; its last tensor ends exactly at
// the end of the file (32 bytes, no padding after it), so any shorter file is broken.
void write_valid_file(const std::filesystem::path& path, bool big_endian) {
  Writer writer;
  writer.set("general.architecture", "llama");
  writer.set("tokenizer.ggml.tokens", string_array({"<s>", "a", "bc"}));
  writer.set("nested", make_array(ValueType::Array, {Value(make_array(ValueType::Int16, {int16_t{1}})),
                                                     Value(Array{ValueType::Float64, {}})}));
  writer.set("flag", true);
  writer.set("ratio", 0.25);
  writer.add_tensor("q", GgmlType::Q8_0, {32}, testing::pattern_bytes(34, 3));
  writer.add_tensor("f", GgmlType::F32, {8}, testing::pattern_bytes(32, 4));
  writer.write(path, {.big_endian = big_endian});
}

TEST(BrokenFile, EveryTruncationIsRefused) {
  TempDir dir;
  for (bool big_endian : {false, true}) {
    write_valid_file(dir / "whole.gguf", big_endian);
    const auto whole = testing::read_bytes(dir / "whole.gguf");
    ASSERT_NO_THROW(Model::open(dir / "whole.gguf"));
    for (size_t length = 0; length < whole.size(); ++length) {
      const auto path = dir / "cut.gguf";
      testing::write_bytes(path, std::span<const uint8_t>(whole).first(length));
      EXPECT_THROW(Model::open(path), FormatError) << "length " << length << " of " << whole.size();
    }
  }
}

TEST(BrokenFile, RandomByteChangesRaiseFormatErrorOrRead) {
  TempDir dir;
  write_valid_file(dir / "whole.gguf", false);
  const auto whole = testing::read_bytes(dir / "whole.gguf");
  std::mt19937 random(1234);
  int refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<uint8_t> bytes = whole;
    for (int k = 0; k < 1 + round % 4; ++k) bytes[random() % bytes.size()] = static_cast<uint8_t>(random());
    try {
      const auto model = Model::open_memory(bytes);
      for (const TensorInfo& t : model->tensors()) (void)model->tensor_data(t);
    } catch (const FormatError&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(BrokenFile, WrongMagic) {
  ByteBuilder b;
  b.raw("GGML").u32(3).u64(0).u64(0);
  expect_broken(b, "magic", "expected \"GGUF\"", 0);
}

TEST(BrokenFile, VersionOneIsRefusedWithAReason) {
  ByteBuilder b;
  b.raw("GGUF").u32(1).u32(0).u32(0);  // v1 had 32-bit counts
  expect_broken(b, "version", "v1 (32-bit counts)", 4);
}

TEST(BrokenFile, VersionsBeyondThreeAreRefusedInEitherByteOrder) {
  for (std::endian order : {std::endian::little, std::endian::big}) {
    ByteBuilder b(order);
    b.header(4, 0, 0);
    expect_broken(b, "version", "unsupported version 4", 4);
  }
  ByteBuilder zero;
  zero.header(0, 0, 0);
  expect_broken(zero, "version", "unsupported version 0", 4);
}

TEST(BrokenFile, HugeCountsAreRefusedBeforeAnyAllocation) {
  ByteBuilder tensors;
  tensors.header(3, kHuge, 0);
  expect_broken(tensors, "tensor_count", "9223372036854775808 exceeds the 8 bytes left", 8);
  ByteBuilder kvs;
  kvs.header(3, 0, kHuge);
  expect_broken(kvs, "kv_count", "9223372036854775808 exceeds", 16);
  ByteBuilder kvs_max;
  kvs_max.header(3, 0, ~uint64_t{0});
  expect_broken(kvs_max, "kv_count", "18446744073709551615 exceeds", 16);
  // Plausible before the metadata, impossible after it.
  ByteBuilder after;
  after.header(3, 2, 1).kv_string("general.name", std::string(40, 'n')).zeros(30);
  expect_broken(after, "tensor_count", "2 exceeds the 30 bytes left", 8);
}

TEST(BrokenFile, HugeArrayCountsAndStringLengthsAreRefused) {
  ByteBuilder array;
  array.header(3, 0, 1).key("tokenizer.ggml.tokens", kArray).u32(kString).u64(kHuge).zeros(64);
  expect_broken(array, "kv[0] \"tokenizer.ggml.tokens\" array count", "exceeds the 64 bytes left", 61);
  ByteBuilder numbers;  // 31 uint32 need 124 bytes; 120 are left
  numbers.header(3, 0, 1).key("n", kArray).u32(4).u64(31).zeros(120);
  expect_broken(numbers, "kv[0] \"n\" array count", "31 exceeds the 120 bytes left");
  ByteBuilder value;
  value.header(3, 0, 1).key("general.name", kString).u64(kHuge).raw("abc");
  expect_broken(value, "kv[0] \"general.name\" value length", "exceeds the 3 bytes left", 24 + 8 + 12 + 4);
  ByteBuilder key;
  key.header(3, 0, 1).u64(kHuge).raw("general.name");
  expect_broken(key, "kv[0] key length", "9223372036854775808 exceeds the 12 bytes left", 24);
  ByteBuilder item;
  item.header(3, 0, 1).key("t", kArray).u32(kString).u64(2).str("ok").u64(~uint64_t{0}).zeros(8);
  expect_broken(item, "kv[0] \"t\" item[1] length", "18446744073709551615 exceeds the 8 bytes left");
  ByteBuilder name;
  name.header(3, 1, 0).u64(kHuge).zeros(40);
  expect_broken(name, "tensor[0] name length", "exceeds the 40 bytes left", 24);
}

TEST(BrokenFile, UnknownValueTypes) {
  ByteBuilder value;
  value.header(3, 0, 1).key("k", 13).u32(0);
  expect_broken(value, "kv[0] \"k\" value type", "unknown value type 13", 24 + 9);
  ByteBuilder element;
  element.header(3, 0, 1).key("k", kArray).u32(99).u64(0);
  expect_broken(element, "kv[0] \"k\" element type", "unknown value type 99", 24 + 9 + 4);
}

ByteBuilder nested_arrays(int levels) {
  ByteBuilder b;
  b.header(3, 0, 1).key("deep", kArray);
  for (int level = 1; level < levels; ++level) b.u32(kArray).u64(1);
  b.u32(0).u64(0);  // innermost: an empty array of uint8
  return b;
}

TEST(BrokenFile, ArrayNestingIsBounded) {
  EXPECT_NO_THROW(Model::open_memory(nested_arrays(8).bytes()));
  expect_broken(nested_arrays(9), "kv[0] \"deep\"", "nest deeper than 8");
  expect_broken(nested_arrays(100000), "kv[0] \"deep\"", "nest deeper than 8");
}

TEST(BrokenFile, DuplicateAndEmptyKeysAndBadBools) {
  ByteBuilder duplicate;
  duplicate.header(3, 0, 2).kv_u32("a", 1).kv_u32("a", 2);
  expect_broken(duplicate, "kv[1] \"a\"", "duplicate key", 24 + 17);
  ByteBuilder empty;
  empty.header(3, 0, 1).kv_u32("", 1);
  expect_broken(empty, "kv[0] key", "is empty", 24);
  ByteBuilder flag;
  flag.header(3, 0, 1).key("flag", 7).u8(2);
  expect_broken(flag, "kv[0] \"flag\" value", "bool byte is 2");
}

TEST(BrokenFile, AlignmentMustBeAUint32PowerOfTwo) {
  for (uint32_t alignment : {48u, 0u}) {
    ByteBuilder b;
    b.header(3, 0, 1).kv_u32("general.alignment", alignment);
    expect_broken(b, "general.alignment", "not a non-zero power of two", 24 + 8 + 17 + 4);
  }
  ByteBuilder wide;
  wide.header(3, 0, 1).key("general.alignment", 10).u64(32);
  expect_broken(wide, "general.alignment", "must be uint32, found uint64");
}

TEST(BrokenFile, TensorShapes) {
  ByteBuilder duplicate;
  duplicate.header(3, 2, 0).tensor_info("t", {8}, kF32, 0).tensor_info("t", {8}, kF32, 32).pad_to(32).zeros(64);
  expect_broken(duplicate, "tensor[1] \"t\"", "duplicate tensor name", 24 + 33);
  ByteBuilder dims;
  dims.header(3, 1, 0).tensor_info("t", {1, 1, 1, 1, 1}, kF32, 0).pad_to(32).zeros(32);
  expect_broken(dims, "tensor[0] \"t\" n_dims", "5 dimensions, at most 4", 24 + 9);
  ByteBuilder negative;
  negative.header(3, 1, 0).tensor_info("t", {4, kHuge}, kF32, 0).pad_to(32).zeros(32);
  expect_broken(negative, "tensor[0] \"t\" dims[1]", "exceeds INT64_MAX", 24 + 9 + 4 + 8);
  ByteBuilder overflow;
  overflow.header(3, 1, 0).tensor_info("t", {uint64_t{1} << 32, uint64_t{1} << 32}, kF32, 0).pad_to(32).zeros(32);
  expect_broken(overflow, "tensor[0] \"t\" dims", "element count overflows int64");
  ByteBuilder bytes;  // 2^61 f64 elements fit int64, their 2^64 bytes do not
  bytes.header(3, 1, 0).tensor_info("t", {uint64_t{1} << 61}, kF64, 0).pad_to(32).zeros(32);
  expect_broken(bytes, "tensor[0] \"t\" type", "size in bytes overflows");
  ByteBuilder row;
  row.header(3, 1, 0).tensor_info("t", {16, 2}, kQ4_0, 0).pad_to(32).zeros(32);
  expect_broken(row, "tensor[0] \"t\" type", "not a multiple of q4_0's block size 32");
}

TEST(BrokenFile, UnknownAndRetiredTensorTypes) {
  ByteBuilder unknown;
  unknown.header(3, 1, 0).tensor_info("t", {8}, 77, 0).pad_to(32).zeros(32);
  expect_broken(unknown, "tensor[0] \"t\" type", "unknown tensor type 77", 24 + 9 + 4 + 8);
  ByteBuilder retired;
  retired.header(3, 1, 0).tensor_info("t", {8}, 31, 0).pad_to(32).zeros(32);
  expect_broken(retired, "tensor[0] \"t\" type", "retired interleaved type Q4_0_4_4 (31)");
}

TEST(BrokenFile, TensorOffsets) {
  const uint64_t offset_field = 24 + 9 + 4 + 8 + 4;  // the single tensor info's offset field
  ByteBuilder misaligned;
  misaligned.header(3, 1, 0).tensor_info("t", {2}, kF32, 4).pad_to(32).zeros(32);
  expect_broken(misaligned, "tensor[0] \"t\" offset", "4 is not a multiple of the alignment 32", offset_field);
  ByteBuilder past;
  past.header(3, 1, 0).tensor_info("t", {8}, kF32, 32).pad_to(32).zeros(40);
  expect_broken(past, "tensor[0] \"t\" offset", "past the end of the data section (40 bytes", offset_field);
  ByteBuilder wraps;  // offset + size wraps around 2^64
  wraps.header(3, 1, 0).tensor_info("t", {8}, kF32, ~uint64_t{31}).pad_to(32).zeros(32);
  expect_broken(wraps, "tensor[0] \"t\" offset", "past the end", offset_field);
  ByteBuilder no_data;  // the file ends before its data section
  no_data.header(3, 1, 0).tensor_info("t", {8}, kF32, 0);
  expect_broken(no_data, "tensor[0] \"t\" offset", "past the end", offset_field);
  ByteBuilder overlap;
  overlap.header(3, 3, 0)
      .tensor_info("a", {16}, kF32, 0)
      .tensor_info("b", {8}, kF32, 64)
      .tensor_info("c", {8}, kF32, 32)
      .pad_to(32)
      .zeros(96);
  expect_broken(overlap, "tensor[2] \"c\" offset", "overlaps \"a\" (data offsets 0 to 64)");
}

}  // namespace
}  // namespace pico::gguf
