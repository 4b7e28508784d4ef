// Reads GGUF files (v2 and v3, either byte order) without copying them: the file is
// mapped, and tensors are views into the mapping. Split models
// (name-00001-of-0000N.gguf, with split.* keys) open as one model.
//
// Every count, length, size and offset is checked against the file before it is
// used; a malformed file raises FormatError naming the field and its byte offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/value.hpp"
#include "quant/type_traits.hpp"

namespace pico::gguf {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kDefaultAlignment = 32;
constexpr int kMaxDimensions = 4;

class FormatError : public std::runtime_error {
 public:
  FormatError(const std::string& path, uint64_t offset, const std::string& field, const std::string& what);
  const std::string& field() const { return field_; }
  uint64_t offset() const { return offset_; }

 private:
  std::string field_;
  uint64_t offset_;
};

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  // ggml order: shape[0] is the innermost (row) length. 0 to 4 entries: as in ggml,
  // no entries is a scalar (one element), and a 0 dimension an empty tensor.
  std::vector<uint64_t> shape;
  uint64_t elements = 0;
  uint64_t bytes = 0;
  uint32_t file_index = 0;       // which split file holds it
  uint64_t data_offset = 0;      // relative to that file's data section
  uint64_t file_offset = 0;      // absolute byte offset in that file
};

// One mapped .gguf file.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }
  // Hints the kernel to read a byte range ahead (madvise WILLNEED); no-op on error.
  void prefetch(uint64_t offset, uint64_t length) const;

  // Views caller-owned bytes as if they were a mapped file named `name`; the bytes
  // must outlive the result. Nothing is mapped or copied (fuzzing, tests).
  static std::unique_ptr<MappedFile> borrow(std::span<const uint8_t> bytes, std::filesystem::path name);

 private:
  MappedFile() = default;

  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;  // false for borrowed bytes and empty files: nothing to unmap
};

struct ReadOptions {
  // Follow split.count to open the sibling files of a split model.
  bool open_splits = true;
};

class Model {
 public:
  // Opens `path`; for any part of a split model, opens all of its parts (metadata is
  // the first part's). Throws FormatError for a malformed file or an inconsistent or
  // missing part, std::system_error when `path` itself cannot be opened or mapped.
  static std::unique_ptr<Model> open(const std::filesystem::path& path, const ReadOptions& options = {});
  // Reads a GGUF image held in memory, checked exactly as a file is; `name` stands
  // for the path in error messages. Split siblings are not followed (the model holds
  // this part's tensors only). `bytes` must outlive the model.
  static std::unique_ptr<Model> open_memory(std::span<const uint8_t> bytes, const std::string& name = "<memory>");

  uint32_t version() const { return version_; }
  bool foreign_byte_order() const { return foreign_; }  // file order differs from the host's
  bool big_endian() const;                              // the file's byte order
  uint32_t alignment() const { return alignment_; }
  size_t file_count() const { return files_.size(); }
  const MappedFile& file(size_t index) const { return *files_.at(index); }

  // Metadata of the first file (split files repeat only the split.* keys).
  const Metadata& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  // The tensor's bytes in host byte order (thread-safe; std::invalid_argument for a
  // tensor that is not this model's). For a file of the host's order this is a
  // view into the mapping; for the other order the tensor is swapped once into
  // memory owned by the model, on first access.
  std::span<const uint8_t> tensor_data(const TensorInfo& tensor) const;
  void prefetch(const TensorInfo& tensor) const;

 private:
  friend class ModelAssembler;  // reader.cpp: parses the files and fills the model
  Model() = default;
  size_t index_of(const TensorInfo& tensor) const;

  uint32_t version_ = 0;
  bool foreign_ = false;
  uint32_t alignment_ = kDefaultAlignment;
  std::vector<std::unique_ptr<MappedFile>> files_;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  mutable std::mutex swapped_mutex_;
  mutable std::unordered_map<size_t, std::vector<uint8_t>> swapped_;
};

}  // namespace pico::gguf
