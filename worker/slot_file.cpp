#include "slot_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace pico::worker {

namespace {

constexpr char kMagic[8] = {'P', 'I', 'C', 'O', 'S', 'L', 'O', 'T'};
constexpr uint32_t kVersion = 1;

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

class Reader {
 public:
  Reader(const std::string& bytes, const std::string& what) : bytes_(bytes), what_(what) {}
  template <class T>
  T get() {
    T value;
    need(sizeof value);
    std::memcpy(&value, bytes_.data() + at_, sizeof value);
    at_ += sizeof value;
    return value;
  }
  const char* take(size_t n) {
    need(n);
    const char* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  size_t left() const { return bytes_.size() - at_; }

 private:
  void need(size_t n) const {
    if (n > left()) throw std::invalid_argument(what_ + " is truncated");
  }
  const std::string& bytes_;
  std::string what_;
  size_t at_ = 0;
};

}  // namespace

std::filesystem::path slot_file_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) throw std::invalid_argument("slots on disk are off (start with --slot-save-path DIR)");
  const bool printable = std::all_of(name.begin(), name.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f && c != '/' && c != '\\';
  });
  if (name.empty() || name.size() > 255 || name == "." || name == ".." || !printable) {
    throw std::invalid_argument("slot file name '" + name + "' is not a plain file name");
  }
  return std::filesystem::path(dir) / name;
}

uint64_t save_slot(const StageEngine& engine, int32_t seq_id, const std::filesystem::path& path,
                   std::span<const int32_t> tokens) {
  const auto state = engine.snapshot(seq_id);
  if (!state) throw std::invalid_argument("sequence " + std::to_string(seq_id) + " is not open on this stage");
  if (state->n_pos < static_cast<int64_t>(tokens.size())) {
    throw std::invalid_argument("sequence " + std::to_string(seq_id) + " holds " + std::to_string(state->n_pos) +
                                " positions, not the " + std::to_string(tokens.size()) + " tokens given");
  }
  std::string out(kMagic, sizeof kMagic);
  put(out, kVersion);
  put(out, engine.identity().hash);
  put(out, engine.layers().first);
  put(out, engine.layers().last);
  put(out, static_cast<uint64_t>(tokens.size()));
  for (const int32_t t : tokens) put(out, t);
  put(out, static_cast<uint64_t>(state->bytes.size()));
  out.append(reinterpret_cast<const char*>(state->bytes.data()), state->bytes.size());
  const std::filesystem::path temporary = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file.write(out.data(), static_cast<std::streamsize>(out.size()));
    if (!file) {
      std::error_code ec;
      std::filesystem::remove(temporary, ec);
      throw std::runtime_error("cannot write slot file " + path.string());
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) throw std::runtime_error("cannot write slot file " + path.string() + ": " + ec.message());
  return state->bytes.size();
}

std::vector<int32_t> restore_slot(StageEngine& engine, int32_t seq_id, const std::filesystem::path& path) {
  const std::string what = "slot file " + path.filename().string();
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw std::invalid_argument(what + ": no such file");
  // A state no larger than this stage's budget for all sequences, tokens no more than
  // its context: the file is read whole only then.
  const uint64_t most = engine.limits().state_budget_bytes + 64 +
                        4 * static_cast<uint64_t>(std::max<int64_t>(engine.limits().max_positions, 0) + 1);
  if (size > most) throw std::invalid_argument(what + " holds " + std::to_string(size) + " bytes, more than this stage holds");
  std::string bytes(static_cast<size_t>(size), '\0');
  {
    std::ifstream file(path, std::ios::binary);
    file.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!file) throw std::invalid_argument(what + ": cannot read it");
  }
  Reader in(bytes, what);
  if (std::memcmp(in.take(sizeof kMagic), kMagic, sizeof kMagic) != 0) throw std::invalid_argument(what + " is not a slot file");
  if (in.get<uint32_t>() != kVersion) throw std::invalid_argument(what + " is of another version");
  if (in.get<uint64_t>() != engine.identity().hash) throw std::invalid_argument(what + " is another model's");
  const auto first = in.get<int32_t>(), last = in.get<int32_t>();
  if (first != engine.layers().first || last != engine.layers().last) {
    throw std::invalid_argument(what + " holds layers " + std::to_string(first) + "-" + std::to_string(last - 1) +
                                ", this stage runs " + std::to_string(engine.layers().first) + "-" +
                                std::to_string(engine.layers().last - 1));
  }
  const auto n_tokens = in.get<uint64_t>();
  if (n_tokens > in.left() / sizeof(int32_t)) throw std::invalid_argument(what + " is truncated");
  std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
  std::memcpy(tokens.data(), in.take(tokens.size() * sizeof(int32_t)), tokens.size() * sizeof(int32_t));
  const auto n_state = in.get<uint64_t>();
  if (n_state != in.left()) throw std::invalid_argument(what + " is truncated or has bytes after its state");
  const char* state = in.take(static_cast<size_t>(n_state));
  engine.restore(seq_id, std::span(reinterpret_cast<const uint8_t*>(state), static_cast<size_t>(n_state)));
  return tokens;
}

}  // namespace pico::worker
