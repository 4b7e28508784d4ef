#include "gguf/reader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <system_error>

#include "gguf/writer.hpp"  // split_path

namespace pico::gguf {
namespace {

// Array nesting allowed in metadata; each level is a recursive call, so a bound keeps
// a crafted file from exhausting the stack.
constexpr int kMaxArrayDepth = 8;
// Every metadata value costs ~40 bytes of memory however few bytes it takes in the
// file (a uint8 takes one), so the total is bounded too. Real models hold a few
// million at most (vocabularies of ~300k tokens, their scores, types and merges).
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 25;
// Smallest encodings, used to refuse counts the remaining bytes cannot hold before
// anything is reserved: a key/value pair is key length + type + a 1-byte value; a
// tensor info is name length + n_dims + type + offset.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;
constexpr uint64_t kMinArrayBytes = 4 + 8;
constexpr uint64_t kKvCountOffset = 16;

template <typename T>
T byteswap_value(T value) {
  auto bytes = std::bit_cast<std::array<uint8_t, sizeof(T)>>(value);
  std::reverse(bytes.begin(), bytes.end());
  return std::bit_cast<T>(bytes);
}

std::string hex(uint64_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof(buffer), "0x%llx", static_cast<unsigned long long>(value));
  return buffer;
}

std::string num(uint64_t value) { return std::to_string(value); }

// Keys and names in messages: quoted, escaped, and cut short (a crafted file can hold
// megabytes of binary "name").
std::string quote_for_message(std::string_view text) {
  constexpr size_t kShown = 80;
  std::string shown(text.substr(0, kShown));
  std::string out = to_display_string(Value(std::move(shown)));
  if (text.size() > kShown) out.insert(out.size() - 1, "...");
  return out;
}

// Names a field for error messages ("kv[3] \"tokenizer.ggml.tokens\" item[7]"); the
// text is only built when an error is raised.
struct Field {
  std::string_view label;
  const Field* parent = nullptr;
  uint64_t index = 0;
  bool indexed = false;

  std::string describe(std::string_view part = {}) const {
    std::string out = parent ? parent->describe() + " " : std::string();
    out += label;
    if (indexed) out += "[" + num(index) + "]";
    if (!part.empty()) {
      if (!out.empty()) out += ' ';
      out += part;
    }
    return out;
  }
};

uint64_t min_encoded_bytes(ValueType type) {
  switch (type) {
    case ValueType::UInt8: case ValueType::Int8: case ValueType::Bool: return 1;
    case ValueType::UInt16: case ValueType::Int16: return 2;
    case ValueType::UInt32: case ValueType::Int32: case ValueType::Float32: return 4;
    case ValueType::UInt64: case ValueType::Int64: case ValueType::Float64: return 8;
    case ValueType::String: return 8;
    case ValueType::Array: return kMinArrayBytes;
  }
  return 1;
}

// Reads numbers and strings from the file's bytes in the file's byte order; never
// past the end.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return bytes_.size() - pos_; }
  uint64_t size() const { return bytes_.size(); }
  const uint8_t* at(uint64_t offset) const { return bytes_.data() + offset; }
  void set_foreign(bool foreign) { foreign_ = foreign; }

  [[noreturn]] void fail(uint64_t offset, const std::string& field, const std::string& what) const {
    throw FormatError(path_, offset, field, what);
  }

  template <typename T>
  T read(const Field& field, std::string_view part = {}) {
    if (left() < sizeof(T)) {
      fail(pos_, field.describe(part),
           "needs " + num(sizeof(T)) + " bytes but the file ends " + num(left()) + " bytes later (file is " +
               num(size()) + " bytes)");
    }
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return foreign_ ? byteswap_value(value) : value;
  }

  // uint64 length, then that many bytes.
  std::string read_string(const Field& field, std::string_view length_part) {
    const uint64_t length_at = pos_;
    const auto length = read<uint64_t>(field, length_part);
    if (length > left()) {
      fail(length_at, field.describe(length_part), num(length) + " exceeds the " + num(left()) + " bytes left");
    }
    std::string text(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(length));
    pos_ += length;
    return text;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& path_;
  uint64_t pos_ = 0;
  bool foreign_ = false;
};

}  // namespace

// One file's header, checked; Model assembles one or several of these.
struct ParsedFile {
  std::unique_ptr<MappedFile> file;
  uint32_t version = 0;
  bool foreign = false;
  uint32_t alignment = kDefaultAlignment;
  Metadata metadata;
  std::vector<uint64_t> value_offsets;  // of each metadata value, in entry order
  std::vector<TensorInfo> tensors;
  std::vector<uint64_t> tensor_info_offsets;  // where each tensor's info begins
  uint64_t data_start = 0;

  uint64_t value_offset(std::string_view key) const {
    const auto& entries = metadata.entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].first == key) return value_offsets[i];
    }
    return kKvCountOffset;  // absent keys are reported at the kv count
  }
  std::string path() const { return file->path().string(); }
};

namespace {

class HeaderParser {
 public:
  explicit HeaderParser(const MappedFile& file) : path_(file.path().string()), cursor_(file.bytes(), path_) {}

  void parse(ParsedFile& out) {
    read_magic_and_version(out);
    const uint64_t tensor_count = read_count(Field{"tensor_count"}, kMinTensorInfoBytes, "tensor info");
    const uint64_t kv_count = read_count(Field{"kv_count"}, kMinKeyValueBytes, "key/value pair");
    read_metadata(out, kv_count);
    read_alignment(out);
    read_tensor_infos(out, tensor_count);
    place_tensors(out);
  }

 private:
  void read_magic_and_version(ParsedFile& out) {
    const Field magic_field{"magic"};
    const auto magic = cursor_.read<std::array<uint8_t, 4>>(magic_field);
    if (std::memcmp(magic.data(), "GGUF", 4) != 0) {
      char found[32];
      std::snprintf(found, sizeof(found), "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
      cursor_.fail(0, "magic", std::string("expected \"GGUF\" (47 47 55 46), found ") + found);
    }
    // The version is small, so a file of the other byte order shows it with its
    // low half zero (3 reads as 0x03000000); every later field is then swapped.
    const auto raw = cursor_.read<uint32_t>(Field{"version"});
    const uint32_t swapped = byteswap_value(raw);
    out.foreign = (raw & 0xffffu) == 0 && swapped != 0 && raw != 0;
    out.version = out.foreign ? swapped : raw;
    cursor_.set_foreign(out.foreign);
    if (out.version == 1) {
      cursor_.fail(4, "version",
                   "GGUF v1 (32-bit counts) is not supported: re-convert the model with a current converter");
    }
    if (out.version < 2 || out.version > 3) {
      cursor_.fail(4, "version", "unsupported version " + num(out.version) + " (this reader handles 2 and 3)");
    }
  }

  // A count of items that each take at least `min_bytes`: refused when the bytes
  // left cannot hold them, before anything is sized by it.
  uint64_t read_count(const Field& field, uint64_t min_bytes, std::string_view item) {
    const uint64_t at = cursor_.pos();
    const auto count = cursor_.read<uint64_t>(field);
    check_count(count, min_bytes, at, field.describe(), item);
    return count;
  }

  void check_count(uint64_t count, uint64_t min_bytes, uint64_t at, const std::string& field, std::string_view item) {
    if (count > cursor_.left() / min_bytes) {
      cursor_.fail(at, field,
                   num(count) + " exceeds the " + num(cursor_.left()) + " bytes left (each " + std::string(item) +
                       " takes at least " + num(min_bytes) + " bytes)");
    }
  }

  ValueType read_value_type(const Field& field, std::string_view part) {
    const uint64_t at = cursor_.pos();
    const auto number = cursor_.read<uint32_t>(field, part);
    if (number > static_cast<uint32_t>(ValueType::Float64)) {
      cursor_.fail(at, field.describe(part), "unknown value type " + num(number));
    }
    return static_cast<ValueType>(number);
  }

  void read_metadata(ParsedFile& out, uint64_t kv_count) {
    out.value_offsets.reserve(static_cast<size_t>(kv_count));
    for (uint64_t i = 0; i < kv_count; ++i) {
      const std::string index_label = "kv[" + num(i) + "]";
      const uint64_t key_at = cursor_.pos();
      std::string key = cursor_.read_string(Field{index_label}, "key length");
      const std::string label = index_label + " " + quote_for_message(key);
      const Field field{label};
      if (key.empty()) cursor_.fail(key_at, index_label + " key", "is empty");
      if (out.metadata.contains(key)) {
        const auto& entries = out.metadata.entries();
        size_t first = 0;
        while (first < entries.size() && entries[first].first != key) ++first;
        cursor_.fail(key_at, label, "duplicate key (first defined by kv[" + num(first) + "])");
      }
      const ValueType type = read_value_type(field, "value type");
      out.value_offsets.push_back(cursor_.pos());
      Value value = read_value(type, field, "value", 1);
      out.metadata.set(std::move(key), std::move(value));
    }
  }

  Value read_value(ValueType type, const Field& field, std::string_view part, int depth) {
    switch (type) {
      case ValueType::UInt8: return cursor_.read<uint8_t>(field, part);
      case ValueType::Int8: return cursor_.read<int8_t>(field, part);
      case ValueType::UInt16: return cursor_.read<uint16_t>(field, part);
      case ValueType::Int16: return cursor_.read<int16_t>(field, part);
      case ValueType::UInt32: return cursor_.read<uint32_t>(field, part);
      case ValueType::Int32: return cursor_.read<int32_t>(field, part);
      case ValueType::Float32: return cursor_.read<float>(field, part);
      case ValueType::UInt64: return cursor_.read<uint64_t>(field, part);
      case ValueType::Int64: return cursor_.read<int64_t>(field, part);
      case ValueType::Float64: return cursor_.read<double>(field, part);
      case ValueType::Bool: {
        const uint64_t at = cursor_.pos();
        const auto byte = cursor_.read<uint8_t>(field, part);
        if (byte > 1) cursor_.fail(at, field.describe(part), "bool byte is " + num(byte) + ", not 0 or 1");
        return byte == 1;
      }
      case ValueType::String: return cursor_.read_string(field, part.empty() ? "length" : "value length");
      case ValueType::Array: return read_array(field, depth);
    }
    cursor_.fail(cursor_.pos(), field.describe(part), "unknown value type");
  }

  Array read_array(const Field& field, int depth) {
    if (depth > kMaxArrayDepth) {
      cursor_.fail(cursor_.pos(), field.describe(), "arrays nest deeper than " + num(kMaxArrayDepth) + " levels");
    }
    Array array;
    array.element_type = read_value_type(field, "element type");
    const uint64_t count_at = cursor_.pos();
    const auto count = cursor_.read<uint64_t>(field, "array count");
    const uint64_t min_bytes = min_encoded_bytes(array.element_type);
    check_count(count, min_bytes, count_at, field.describe("array count"),
                std::string(value_type_name(array.element_type)) + " item");
    values_read_ += count;
    if (values_read_ > kMaxMetadataValues) {
      cursor_.fail(count_at, field.describe("array count"),
                   "metadata would hold more than " + num(kMaxMetadataValues) + " values");
    }
    array.items.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) {
      const Field item{"item", &field, i, true};
      array.items.push_back(read_value(array.element_type, item, {}, depth + 1));
    }
    return array;
  }

  void read_alignment(ParsedFile& out) {
    const Value* value = out.metadata.find("general.alignment");
    if (!value) return;
    const uint64_t at = out.value_offset("general.alignment");
    const auto* alignment = std::get_if<uint32_t>(&value->storage);
    if (!alignment) {
      cursor_.fail(at, "general.alignment",
                   "must be uint32, found " + std::string(value_type_name(value->type())));
    }
    if (*alignment == 0 || !std::has_single_bit(*alignment)) {
      cursor_.fail(at, "general.alignment", num(*alignment) + " is not a non-zero power of two");
    }
    out.alignment = *alignment;
  }

  void read_tensor_infos(ParsedFile& out, uint64_t tensor_count) {
    // Checked again now that the metadata's bytes are spent.
    check_count(tensor_count, kMinTensorInfoBytes, 8, "tensor_count", "tensor info");
    out.tensors.reserve(static_cast<size_t>(tensor_count));
    out.tensor_info_offsets.reserve(static_cast<size_t>(tensor_count));
    offset_fields_.reserve(static_cast<size_t>(tensor_count));
    labels_.reserve(static_cast<size_t>(tensor_count));
    std::unordered_map<std::string, size_t> seen;
    for (uint64_t i = 0; i < tensor_count; ++i) {
      const std::string index_label = "tensor[" + num(i) + "]";
      const uint64_t name_at = cursor_.pos();
      out.tensor_info_offsets.push_back(name_at);
      TensorInfo info;
      info.name = cursor_.read_string(Field{index_label}, "name length");
      labels_.push_back(index_label + " " + quote_for_message(info.name));
      const Field field{labels_.back()};
      if (auto [it, inserted] = seen.emplace(info.name, static_cast<size_t>(i)); !inserted) {
        cursor_.fail(name_at, labels_.back(), "duplicate tensor name (first used by tensor[" + num(it->second) + "])");
      }
      read_shape(info, field);
      read_type(info, field);
      offset_fields_.push_back(cursor_.pos());
      info.data_offset = cursor_.read<uint64_t>(field, "offset");
      out.tensors.push_back(std::move(info));
    }
  }

  void read_shape(TensorInfo& info, const Field& field) {
    const uint64_t n_dims_at = cursor_.pos();
    const auto n_dims = cursor_.read<uint32_t>(field, "n_dims");
    if (n_dims > static_cast<uint32_t>(kMaxDimensions)) {
      cursor_.fail(n_dims_at, field.describe("n_dims"),
                   num(n_dims) + " dimensions, at most " + num(kMaxDimensions) + " are allowed");
    }
    constexpr auto kMaxElements = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    info.shape.resize(n_dims);
    bool any_zero = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t at = cursor_.pos();
      const Field dim{"dims", &field, d, true};
      info.shape[d] = cursor_.read<uint64_t>(dim);
      // ggml stores dimensions as int64: larger values are negative there.
      if (info.shape[d] > kMaxElements) cursor_.fail(at, dim.describe(), num(info.shape[d]) + " exceeds INT64_MAX");
      any_zero = any_zero || info.shape[d] == 0;
    }
    // No dimensions is a scalar (one element), as in ggml.
    uint64_t elements = any_zero ? 0 : 1;
    for (uint32_t d = 0; d < n_dims && elements != 0; ++d) {
      if (elements > kMaxElements / info.shape[d]) {
        cursor_.fail(n_dims_at + 4, field.describe("dims"), "element count overflows int64");
      }
      elements *= info.shape[d];
    }
    info.elements = elements;
  }

  void read_type(TensorInfo& info, const Field& field) {
    const uint64_t at = cursor_.pos();
    const auto number = cursor_.read<uint32_t>(field, "type");
    const TypeTraits* traits = find_type(number);
    if (!traits) {
      std::string reason(refusal_reason(number));
      if (reason.find("(" + num(number) + ")") == std::string::npos) reason += " " + num(number);
      cursor_.fail(at, field.describe("type"), reason);
    }
    info.type = traits->type;
    const uint64_t row = info.shape.empty() ? 1 : info.shape[0];
    if (row % traits->block_size != 0) {
      cursor_.fail(at, field.describe("type"),
                   "rows of " + num(row) + " elements are not a multiple of " + std::string(traits->name) +
                       "'s block size " + num(traits->block_size));
    }
    const std::optional<uint64_t> bytes = bytes_of(*traits, info.elements);
    if (!bytes) cursor_.fail(at, field.describe("type"), "size in bytes overflows 64 bits");
    info.bytes = *bytes;
  }

  // Places every tensor inside the data section: aligned, in bounds, not overlapping.
  void place_tensors(ParsedFile& out) {
    const uint64_t header_end = cursor_.pos();
    const uint64_t alignment = out.alignment;
    out.data_start = (header_end + alignment - 1) / alignment * alignment;
    const uint64_t data_size = cursor_.size() > out.data_start ? cursor_.size() - out.data_start : 0;
    for (size_t i = 0; i < out.tensors.size(); ++i) {
      TensorInfo& info = out.tensors[i];
      const std::string field = labels_[i] + " offset";
      if (info.data_offset % alignment != 0) {
        cursor_.fail(offset_fields_[i], field,
                     num(info.data_offset) + " is not a multiple of the alignment " + num(alignment));
      }
      if (info.data_offset > data_size || info.bytes > data_size - info.data_offset) {
        cursor_.fail(offset_fields_[i], field,
                     num(info.bytes) + " bytes at data offset " + num(info.data_offset) +
                         " run past the end of the data section (" + num(data_size) + " bytes from " +
                         hex(out.data_start) + ")");
      }
      info.file_offset = out.data_start + info.data_offset;
    }
    std::vector<size_t> order(out.tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&out](size_t a, size_t b) {
      const TensorInfo& x = out.tensors[a];
      const TensorInfo& y = out.tensors[b];
      return x.data_offset != y.data_offset ? x.data_offset < y.data_offset : x.bytes < y.bytes;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& before = out.tensors[order[k - 1]];
      const TensorInfo& after = out.tensors[order[k]];
      if (before.data_offset + before.bytes > after.data_offset) {
        cursor_.fail(offset_fields_[order[k]], labels_[order[k]] + " offset",
                     "data at " + num(after.data_offset) + " overlaps " + quote_for_message(before.name) +
                         " (data offsets " + num(before.data_offset) + " to " + num(before.data_offset + before.bytes) +
                         ")");
      }
    }
  }

  std::string path_;
  Cursor cursor_;
  uint64_t values_read_ = 0;
  std::vector<uint64_t> offset_fields_;  // where each tensor's offset field lies
  std::vector<std::string> labels_;      // "tensor[i] \"name\"" of each tensor
};

ParsedFile parse_file(std::unique_ptr<MappedFile> file) {
  ParsedFile parsed;
  HeaderParser(*file).parse(parsed);
  parsed.file = std::move(file);
  return parsed;
}

// split.no and split.count may be any integer type (llama.cpp writes uint16).
int64_t split_key(const ParsedFile& part, std::string_view key) {
  const Value* value = part.metadata.find(key);
  if (!value) throw FormatError(part.path(), kKvCountOffset, std::string(key), "missing in a part of a split model");
  const std::optional<int64_t> number = value->as_int();
  if (!number || value->type() == ValueType::Bool) {
    throw FormatError(part.path(), part.value_offset(key), std::string(key),
                      "must be an integer, found " + std::string(value_type_name(value->type())));
  }
  return *number;
}

// "dir/model-00002-of-00003.gguf" -> {"dir/model", 2, 3}.
struct SplitName {
  std::filesystem::path prefix;
  uint64_t number = 0;
  uint64_t count = 0;
};

std::optional<SplitName> parse_split_name(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  constexpr std::string_view kSuffix = ".gguf";
  if (name.size() < kSuffix.size() || name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
    return std::nullopt;
  }
  const std::string stem = name.substr(0, name.size() - kSuffix.size());
  const size_t of = stem.rfind("-of-");
  if (of == std::string::npos) return std::nullopt;
  const size_t dash = stem.rfind('-', of == 0 ? 0 : of - 1);
  if (dash == std::string::npos || dash >= of) return std::nullopt;
  auto parse_digits = [](std::string_view digits) -> std::optional<uint64_t> {
    if (digits.empty() || digits.size() > 9) return std::nullopt;
    uint64_t value = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      value = value * 10 + static_cast<uint64_t>(c - '0');
    }
    return value;
  };
  const auto number = parse_digits(std::string_view(stem).substr(dash + 1, of - dash - 1));
  const auto count = parse_digits(std::string_view(stem).substr(of + 4));
  if (!number || !count) return std::nullopt;
  return SplitName{path.parent_path() / stem.substr(0, dash), *number, *count};
}

}  // namespace

FormatError::FormatError(const std::string& path, uint64_t offset, const std::string& field, const std::string& what)
    : std::runtime_error(path + ": offset " + hex(offset) + ": " + field + ": " + what),
      field_(field),
      offset_(offset) {}

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), path.string() + ": cannot open");
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    throw std::system_error(error, std::generic_category(), path.string() + ": cannot stat");
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path.string() + ": not a regular file");
  }
  if (static_cast<uint64_t>(info.st_size) > std::numeric_limits<size_t>::max()) {
    ::close(fd);
    throw std::runtime_error(path.string() + ": too large to map on this machine");
  }
  size_ = static_cast<size_t>(info.st_size);
  if (size_ > 0) {  // mmap refuses a length of 0; an empty file reads as "too short"
    void* address = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      throw std::system_error(error, std::generic_category(), path.string() + ": cannot map");
    }
    data_ = static_cast<const uint8_t*>(address);
    mapped_ = true;
    // The header is parsed right away; tensor data is read later, as needed.
    constexpr uint64_t kHeaderReadAhead = 16u << 20;
    prefetch(0, kHeaderReadAhead);
  }
  ::close(fd);  // the mapping keeps the file open
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

std::unique_ptr<MappedFile> MappedFile::borrow(std::span<const uint8_t> bytes, std::filesystem::path name) {
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->path_ = std::move(name);
  file->data_ = bytes.data();
  file->size_ = bytes.size();
  return file;
}

void MappedFile::prefetch(uint64_t offset, uint64_t length) const {
  if (!mapped_ || offset >= size_) return;
  length = std::min<uint64_t>(length, size_ - offset);
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (page == 0 || page > (uint64_t{1} << 30)) return;
  const uint64_t start = offset / page * page;  // madvise wants a page-aligned address
  ::madvise(const_cast<uint8_t*>(data_) + start, static_cast<size_t>(length + (offset - start)), MADV_WILLNEED);
}

// Builds a Model from parsed files (one, or all parts of a split model).
class ModelAssembler {
 public:
  static std::unique_ptr<Model> from_parts(std::vector<ParsedFile> parts) {
    std::unique_ptr<Model> model(new Model());
    ParsedFile& first = parts.front();
    model->version_ = first.version;
    model->foreign_ = first.foreign;
    model->alignment_ = first.alignment;
    model->metadata_ = std::move(first.metadata);
    for (size_t index = 0; index < parts.size(); ++index) {
      ParsedFile& part = parts[index];
      if (part.foreign != model->foreign_) {
        throw FormatError(part.path(), 4, "version", "byte order differs from that of the first part");
      }
      for (size_t t = 0; t < part.tensors.size(); ++t) {
        TensorInfo& info = part.tensors[t];
        info.file_index = static_cast<uint32_t>(index);
        auto [it, inserted] = model->tensor_index_.emplace(info.name, model->tensors_.size());
        if (!inserted) {
          const TensorInfo& earlier = model->tensors_[it->second];
          throw FormatError(part.path(), part.tensor_info_offsets[t], "tensor " + quote_for_message(info.name),
                            "also present in part " + num(earlier.file_index + 1));
        }
        model->tensors_.push_back(std::move(info));
      }
      model->files_.push_back(std::move(part.file));
    }
    return model;
  }

  static std::unique_ptr<Model> open(const std::filesystem::path& path, const ReadOptions& options) {
    ParsedFile opened = parse_file(std::make_unique<MappedFile>(path));
    const Value* count_value = opened.metadata.find("split.count");
    if (!options.open_splits || !count_value) return single(std::move(opened));
    const int64_t count = split_key(opened, "split.count");
    const uint64_t count_at = opened.value_offset("split.count");
    if (count < 1) {
      throw FormatError(opened.path(), count_at, "split.count", "is " + std::to_string(count) + ", not a count of parts");
    }
    if (count == 1) return single(std::move(opened));

    const std::optional<SplitName> name = parse_split_name(path);
    if (!name || name->count != static_cast<uint64_t>(count) || name->number < 1 || name->number > name->count) {
      std::string digits = std::to_string(count);
      if (digits.size() < 5) digits.insert(0, 5 - digits.size(), '0');
      throw FormatError(opened.path(), count_at, "split.count",
                        "is " + std::to_string(count) + " but the file name does not end in -0000i-of-" + digits +
                            ".gguf, so its sibling parts cannot be found");
    }
    // Not reserved: the count is only as trustworthy as the parts that turn up.
    std::vector<ParsedFile> parts;
    uint64_t tensor_total = 0;
    const auto opened_index = static_cast<int64_t>(name->number - 1);
    for (int64_t i = 0; i < count; ++i) {
      if (i == opened_index) {
        parts.push_back(std::move(opened));
      } else {
        const std::filesystem::path sibling =
            split_path(name->prefix, static_cast<int>(i + 1), static_cast<int>(count));
        std::unique_ptr<MappedFile> file;
        try {
          file = std::make_unique<MappedFile>(sibling);
        } catch (const std::exception& error) {
          throw FormatError(path.string(), count_at, "split.count",
                            "part " + num(static_cast<uint64_t>(i + 1)) + " of " + num(static_cast<uint64_t>(count)) +
                                " cannot be opened: " + error.what());
        }
        parts.push_back(parse_file(std::move(file)));
      }
      const ParsedFile& part = parts.back();
      const int64_t part_count = split_key(part, "split.count");
      if (part_count != count) {
        throw FormatError(part.path(), part.value_offset("split.count"), "split.count",
                          "is " + std::to_string(part_count) + " but part " + num(name->number) + " says " +
                              std::to_string(count));
      }
      const int64_t part_no = split_key(part, "split.no");
      if (part_no != i) {
        throw FormatError(part.path(), part.value_offset("split.no"), "split.no",
                          "is " + std::to_string(part_no) + " but the file is part " +
                              num(static_cast<uint64_t>(i + 1)) + " (split.no counts from 0, expected " +
                              std::to_string(i) + ")");
      }
      tensor_total += part.tensors.size();
    }
    check_tensor_total(parts.front(), tensor_total);
    return from_parts(std::move(parts));
  }

  static std::unique_ptr<Model> single(ParsedFile parsed) {
    std::vector<ParsedFile> parts;
    parts.push_back(std::move(parsed));
    return from_parts(std::move(parts));
  }

 private:
  static void check_tensor_total(const ParsedFile& first, uint64_t tensor_total) {
    const Value* total = first.metadata.find("split.tensors.count");
    if (!total) return;
    const std::optional<int64_t> expected = total->as_int();
    if (!expected || *expected < 0 || static_cast<uint64_t>(*expected) != tensor_total) {
      throw FormatError(first.path(), first.value_offset("split.tensors.count"), "split.tensors.count",
                        "is " + to_display_string(*total) + " but the parts hold " + num(tensor_total) + " tensors");
    }
  }
};

std::unique_ptr<Model> Model::open(const std::filesystem::path& path, const ReadOptions& options) {
  return ModelAssembler::open(path, options);
}

std::unique_ptr<Model> Model::open_memory(std::span<const uint8_t> bytes, const std::string& name) {
  return ModelAssembler::single(parse_file(MappedFile::borrow(bytes, name)));
}

bool Model::big_endian() const { return foreign_ != (std::endian::native == std::endian::big); }

const TensorInfo* Model::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

size_t Model::index_of(const TensorInfo& tensor) const {
  auto it = tensor_index_.find(tensor.name);
  if (it != tensor_index_.end()) {
    const TensorInfo& own = tensors_[it->second];
    if (own.file_index == tensor.file_index && own.file_offset == tensor.file_offset && own.bytes == tensor.bytes) {
      return it->second;
    }
  }
  throw std::invalid_argument("tensor " + quote_for_message(tensor.name) + " is not one of this model's tensors");
}

std::span<const uint8_t> Model::tensor_data(const TensorInfo& tensor) const {
  const size_t index = index_of(tensor);
  const TensorInfo& own = tensors_[index];
  // An empty tensor's offset may lie past the end of a file that has no data section.
  if (own.bytes == 0) return {};
  // In bounds: checked against the file when the header was read.
  const std::span<const uint8_t> stored =
      files_[own.file_index]->bytes().subspan(static_cast<size_t>(own.file_offset), static_cast<size_t>(own.bytes));
  if (!foreign_) return stored;
  {
    std::lock_guard<std::mutex> lock(swapped_mutex_);
    if (auto it = swapped_.find(index); it != swapped_.end()) return it->second;
  }
  // Swap outside the lock so threads reading other tensors do not wait; if two
  // threads race on one tensor, the first copy stored wins.
  std::vector<uint8_t> copy(stored.begin(), stored.end());
  const TypeTraits& traits = type_traits(own.type);
  byteswap_blocks(traits, copy.data(), own.bytes / traits.block_bytes);
  std::lock_guard<std::mutex> lock(swapped_mutex_);
  auto [it, inserted] = swapped_.emplace(index, std::move(copy));
  return it->second;
}

void Model::prefetch(const TensorInfo& tensor) const {
  const TensorInfo& own = tensors_[index_of(tensor)];
  files_[own.file_index]->prefetch(own.file_offset, own.bytes);
}

}  // namespace pico::gguf
