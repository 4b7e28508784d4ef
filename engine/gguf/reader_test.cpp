#include "gguf/reader.hpp"

#include <gtest/gtest.h>

#include "gguf/test_files.hpp"

namespace pico::gguf {
namespace {

using testing::ByteBuilder;
using testing::expect_format_error;
using testing::host_bytes;
using testing::TempDir;

constexpr uint32_t kF32 = 0, kQ8_0 = 8;  // ggml type numbers

constexpr uint16_t kHalfOne = 0x3c00;  // 1.0 as an IEEE half

// A little-endian file made field by field: four kv pairs and two tensors.
struct HandMadeFile {
  std::vector<uint8_t> bytes;
  uint64_t data_start = 0;
  std::vector<float> a_values{0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<uint8_t> b_quants = testing::pattern_bytes(32, 7);
};

HandMadeFile hand_made_file(uint32_t version = 3) {
  HandMadeFile file;
  ByteBuilder b(std::endian::little);
  b.header(version, 2, 4);
  b.kv_string("general.architecture", "llama");
  b.key("llama.context_length", 4).u32(4096);
  b.key("tokenizer.ggml.scores", 9).u32(6).u64(3).f32(0.5f).f32(-1.0f).f32(2.0f);
  b.key("general.flag", 7).u8(1);
  b.tensor_info("a", {4, 2}, kF32, 0);
  b.tensor_info("b", {32}, kQ8_0, 32);
  file.data_start = (b.size() + 31) / 32 * 32;
  b.pad_to(32);
  for (float v : file.a_values) b.f32(v);
  b.u16(kHalfOne).raw(file.b_quants);
  file.bytes = b.bytes();
  return file;
}

// What "b" (one q8_0 block) holds in host order: the half-precision scale, then 32 int8.
std::vector<uint8_t> expected_b(const HandMadeFile& file) {
  std::vector<uint8_t> block = host_bytes(std::vector<uint16_t>{kHalfOne});
  block.insert(block.end(), file.b_quants.begin(), file.b_quants.end());
  return block;
}

void check_hand_made_model(const Model& model, const HandMadeFile& file) {
  EXPECT_EQ(model.version(), 3u);
  EXPECT_FALSE(model.big_endian());
  EXPECT_EQ(model.foreign_byte_order(), std::endian::native == std::endian::big);
  EXPECT_EQ(model.alignment(), 32u);
  EXPECT_EQ(model.file_count(), 1u);

  const Metadata& m = model.metadata();
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m.entries()[0].first, "general.architecture");
  EXPECT_EQ(m.entries()[3].first, "general.flag");
  EXPECT_EQ(m.get_string("general.architecture"), "llama");
  EXPECT_EQ(m.find("llama.context_length")->type(), ValueType::UInt32);
  EXPECT_EQ(m.get_int("llama.context_length"), 4096);
  EXPECT_EQ(m.get_bool("general.flag"), true);
  EXPECT_EQ(*m.get_array("tokenizer.ggml.scores"), make_array(ValueType::Float32, {0.5f, -1.0f, 2.0f}));

  ASSERT_EQ(model.tensors().size(), 2u);
  const TensorInfo* a = model.find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, GgmlType::F32);
  EXPECT_EQ(a->shape, (std::vector<uint64_t>{4, 2}));
  EXPECT_EQ(a->elements, 8u);
  EXPECT_EQ(a->bytes, 32u);
  EXPECT_EQ(a->data_offset, 0u);
  EXPECT_EQ(a->file_offset, file.data_start);
  EXPECT_EQ(a->file_index, 0u);
  const auto a_data = model.tensor_data(*a);
  EXPECT_EQ(std::vector<uint8_t>(a_data.begin(), a_data.end()), host_bytes(file.a_values));

  const TensorInfo* b = model.find_tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, GgmlType::Q8_0);
  EXPECT_EQ(b->bytes, 34u);
  EXPECT_EQ(b->file_offset, file.data_start + 32);
  const auto b_data = model.tensor_data(*b);
  EXPECT_EQ(std::vector<uint8_t>(b_data.begin(), b_data.end()), expected_b(file));
  EXPECT_EQ(model.find_tensor("c"), nullptr);
  model.prefetch(*b);  // a hint: must simply not fail
}

TEST(Reader, ReadsAFileMadeByHand) {
  TempDir dir;
  const HandMadeFile file = hand_made_file();
  testing::write_bytes(dir / "m.gguf", file.bytes);
  const auto model = Model::open(dir / "m.gguf");
  check_hand_made_model(*model, file);
  EXPECT_EQ(model->file(0).path(), dir / "m.gguf");
  EXPECT_EQ(model->file(0).bytes().size(), file.bytes.size());
}

TEST(Reader, OpenMemoryChecksAndReadsTheSameWay) {
  const HandMadeFile file = hand_made_file();
  const auto model = Model::open_memory(file.bytes, "in-memory.gguf");
  check_hand_made_model(*model, file);
  // Views into the caller's bytes, not copies (when the order is the host's).
  if (!model->foreign_byte_order()) {
    EXPECT_EQ(model->tensor_data(*model->find_tensor("a")).data(), file.bytes.data() + file.data_start);
  }
  std::vector<uint8_t> cut(file.bytes.begin(), file.bytes.begin() + 10);
  expect_format_error([&] { Model::open_memory(cut, "cut.gguf"); }, "tensor_count", "cut.gguf: offset 0x8");
}

TEST(Reader, VersionTwoHasTheSameLayout) {
  HandMadeFile file = hand_made_file(2);
  const auto model = Model::open_memory(file.bytes);
  EXPECT_EQ(model->version(), 2u);
  EXPECT_EQ(model->tensors().size(), 2u);
}

TEST(Reader, AlignmentKeyMovesTheDataSection) {
  ByteBuilder b;
  b.header(3, 2, 1).kv_u32("general.alignment", 64);
  b.tensor_info("x", {16}, kF32, 0).tensor_info("y", {2}, kF32, 64);
  const uint64_t data_start = (b.size() + 63) / 64 * 64;
  b.pad_to(64).zeros(64).f32(1.0f).f32(2.0f);
  const auto model = Model::open_memory(b.bytes());
  EXPECT_EQ(model->alignment(), 64u);
  EXPECT_EQ(model->find_tensor("x")->file_offset, data_start);
  EXPECT_EQ(model->find_tensor("y")->file_offset, data_start + 64);
  const auto y = model->tensor_data(*model->find_tensor("y"));
  EXPECT_EQ(std::vector<uint8_t>(y.begin(), y.end()), host_bytes(std::vector<float>{1.0f, 2.0f}));
}

TEST(Reader, TensorsNeedNotBeStoredInInfoOrder) {
  ByteBuilder b;
  b.header(3, 2, 0).tensor_info("late", {8}, kF32, 32).tensor_info("early", {8}, kF32, 0);
  b.pad_to(32).zeros(64);
  const auto model = Model::open_memory(b.bytes());
  EXPECT_EQ(model->tensors()[0].name, "late");
  EXPECT_EQ(model->tensors()[0].data_offset, 32u);
}

TEST(Reader, ScalarsAndEmptyTensorsAreAcceptedAsInGgml) {
  ByteBuilder b;
  b.header(3, 2, 0).tensor_info("scalar", {}, kF32, 0).tensor_info("empty", {4, 0}, kF32, 0);
  b.pad_to(32).f32(3.5f);
  const auto model = Model::open_memory(b.bytes());
  const TensorInfo* scalar = model->find_tensor("scalar");
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->elements, 1u);
  EXPECT_EQ(scalar->bytes, 4u);
  const TensorInfo* empty = model->find_tensor("empty");
  EXPECT_EQ(empty->elements, 0u);
  EXPECT_EQ(empty->bytes, 0u);
  EXPECT_TRUE(model->tensor_data(*empty).empty());
}

TEST(Reader, EmptyTensorsNeedNoDataSection) {
  ByteBuilder b;
  b.header(3, 1, 0).tensor_info("nothing", {0, 5}, kF32, 0);  // the file ends with the header
  const auto model = Model::open_memory(b.bytes());
  EXPECT_GT(model->tensors()[0].file_offset, b.size());
  EXPECT_TRUE(model->tensor_data(model->tensors()[0]).empty());
  model->prefetch(model->tensors()[0]);
}

TEST(Reader, MissingFileAndDirectoryRaiseErrorsNamingThePath) {
  TempDir dir;
  try {
    Model::open(dir / "absent.gguf");
    ADD_FAILURE() << "no error";
  } catch (const std::system_error& error) {
    EXPECT_NE(std::string(error.what()).find("absent.gguf"), std::string::npos) << error.what();
  }
  EXPECT_THROW(Model::open(dir.path()), std::runtime_error);
}

TEST(Reader, EmptyFileIsTooShortForTheMagic) {
  TempDir dir;
  testing::write_bytes(dir / "empty.gguf", {});
  expect_format_error([&] { Model::open(dir / "empty.gguf"); }, "magic", "file is 0 bytes", 0);
}

TEST(Reader, ErrorMessageNamesPathOffsetFieldAndProblem) {
  ByteBuilder b;
  b.header(3, 0, 1).key("tokenizer.ggml.tokens", 9).u32(8).u64(99999999999).zeros(120);
  // 24 header bytes, 8 + 21 key bytes, 4 value type, 4 element type: the count is at 61.
  try {
    Model::open_memory(b.bytes(), "model.gguf");
    ADD_FAILURE() << "no error";
  } catch (const FormatError& error) {
    EXPECT_EQ(error.offset(), 61u);
    EXPECT_EQ(error.field(), "kv[0] \"tokenizer.ggml.tokens\" array count");
    EXPECT_EQ(std::string(error.what()),
              "model.gguf: offset 0x3d: kv[0] \"tokenizer.ggml.tokens\" array count: 99999999999 exceeds the 120 "
              "bytes left (each string item takes at least 8 bytes)");
  }
}

TEST(Reader, TensorOfAnotherModelIsRefused) {
  const HandMadeFile file = hand_made_file();
  const auto model = Model::open_memory(file.bytes);
  TensorInfo stranger = *model->find_tensor("a");
  stranger.file_offset += 32;
  EXPECT_THROW(model->tensor_data(stranger), std::invalid_argument);
  stranger.name = "zzz";
  EXPECT_THROW(model->tensor_data(stranger), std::invalid_argument);
}

}  // namespace
}  // namespace pico::gguf
