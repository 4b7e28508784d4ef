#include "gguf/writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <system_error>

namespace pico::gguf {
namespace {

constexpr uint64_t kMaxElements = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
constexpr int kMaxDims = 4;  // as reader.hpp's kMaxDimensions (not included here)

template <typename T>
T byteswap_value(T value) {
  auto bytes = std::bit_cast<std::array<uint8_t, sizeof(T)>>(value);
  std::reverse(bytes.begin(), bytes.end());
  return std::bit_cast<T>(bytes);
}

bool host_is_big_endian() { return std::endian::native == std::endian::big; }

uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

// The header (everything before the data section) in the file's byte order.
class HeaderBytes {
 public:
  explicit HeaderBytes(bool swap) : swap_(swap) {}

  template <typename T>
  void put(T value) {
    if (swap_) value = byteswap_value(value);
    const auto raw = std::bit_cast<std::array<uint8_t, sizeof(T)>>(value);
    bytes_.insert(bytes_.end(), raw.begin(), raw.end());
  }

  void put_bytes(std::string_view text) { bytes_.insert(bytes_.end(), text.begin(), text.end()); }
  void put_string(std::string_view text) {
    put<uint64_t>(text.size());
    put_bytes(text);
  }

  // The value's payload (its type number is written by the caller).
  void put_value(const Value& value, const std::string& key) {
    std::visit(
        [this, &key](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>) {
            put<uint8_t>(v ? 1 : 0);
          } else if constexpr (std::is_same_v<T, std::string>) {
            put_string(v);
          } else if constexpr (std::is_same_v<T, Array>) {
            put<uint32_t>(static_cast<uint32_t>(v.element_type));
            put<uint64_t>(v.items.size());
            for (size_t i = 0; i < v.items.size(); ++i) {
              if (v.items[i].type() != v.element_type) {
                throw std::invalid_argument("gguf writer: " + key + ": array item " + std::to_string(i) + " is " +
                                            std::string(value_type_name(v.items[i].type())) + " in an array of " +
                                            std::string(value_type_name(v.element_type)));
              }
              put_value(v.items[i], key);
            }
          } else {
            put<T>(v);
          }
        },
        value.storage);
  }

  void pad_to(uint64_t alignment) { bytes_.resize(static_cast<size_t>(align_up(bytes_.size(), alignment)), 0); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  bool swap_;
  std::vector<uint8_t> bytes_;
};

void check_options(const WriteOptions& options) {
  if (options.version != 2 && options.version != 3) {
    throw std::invalid_argument("gguf writer: version " + std::to_string(options.version) +
                                " (only 2 and 3 are written)");
  }
  if (options.alignment == 0 || !std::has_single_bit(options.alignment)) {
    throw std::invalid_argument("gguf writer: alignment " + std::to_string(options.alignment) +
                                " is not a non-zero power of two");
  }
}

// The file must say which alignment its data uses; an existing key (copied from a
// model that was read) is overwritten so that it cannot contradict the layout.
void apply_alignment(Metadata& metadata, uint32_t alignment) {
  if (alignment != 32 || metadata.contains("general.alignment")) metadata.set("general.alignment", alignment);
}

// Writes to a temporary sibling, then renames: a failed write leaves no half file.
class OutputFile {
  static std::filesystem::path temporary_name(const std::filesystem::path& path) {
    static std::atomic<unsigned> counter{0};  // distinct names for writers in several threads
    return path.string() + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  }

 public:
  explicit OutputFile(std::filesystem::path path)
      : path_(std::move(path)), temporary_(temporary_name(path_)) {
    file_ = std::fopen(temporary_.c_str(), "wb");
    if (!file_) fail("cannot create " + temporary_.string());
  }
  ~OutputFile() {
    if (file_) {
      std::fclose(file_);
      std::error_code ignored;
      std::filesystem::remove(temporary_, ignored);
    }
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t size) {
    if (size > 0 && std::fwrite(data, 1, size, file_) != size) fail("write failed");
  }
  void zeros(size_t count) {
    static constexpr std::array<uint8_t, 64> kZeros{};
    while (count > 0) {
      const size_t n = std::min(count, kZeros.size());
      write(kZeros.data(), n);
      count -= n;
    }
  }
  void commit() {
    std::FILE* file = std::exchange(file_, nullptr);
    if (std::fclose(file) != 0) {
      const int error = errno;
      std::error_code ignored;
      std::filesystem::remove(temporary_, ignored);
      errno = error;
      fail("close failed");
    }
    std::error_code error;
    std::filesystem::rename(temporary_, path_, error);
    if (error) {
      std::filesystem::remove(temporary_, error);
      throw std::runtime_error(path_.string() + ": cannot rename " + temporary_.string() + " into place");
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path_.string() + ": " + what + ": " + std::strerror(errno));
  }

  std::filesystem::path path_;
  std::filesystem::path temporary_;
  std::FILE* file_ = nullptr;
};

void write_gguf(const std::filesystem::path& path, const Metadata& metadata,
                std::span<const Writer::Tensor> tensors, const WriteOptions& options) {
  const bool swap = options.big_endian != host_is_big_endian();
  const uint64_t alignment = options.alignment;
  HeaderBytes header(swap);
  header.put_bytes("GGUF");  // the magic is four bytes, the same in either order
  header.put<uint32_t>(options.version);
  header.put<uint64_t>(tensors.size());
  header.put<uint64_t>(metadata.size());
  for (const auto& [key, value] : metadata.entries()) {
    if (key.empty()) throw std::invalid_argument("gguf writer: " + path.string() + ": empty metadata key");
    header.put_string(key);
    header.put<uint32_t>(static_cast<uint32_t>(value.type()));
    header.put_value(value, key);
  }
  uint64_t data_offset = 0;
  for (const Writer::Tensor& tensor : tensors) {
    header.put_string(tensor.name);
    header.put<uint32_t>(static_cast<uint32_t>(tensor.shape.size()));
    for (uint64_t dim : tensor.shape) header.put<uint64_t>(dim);
    header.put<uint32_t>(static_cast<uint32_t>(tensor.type));
    header.put<uint64_t>(data_offset);
    data_offset += align_up(tensor.data.size(), alignment);
  }
  header.pad_to(alignment);

  OutputFile out(path);
  out.write(header.bytes().data(), header.bytes().size());
  std::vector<uint8_t> swapped;
  for (const Writer::Tensor& tensor : tensors) {
    const uint8_t* data = tensor.data.data();
    if (swap) {
      const TypeTraits& traits = type_traits(tensor.type);
      swapped.assign(tensor.data.begin(), tensor.data.end());
      byteswap_blocks(traits, swapped.data(), swapped.size() / traits.block_bytes);
      data = swapped.data();
    }
    out.write(data, tensor.data.size());
    // Padding after every tensor, the last included, as llama.cpp writes it.
    out.zeros(static_cast<size_t>(align_up(tensor.data.size(), alignment) - tensor.data.size()));
  }
  out.commit();
}

}  // namespace

void Writer::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> shape, std::span<const uint8_t> data) {
  add_tensor(std::move(name), type, std::move(shape), std::vector<uint8_t>(data.begin(), data.end()));
}

void Writer::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> shape, std::vector<uint8_t>&& data) {
  const std::string what = "gguf writer: tensor \"" + name + "\": ";
  const TypeTraits* traits = find_type(static_cast<uint32_t>(type));
  if (!traits) {
    throw std::invalid_argument(what + "type " + std::to_string(static_cast<uint32_t>(type)) + " has no row");
  }
  for (const Tensor& existing : tensors_) {
    if (existing.name == name) throw std::invalid_argument(what + "added twice");
  }
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    throw std::invalid_argument(what + std::to_string(shape.size()) + " dimensions (at most 4)");
  }
  uint64_t elements = 1;
  for (uint64_t dim : shape) {
    if (dim > kMaxElements || (dim != 0 && elements > kMaxElements / dim)) {
      throw std::invalid_argument(what + "element count overflows int64");
    }
    elements *= dim;
  }
  const uint64_t row = shape.empty() ? 1 : shape[0];
  if (row % traits->block_size != 0) {
    throw std::invalid_argument(what + "rows of " + std::to_string(row) + " elements are not a multiple of " +
                                std::string(traits->name) + "'s block size " + std::to_string(traits->block_size));
  }
  const std::optional<uint64_t> bytes = bytes_of(*traits, elements);
  if (!bytes || *bytes != data.size()) {
    throw std::invalid_argument(what + std::to_string(data.size()) + " bytes of data, the shape needs " +
                                (bytes ? std::to_string(*bytes) : std::string("more than 2^64")));
  }
  tensors_.push_back(Tensor{std::move(name), type, std::move(shape), std::move(data)});
}

void Writer::write(const std::filesystem::path& path, const WriteOptions& options) const {
  check_options(options);
  Metadata metadata = metadata_;
  apply_alignment(metadata, options.alignment);
  write_gguf(path, metadata, tensors_, options);
}

std::vector<std::filesystem::path> Writer::write_split(const std::filesystem::path& prefix,
                                                       size_t max_tensors_per_file, const WriteOptions& options) const {
  check_options(options);
  if (max_tensors_per_file == 0) throw std::invalid_argument("gguf writer: max_tensors_per_file is 0");
  const size_t count = std::max<size_t>(1, (tensors_.size() + max_tensors_per_file - 1) / max_tensors_per_file);
  // llama.cpp's gguf-split stores the part numbers as uint16 and the total as int32.
  if (count > std::numeric_limits<uint16_t>::max()) {
    throw std::invalid_argument("gguf writer: " + std::to_string(count) + " parts (at most 65535)");
  }
  if (tensors_.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("gguf writer: too many tensors for split.tensors.count");
  }
  std::vector<std::filesystem::path> paths;
  for (size_t part = 0; part < count; ++part) {
    Metadata metadata;
    if (part == 0) {
      metadata = metadata_;
      // A model that was itself split carries stale split keys; they are rewritten.
      for (const char* key : {"split.no", "split.count", "split.tensors.count"}) metadata.erase(key);
    }
    // Every part, not only the first, must say how its own data is aligned.
    apply_alignment(metadata, options.alignment);
    metadata.set("split.no", static_cast<uint16_t>(part));
    metadata.set("split.count", static_cast<uint16_t>(count));
    metadata.set("split.tensors.count", static_cast<int32_t>(tensors_.size()));
    const size_t first = std::min(part * max_tensors_per_file, tensors_.size());
    const size_t last = std::min(first + max_tensors_per_file, tensors_.size());
    paths.push_back(split_path(prefix, static_cast<int>(part + 1), static_cast<int>(count)));
    write_gguf(paths.back(), metadata, std::span<const Tensor>(tensors_).subspan(first, last - first), options);
  }
  return paths;
}

std::filesystem::path split_path(const std::filesystem::path& prefix, int number, int count) {
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), "-%05d-of-%05d.gguf", number, count);
  return std::filesystem::path(prefix.string() + suffix);
}

}  // namespace pico::gguf
