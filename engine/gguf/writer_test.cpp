#include "gguf/writer.hpp"

#include <gtest/gtest.h>

#include <limits>

#include "gguf/reader.hpp"
#include "gguf/test_files.hpp"

namespace pico::gguf {
namespace {

using testing::ByteBuilder;
using testing::host_bytes;
using testing::pattern_bytes;
using testing::TempDir;

template <typename T>
using limits = std::numeric_limits<T>;

// One or more values of every type the format has, arrays in every shape.
Metadata every_value_type() {
  Metadata m;
  m.set("u8.min", uint8_t{0});
  m.set("u8.max", uint8_t{255});
  m.set("i8.min", int8_t{-128});
  m.set("i8.max", int8_t{127});
  m.set("u16.max", uint16_t{65535});
  m.set("i16.min", int16_t{-32768});
  m.set("u32.max", uint32_t{4294967295u});
  m.set("i32.min", limits<int32_t>::min());
  m.set("f32", 3.25f);
  m.set("f32.negative_zero", -0.0f);
  m.set("f32.infinity", limits<float>::infinity());
  m.set("f32.nan", limits<float>::quiet_NaN());
  m.set("f32.denormal", limits<float>::denorm_min());
  m.set("bool.true", true);
  m.set("bool.false", false);
  m.set("string.empty", "");
  m.set("string.utf8", "h\xc3\xa9llo w\xc3\xb6rld \xf0\x9f\xa6\x99");
  m.set("string.nul", std::string("a\0b", 3));
  m.set("u64.zero", uint64_t{0});
  m.set("u64.max", limits<uint64_t>::max());
  m.set("i64.min", limits<int64_t>::min());
  m.set("i64.max", limits<int64_t>::max());
  m.set("f64.denormal", limits<double>::denorm_min());
  m.set("f64.lowest", limits<double>::lowest());
  m.set("f64.nan", limits<double>::quiet_NaN());
  m.set("array.u8", make_array(ValueType::UInt8, {uint8_t{0}, uint8_t{255}}));
  m.set("array.i32.empty", Array{ValueType::Int32, {}});
  m.set("array.strings", string_array({"<s>", "", "\xe2\x96\x81the", std::string(300, 'x')}));
  m.set("array.bool", make_array(ValueType::Bool, {true, false, true}));
  m.set("array.f64", make_array(ValueType::Float64, {1e-300, -2.5}));
  m.set("array.u64", make_array(ValueType::UInt64, {limits<uint64_t>::max(), uint64_t{1}}));
  m.set("array.nested", make_array(ValueType::Array, {Value(make_array(ValueType::Int16, {int16_t{1}, int16_t{-2}})),
                                                      Value(Array{ValueType::Int16, {}}),
                                                      Value(make_array(ValueType::Int16, {int16_t{3}}))}));
  m.set("array.nested.strings",
        make_array(ValueType::Array, {Value(string_array({"a", "b"})), Value(string_array({}))}));
  m.set("array.nested.three",
        make_array(ValueType::Array,
                   {Value(make_array(ValueType::Array, {Value(make_array(ValueType::Float32, {1.0f, 2.0f}))}))}));
  m.set("array.of.arrays.empty", Array{ValueType::Array, {}});
  return m;
}

void expect_same_metadata(const Metadata& actual, const Metadata& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual.entries()[i].first, expected.entries()[i].first) << i;
    EXPECT_TRUE(actual.entries()[i].second == expected.entries()[i].second)
        << expected.entries()[i].first << ": " << to_display_string(actual.entries()[i].second) << " vs "
        << to_display_string(expected.entries()[i].second);
  }
}

TEST(Writer, EveryValueTypeRoundTripsInOrder) {
  TempDir dir;
  for (uint32_t version : {2u, 3u}) {
    Writer writer;
    writer.metadata() = every_value_type();
    const auto path = dir / ("v" + std::to_string(version) + ".gguf");
    writer.write(path, {.version = version});
    const auto model = Model::open(path);
    EXPECT_EQ(model->version(), version);
    const auto bytes = testing::read_bytes(path);
    ASSERT_GE(bytes.size(), 8u);
    EXPECT_EQ(bytes[4], version);  // little-endian version field
    expect_same_metadata(model->metadata(), every_value_type());
    EXPECT_TRUE(model->tensors().empty());
  }
}

struct TensorCase {
  const char* name;
  GgmlType type;
  std::vector<uint64_t> shape;
  size_t bytes;  // from ggml's block sizes, worked out by hand
};

const std::vector<TensorCase>& tensor_cases() {
  static const std::vector<TensorCase> cases = {
      {"f32", GgmlType::F32, {7, 3}, 84},      {"f16", GgmlType::F16, {5}, 10},
      {"bf16", GgmlType::BF16, {3, 2}, 12},    {"q4_0", GgmlType::Q4_0, {64, 2}, 4 * 18},
      {"q8_0", GgmlType::Q8_0, {32, 3}, 3 * 34}, {"q4_k", GgmlType::Q4_K, {256}, 144},
      {"q6_k", GgmlType::Q6_K, {256, 2}, 2 * 210}, {"iq4_nl", GgmlType::IQ4_NL, {32, 1, 1, 2}, 2 * 18},
      {"i8", GgmlType::I8, {9}, 9},            {"i16", GgmlType::I16, {3}, 6},
      {"i32", GgmlType::I32, {4}, 16},         {"i64", GgmlType::I64, {3}, 24},
      {"f64", GgmlType::F64, {2}, 16},
  };
  return cases;
}

Writer writer_with_tensors() {
  Writer writer;
  writer.set("general.architecture", "test");
  uint32_t seed = 1;
  for (const TensorCase& c : tensor_cases()) writer.add_tensor(c.name, c.type, c.shape, pattern_bytes(c.bytes, seed++));
  return writer;
}

TEST(Writer, TensorsOfManyTypesRoundTripByteForByte) {
  TempDir dir;
  for (uint32_t alignment : {32u, 64u, 1u}) {
    const auto path = dir / ("a" + std::to_string(alignment) + ".gguf");
    writer_with_tensors().write(path, {.alignment = alignment});
    const auto model = Model::open(path);
    EXPECT_EQ(model->alignment(), alignment);
    ASSERT_EQ(model->tensors().size(), tensor_cases().size());
    uint64_t expected_offset = 0;
    uint32_t seed = 1;
    for (size_t i = 0; i < tensor_cases().size(); ++i) {
      const TensorCase& c = tensor_cases()[i];
      const TensorInfo& info = model->tensors()[i];
      EXPECT_EQ(info.name, c.name);
      EXPECT_EQ(info.type, c.type);
      EXPECT_EQ(info.shape, c.shape);
      EXPECT_EQ(info.bytes, c.bytes) << c.name;
      EXPECT_EQ(info.data_offset, expected_offset) << c.name;
      EXPECT_EQ(info.file_offset % alignment, 0u) << c.name;
      expected_offset += (c.bytes + alignment - 1) / alignment * alignment;
      const auto data = model->tensor_data(info);
      EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), pattern_bytes(c.bytes, seed++)) << c.name;
    }
  }
}

TEST(Writer, AlignmentKeyIsWrittenOnlyWhenNotTheDefault) {
  TempDir dir;
  Writer writer;
  writer.set("a", uint32_t{1});
  writer.write(dir / "32.gguf");
  EXPECT_FALSE(Model::open(dir / "32.gguf")->metadata().contains("general.alignment"));
  writer.write(dir / "64.gguf", {.alignment = 64});
  const auto aligned = Model::open(dir / "64.gguf");
  const Value* key = aligned->metadata().find("general.alignment");
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(*key, Value(uint32_t{64}));
  // A key that disagrees with the layout written is corrected, in place.
  writer.set("general.alignment", uint64_t{32});
  writer.write(dir / "128.gguf", {.alignment = 128});
  const auto model = Model::open(dir / "128.gguf");
  EXPECT_EQ(model->alignment(), 128u);
  EXPECT_EQ(model->metadata().entries()[1].first, "general.alignment");
}

TEST(Writer, RefusesBadOptions) {
  TempDir dir;
  Writer writer;
  for (uint32_t alignment : {0u, 3u, 48u}) {
    EXPECT_THROW(writer.write(dir / "x.gguf", {.alignment = alignment}), std::invalid_argument) << alignment;
  }
  EXPECT_THROW(writer.write(dir / "x.gguf", {.version = 1}), std::invalid_argument);
  EXPECT_THROW(writer.write(dir / "x.gguf", {.version = 4}), std::invalid_argument);
  EXPECT_THROW(writer.write_split(dir / "x", 0), std::invalid_argument);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(Writer, RefusesTensorsThatDoNotMatchTheirShape) {
  Writer writer;
  EXPECT_THROW(writer.add_tensor("short", GgmlType::F32, {4}, pattern_bytes(15, 1)), std::invalid_argument);
  EXPECT_THROW(writer.add_tensor("row", GgmlType::Q4_0, {16, 2}, pattern_bytes(18, 1)), std::invalid_argument);
  EXPECT_THROW(writer.add_tensor("dims", GgmlType::F32, {1, 1, 1, 1, 1}, pattern_bytes(4, 1)), std::invalid_argument);
  EXPECT_THROW(writer.add_tensor("huge", GgmlType::F32, {uint64_t{1} << 62, 4}, pattern_bytes(4, 1)),
               std::invalid_argument);
  writer.add_tensor("ok", GgmlType::F32, {1}, pattern_bytes(4, 1));
  EXPECT_THROW(writer.add_tensor("ok", GgmlType::F32, {1}, pattern_bytes(4, 1)), std::invalid_argument);
  EXPECT_EQ(writer.tensors().size(), 1u);
}

TEST(Writer, RefusesMixedArraysAndLeavesNoFileBehind) {
  TempDir dir;
  Writer writer;
  Array mixed{ValueType::Int32, {int32_t{1}, uint8_t{2}}};
  writer.set("mixed", mixed);
  EXPECT_THROW(writer.write(dir / "m.gguf"), std::invalid_argument);
  writer.set("mixed", "fixed");
  writer.set("", uint8_t{1});
  EXPECT_THROW(writer.write(dir / "m.gguf"), std::invalid_argument);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(Writer, UnwritablePathRaisesAnErrorNamingIt) {
  TempDir dir;
  Writer writer;
  const auto path = dir / "no-such-dir" / "m.gguf";
  try {
    writer.write(path);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(path.string()), std::string::npos) << error.what();
  }
}

// The Writer's bytes, compared with a file spelled out field by field.
std::vector<uint8_t> expected_small_file(std::endian order) {
  ByteBuilder b(order);
  b.header(3, 2, 3);
  b.kv_string("general.architecture", "llama");
  b.kv_u32("x.count", 7);
  b.key("x.list", 9).u32(3).u64(2).u16(1).u16(static_cast<uint16_t>(-2));
  b.tensor_info("t", {2}, 0, 0);
  b.tensor_info("q", {32}, 8, 32);
  b.pad_to(32);
  b.f32(1.5f).f32(-2.0f).pad_to(32);
  b.u16(0x3c00).raw(pattern_bytes(32, 9)).pad_to(32);
  return b.bytes();
}

Writer small_writer() {
  Writer writer;
  writer.set("general.architecture", "llama");
  writer.set("x.count", uint32_t{7});
  writer.set("x.list", make_array(ValueType::Int16, {int16_t{1}, int16_t{-2}}));
  writer.add_tensor("t", GgmlType::F32, {2}, host_bytes(std::vector<float>{1.5f, -2.0f}));
  std::vector<uint8_t> block = host_bytes(std::vector<uint16_t>{0x3c00});
  const auto quants = pattern_bytes(32, 9);
  block.insert(block.end(), quants.begin(), quants.end());
  writer.add_tensor("q", GgmlType::Q8_0, {32}, std::move(block));
  return writer;
}

TEST(Writer, BytesMatchTheFormatSpelledOutByHand) {
  TempDir dir;
  small_writer().write(dir / "le.gguf", {.big_endian = false});
  small_writer().write(dir / "be.gguf", {.big_endian = true});
  EXPECT_EQ(testing::read_bytes(dir / "le.gguf"), expected_small_file(std::endian::little));
  EXPECT_EQ(testing::read_bytes(dir / "be.gguf"), expected_small_file(std::endian::big));
}

TEST(Writer, SplitPathUsesFiveDigitNumbers) {
  EXPECT_EQ(split_path("dir/model", 1, 3), std::filesystem::path("dir/model-00001-of-00003.gguf"));
  EXPECT_EQ(split_path("m", 12, 123456), std::filesystem::path("m-00012-of-123456.gguf"));
}

}  // namespace
}  // namespace pico::gguf
