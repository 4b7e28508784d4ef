// Helpers for the gguf tests: a temporary directory per test, whole-file I/O, and a
// byte builder that writes GGUF fields by hand, independently of the Writer, so
// that tests can state what the bytes of a file must be.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/reader.hpp"

namespace pico::gguf {

// Readable values in GoogleTest's failure messages.
inline void PrintTo(const Value& value, std::ostream* out) { *out << to_display_string(value); }
inline void PrintTo(const Array& array, std::ostream* out) { *out << to_display_string(Value(array)); }

}  // namespace pico::gguf

namespace pico::gguf::testing {

// A fresh directory under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    static std::atomic<unsigned> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "pico-gguf-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    if (info) name += std::string("-") + info->name();
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Deterministic arbitrary bytes (tensor payloads are opaque to the reader).
inline std::vector<uint8_t> pattern_bytes(size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<uint8_t> bytes(count);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(random() & 0xff);
  return bytes;
}

// The host's in-memory bytes of some numbers.
template <typename T>
std::vector<uint8_t> host_bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// GGUF bytes in a chosen byte order. Numbers are split into bytes by shifting, so
// the output does not depend on the host's order.
class ByteBuilder {
 public:
  explicit ByteBuilder(std::endian order = std::endian::little) : order_(order) {}

  ByteBuilder& uint(uint64_t value, int width) {
    for (int i = 0; i < width; ++i) {
      const int shift = order_ == std::endian::little ? 8 * i : 8 * (width - 1 - i);
      bytes_.push_back(static_cast<uint8_t>((value >> shift) & 0xff));
    }
    return *this;
  }
  ByteBuilder& u8(uint8_t v) { return uint(v, 1); }
  ByteBuilder& u16(uint16_t v) { return uint(v, 2); }
  ByteBuilder& u32(uint32_t v) { return uint(v, 4); }
  ByteBuilder& u64(uint64_t v) { return uint(v, 8); }
  ByteBuilder& i32(int32_t v) { return uint(static_cast<uint32_t>(v), 4); }
  ByteBuilder& f32(float v) { return uint(std::bit_cast<uint32_t>(v), 4); }
  ByteBuilder& f64(double v) { return uint(std::bit_cast<uint64_t>(v), 8); }
  ByteBuilder& raw(std::string_view text) {
    bytes_.insert(bytes_.end(), text.begin(), text.end());
    return *this;
  }
  ByteBuilder& raw(std::span<const uint8_t> data) {
    bytes_.insert(bytes_.end(), data.begin(), data.end());
    return *this;
  }
  ByteBuilder& str(std::string_view text) { return u64(text.size()).raw(text); }

  ByteBuilder& header(uint32_t version, uint64_t tensor_count, uint64_t kv_count) {
    return raw("GGUF").u32(version).u64(tensor_count).u64(kv_count);
  }
  // Key and value type; the caller writes the value.
  ByteBuilder& key(std::string_view name, uint32_t value_type) { return str(name).u32(value_type); }
  ByteBuilder& kv_u32(std::string_view name, uint32_t v) { return key(name, 4).u32(v); }
  ByteBuilder& kv_string(std::string_view name, std::string_view v) { return key(name, 8).str(v); }
  ByteBuilder& tensor_info(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  ByteBuilder& pad_to(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  ByteBuilder& zeros(size_t count) {
    bytes_.insert(bytes_.end(), count, 0);
    return *this;
  }

  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::endian order_;
  std::vector<uint8_t> bytes_;
};

// Runs `open` and checks it raises FormatError at `offset` (unless ~0) with a field
// containing `field_part` and a message containing `message_part`.
inline void expect_format_error(const std::function<void()>& open, std::string_view field_part,
                                std::string_view message_part, uint64_t offset = ~uint64_t{0}) {
  try {
    open();
    ADD_FAILURE() << "no FormatError (expected field \"" << field_part << "\")";
  } catch (const FormatError& error) {
    const std::string what = error.what();
    EXPECT_NE(error.field().find(field_part), std::string::npos) << "field: " << error.field() << "\n" << what;
    EXPECT_NE(what.find(message_part), std::string::npos) << what;
    if (offset != ~uint64_t{0}) {
      EXPECT_EQ(error.offset(), offset) << what;
    }
  }
}

}  // namespace pico::gguf::testing
