#include "gguf/value.hpp"

#include <bit>
#include <charconv>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <type_traits>

namespace pico::gguf {

std::string_view value_type_name(ValueType type) {
  switch (type) {
    case ValueType::UInt8: return "uint8";
    case ValueType::Int8: return "int8";
    case ValueType::UInt16: return "uint16";
    case ValueType::Int16: return "int16";
    case ValueType::UInt32: return "uint32";
    case ValueType::Int32: return "int32";
    case ValueType::Float32: return "float32";
    case ValueType::Bool: return "bool";
    case ValueType::String: return "string";
    case ValueType::Array: return "array";
    case ValueType::UInt64: return "uint64";
    case ValueType::Int64: return "int64";
    case ValueType::Float64: return "float64";
  }
  return "unknown";
}

std::optional<int64_t> Value::as_int() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return v ? 1 : 0;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(v);
        } else if constexpr (std::is_integral_v<T>) {
          return static_cast<int64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      storage);
}

std::optional<double> Value::as_float() const {
  return std::visit(
      [](const auto& v) -> std::optional<double> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return std::nullopt;  // a flag is not a number
        } else if constexpr (std::is_arithmetic_v<T>) {
          return static_cast<double>(v);
        } else {
          return std::nullopt;
        }
      },
      storage);
}

Array make_array(ValueType element_type, std::vector<Value> items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].type() != element_type) {
      throw std::invalid_argument("make_array: item " + std::to_string(i) + " is " +
                                  std::string(value_type_name(items[i].type())) + ", not " +
                                  std::string(value_type_name(element_type)));
    }
  }
  return Array{element_type, std::move(items)};
}

Array string_array(const std::vector<std::string>& items) {
  Array array{ValueType::String, {}};
  array.items.reserve(items.size());
  for (const std::string& item : items) array.items.emplace_back(item);
  return array;
}

bool operator==(const Array& a, const Array& b) { return a.element_type == b.element_type && a.items == b.items; }

bool operator==(const Value& a, const Value& b) {
  if (a.storage.index() != b.storage.index()) return false;
  return std::visit(
      [&b](const auto& left) {
        using T = std::decay_t<decltype(left)>;
        const T& right = std::get<T>(b.storage);
        // Floats compare by bit pattern: equal means "the same bytes in a file", so a
        // NaN equals itself and -0.0 differs from 0.0.
        if constexpr (std::is_same_v<T, float>) {
          return std::bit_cast<uint32_t>(left) == std::bit_cast<uint32_t>(right);
        } else if constexpr (std::is_same_v<T, double>) {
          return std::bit_cast<uint64_t>(left) == std::bit_cast<uint64_t>(right);
        } else {
          return left == right;
        }
      },
      a.storage);
}

void Metadata::set(std::string key, Value value) {
  if (auto it = index_.find(key); it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

const Value* Metadata::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

bool Metadata::erase(std::string_view key) {
  auto it = index_.find(std::string(key));
  if (it == index_.end()) return false;
  const size_t position = it->second;
  index_.erase(it);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(position));
  // Later entries moved down by one.
  for (auto& [name, slot] : index_) {
    if (slot > position) --slot;
  }
  return true;
}

std::optional<int64_t> Metadata::get_int(std::string_view key) const {
  const Value* value = find(key);
  return value ? value->as_int() : std::nullopt;
}

std::optional<double> Metadata::get_float(std::string_view key) const {
  const Value* value = find(key);
  return value ? value->as_float() : std::nullopt;
}

std::optional<bool> Metadata::get_bool(std::string_view key) const {
  const Value* value = find(key);
  if (!value) return std::nullopt;
  const bool* flag = std::get_if<bool>(&value->storage);
  return flag ? std::optional<bool>(*flag) : std::nullopt;
}

std::optional<std::string_view> Metadata::get_string(std::string_view key) const {
  const Value* value = find(key);
  const std::string* text = value ? value->string() : nullptr;
  return text ? std::optional<std::string_view>(*text) : std::nullopt;
}

const Array* Metadata::get_array(std::string_view key) const {
  const Value* value = find(key);
  return value ? value->array() : nullptr;
}

namespace {

template <typename Float>
void append_float(std::string& out, Float v) {
  char buffer[64];
  // Shortest text that reads back to the same value.
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), v);
  out.append(buffer, result.ptr);
}

void append_quoted(std::string& out, const std::string& text) {
  out += '"';
  for (char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (byte < 0x20 || byte == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
          out += escaped;
        } else {
          out += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
}

void append_value(std::string& out, const Value& value, size_t max_items) {
  std::visit(
      [&out, max_items](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          out += v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          append_quoted(out, v);
        } else if constexpr (std::is_same_v<T, Array>) {
          out += '[';
          const size_t shown = v.items.size() <= max_items ? v.items.size() : max_items;
          for (size_t i = 0; i < shown; ++i) {
            if (i > 0) out += ", ";
            append_value(out, v.items[i], max_items);
          }
          if (shown < v.items.size()) {
            out += shown > 0 ? ", ... " : "... ";
            out += std::to_string(v.items.size()) + " items";
          }
          out += ']';
        } else if constexpr (std::is_floating_point_v<T>) {
          append_float(out, v);
        } else {
          // int8/uint8 print as numbers, not characters.
          out += std::to_string(static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(v));
        }
      },
      value.storage);
}

}  // namespace

std::string to_display_string(const Value& value, size_t max_items) {
  std::string out;
  append_value(out, value, max_items);
  return out;
}

}  // namespace pico::gguf
