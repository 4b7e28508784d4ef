// Cross-check against llama.cpp itself: loads ggml's base library (libggml-base.so,
// e.g. the one node-llama-cpp ships) at run time from $PICO_GGML_LIB and compares,
// type by type:
//   - dequantization of random blocks (with finite f16 scales): bit-identical floats;
//   - our reference quantizer against ggml's on the same input: identical bytes.
// Fails when PICO_GGML_LIB is unset (ctest sets it to node-llama-cpp's library).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/float_convert.hpp"
#include "quant/quantize.hpp"
#include "quant/test_data.hpp"

namespace pico {
namespace {

using GgmlToFloat = void (*)(const void*, float*, int64_t);
using GgmlFromFloat = void (*)(const float*, void*, int64_t);
using GgmlQuantizeRows = size_t (*)(const float*, void*, int64_t, int64_t, const float*);

class Ggml {
 public:
  static Ggml& get() {
    static Ggml instance;
    return instance;
  }
  bool loaded() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }
  void* symbol(const std::string& name) const { return handle_ ? dlsym(handle_, name.c_str()) : nullptr; }

 private:
  Ggml() {
    const char* path = std::getenv("PICO_GGML_LIB");
    if (!path || !*path) {
      error_ = "PICO_GGML_LIB is not set (path of llama.cpp's libggml-base.so)";
      return;
    }
    handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle_) error_ = std::string("dlopen failed: ") + dlerror();
  }
  void* handle_ = nullptr;
  std::string error_;
};

#define REQUIRE_GGML()                                                      \
  do {                                                                      \
    ASSERT_TRUE(Ggml::get().loaded()) << Ggml::get().error();               \
  } while (0)

// How our quantizer's output is compared with ggml's.
enum class QuantCheck {
  kNone,        // no quantizer on one side
  kBytes,       // ggml's quantize_row_<name>_ref: identical bytes
  kBytesRows,   // ggml's quantize_<name>(src, dst, rows, n, NULL): identical bytes
};

struct Case {
  GgmlType type;
  const char* ggml_name;
  bool has_dequantize;  // ggml exports dequantize_row_<name>
  QuantCheck quant;
  std::vector<int> f16_offsets;  // f16 fields that must hold finite values
};

std::vector<Case> cases() {
  using T = GgmlType;
  using Q = QuantCheck;
  return {
      {T::Q4_0, "q4_0", true, Q::kBytes, {0}},
      {T::Q4_1, "q4_1", true, Q::kBytes, {0, 2}},
      {T::Q5_0, "q5_0", true, Q::kBytes, {0}},
      {T::Q5_1, "q5_1", true, Q::kBytes, {0, 2}},
      {T::Q8_0, "q8_0", true, Q::kBytes, {0}},
      {T::Q8_1, "q8_1", false, Q::kBytes, {0, 2}},
      {T::Q2_K, "q2_K", true, Q::kBytes, {80, 82}},
      {T::Q3_K, "q3_K", true, Q::kBytes, {108}},
      {T::Q4_K, "q4_K", true, Q::kBytes, {0, 2}},
      {T::Q5_K, "q5_K", true, Q::kBytes, {0, 2}},
      {T::Q6_K, "q6_K", true, Q::kBytes, {208}},
      {T::Q8_K, "q8_K", true, Q::kBytes, {}},
      {T::IQ2_XXS, "iq2_xxs", true, Q::kNone, {0}},
      {T::IQ2_XS, "iq2_xs", true, Q::kNone, {0}},
      {T::IQ2_S, "iq2_s", true, Q::kNone, {0}},
      {T::IQ3_XXS, "iq3_xxs", true, Q::kNone, {0}},
      {T::IQ3_S, "iq3_s", true, Q::kNone, {0}},
      {T::IQ1_S, "iq1_s", true, Q::kNone, {0}},
      {T::IQ1_M, "iq1_m", true, Q::kNone, {}},
      {T::IQ4_NL, "iq4_nl", true, Q::kBytesRows, {0}},
      {T::IQ4_XS, "iq4_xs", true, Q::kBytes, {0}},
      {T::TQ1_0, "tq1_0", true, Q::kBytes, {52}},
      {T::TQ2_0, "tq2_0", true, Q::kBytes, {64}},
      {T::MXFP4, "mxfp4", true, Q::kBytes, {}},
      {T::NVFP4, "nvfp4", true, Q::kBytes, {}},
      {T::Q1_0, "q1_0", true, Q::kBytes, {0}},
      {T::Q2_0, "q2_0", true, Q::kBytes, {0}},
  };
}

std::string describe(const Case& c) { return c.ggml_name; }

// Random blocks whose f16 scales are finite (random bits with the exponent kept
// below all-ones, so subnormals and both signs occur).
std::vector<uint8_t> random_blocks(const Case& c, size_t blocks, std::mt19937& rng) {
  const TypeTraits& row = type_traits(c.type);
  std::vector<uint8_t> data(blocks * row.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> magnitude(-8.0f, 8.0f);
  for (size_t i = 0; i < blocks; ++i) {
    uint8_t* block = data.data() + i * row.block_bytes;
    for (int offset : c.f16_offsets) {
      uint16_t h;
      std::memcpy(&h, block + offset, 2);
      if (i % 4 == 0) {
        h = fp32_to_fp16(std::ldexp(1.0f, static_cast<int>(magnitude(rng))) * magnitude(rng) * 0.125f);
      } else if ((h & 0x7c00) == 0x7c00) {
        h = static_cast<uint16_t>(h & ~0x4000);
      }
      std::memcpy(block + offset, &h, 2);
    }
    if (c.type == GgmlType::Q8_K) {
      const float d = magnitude(rng) * 0.01f;
      std::memcpy(block, &d, 4);
    }
    if (c.type == GgmlType::IQ1_M) {
      // The f16 scale is spread over the top nibbles of four uint16 at offset 48;
      // bit 14 of the last is the top exponent bit.
      block[55] = static_cast<uint8_t>(block[55] & ~0x40);
    }
  }
  return data;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, size_t* first_diff) {
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y) {
      *first_diff = i;
      return false;
    }
  }
  return true;
}

// Inputs for the quantizer comparison (multiples of 256 values).
std::vector<std::vector<float>> quantizer_inputs() {
  std::vector<std::vector<float>> sets;
  const size_t n = 4096;
  sets.push_back(quant_test::synthetic_data(0.0f, n));  // test-quantize-fns' data
  sets.push_back(quant_test::synthetic_data(1.0f, n));
  sets.push_back(quant_test::portable_data());  // the data of quant_test's digests
  std::mt19937 rng(1234);
  for (int s = 0; s < 3; ++s) {  // Gaussian, with the scale varying per 32 and per 256
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(-6.0f, 3.0f);
    std::vector<float> v(n);
    float scale = 1;
    for (size_t i = 0; i < n; ++i) {
      if (i % 32 == 0) scale = std::exp2(exponent(rng));
      v[i] = normal(rng) * scale;
    }
    sets.push_back(v);
  }
  {  // awkward blocks: zeros, constants, one outlier, all positive, all negative, tiny
    std::vector<float> v(n, 0.0f);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (size_t b = 0; b < n / 256; ++b) {
      float* x = v.data() + b * 256;
      switch (b % 8) {
        case 0: break;  // zeros
        case 1: for (int i = 0; i < 256; ++i) x[i] = 0.75f; break;
        case 2: for (int i = 0; i < 256; ++i) x[i] = i == 77 ? 40.0f : unit(rng) * 0.01f; break;
        case 3: for (int i = 0; i < 256; ++i) x[i] = std::fabs(unit(rng)) + 0.5f; break;
        case 4: for (int i = 0; i < 256; ++i) x[i] = -std::fabs(unit(rng)) - 0.5f; break;
        case 5: for (int i = 0; i < 256; ++i) x[i] = unit(rng) * 1e-6f; break;
        case 6: for (int i = 0; i < 256; ++i) x[i] = (i % 32 < 16) ? 0.0f : unit(rng); break;
        default: for (int i = 0; i < 256; ++i) x[i] = unit(rng) * 1000.0f; break;
      }
    }
    sets.push_back(v);
  }
  return sets;
}

TEST(GgmlCrosscheck, DequantizeRandomBlocksIsBitIdentical) {
  REQUIRE_GGML();
  std::mt19937 rng(42);
  std::vector<std::string> matched;
  for (const Case& c : cases()) {
    if (!c.has_dequantize) continue;
    SCOPED_TRACE(describe(c));
    auto theirs = reinterpret_cast<GgmlToFloat>(Ggml::get().symbol(std::string("dequantize_row_") + c.ggml_name));
    ASSERT_NE(theirs, nullptr) << "ggml does not export dequantize_row_" << c.ggml_name;
    const TypeTraits& row = type_traits(c.type);
    const size_t blocks = 4096 / row.block_size * 4;
    const std::vector<uint8_t> data = random_blocks(c, blocks, rng);
    const auto n = static_cast<int64_t>(blocks * row.block_size);
    std::vector<float> ours(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
    dequantize_row(c.type, data.data(), ours.data(), n);
    theirs(data.data(), ref.data(), n);
    size_t at = 0;
    const bool same = same_bits(ours, ref, &at);
    EXPECT_TRUE(same) << "first difference at element " << at << " (block " << at / row.block_size << "): ours "
                      << ours[at] << ", ggml " << ref[at];
    if (same) matched.push_back(c.ggml_name);
  }
  std::string list;
  for (const std::string& m : matched) list += " " + m;
  std::printf("dequantize bit-identical to ggml:%s\n", list.c_str());
}

TEST(GgmlCrosscheck, ReferenceQuantizersGiveTheSameBytes) {
  REQUIRE_GGML();
  const auto inputs = quantizer_inputs();
  std::vector<std::string> matched;
  for (const Case& c : cases()) {
    if (c.quant == QuantCheck::kNone) continue;
    SCOPED_TRACE(describe(c));
    const TypeTraits& row = type_traits(c.type);
    void* sym = c.quant == QuantCheck::kBytes ? Ggml::get().symbol(std::string("quantize_row_") + c.ggml_name + "_ref")
                                              : Ggml::get().symbol(std::string("quantize_") + c.ggml_name);
    ASSERT_NE(sym, nullptr) << "ggml does not export the quantizer of " << c.ggml_name;
    bool all_same = true;
    for (size_t s = 0; s < inputs.size(); ++s) {
      const std::vector<float>& x = inputs[s];
      const auto n = static_cast<int64_t>(x.size());
      const size_t bytes = *bytes_of(row, x.size());
      std::vector<uint8_t> ours(bytes, 0), ref(bytes, 0);
      quantize_row(c.type, x.data(), ours.data(), n);
      if (c.quant == QuantCheck::kBytes) {
        reinterpret_cast<GgmlFromFloat>(sym)(x.data(), ref.data(), n);
      } else {
        reinterpret_cast<GgmlQuantizeRows>(sym)(x.data(), ref.data(), 1, n, nullptr);
      }
      size_t first = bytes;
      for (size_t i = 0; i < bytes; ++i) {
        if (ours[i] != ref[i]) {
          first = i;
          break;
        }
      }
      if (first != bytes) {
        all_same = false;
        // Report how far apart the two encodings are in decoded error.
        double err_ours = 0, err_ref = 0;
        if (row.dequantize) {
          std::vector<float> a(x.size()), b(x.size());
          dequantize_row(c.type, ours.data(), a.data(), n);
          dequantize_row(c.type, ref.data(), b.data(), n);
          for (size_t i = 0; i < x.size(); ++i) {
            err_ours += (a[i] - x[i]) * (a[i] - x[i]);
            err_ref += (b[i] - x[i]) * (b[i] - x[i]);
          }
        }
        ADD_FAILURE() << "input set " << s << ": first differing byte " << first << " (block "
                      << first / row.block_bytes << ", byte " << first % row.block_bytes << "): ours "
                      << int(ours[first]) << ", ggml " << int(ref[first]) << "; squared error ours " << err_ours
                      << ", ggml " << err_ref;
      }
    }
    if (all_same) matched.push_back(c.ggml_name);
  }
  std::string list;
  for (const std::string& m : matched) list += " " + m;
  std::printf("quantizer bytes identical to ggml:%s\n", list.c_str());
}

// test_digests.inc pins, for quant_test on every host (qemu's aarch64, armv7,
// s390x included), the bytes that llama.cpp makes of portable_data(); this checks
// that the recorded values are llama.cpp's, not merely what pico once produced.
TEST(GgmlCrosscheck, RecordedDigestsAreGgmlsBytes) {
  REQUIRE_GGML();
  struct Recorded {
    GgmlType type;
    uint64_t digest;
  };
  const Recorded recorded[] = {
#include "quant/test_digests.inc"
  };
  const std::vector<float> x = quant_test::portable_data();
  const auto n = static_cast<int64_t>(x.size());
  size_t checked = 0;
  for (const Recorded& r : recorded) {
    const TypeTraits& row = type_traits(r.type);
    std::vector<uint8_t> theirs(*bytes_of(row, x.size()), 0);
    if (r.type == GgmlType::F32) {
      std::memcpy(theirs.data(), x.data(), theirs.size());
    } else if (r.type == GgmlType::F16 || r.type == GgmlType::BF16) {
      auto convert = reinterpret_cast<void (*)(const float*, void*, int64_t)>(
          Ggml::get().symbol(r.type == GgmlType::F16 ? "ggml_fp32_to_fp16_row" : "ggml_fp32_to_bf16_row_ref"));
      ASSERT_NE(convert, nullptr);
      convert(x.data(), theirs.data(), n);
    } else {
      const Case* c = nullptr;
      static const std::vector<Case> all = cases();
      for (const Case& candidate : all) {
        if (candidate.type == r.type) c = &candidate;
      }
      ASSERT_TRUE(c && c->quant != QuantCheck::kNone) << row.name << " has no ggml quantizer to pin its digest";
      if (c->quant == QuantCheck::kBytes) {
        auto quantize = reinterpret_cast<GgmlFromFloat>(Ggml::get().symbol(std::string("quantize_row_") + c->ggml_name + "_ref"));
        ASSERT_NE(quantize, nullptr);
        quantize(x.data(), theirs.data(), n);
      } else {
        auto quantize = reinterpret_cast<GgmlQuantizeRows>(Ggml::get().symbol(std::string("quantize_") + c->ggml_name));
        ASSERT_NE(quantize, nullptr);
        quantize(x.data(), theirs.data(), 1, n, nullptr);
      }
    }
    EXPECT_EQ(quant_test::fnv1a(theirs), r.digest) << row.name;
    ++checked;
  }
  EXPECT_GE(checked, 20u);
}

TEST(GgmlCrosscheck, HalfAndBfloatConversionsMatch) {
  REQUIRE_GGML();
  auto f16_to_f32 = reinterpret_cast<void (*)(const uint16_t*, float*, int64_t)>(Ggml::get().symbol("ggml_fp16_to_fp32_row"));
  auto f32_to_f16 = reinterpret_cast<void (*)(const float*, uint16_t*, int64_t)>(Ggml::get().symbol("ggml_fp32_to_fp16_row"));
  auto bf16_to_f32 = reinterpret_cast<void (*)(const uint16_t*, float*, int64_t)>(Ggml::get().symbol("ggml_bf16_to_fp32_row"));
  auto f32_to_bf16 =
      reinterpret_cast<void (*)(const float*, uint16_t*, int64_t)>(Ggml::get().symbol("ggml_fp32_to_bf16_row_ref"));
  ASSERT_TRUE(f16_to_f32 && f32_to_f16 && bf16_to_f32 && f32_to_bf16);

  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> ref(65536);
  f16_to_f32(all.data(), ref.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const float ours = fp16_to_fp32(all[i]);
    if (std::isnan(ref[i])) {
      EXPECT_TRUE(std::isnan(ours)) << i;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(ref[i])) << "f16 bits " << i;
    }
  }
  bf16_to_f32(all.data(), ref.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    if (std::isnan(ref[i])) continue;
    EXPECT_EQ(std::bit_cast<uint32_t>(bf16_to_fp32(all[i])), std::bit_cast<uint32_t>(ref[i])) << "bf16 bits " << i;
  }

  // Floats: random bit patterns plus every f16 value and the midpoints between
  // neighbouring f16 values (the ties), and their neighbours.
  std::vector<float> x;
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float lo = fp16_to_fp32(static_cast<uint16_t>(h));
    const float hi = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      x.push_back(v);
      x.push_back(-v);
    }
  }
  std::vector<uint16_t> ours(x.size()), theirs(x.size());
  f32_to_f16(x.data(), theirs.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ours[i] = fp32_to_fp16(x[i]);
  size_t mismatches = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) continue;
    if (ours[i] != theirs[i] && mismatches++ < 10) {
      ADD_FAILURE() << "f32 " << x[i] << " (bits " << std::hex << std::bit_cast<uint32_t>(x[i]) << ") -> f16 ours "
                    << ours[i] << ", ggml " << theirs[i] << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  f32_to_bf16(x.data(), theirs.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ours[i] = fp32_to_bf16(x[i]);
  EXPECT_EQ(ours, theirs);
}

}  // namespace
}  // namespace pico
