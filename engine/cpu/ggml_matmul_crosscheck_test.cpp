// pico's matmul against llama.cpp's own, output for output: ggml's GGML_OP_MUL_MAT on
// its CPU backend (node-llama-cpp's prebuilt libraries, loaded at run time from
// $PICO_GGML_LIB_DIR; ctest sets it, and the test fails without it), with the weight
// in a plain CPU buffer and in the CPU "repack" buffer (llama.cpp's default for the
// types it interleaves), against pico's matmul at every CPU level the host runs.
//
// Random-weight models turn a last-bit difference in one matmul output into another
// 8-bit activation code, so kernels that aim at llama.cpp's numbers must perform its
// float operations in its order. This test is the per-type oracle for that work: it
// prints, per (type, ggml build, weight buffer, pico level), the fraction of outputs
// that are bit-identical and the largest ulp distance, and fails when a cell listed
// as exact in kExpected is not.
//
// ggml builds: the one llama.cpp picks on this host (highest ggml_backend_score among
// libggml-cpu-*.so, as ggml's loader does) and the AVX2-only "haswell" build.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "cpu/matmul.hpp"
#include "cpu/test_support.hpp"

namespace pico::cpu {
namespace {

// ---- Expected exactness, one line per weight type: flip a character when a kernel
// changes. Four columns: {reference build, AVX2 build} x {plain buffer, repack buffer};
// in each, one character per pico level scalar, avx2, avx512:
//   'x' every output bit-identical for every token count (asserted),
//   'g' bit-identical for the tokens llama.cpp's repacked gemm computes (every
//       group of 4; the leftover tokens of a batch go through its gemv, which sums
//       in another order) (asserted),
//   '-' not (yet) identical (printed only),
//   '.' no such path (the build does not repack the type).
struct Expected {
  GgmlType type;
  const char* ref_plain;
  const char* ref_repack;
  const char* avx2_plain;
  const char* avx2_repack;
};

using T = GgmlType;
// clang-format off
constexpr Expected kExpected[] = {
    //              ref plain  ref repack  avx2 plain  avx2 repack
    {T::F32,        "---",     "...",      "---",      "..."},
    {T::F16,        "---",     "...",      "---",      "..."},
    {T::BF16,       "---",     "...",      "---",      "..."},
    {T::Q8_0,       "-xx",     "...",      "-xx",      "..."},
    {T::Q4_0,       "---",     "-xx",      "---",      "-xx"},
    {T::Q4_1,       "-xx",     "...",      "-xx",      "..."},
    {T::Q5_0,       "-xx",     "...",      "-xx",      "..."},
    {T::Q5_1,       "-xx",     "...",      "-xx",      "..."},
    {T::Q2_K,       "-x-",     "--g",      "-x-",      "..."},
    {T::Q3_K,       "-xx",     "...",      "-xx",      "..."},
    {T::Q4_K,       "---",     "-gg",      "---",      "-gg"},
    {T::Q5_K,       "-xx",     "...",      "-xx",      "..."},
    {T::Q6_K,       "-xx",     "...",      "-xx",      "..."},
    {T::IQ4_NL,     "---",     "-xx",      "---",      "-xx"},
};
// clang-format on

constexpr int64_t kRows = 64;  // a multiple of 8: the repacked layouts interleave 8 rows
constexpr int64_t kCols = 1024;
constexpr int64_t kTokenCounts[] = {1, 3, 4, 5, 17, 64};
constexpr int64_t kMaxTokens = 64;

// ---- The few ggml entry points used, declared by hand (ggml.h, ggml-backend.h,
// ggml-alloc.h, ggml-cpu.h of the v0.4.0 build). Enums are int-sized; ggml's type
// numbers are pico's GgmlType values.
struct GgmlInitParams {
  size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
static_assert(sizeof(GgmlInitParams) == 24);

struct GgmlContext;
struct GgmlTensor;
struct GgmlGraph;
struct GgmlBackend;
struct GgmlBuffer;
struct GgmlBufferType;
constexpr int kGgmlStatusSuccess = 0;
constexpr int kGgmlTypeF32 = 0;

struct GgmlApi {
  // libggml-base
  GgmlContext* (*init)(GgmlInitParams) = nullptr;
  void (*free)(GgmlContext*) = nullptr;
  size_t (*tensor_overhead)() = nullptr;
  size_t (*graph_overhead)() = nullptr;
  GgmlTensor* (*new_tensor_2d)(GgmlContext*, int, int64_t, int64_t) = nullptr;
  GgmlTensor* (*mul_mat)(GgmlContext*, GgmlTensor*, GgmlTensor*) = nullptr;
  GgmlGraph* (*new_graph)(GgmlContext*) = nullptr;
  void (*build_forward_expand)(GgmlGraph*, GgmlTensor*) = nullptr;
  GgmlBufferType* (*cpu_buffer_type)() = nullptr;
  GgmlBuffer* (*alloc_ctx_tensors_from_buft)(GgmlContext*, GgmlBufferType*) = nullptr;
  void (*buffer_free)(GgmlBuffer*) = nullptr;
  void (*tensor_set)(GgmlTensor*, const void*, size_t, size_t) = nullptr;
  void (*tensor_get)(const GgmlTensor*, void*, size_t, size_t) = nullptr;
  int (*graph_compute)(GgmlBackend*, GgmlGraph*) = nullptr;
  bool (*supports_op)(GgmlBackend*, const GgmlTensor*) = nullptr;
  void (*backend_free)(GgmlBackend*) = nullptr;
  void (*log_set)(void (*)(int, const char*, void*), void*) = nullptr;
  // libggml-cpu-*
  int (*score)() = nullptr;
  GgmlBackend* (*cpu_init)() = nullptr;
  void (*cpu_set_n_threads)(GgmlBackend*, int) = nullptr;
  int (*cpu_has_llamafile)() = nullptr;
  GgmlBufferType* (*repack_buffer_type)() = nullptr;  // C++: ggml_backend_cpu_repack_buffer_type()
};

// ggml's log: warnings and errors only (GGML_LOG_LEVEL_WARN 3, ERROR 4), not the
// "repack tensor ..." notes that would cut through the table.
void quiet_log(int level, const char* text, void*) {
  if (level == 3 || level == 4) std::fputs(text, stderr);
}

template <class Fn>
void bind(void* handle, Fn& fn, const char* name, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));  // searches the library's dependencies too
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
}

// One libggml-cpu-*.so (with the libggml-base.so next to it, found by its RUNPATH).
struct GgmlCpuLibrary {
  std::string name;  // "zen4", "haswell", ...
  void* handle = nullptr;
  GgmlApi api;
};

// Opens `path` and binds the API; returns an empty name (and says why) on failure.
GgmlCpuLibrary open_library(const std::filesystem::path& path, std::string& error) {
  GgmlCpuLibrary lib;
  lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib.handle) {
    error = dlerror();
    return {};
  }
  std::string missing;
  GgmlApi& a = lib.api;
  bind(lib.handle, a.init, "ggml_init", missing);
  bind(lib.handle, a.free, "ggml_free", missing);
  bind(lib.handle, a.tensor_overhead, "ggml_tensor_overhead", missing);
  bind(lib.handle, a.graph_overhead, "ggml_graph_overhead", missing);
  bind(lib.handle, a.new_tensor_2d, "ggml_new_tensor_2d", missing);
  bind(lib.handle, a.mul_mat, "ggml_mul_mat", missing);
  bind(lib.handle, a.new_graph, "ggml_new_graph", missing);
  bind(lib.handle, a.build_forward_expand, "ggml_build_forward_expand", missing);
  bind(lib.handle, a.cpu_buffer_type, "ggml_backend_cpu_buffer_type", missing);
  bind(lib.handle, a.alloc_ctx_tensors_from_buft, "ggml_backend_alloc_ctx_tensors_from_buft", missing);
  bind(lib.handle, a.buffer_free, "ggml_backend_buffer_free", missing);
  bind(lib.handle, a.tensor_set, "ggml_backend_tensor_set", missing);
  bind(lib.handle, a.tensor_get, "ggml_backend_tensor_get", missing);
  bind(lib.handle, a.graph_compute, "ggml_backend_graph_compute", missing);
  bind(lib.handle, a.supports_op, "ggml_backend_supports_op", missing);
  bind(lib.handle, a.backend_free, "ggml_backend_free", missing);
  bind(lib.handle, a.log_set, "ggml_log_set", missing);
  bind(lib.handle, a.score, "ggml_backend_score", missing);
  bind(lib.handle, a.cpu_init, "ggml_backend_cpu_init", missing);
  bind(lib.handle, a.cpu_set_n_threads, "ggml_backend_cpu_set_n_threads", missing);
  bind(lib.handle, a.cpu_has_llamafile, "ggml_cpu_has_llamafile", missing);
  bind(lib.handle, a.repack_buffer_type, "_Z35ggml_backend_cpu_repack_buffer_typev", missing);
  if (!missing.empty()) {
    error = path.string() + " lacks " + missing;
    dlclose(lib.handle);
    return {};
  }
  lib.name = path.stem().string().substr(std::string("libggml-cpu-").size());
  return lib;
}

// The build llama.cpp's loader would pick (highest score) and the AVX2 build, as far
// as the host runs them. Libraries stay loaded for the whole process.
std::vector<GgmlCpuLibrary> open_libraries(const std::filesystem::path& dir, std::string& error) {
  std::vector<GgmlCpuLibrary> candidates;
  if (!std::filesystem::is_directory(dir)) {
    error = dir.string() + " is not a directory (scripts/setup.sh installs node-llama-cpp)";
    return {};
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("libggml-cpu-", 0) != 0 || entry.path().extension() != ".so") continue;
    GgmlCpuLibrary lib = open_library(entry.path(), error);
    if (lib.name.empty()) return {};
    if (lib.api.score() > 0) {
      candidates.push_back(lib);
    } else {
      dlclose(lib.handle);
    }
  }
  if (candidates.empty()) {
    error = "no libggml-cpu-*.so in " + dir.string() + " runs on this host";
    return {};
  }
  auto best = std::max_element(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    return a.api.score() < b.api.score();
  });
  std::vector<GgmlCpuLibrary> chosen = {*best};
  for (const GgmlCpuLibrary& lib : candidates) {
    if (lib.name == "haswell" && lib.handle != best->handle) chosen.push_back(lib);
  }
  return chosen;
}

enum class WeightBuffer { plain, repack };

// One weight matrix in a ggml buffer (plain or repack) on a 1-thread CPU backend;
// run() gives MUL_MAT with the first `tokens` rows of x, y[t * kRows + r]. usable() is
// false when the buffer does not take the weight type (repack of a type this build
// does not interleave).
class GgmlMatmul {
 public:
  GgmlMatmul(const GgmlApi& api, GgmlType type, WeightBuffer where, const std::vector<uint8_t>& weight)
      : api_(api) {
    backend_ = api.cpu_init();
    api.cpu_set_n_threads(backend_, 1);
    weight_ctx_ = api.init({api.tensor_overhead() * 2, nullptr, true});
    weight_ = api.new_tensor_2d(weight_ctx_, static_cast<int>(type), kCols, kRows);
    GgmlBufferType* buft = where == WeightBuffer::repack ? api.repack_buffer_type() : api.cpu_buffer_type();
    weight_buffer_ = api.alloc_ctx_tensors_from_buft(weight_ctx_, buft);
    // Ask before writing the weight: the repack buffer's set_tensor crashes on a type
    // it cannot interleave, and its supports_op says which ones it can.
    Graph probe = build(1);
    usable_ = api.supports_op(backend_, probe.y);
    release(probe);
    if (usable_) api.tensor_set(weight_, weight.data(), 0, weight.size());
  }
  ~GgmlMatmul() {
    api_.buffer_free(weight_buffer_);
    api_.free(weight_ctx_);
    api_.backend_free(backend_);
  }
  GgmlMatmul(const GgmlMatmul&) = delete;
  GgmlMatmul& operator=(const GgmlMatmul&) = delete;

  bool usable() const { return usable_; }

  std::vector<float> run(const std::vector<float>& x, int64_t tokens) {
    Graph g = build(tokens);
    api_.tensor_set(g.x, x.data(), 0, static_cast<size_t>(tokens * kCols) * sizeof(float));
    std::vector<float> y(static_cast<size_t>(tokens * kRows));
    const int status = api_.graph_compute(backend_, g.graph);
    if (status == kGgmlStatusSuccess) api_.tensor_get(g.y, y.data(), 0, y.size() * sizeof(float));
    release(g);
    if (status != kGgmlStatusSuccess) ADD_FAILURE() << "ggml_backend_graph_compute: status " << status;
    return y;
  }

 private:
  struct Graph {
    GgmlContext* ctx;
    GgmlBuffer* buffer;
    GgmlTensor* x;
    GgmlTensor* y;
    GgmlGraph* graph;
  };

  Graph build(int64_t tokens) {
    Graph g{};
    g.ctx = api_.init({api_.tensor_overhead() * 4 + api_.graph_overhead(), nullptr, true});
    g.x = api_.new_tensor_2d(g.ctx, kGgmlTypeF32, kCols, tokens);
    g.y = api_.mul_mat(g.ctx, weight_, g.x);
    g.graph = api_.new_graph(g.ctx);
    api_.build_forward_expand(g.graph, g.y);
    g.buffer = api_.alloc_ctx_tensors_from_buft(g.ctx, api_.cpu_buffer_type());
    return g;
  }
  void release(Graph& g) {
    api_.buffer_free(g.buffer);
    api_.free(g.ctx);
  }

  const GgmlApi& api_;
  GgmlBackend* backend_ = nullptr;
  GgmlContext* weight_ctx_ = nullptr;
  GgmlTensor* weight_ = nullptr;
  GgmlBuffer* weight_buffer_ = nullptr;
  bool usable_ = false;
};

// Distance in representable floats (0: same bits, or +0 vs -0).
int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : static_cast<int64_t>(i);
  };
  return std::llabs(ordered(a) - ordered(b));
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Outputs near zero (cancellation) show large ulp distances for an error that is
// small at the scale of the row, so the largest difference is also given in ulps of
// the largest |output|.
struct Agreement {
  int64_t identical = 0, total = 0, max_ulp = 0;
  float max_difference = 0.0f, max_magnitude = 0.0f;
  void add(float want, float got) {
    ++total;
    if (same_bits(want, got)) ++identical;
    max_ulp = std::max(max_ulp, ulp_distance(want, got));
    max_difference = std::max(max_difference, std::fabs(want - got));
    max_magnitude = std::max(max_magnitude, std::fabs(want));
  }
  bool exact() const { return identical == total; }
  double percent_identical() const { return 100.0 * static_cast<double>(identical) / static_cast<double>(total); }
  double ulps_at_scale() const {
    const float ulp = std::nextafter(max_magnitude, INFINITY) - max_magnitude;
    return static_cast<double>(max_difference) / static_cast<double>(ulp);
  }
};

// "ident% max-ulp scaled-ulp", 19 characters.
std::string cell(const Agreement& a) {
  char text[40];
  std::snprintf(text, sizeof text, "%5.1f%% %6lld %4.1f", a.percent_identical(), static_cast<long long>(a.max_ulp),
                a.ulps_at_scale());
  return text;
}

using ResultsByTokens = std::map<int64_t, std::vector<float>>;

// Prints one row's cells (`got` against `want`, per token count) and returns the
// agreement over all of them.
// Over the tokens of each count that lie in a full group of 4 (llama.cpp's repacked
// gemm; the rest of a batch goes through its gemv).
Agreement gemm_groups(const ResultsByTokens& want, const ResultsByTokens& got) {
  Agreement a;
  for (int64_t n : kTokenCounts) {
    const size_t in_groups = static_cast<size_t>((n - n % 4) * kRows);
    for (size_t i = 0; i < in_groups; ++i) a.add(want.at(n)[i], got.at(n)[i]);
  }
  return a;
}

Agreement print_cells(const ResultsByTokens& want, const ResultsByTokens& got) {
  Agreement overall;
  for (int64_t n : kTokenCounts) {
    Agreement a;
    const std::vector<float>& w = want.at(n);
    const std::vector<float>& g = got.at(n);
    for (size_t i = 0; i < g.size(); ++i) {
      a.add(w[i], g[i]);
      overall.add(w[i], g[i]);
    }
    std::printf(" %s |", cell(a).c_str());
  }
  return overall;
}

// With PICO_CROSSCHECK_DETAIL=n set: the first n differing outputs of a row (at the
// smallest token count that has any), for whoever is chasing the operation order.
void print_mismatches(const ResultsByTokens& want, const ResultsByTokens& got) {
  const char* setting = std::getenv("PICO_CROSSCHECK_DETAIL");
  const long limit = setting ? std::strtol(setting, nullptr, 10) : 0;
  if (limit <= 0) return;
  for (int64_t n : kTokenCounts) {
    const std::vector<float>& w = want.at(n);
    const std::vector<float>& g = got.at(n);
    long shown = 0;
    for (size_t i = 0; i < g.size() && shown < limit; ++i) {
      if (same_bits(w[i], g[i])) continue;
      ++shown;
      std::printf("    N=%lld token %lld row %lld: ggml %.9g pico %.9g (%lld ulp)\n", static_cast<long long>(n),
                  static_cast<long long>(i) / kRows, static_cast<long long>(i) % kRows, static_cast<double>(w[i]),
                  static_cast<double>(g[i]), static_cast<long long>(ulp_distance(w[i], g[i])));
    }
    if (shown > 0) return;
  }
}

// Restores the active level after the test changes it.
struct LevelGuard {
  CpuLevel saved = cpu_level();
  ~LevelGuard() { set_cpu_level(saved); }
};

// The reference columns are for a host whose pick is a wider build than haswell (zen4,
// skylakex ...); where llama.cpp picks haswell itself (an AVX2-only host), the haswell
// columns hold for it.
char expected_mark(const Expected& e, const GgmlCpuLibrary& lib, WeightBuffer where, CpuLevel level) {
  const bool reference_build = lib.name != "haswell";
  const char* column = reference_build ? (where == WeightBuffer::plain ? e.ref_plain : e.ref_repack)
                                       : (where == WeightBuffer::plain ? e.avx2_plain : e.avx2_repack);
  const size_t index = level == CpuLevel::scalar ? 0 : level == CpuLevel::avx2 ? 1 : 2;
  return column[index];
}

// The ggml builds, opened once per process (they stay loaded).
const std::vector<GgmlCpuLibrary>& libraries(std::string& error) {
  static std::string open_error;
  static const std::vector<GgmlCpuLibrary> opened = [] {
    const char* dir = std::getenv("PICO_GGML_LIB_DIR");
    if (!dir) {
      open_error = "PICO_GGML_LIB_DIR: node-llama-cpp's bins/linux-x64 directory";
      return std::vector<GgmlCpuLibrary>{};
    }
    auto libs = open_libraries(dir, open_error);
    if (!libs.empty()) libs[0].api.log_set(quiet_log, nullptr);  // one libggml-base serves every build
    return libs;
  }();
  error = open_error;
  return opened;
}

// Once per process: ctest runs one type per process, a plain run all of them.
void print_header(const std::vector<GgmlCpuLibrary>& libs) {
  static bool printed = false;
  if (printed) return;
  printed = true;
  std::printf("ggml builds: %s (reference: llama.cpp's pick on this host; llamafile sgemm %s)", libs[0].name.c_str(),
              libs[0].api.cpu_has_llamafile() ? "on" : "off");
  if (libs.size() > 1) std::printf(", %s (AVX2 build)", libs[1].name.c_str());
  std::printf("\n%d x %d weights; per token count N: %% of outputs bit-identical, max ulp distance, max difference "
              "in ulps of the largest |output|; ggml N-dep: ggml outputs whose bits change with N\n",
              static_cast<int>(kRows), static_cast<int>(kCols));
  std::printf("%-7s %-9s %-6s %-6s |", "type", "ggml", "buffer", "pico");
  for (int64_t n : kTokenCounts) std::printf(" N=%-16lld|", static_cast<long long>(n));
  std::printf(" ggml N-dep | expected\n");
}

void PrintTo(const Expected& e, std::ostream* os) { *os << type_traits(e.type).name; }

class GgmlMatmulCrosscheck : public ::testing::TestWithParam<Expected> {};

TEST_P(GgmlMatmulCrosscheck, BitIdenticalWhereExpected) {
  const Expected& e = GetParam();
  std::string error;
  const std::vector<GgmlCpuLibrary>& libs = libraries(error);
  ASSERT_FALSE(libs.empty()) << error;
  print_header(libs);

  const std::vector<float> x = test::random_floats(static_cast<size_t>(kMaxTokens * kCols), 7);
  const std::vector<uint8_t> weight = test::random_rows(e.type, kRows, kCols, 11);
  const std::string type_name(type_traits(e.type).name);
  ThreadPool pool(1);
  LevelGuard guard;

  // pico's results per level and token count, through matmul as model code calls it.
  std::map<CpuLevel, ResultsByTokens> pico_results;
  for (CpuLevel level : supported_levels()) {
    set_cpu_level(level);
    for (int64_t n : kTokenCounts) {
      std::vector<float>& y = pico_results[level][n];
      y.resize(static_cast<size_t>(n * kRows));
      matmul(pool, e.type, weight.data(), kRows, kCols, x.data(), n, y.data());
    }
  }

  std::vector<std::string> newly_exact;
  for (size_t li = 0; li < libs.size(); ++li) {
    const GgmlCpuLibrary& lib = libs[li];
    ResultsByTokens ggml_plain;
    for (WeightBuffer where : {WeightBuffer::plain, WeightBuffer::repack}) {
      GgmlMatmul ggml(lib.api, e.type, where, weight);
      const char* buffer_name = where == WeightBuffer::plain ? "plain" : "repack";
      const std::string path_text = type_name + " " + lib.name + " " + buffer_name;
      if (!ggml.usable()) {
        for (CpuLevel level : supported_levels()) {
          EXPECT_EQ(expected_mark(e, lib, where, level), '.') << path_text << ": ggml has no such path";
        }
        continue;
      }
      ResultsByTokens theirs;
      for (int64_t n : kTokenCounts) theirs[n] = ggml.run(x, n);
      // Does ggml's output for a token depend on how many tokens came with it (e.g.
      // the repacked gemm on groups of 4 tokens vs gemv on the rest, or sgemm for
      // N >= 2 vs vec_dot for N = 1)?
      int64_t n_dependent = 0;
      const std::vector<float>& widest = theirs[kMaxTokens];
      for (int64_t n : kTokenCounts) {
        for (size_t i = 0; i < theirs[n].size(); ++i) n_dependent += !same_bits(theirs[n][i], widest[i]);
      }
      for (CpuLevel level : supported_levels()) {
        std::printf("%-7s %-9s %-6s %-6s |", type_name.c_str(), lib.name.c_str(), buffer_name,
                    std::string(level_name(level)).c_str());
        const Agreement overall = print_cells(theirs, pico_results[level]);
        const char mark = expected_mark(e, lib, where, level);
        std::printf(" %10lld | %c\n", static_cast<long long>(n_dependent), mark);
        print_mismatches(theirs, pico_results[level]);
        const std::string cell_text = path_text + " @ " + std::string(level_name(level));
        EXPECT_NE(mark, '.') << cell_text << ": ggml has this path, kExpected says it has not";
        if (mark == 'x') {
          EXPECT_TRUE(overall.exact()) << cell_text << ": " << overall.total - overall.identical << " of "
                                       << overall.total << " outputs differ, up to " << overall.max_ulp
                                       << " ulp (kExpected marks it exact)";
        } else if (mark == 'g') {
          const Agreement grouped = gemm_groups(theirs, pico_results[level]);
          EXPECT_TRUE(grouped.exact()) << cell_text << ": " << grouped.total - grouped.identical << " of "
                                       << grouped.total << " outputs of 4-token groups differ, up to "
                                       << grouped.max_ulp << " ulp (kExpected marks them exact)";
        } else if (overall.exact()) {
          newly_exact.push_back(cell_text);
        } else if (gemm_groups(theirs, pico_results[level]).exact()) {
          newly_exact.push_back(cell_text + " (4-token groups: 'g')");
        }
      }
      // ggml against itself: which of the repacked results equal the plain path's
      // (for instance its gemv leftovers), for kernels that must pick one order.
      if (where == WeightBuffer::plain) {
        ggml_plain = theirs;
      } else if (!ggml_plain.empty()) {
        std::printf("%-7s %-9s %-6s %-6s |", type_name.c_str(), lib.name.c_str(), buffer_name, "=plain");
        print_cells(ggml_plain, theirs);
        std::printf(" %10s | (ggml repack vs ggml plain)\n", "");
      }
    }
  }
  for (const std::string& cell_text : newly_exact) {
    std::printf("now bit-identical, mark it 'x' in kExpected: %s\n", cell_text.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GgmlMatmulCrosscheck, ::testing::ValuesIn(kExpected),
                         [](const ::testing::TestParamInfo<Expected>& param_info) {
                           return std::string(type_traits(param_info.param.type).name);
                         });

}  // namespace
}  // namespace pico::cpu
