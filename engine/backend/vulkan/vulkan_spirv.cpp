#include <cstddef>
#include <map>
#include <set>

#include "backend/vulkan/vulkan_shaders.hpp"

namespace pico::backend::vulkan {

// Reads the decorations glslc writes for `readonly` buffers: NonWritable on every member
// of the block's struct (or on the variable itself), and the Binding of each variable.
uint32_t written_bindings(std::span<const uint32_t> words) {
  enum : uint32_t {
    kOpTypeStruct = 30,
    kOpTypePointer = 32,
    kOpVariable = 59,
    kOpDecorate = 71,
    kOpMemberDecorate = 72,
    kNonWritable = 24,
    kBinding = 33,
  };
  std::map<uint32_t, uint32_t> binding_of;        // variable -> binding
  std::set<uint32_t> non_writable;                // variables decorated so
  std::map<uint32_t, std::set<uint32_t>> read_only_members;  // struct -> members decorated so
  std::map<uint32_t, size_t> members;             // struct -> member count
  std::map<uint32_t, uint32_t> pointee;           // pointer type -> type
  std::map<uint32_t, uint32_t> type_of;           // variable -> pointer type
  constexpr size_t kHeaderWords = 5;
  for (size_t at = kHeaderWords; at < words.size();) {
    const uint32_t count = words[at] >> 16, op = words[at] & 0xffffu;
    if (count == 0 || at + count > words.size()) break;  // not SPIR-V past here
    const uint32_t* w = &words[at];
    if (op == kOpDecorate && count >= 3) {
      if (w[2] == kBinding && count >= 4) binding_of[w[1]] = w[3];
      if (w[2] == kNonWritable) non_writable.insert(w[1]);
    } else if (op == kOpMemberDecorate && count >= 4 && w[3] == kNonWritable) {
      read_only_members[w[1]].insert(w[2]);
    } else if (op == kOpTypeStruct && count >= 2) {
      members[w[1]] = count - 2;
    } else if (op == kOpTypePointer && count >= 4) {
      pointee[w[1]] = w[3];
    } else if (op == kOpVariable && count >= 4) {
      type_of[w[2]] = w[1];
    }
    at += count;
  }
  uint32_t written = 0;
  for (const auto& [variable, binding] : binding_of) {
    if (binding >= 32 || non_writable.count(variable)) continue;
    bool read_only = false;
    if (const auto t = type_of.find(variable); t != type_of.end()) {
      if (const auto p = pointee.find(t->second); p != pointee.end()) {
        const auto m = members.find(p->second);
        const auto r = read_only_members.find(p->second);
        read_only = m != members.end() && r != read_only_members.end() && m->second > 0 && r->second.size() == m->second;
      }
    }
    if (!read_only) written |= 1u << binding;
  }
  return written;
}

}  // namespace pico::backend::vulkan
