// Slot files: what is saved restores into another sequence bit for bit, and a file of
// another model or layer range, a truncated one or a bad name is refused naming why.
#include "slot_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "synthetic/synthetic_model.hpp"

namespace pico::worker {
namespace {

class SlotFileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("pico-slot-file-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    for (const uint64_t seed : {1, 2}) {
      synthetic::SyntheticSpec spec;
      spec.n_layers = 2;
      spec.n_ctx_train = 256;
      spec.seed = seed;
      spec.node_modules = PICO_NODE_MODULES_DIR;
      synthetic::write_synthetic_model(spec, (dir_ / ("m" + std::to_string(seed) + ".gguf")).string());
    }
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static StageEngine engine(int seed, std::optional<model::LayerRange> range = std::nullopt) {
    StageLimitOptions limits;
    limits.kv_memory = uint64_t{64} << 20;
    return StageEngine((dir_ / ("m" + std::to_string(seed) + ".gguf")).string(), range, 1, limits);
  }
  static std::string error_of(StageEngine& e, const std::filesystem::path& path) {
    try {
      restore_slot(e, 9, path);
    } catch (const std::invalid_argument& x) {
      return x.what();
    }
    return "(restored)";
  }
  static inline std::filesystem::path dir_;
};

TEST_F(SlotFileTest, RestoresWhatWasSavedAndRefusesAnythingElse) {
  StageEngine a = engine(1);
  std::vector<model::BatchToken> batch;
  for (int32_t p = 0; p < 6; ++p) batch.push_back({4, p, 3 + p, p == 5});
  a.forward(batch, nullptr);
  const std::vector<int32_t> tokens{3, 4, 5, 6, 7, 8};
  const std::filesystem::path path = slot_file_path(dir_.string(), "s.bin");
  EXPECT_GT(save_slot(a, 4, path, tokens), 0u);
  StageEngine b = engine(1);
  EXPECT_EQ(restore_slot(b, 9, path), tokens);
  EXPECT_EQ(b.snapshot(9)->bytes, a.snapshot(4)->bytes);
  EXPECT_EQ(b.snapshot(9)->n_pos, 6);

  StageEngine other_model = engine(2);
  EXPECT_NE(error_of(other_model, path).find("another model's"), std::string::npos);
  StageEngine other_range = engine(1, model::LayerRange{1, 2});
  EXPECT_NE(error_of(other_range, path).find("holds layers 0-1, this stage runs 1-1"), std::string::npos);
  EXPECT_NE(error_of(b, dir_ / "none.bin").find("no such file"), std::string::npos);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (const size_t keep : {size_t{4}, size_t{30}, bytes.size() - 1}) {
    std::ofstream(dir_ / "cut.bin", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(keep));
    EXPECT_NE(error_of(b, dir_ / "cut.bin").find("truncated"), std::string::npos) << keep;
  }
  std::ofstream(dir_ / "long.bin", std::ios::binary) << bytes << "x";
  EXPECT_NE(error_of(b, dir_ / "long.bin").find("bytes after its state"), std::string::npos);
  EXPECT_EQ(restore_slot(b, 9, path), tokens);  // still restorable after the refusals

  EXPECT_THROW(save_slot(a, 77, path, tokens), std::invalid_argument);  // not open
  EXPECT_THROW(save_slot(a, 4, path, std::vector<int32_t>(7, 1)), std::invalid_argument);  // more tokens than positions
  for (const char* bad : {"", ".", "..", "a/b", "../x", "a\\b"}) {
    EXPECT_THROW(slot_file_path(dir_.string(), bad), std::invalid_argument) << bad;
  }
  EXPECT_THROW(slot_file_path("", "ok.bin"), std::invalid_argument);  // off
}

}  // namespace
}  // namespace pico::worker
