// GGUF metadata values: the thirteen value types of the format, arrays included
// (arrays of strings, and arrays of arrays).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <unordered_map>
#include <variant>
#include <vector>

namespace pico::gguf {

enum class ValueType : uint32_t {
  UInt8 = 0,
  Int8 = 1,
  UInt16 = 2,
  Int16 = 3,
  UInt32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  UInt64 = 10,
  Int64 = 11,
  Float64 = 12,
};

std::string_view value_type_name(ValueType type);

struct Value;

struct Array {
  ValueType element_type = ValueType::UInt8;
  std::vector<Value> items;
};

struct Value {
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
                               Array, uint64_t, int64_t, double>;
  Storage storage;

  Value() = default;
  template <typename T>
    requires std::is_constructible_v<Storage, T&&>
  Value(T&& v) : storage(std::forward<T>(v)) {}  // NOLINT: values convert implicitly
  Value(const char* s) : storage(std::string(s)) {}

  ValueType type() const { return static_cast<ValueType>(storage.index()); }
  const Array* array() const { return std::get_if<Array>(&storage); }
  const std::string* string() const { return std::get_if<std::string>(&storage); }
  // Any integer type (or bool) as a 64-bit integer; nullopt for others and for
  // unsigned values above INT64_MAX.
  std::optional<int64_t> as_int() const;
  // Any numeric type as a double.
  std::optional<double> as_float() const;
};

// Builds an array value from a list of values of one type (std::invalid_argument if
// an item has another type).
Array make_array(ValueType element_type, std::vector<Value> items);
Array string_array(const std::vector<std::string>& items);

// Same type and same contents; floats compare by bit pattern (as stored in a file:
// NaN equals itself, -0.0 differs from 0.0).
bool operator==(const Array& a, const Array& b);
bool operator==(const Value& a, const Value& b);

// Key/value pairs in file order, with lookup by key.
class Metadata {
 public:
  void set(std::string key, Value value);  // replaces an existing key in place
  const Value* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  bool erase(std::string_view key);

  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string_view> get_string(std::string_view key) const;
  const Array* get_array(std::string_view key) const;

  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// Short human-readable rendering, long arrays abbreviated ("[1, 2, 3, ... 32000 items]").
std::string to_display_string(const Value& value, size_t max_items = 8);

}  // namespace pico::gguf
