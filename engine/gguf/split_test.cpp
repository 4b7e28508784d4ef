// Split models: name-0000i-of-0000N.gguf parts, split.* keys as llama.cpp's
// gguf-split writes them (split.no counts from 0).
#include <gtest/gtest.h>

#include "gguf/reader.hpp"
#include "gguf/test_files.hpp"
#include "gguf/writer.hpp"

namespace pico::gguf {
namespace {

using testing::expect_format_error;
using testing::pattern_bytes;
using testing::TempDir;

constexpr int kTensors = 5;

std::vector<uint8_t> tensor_bytes(int i) { return pattern_bytes(4 * (8 + 4 * i), 100 + i); }

Writer model_writer() {
  Writer writer;
  writer.set("general.architecture", "llama");
  writer.set("general.name", "split test");
  for (int i = 0; i < kTensors; ++i) {
    writer.add_tensor("t" + std::to_string(i), GgmlType::F32, {static_cast<uint64_t>(8 + 4 * i)}, tensor_bytes(i));
  }
  return writer;
}

// A part written by hand-picked split keys, to make inconsistent sets.
void write_part(const std::filesystem::path& path, Value no, Value count, std::vector<int> tensors,
                std::optional<Value> total = std::nullopt) {
  Writer writer;
  writer.set("split.no", std::move(no));
  writer.set("split.count", std::move(count));
  if (total) writer.set("split.tensors.count", *total);
  for (int i : tensors) {
    writer.add_tensor("t" + std::to_string(i), GgmlType::F32, {static_cast<uint64_t>(8 + 4 * i)}, tensor_bytes(i));
  }
  writer.write(path);
}

TEST(Split, PartsCarryTheKeysOfLlamaCppGgufSplit) {
  TempDir dir;
  const auto paths = model_writer().write_split(dir / "model", 2);
  ASSERT_EQ(paths.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(paths[i], dir / ("model-0000" + std::to_string(i + 1) + "-of-00003.gguf"));
    const auto part = Model::open(paths[i], {.open_splits = false});
    const Metadata& m = part->metadata();
    EXPECT_EQ(*m.find("split.no"), Value(static_cast<uint16_t>(i)));
    EXPECT_EQ(*m.find("split.count"), Value(uint16_t{3}));
    EXPECT_EQ(*m.find("split.tensors.count"), Value(int32_t{kTensors}));
    // The first part holds all metadata; the others only the split keys.
    EXPECT_EQ(m.size(), i == 0 ? 5u : 3u);
    EXPECT_EQ(m.contains("general.architecture"), i == 0);
    EXPECT_EQ(part->file_count(), 1u);
    EXPECT_EQ(part->tensors().size(), i < 2 ? 2u : 1u);
  }
}

void expect_whole_model(const Model& model) {
  EXPECT_EQ(model.file_count(), 3u);
  EXPECT_EQ(model.metadata().get_string("general.architecture"), "llama");
  EXPECT_EQ(model.metadata().get_int("split.no"), 0);
  ASSERT_EQ(model.tensors().size(), static_cast<size_t>(kTensors));
  for (int i = 0; i < kTensors; ++i) {
    const TensorInfo& info = model.tensors()[i];
    EXPECT_EQ(info.name, "t" + std::to_string(i));
    EXPECT_EQ(info.file_index, static_cast<uint32_t>(i / 2));
    EXPECT_EQ(model.find_tensor(info.name), &info);
    const auto data = model.tensor_data(info);
    EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), tensor_bytes(i)) << info.name;
  }
}

TEST(Split, OpeningAnyPartOpensAllParts) {
  TempDir dir;
  const auto paths = model_writer().write_split(dir / "model", 2);
  for (const auto& path : paths) {
    SCOPED_TRACE(path.string());
    expect_whole_model(*Model::open(path));
  }
}

TEST(Split, BigEndianPartsReadInHostOrder) {
  TempDir dir;
  const auto paths = model_writer().write_split(dir / "be", 2, {.big_endian = true});
  const auto model = Model::open(paths[1]);
  EXPECT_TRUE(model->big_endian());
  expect_whole_model(*model);
}

TEST(Split, MissingPartIsNamedInTheError) {
  TempDir dir;
  const auto paths = model_writer().write_split(dir / "model", 2);
  std::filesystem::remove(paths[2]);
  expect_format_error([&] { Model::open(paths[0]); }, "split.count", "part 3 of 3 cannot be opened");
  expect_format_error([&] { Model::open(paths[0]); }, "split.count", "model-00003-of-00003.gguf");
}

TEST(Split, PartsMustAgreeOnTheCount) {
  TempDir dir;
  const auto paths = model_writer().write_split(dir / "model", 2);
  write_part(paths[2], uint16_t{2}, uint16_t{4}, {4});
  try {
    Model::open(paths[0]);
    ADD_FAILURE() << "no error";
  } catch (const FormatError& error) {
    EXPECT_EQ(error.field(), "split.count");
    EXPECT_NE(std::string(error.what()).find(paths[2].string()), std::string::npos) << error.what();
  }
}

TEST(Split, EachPartMustHaveItsNumber) {
  TempDir dir;
  const auto paths = model_writer().write_split(dir / "model", 2);
  write_part(paths[1], uint16_t{5}, uint16_t{3}, {2, 3});
  expect_format_error([&] { Model::open(paths[0]); }, "split.no", "is 5 but the file is part 2");
  Writer no_number;
  no_number.set("split.count", uint16_t{3});
  no_number.write(paths[1]);
  expect_format_error([&] { Model::open(paths[0]); }, "split.no", "missing");
}

TEST(Split, TensorTotalMustMatchTheParts) {
  TempDir dir;
  write_part(dir / "m-00001-of-00002.gguf", uint16_t{0}, uint16_t{2}, {0, 1}, int32_t{99});
  write_part(dir / "m-00002-of-00002.gguf", uint16_t{1}, uint16_t{2}, {2});
  expect_format_error([&] { Model::open(dir / "m-00001-of-00002.gguf"); }, "split.tensors.count",
                      "is 99 but the parts hold 3 tensors");
}

TEST(Split, ATensorMayNotAppearInTwoParts) {
  TempDir dir;
  write_part(dir / "m-00001-of-00002.gguf", uint16_t{0}, uint16_t{2}, {0, 1});
  write_part(dir / "m-00002-of-00002.gguf", uint16_t{1}, uint16_t{2}, {1});
  expect_format_error([&] { Model::open(dir / "m-00002-of-00002.gguf"); }, "tensor \"t1\"", "also present in part 1");
}

TEST(Split, AnyIntegerTypeServesForTheSplitKeys) {
  TempDir dir;
  write_part(dir / "m-00001-of-00002.gguf", uint32_t{0}, int64_t{2}, {0}, uint64_t{2});
  write_part(dir / "m-00002-of-00002.gguf", int8_t{1}, uint8_t{2}, {1});
  const auto model = Model::open(dir / "m-00001-of-00002.gguf");
  EXPECT_EQ(model->file_count(), 2u);
  EXPECT_EQ(model->tensors().size(), 2u);
  write_part(dir / "m-00002-of-00002.gguf", "1", uint8_t{2}, {1});
  expect_format_error([&] { Model::open(dir / "m-00001-of-00002.gguf"); }, "split.no", "must be an integer");
}

TEST(Split, SplitCountWithoutANumberedNameIsRefused) {
  TempDir dir;
  write_part(dir / "plain.gguf", uint16_t{0}, uint16_t{2}, {0});
  expect_format_error([&] { Model::open(dir / "plain.gguf"); }, "split.count", "does not end in -0000i-of-00002.gguf");
  // Without following splits it opens as the one part it is.
  EXPECT_EQ(Model::open(dir / "plain.gguf", {.open_splits = false})->tensors().size(), 1u);
}

TEST(Split, StaleSplitKeysAreRewrittenAndOnePartIsAPlainModel) {
  TempDir dir;
  Writer writer = model_writer();
  writer.set("split.count", uint16_t{7});
  writer.set("split.no", uint16_t{3});
  const auto paths = writer.write_split(dir / "one", 100);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0], dir / "one-00001-of-00001.gguf");
  const auto model = Model::open(paths[0]);
  EXPECT_EQ(model->file_count(), 1u);
  EXPECT_EQ(model->metadata().get_int("split.count"), 1);
  EXPECT_EQ(model->metadata().get_int("split.no"), 0);
  EXPECT_EQ(model->metadata().entries()[2].first, "split.no");  // after the model's own keys
  EXPECT_EQ(model->tensors().size(), static_cast<size_t>(kTensors));
}

TEST(Split, NonDefaultAlignmentIsWrittenIntoEveryPart) {
  TempDir dir;
  const auto paths = model_writer().write_split(dir / "a", 2, {.alignment = 128});
  for (const auto& path : paths) EXPECT_EQ(Model::open(path, {.open_splits = false})->alignment(), 128u);
  expect_whole_model(*Model::open(paths[0]));
}

}  // namespace
}  // namespace pico::gguf
