// Writes the seed corpus of gguf_reader_fuzz: a few small valid GGUF files made by
// the Writer, covering both byte orders, both versions, alignments, nested arrays,
// quantized types and split parts.
//   gguf_fuzz_seeds DIR
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "gguf/writer.hpp"
#include "seed_corpus.hpp"

namespace {

using namespace pico;
using namespace pico::gguf;

std::vector<uint8_t> filler(size_t count, uint8_t start) {
  std::vector<uint8_t> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<uint8_t>(start + i * 7);
  return bytes;
}

Writer small_model() {
  Writer writer;
  writer.set("general.architecture", "llama");
  writer.set("llama.context_length", uint32_t{2048});
  writer.set("tokenizer.ggml.tokens", string_array({"<unk>", "<s>", "</s>", "\xe2\x96\x81the"}));
  writer.set("tokenizer.ggml.scores", make_array(ValueType::Float32, {0.0f, 0.0f, 0.0f, -1.5f}));
  writer.add_tensor("token_embd.weight", GgmlType::F32, {4, 2}, filler(32, 1));
  writer.add_tensor("output_norm.weight", GgmlType::F16, {4}, filler(8, 2));
  return writer;
}

Writer every_value_type() {
  Writer writer;
  writer.set("u8", uint8_t{255});
  writer.set("i8", int8_t{-1});
  writer.set("u16", uint16_t{65535});
  writer.set("i16", int16_t{-2});
  writer.set("u32", uint32_t{7});
  writer.set("i32", int32_t{-3});
  writer.set("f32", 0.5f);
  writer.set("bool", true);
  writer.set("string", "text");
  writer.set("u64", std::numeric_limits<uint64_t>::max());
  writer.set("i64", std::numeric_limits<int64_t>::min());
  writer.set("f64", 2.5);
  writer.set("empty", Array{ValueType::UInt32, {}});
  writer.set("nested", make_array(ValueType::Array, {Value(make_array(ValueType::Int16, {int16_t{1}})),
                                                     Value(string_array({"a", "b"}))}));
  writer.add_tensor("scalar", GgmlType::I32, {}, filler(4, 3));
  return writer;
}

Writer quantized_model() {
  Writer writer;
  writer.set("general.architecture", "test");
  writer.add_tensor("q4_0", GgmlType::Q4_0, {32, 2}, filler(36, 4));
  writer.add_tensor("q8_0", GgmlType::Q8_0, {32}, filler(34, 5));
  writer.add_tensor("q4_k", GgmlType::Q4_K, {256}, filler(144, 6));
  writer.add_tensor("q6_k", GgmlType::Q6_K, {256}, filler(210, 7));
  writer.add_tensor("iq1_s", GgmlType::IQ1_S, {256}, filler(50, 8));
  writer.add_tensor("empty", GgmlType::F32, {0, 3}, std::vector<uint8_t>{});
  return writer;
}

}  // namespace

int main(int argc, char** argv) {
  return pico::fuzz::seed_corpus_main(argc, argv, [](const std::filesystem::path& dir) {
    small_model().write(dir / "seed-small-le.gguf");
    small_model().write(dir / "seed-small-be.gguf", {.big_endian = true});
    small_model().write(dir / "seed-small-v2.gguf", {.version = 2});
    every_value_type().write(dir / "seed-values.gguf");
    every_value_type().write(dir / "seed-values-be.gguf", {.big_endian = true});
    quantized_model().write(dir / "seed-quantized-a64.gguf", {.alignment = 64});
    quantized_model().write(dir / "seed-quantized-be.gguf", {.big_endian = true, .alignment = 1});
    Writer().write(dir / "seed-empty.gguf");
    small_model().write_split(dir / "seed-split", 1);
  });
}
