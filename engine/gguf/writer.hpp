// Writes GGUF v3 files: metadata in insertion order, tensor infos, and the data
// section with every tensor aligned to general.alignment. Either byte order can be
// written (the tests make big-endian files on little-endian hosts and the reverse),
// and a model can be written split across several files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "gguf/value.hpp"
#include "quant/type_traits.hpp"

namespace pico::gguf {

struct WriteOptions {
  uint32_t version = 3;
  bool big_endian = false;  // byte order of the file (tensor data given in host order is swapped)
  uint32_t alignment = 32;  // also written as general.alignment when not 32
};

class Writer {
 public:
  Metadata& metadata() { return metadata_; }
  void set(std::string key, Value value) { metadata_.set(std::move(key), std::move(value)); }

  // `data` is in host byte order, bytes_of(type, elements) long; it is copied.
  // std::invalid_argument for a size or shape that does not fit the type, more than
  // 4 dimensions, or a name already added.
  void add_tensor(std::string name, GgmlType type, std::vector<uint64_t> shape, std::span<const uint8_t> data);
  // Same, taking ownership.
  void add_tensor(std::string name, GgmlType type, std::vector<uint64_t> shape, std::vector<uint8_t>&& data);

  // Writes to a temporary file beside `path`, then renames it into place. Throws
  // std::invalid_argument for bad options or values (an array item of another type,
  // an empty key), std::runtime_error naming the path when the file cannot be written.
  void write(const std::filesystem::path& path, const WriteOptions& options = {}) const;

  // Writes `prefix`-0000i-of-0000N.gguf files of at most `max_tensors_per_file`
  // tensors each, with split.no / split.count / split.tensors.count; the first holds
  // all metadata. Returns the paths written. As llama.cpp's gguf-split: split.no
  // (uint16, counting from 0), split.count (uint16), split.tensors.count (int32),
  // after the model's own keys; later parts hold only these (and general.alignment
  // when it is not 32). Stale split.* keys in metadata() are replaced.
  std::vector<std::filesystem::path> write_split(const std::filesystem::path& prefix, size_t max_tensors_per_file,
                                                 const WriteOptions& options = {}) const;

  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> data;
  };
  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  Metadata metadata_;
  std::vector<Tensor> tensors_;
};

// Split file name: split_path("dir/model", 1, 3) == "dir/model-00001-of-00003.gguf".
std::filesystem::path split_path(const std::filesystem::path& prefix, int number, int count);

}  // namespace pico::gguf
