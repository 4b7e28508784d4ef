// The Vulkan ops against the CPU backend on odd shapes (NMSE as llama.cpp's
// test-backend-ops: <= 5e-4 for matmul-like ops, <= 1e-6 elementwise), and batch
// invariance on the device. Runs on whatever device 0 is (lavapipe here); with no
// usable device every test reports itself skipped, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/vulkan/vulkan_device.hpp"
#include "backend/vulkan/vulkan_ops.hpp"
#include "backend/vulkan/vulkan_shaders.hpp"
#include "cpu/matmul.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/float_convert.hpp"
#include "quant/quantize.hpp"
#include "state/kv_cache.hpp"

namespace pico::backend::vulkan {
namespace {

// The first usable device, or the reason there is none.
Device* device_or_reason(std::string& reason) {
  static std::string why;
  static const std::unique_ptr<Device> device = []() -> std::unique_ptr<Device> {
    std::string error;
    for (const DeviceInfo& info : list_devices(&error)) {
      if (!info.usable) {
        why += info.name + " " + info.unusable_reason + "; ";
        continue;
      }
      return Device::open(info.index);
    }
    why += error.empty() ? "no usable Vulkan device" : error;
    return nullptr;
  }();
  reason = why;
  return device.get();
}

// Another device over the same one, opened with the environment variable `name` set
// (the switches Device::open reads: profiling, the shared-memory tree, the readback).
std::unique_ptr<Device> open_with(const Device& like, const char* name) {
  ::setenv(name, "1", 1);
  std::unique_ptr<Device> device = Device::open(like.info().index);
  ::unsetenv(name);
  return device;
}

#define REQUIRE_DEVICE(d)                                      \
  std::string reason_;                                         \
  Device* d = device_or_reason(reason_);                       \
  if (!d) GTEST_SKIP() << "no Vulkan device: " << reason_

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double nmse(const std::vector<float>& want, const std::vector<float>& got) {
  EXPECT_EQ(want.size(), got.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    err += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return norm == 0 ? err : err / norm;
}

Buffer to_device(Device& d, const void* data, size_t bytes) {
  Buffer b = d.allocate(bytes);
  d.upload(b, 0, data, bytes);
  return b;
}
template <class T>
Buffer to_device(Device& d, const std::vector<T>& v) {
  return to_device(d, v.data(), v.size() * sizeof(T));
}
std::vector<float> from_device(Device& d, const Buffer& b, size_t count) {
  std::vector<float> v(count);
  d.download(b, 0, v.data(), count * sizeof(float));
  return v;
}
BufferRange all(const Buffer& b) { return {&b, 0, 0}; }

// A weight matrix of `type` from random floats, kept in host memory for the CPU backend.
struct HostWeight {
  std::vector<uint8_t> bytes;
  Weight weight;
};
HostWeight make_weight(GgmlType type, int64_t cols, int64_t rows, uint32_t seed) {
  const std::vector<float> values = random_floats(static_cast<size_t>(cols * rows), seed, 0.5f);
  HostWeight h;
  const size_t row = static_cast<size_t>(*bytes_of(type_traits(type), static_cast<uint64_t>(cols)));
  h.bytes.resize(row * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, values.data() + r * cols, h.bytes.data() + r * row, cols);
  h.weight = Weight{type, h.bytes.data(), cols, rows};
  return h;
}

class MatmulTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulTypes, MatchesCpuOnOddShapes) {
  REQUIRE_DEVICE(device);
  const GgmlType type = GetParam();
  Ops ops(*device);
  auto cpu = make_cpu_backend(1);
  const int64_t block = type_traits(type).block_size;
  for (const auto [cols, rows, tokens] :
       {std::array<int64_t, 3>{block, 1, 1}, {3 * block, 37, 1}, {7 * block, 61, 5}, {4096, 33, 3}, {5 * block, 29, 19}}) {
    SCOPED_TRACE(std::to_string(cols) + "x" + std::to_string(rows) + ", " + std::to_string(tokens) + " tokens");
    const HostWeight w = make_weight(type, cols, rows, 7);
    const std::vector<float> x = random_floats(static_cast<size_t>(cols * tokens), 11);
    std::vector<float> want(static_cast<size_t>(rows * tokens));
    cpu->matmul(w.weight, x.data(), tokens, want.data());
    const DeviceWeight dw = ops.upload(w.weight);
    const Buffer dx = to_device(*device, x);
    Buffer dy = device->allocate(want.size() * sizeof(float));
    ops.matmul(dw, all(dx), tokens, all(dy));
    device->submit();
    EXPECT_LE(nmse(want, from_device(*device, dy, want.size())), 5e-4);
  }
}

// Tokens go through the shader in tiles (matmul_body.glsl): a token alone, first or
// last in a tile, or in a partial last tile, gets the same bits.
TEST_P(MatmulTypes, RowIsTheSameAloneAndInABatch) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  const GgmlType type = GetParam();
  // Several 128-value steps of each lane, and for single-value types a row that ends
  // inside a lane's run of 4.
  const int64_t block = type_traits(type).block_size;
  const int64_t cols = block == 1 ? 301 : 12 * block, rows = 53, tokens = 19;
  const HostWeight w = make_weight(type, cols, rows, 3);
  const DeviceWeight dw = ops.upload(w.weight);
  const std::vector<float> x = random_floats(static_cast<size_t>(cols * tokens), 5);
  const Buffer dx = to_device(*device, x);
  Buffer batch = device->allocate(static_cast<size_t>(rows * tokens) * sizeof(float));
  ops.matmul(dw, all(dx), tokens, all(batch));
  device->submit();
  const std::vector<float> together = from_device(*device, batch, static_cast<size_t>(rows * tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<float> one(x.begin() + t * cols, x.begin() + (t + 1) * cols);
    const Buffer d1 = to_device(*device, one);
    Buffer y1 = device->allocate(static_cast<size_t>(rows) * sizeof(float));
    ops.matmul(dw, all(d1), 1, all(y1));
    device->submit();
    const std::vector<float> alone = from_device(*device, y1, static_cast<size_t>(rows));
    EXPECT_EQ(0, std::memcmp(alone.data(), together.data() + t * rows, alone.size() * sizeof(float))) << "token " << t;
  }
}

// Where the device's subgroups shuffle, a row's 32-lane tree runs in registers
// (matmul_body.glsl); it must give the shared-memory tree's bits, which a second
// device opened with PICO_VULKAN_NO_SUBGROUP_TREE computes, alone and in a batch.
TEST_P(MatmulTypes, SubgroupTreeGivesTheSharedMemoryTreesBits) {
  REQUIRE_DEVICE(device);
  if (!device->info().subgroup_tree)
    GTEST_SKIP() << device->info().name << " has subgroups of " << device->info().subgroup_size  // reason: no subgroup tree here
                 << " lanes: the matmuls use the shared-memory tree alone";
  const std::unique_ptr<Device> plain = open_with(*device, "PICO_VULKAN_NO_SUBGROUP_TREE");
  ASSERT_FALSE(plain->info().subgroup_tree);
  const GgmlType type = GetParam();
  const int64_t block = type_traits(type).block_size;
  const int64_t cols = block == 1 ? 301 : 12 * block, rows = 67;
  const HostWeight w = make_weight(type, cols, rows, 13);
  for (const int64_t tokens : {int64_t{1}, int64_t{11}}) {
    const std::vector<float> x = random_floats(static_cast<size_t>(cols * tokens), 29);
    std::vector<std::vector<float>> results;
    for (Device* d : {device, plain.get()}) {
      Ops ops(*d);
      const DeviceWeight dw = ops.upload(w.weight);
      const Buffer dx = to_device(*d, x);
      Buffer dy = d->allocate(static_cast<size_t>(rows * tokens) * sizeof(float));
      ops.matmul(dw, all(dx), tokens, all(dy));
      d->submit();
      results.push_back(from_device(*d, dy, static_cast<size_t>(rows * tokens)));
    }
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float))) << tokens << " tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulTypes,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                                           GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::Q2_K,
                                           GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const auto& param_info) { return std::string(type_traits(param_info.param).name); });

// round_rows against the CPU matmul's own activation rounding (quantize, dequantize),
// per dot partner: F16, BF16, Q8_0, Q8_1, Q8_K; F32 left alone. Rows with a zero block,
// ties of the largest magnitude and values that round half-way. Every device matches
// bit for bit: the shader divides and rounds to F16 in integers (float_rounding.glsl),
// not with the device's own division and packHalf2x16 (NVIDIA's rounds differently).
TEST(VulkanOps, RoundRowsMatchesTheCpuMatmulsActivations) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  cpu::ThreadPool pool(1);
  const int64_t n = 512, rows = 5;
  std::vector<float> x = random_floats(static_cast<size_t>(n * rows), 17);
  for (int64_t i = 0; i < 256; ++i) x[static_cast<size_t>(n + i)] = 0.0f;  // row 1's first Q8_K block
  x[static_cast<size_t>(2 * n + 3)] = 9.5f;                                 // row 2: a tie of magnitudes
  x[static_cast<size_t>(2 * n + 9)] = -9.5f;
  // Row 3's first block: largest magnitude 127 (scale 1), the rest half-way between codes.
  for (int64_t i = 0; i < 256; ++i) x[static_cast<size_t>(3 * n + i)] = static_cast<float>(i % 64 - 32) + 0.5f;
  x[static_cast<size_t>(3 * n)] = 127.0f;
  for (const GgmlType w_type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_1,
                                GgmlType::Q4_K}) {
    SCOPED_TRACE(type_traits(w_type).name);
    const GgmlType a_type = cpu::activation_type(w_type);
    std::vector<float> want = x;
    if (a_type != GgmlType::F32) {
      const size_t row_bytes = cpu::activation_row_bytes(w_type, n);
      std::vector<uint8_t> codes(row_bytes * static_cast<size_t>(rows));
      cpu::quantize_activations(pool, w_type, x.data(), n, rows, codes.data());
      for (int64_t r = 0; r < rows; ++r) dequantize_row(a_type, codes.data() + r * row_bytes, want.data() + r * n, n);
    }
    // Into another buffer (filled with a value no rounding gives), x left as it was.
    const Buffer dx = to_device(*device, x);
    const Buffer dout = to_device(*device, std::vector<float>(x.size(), 1e30f));
    ops.round_rows(all(dx), n, rows, w_type, all(dout));
    device->submit();
    const std::vector<float> got = from_device(*device, dout, x.size());
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += got[i] == want[i] ? 0 : 1;  // -0 == +0
    EXPECT_EQ(differ, 0u) << "of " << x.size() << " values";
    EXPECT_EQ(from_device(*device, dx, x.size()), x);
  }
  // Rows of 96 values (3 blocks of 32): a last workgroup of 256 values only partly
  // filled (288 values), for the types whose blocks allow it.
  const int64_t short_n = 96, short_rows = 3;
  const std::vector<float> y = random_floats(static_cast<size_t>(short_n * short_rows), 23);
  for (const GgmlType w_type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    SCOPED_TRACE("rows of 96, " + std::string(type_traits(w_type).name));
    const GgmlType a_type = cpu::activation_type(w_type);
    const size_t row_bytes = cpu::activation_row_bytes(w_type, short_n);
    std::vector<uint8_t> codes(row_bytes * static_cast<size_t>(short_rows));
    cpu::quantize_activations(pool, w_type, y.data(), short_n, short_rows, codes.data());
    std::vector<float> want(y.size());
    for (int64_t r = 0; r < short_rows; ++r) dequantize_row(a_type, codes.data() + r * row_bytes, want.data() + r * short_n, short_n);
    const Buffer dy = to_device(*device, y);
    ops.round_rows(all(dy), short_n, short_rows, w_type, all(dy));  // in place
    device->submit();
    EXPECT_EQ(from_device(*device, dy, y.size()), want);
  }
  const Buffer dx = to_device(*device, x);
  EXPECT_THROW(ops.round_rows(all(dx), 100, 1, GgmlType::Q4_K, all(dx)), std::invalid_argument);  // not whole blocks
}

// $PICO_VULKAN_PROFILE: a device opened with it times each dispatch by shader (what
// a GPU run reads to find the costly shaders); one opened without it times nothing.
TEST(VulkanOps, ProfileCountsEachShadersDispatches) {
  REQUIRE_DEVICE(plain);
  EXPECT_FALSE(plain->profiling());
  std::unique_ptr<Device> device = open_with(*plain, "PICO_VULKAN_PROFILE");
  if (!device->profiling()) GTEST_SKIP() << "the device's compute queue has no timestamps";  // reason: the driver's
  Ops ops(*device);
  const std::vector<float> a = random_floats(4096, 1), b = random_floats(4096, 2);
  const Buffer da = to_device(*device, a), db = to_device(*device, b);
  Buffer dy = device->allocate(a.size() * sizeof(float));
  for (int i = 0; i < 3; ++i) ops.add(all(da), all(db), 4096, 1, 1, all(dy));
  ops.silu(all(dy), 4096, all(dy));
  device->submit();
  ops.silu(all(dy), 4096, all(dy));  // a second submission adds to the first's
  device->submit();
  std::map<std::string, uint64_t> dispatches;
  for (const Device::ShaderTime& t : device->profile()) {
    dispatches[t.shader] = t.dispatches;
    EXPECT_GE(t.milliseconds, 0.0) << t.shader;
  }
  EXPECT_EQ(dispatches, (std::map<std::string, uint64_t>{{"add", 3}, {"unary", 2}}));
  EXPECT_TRUE(plain->profile().empty());
}

// A long recording goes to the device in parts while the host records the rest (a
// submission without a wait every Device::kDispatchesPerFlush dispatches) and is waited
// for once: the dispatches keep their order across the parts, a buffer released under
// flushed work lives until the wait, and the profile times the dispatches of every part.
TEST(VulkanOps, ALongRecordingIsSubmittedInPartsAndWaitedForOnce) {
  REQUIRE_DEVICE(plain);
  std::unique_ptr<Device> device = open_with(*plain, "PICO_VULKAN_PROFILE");
  Ops ops(*device);
  const int64_t n = 1000, steps = 150;
  const std::vector<float> zeros(n, 0.0f), ones(n, 1.0f);
  const Buffer dy = to_device(*device, zeros);
  auto done = std::make_unique<Buffer>(to_device(*device, ones));
  const uint64_t submissions = device->submissions(), flushes = device->flushes();
  for (int64_t i = 0; i < steps; ++i) ops.add(all(dy), all(*done), n, 1, 1, all(dy));
  done.reset();  // released under flushed work: kept until the wait
  device->submit();
  EXPECT_EQ(device->submissions() - submissions, 1u);
  EXPECT_EQ(device->flushes() - flushes, static_cast<uint64_t>(steps) / Device::kDispatchesPerFlush);
  EXPECT_EQ(from_device(*device, dy, n), std::vector<float>(n, static_cast<float>(steps)));
  if (device->profiling()) {
    uint64_t adds = 0;
    for (const Device::ShaderTime& t : device->profile()) adds += std::string(t.shader) == "add" ? t.dispatches : 0;
    EXPECT_EQ(adds, static_cast<uint64_t>(steps));
  }
}

// Which bindings a shader writes, from its SPIR-V: those not declared readonly.
TEST(VulkanOps, WrittenBindingsAreTheOnesNotDeclaredReadonly) {
  EXPECT_EQ(written_bindings(shader_code(Shader::rms_norm).words), 1u << 2);
  EXPECT_EQ(written_bindings(shader_code(Shader::matmul_q4_0).words), 1u << 2);
  EXPECT_EQ(written_bindings(shader_code(Shader::matmul_tiled_q4_K).words), 1u << 2);
  EXPECT_EQ(written_bindings(shader_code(Shader::round_rows).words), 1u << 1);
  EXPECT_EQ(written_bindings(shader_code(Shader::rope).words), 1u << 0);  // in place
  EXPECT_EQ(written_bindings(shader_code(Shader::attention_f16).words), (1u << 5) | (1u << 6));
  EXPECT_EQ(written_bindings(shader_code(Shader::moe_route).words), (1u << 1) | (1u << 2));
  EXPECT_EQ(written_bindings({}), 0u);
}

// A barrier goes only between dispatches whose bindings meet where one of them writes:
// two adds reading the same inputs into different outputs run side by side, the add of
// their outputs waits for both, an add writing what that one read waits for it (write
// after read), and the submission waits for everything for the host. With
// $PICO_VULKAN_SERIALIZE every dispatch is followed by one. The results are the same.
TEST(VulkanOps, BarriersOnlyWhereDispatchesMeet) {
  REQUIRE_DEVICE(plain);
  const int64_t n = 1000;
  const std::vector<float> a = random_floats(n, 5), b = random_floats(n, 6);
  for (const bool serialized : {false, true}) {
    SCOPED_TRACE(serialized ? "serialized" : "plain");
    std::unique_ptr<Device> device =
        serialized ? open_with(*plain, "PICO_VULKAN_SERIALIZE") : Device::open(plain->info().index);
    Ops ops(*device);
    const Buffer da = to_device(*device, a), db = to_device(*device, b);
    // Three outputs side by side in one buffer: ranges of one buffer meet only where they overlap.
    Buffer out = device->allocate(3 * n * sizeof(float) + 4096);
    const size_t step = ((n * sizeof(float) + 255) / 256) * 256;
    const BufferRange first{&out, 0, n * sizeof(float)}, second{&out, step, n * sizeof(float)},
        third{&out, 2 * step, n * sizeof(float)};
    device->submit();
    const uint64_t before = device->barriers();
    ops.add(all(da), all(db), n, 1, 1, first);
    ops.add(all(db), all(da), n, 1, 1, second);
    EXPECT_EQ(device->barriers() - before, serialized ? 2u : 0u);
    ops.add(first, second, n, 1, 1, third);
    EXPECT_EQ(device->barriers() - before, serialized ? 3u : 1u);
    ops.add(all(da), all(da), n, 1, 1, first);  // first was read by the one before
    EXPECT_EQ(device->barriers() - before, serialized ? 4u : 2u);
    device->submit();
    EXPECT_EQ(device->barriers() - before, serialized ? 4u : 3u);
    const std::vector<float> got = from_device(*device, out, 2 * step / sizeof(float) + n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[static_cast<size_t>(i)], a[i] + a[i]) << i;
      ASSERT_EQ(got[2 * step / sizeof(float) + static_cast<size_t>(i)], (a[i] + b[i]) + (b[i] + a[i])) << i;
    }
  }
}

// A download through the readback buffer (what device memory and a BAR's mapped
// memory take; $PICO_VULKAN_READBACK forces it on any device): the copy is recorded
// after the work before it, so one submission runs both; larger than one readback
// buffer, in parts.
TEST(VulkanOps, DownloadThroughTheReadbackBufferIsOneSubmission) {
  REQUIRE_DEVICE(plain);
  std::unique_ptr<Device> device = open_with(*plain, "PICO_VULKAN_READBACK");
  Ops ops(*device);
  const int64_t n = 3000;
  const std::vector<float> a = random_floats(n, 3), b = random_floats(n, 4);
  const Buffer da = to_device(*device, a), db = to_device(*device, b);
  Buffer dy = device->allocate(n * sizeof(float));
  const uint64_t before = device->submissions(), allocated = device->allocated_bytes();
  ops.add(all(da), all(db), n, 1, 1, all(dy));
  const std::vector<float> got = from_device(*device, dy, n);
  EXPECT_EQ(device->submissions() - before, 1u);
  EXPECT_GE(device->allocated_bytes() - allocated, size_t{1} << 20) << "no readback buffer was made";
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], a[i] + b[i]) << i;
  // 72 MiB: two parts of the 64 MiB readback buffer.
  const size_t big = size_t{72} << 20;
  std::vector<uint8_t> bytes(big);
  for (size_t i = 0; i < big; ++i) bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  const Buffer dbig = to_device(*device, bytes.data(), big);
  std::vector<uint8_t> back(big);
  device->download(dbig, 0, back.data(), big);
  EXPECT_TRUE(back == bytes);
}

TEST(VulkanOps, MatrixLargerThanOneBindingGoesInChunks) {
  REQUIRE_DEVICE(device);
  // Q8_0 rows of 4352 bytes: the chunks start at offsets that are whole rows and a
  // multiple of the device's alignment.
  const int64_t cols = 4096;
  const int64_t row_bytes = cols / 32 * 34;
  const int64_t rows = static_cast<int64_t>(device->info().max_storage_range / static_cast<uint64_t>(row_bytes)) + 97;
  if (rows * row_bytes > (int64_t{1} << 30)) GTEST_SKIP() << "this device's bindings span over 1 GiB: nothing to split here";
  Ops ops(*device);
  auto cpu = make_cpu_backend(2);
  const HostWeight w = make_weight(GgmlType::Q8_0, cols, rows, 9);
  const std::vector<float> x = random_floats(static_cast<size_t>(cols), 2);
  std::vector<float> want(static_cast<size_t>(rows));
  cpu->matmul(w.weight, x.data(), 1, want.data());
  const DeviceWeight dw = ops.upload(w.weight);
  const Buffer dx = to_device(*device, x);
  Buffer dy = device->allocate(want.size() * sizeof(float));
  const uint64_t before = device->dispatches();
  ops.matmul(dw, all(dx), 1, all(dy));
  device->submit();
  EXPECT_GE(device->dispatches() - before, 2u);
  EXPECT_LE(nmse(want, from_device(*device, dy, want.size())), 5e-4);
}

TEST(VulkanOps, GetRowsMatchesCpu) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  auto cpu = make_cpu_backend(1);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                        GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                        GgmlType::Q5_K, GgmlType::Q6_K}) {
    SCOPED_TRACE(std::string(type_traits(type).name));
    const int64_t cols = 3 * type_traits(type).block_size;
    const HostWeight table = make_weight(type, cols, 41, 4);
    const std::vector<int32_t> ids = {0, 40, 7, 7, 13};
    std::vector<float> want(ids.size() * static_cast<size_t>(cols));
    cpu->get_rows(table.weight, ids.data(), static_cast<int64_t>(ids.size()), want.data());
    const DeviceWeight dt = ops.upload(table.weight);
    const Buffer did = to_device(*device, ids);
    Buffer out = device->allocate(want.size() * sizeof(float));
    ops.get_rows(dt, all(did), static_cast<int64_t>(ids.size()), all(out));
    device->submit();
    EXPECT_EQ(nmse(want, from_device(*device, out, want.size())), 0.0);
  }
}

TEST(VulkanOps, RowOpsMatchCpu) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  auto cpu = make_cpu_backend(1);
  const int64_t n = 333, rows = 5;
  const std::vector<float> a = random_floats(static_cast<size_t>(n * rows), 1);
  const std::vector<float> b = random_floats(static_cast<size_t>(n * rows), 2);
  const std::vector<float> w = random_floats(static_cast<size_t>(n), 3);
  const Buffer da = to_device(*device, a), db = to_device(*device, b), dw = to_device(*device, w);
  const size_t count = a.size();
  Buffer dy = device->allocate(count * sizeof(float));
  std::vector<float> want(count);

  cpu->rms_norm(a.data(), w.data(), n, rows, 1e-6f, want.data());
  ops.rms_norm(all(da), all(dw), n, rows, 1e-6f, all(dy));
  device->submit();
  EXPECT_LE(nmse(want, from_device(*device, dy, count)), 1e-6) << "rms_norm";

  cpu->rms_norm(a.data(), nullptr, n, rows, 1e-5f, want.data());
  ops.rms_norm(all(da), BufferRange{}, n, rows, 1e-5f, all(dy));
  device->submit();
  EXPECT_LE(nmse(want, from_device(*device, dy, count)), 1e-6) << "rms_norm without a weight";

  for (const int64_t b_rows : {int64_t{1}, rows}) {
    cpu->add(a.data(), b.data(), n, rows, b_rows, want.data());
    ops.add(all(da), all(db), n, rows, b_rows, all(dy));
    device->submit();
    EXPECT_LE(nmse(want, from_device(*device, dy, count)), 1e-7) << "add, b rows " << b_rows;
    cpu->mul(a.data(), b.data(), n, rows, b_rows, want.data());
    ops.mul(all(da), all(db), n, rows, b_rows, all(dy));
    device->submit();
    EXPECT_LE(nmse(want, from_device(*device, dy, count)), 1e-7) << "mul, b rows " << b_rows;
  }

  cpu->silu(a.data(), n, rows, want.data());
  ops.silu(all(da), static_cast<int64_t>(count), all(dy));
  device->submit();
  EXPECT_LE(nmse(want, from_device(*device, dy, count)), 1e-6) << "silu";

  // Inputs spread over the ranges where each function bends: [-25, 25).
  std::vector<float> wide(count);
  for (size_t i = 0; i < count; ++i) wide[i] = -25.0f + 50.0f * static_cast<float>(i) / static_cast<float>(count);
  const Buffer dwide = to_device(*device, wide);
  const auto check_unary = [&](const char* name, auto cpu_op, auto device_op) {
    cpu_op(wide.data(), static_cast<int64_t>(count), want.data());
    device_op(all(dwide), static_cast<int64_t>(count), all(dy));
    device->submit();
    EXPECT_LE(nmse(want, from_device(*device, dy, count)), 1e-6) << name;
  };
  check_unary("sigmoid", [&](auto... args) { cpu->sigmoid(args...); }, [&](auto... args) { ops.sigmoid(args...); });
  check_unary("softplus", [&](auto... args) { cpu->softplus(args...); }, [&](auto... args) { ops.softplus(args...); });
  check_unary("gelu", [&](auto... args) { cpu->gelu(args...); }, [&](auto... args) { ops.gelu(args...); });
  check_unary("gelu_erf", [&](auto... args) { cpu->gelu_erf(args...); }, [&](auto... args) { ops.gelu_erf(args...); });

  want = a;
  cpu->scale(want.data(), static_cast<int64_t>(count), 0.37f);
  Buffer dscaled = to_device(*device, a);
  ops.scale(all(dscaled), static_cast<int64_t>(count), 0.37f);
  device->submit();
  EXPECT_LE(nmse(want, from_device(*device, dscaled, count)), 1e-7) << "scale";

  const Buffer dbias = to_device(*device, random_floats(static_cast<size_t>(n), 4));
  const std::vector<float> bias = from_device(*device, dbias, static_cast<size_t>(n));
  for (const bool with_weight : {false, true}) {
    cpu->layer_norm(a.data(), with_weight ? w.data() : nullptr, with_weight ? bias.data() : nullptr, n, rows, 1e-5f,
                    want.data());
    ops.layer_norm(all(da), with_weight ? all(dw) : BufferRange{}, with_weight ? all(dbias) : BufferRange{}, n, rows,
                   1e-5f, all(dy));
    device->submit();
    EXPECT_LE(nmse(want, from_device(*device, dy, count)), 1e-6) << "layer_norm, weight and bias " << with_weight;
  }

  cpu->l2_norm(a.data(), n, rows, 1e-6f, want.data());
  ops.l2_norm(all(da), n, rows, 1e-6f, all(dy));
  device->submit();
  EXPECT_LE(nmse(want, from_device(*device, dy, count)), 1e-6) << "l2_norm";

  want = a;
  cpu->softmax(want.data(), n, rows);
  Buffer ds = to_device(*device, a);
  ops.softmax(all(ds), n, rows);
  device->submit();
  EXPECT_LE(nmse(want, from_device(*device, ds, count)), 1e-6) << "softmax";
}

TEST(VulkanOps, RopeMatchesCpu) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  auto cpu = make_cpu_backend(1);
  // 5 tokens at scattered positions, 3 heads of 40 in rows of 130 floats (a strided view).
  const int64_t tokens = 5, heads = 3, head_dim = 40, stride = 130;
  const std::vector<int32_t> pos = {0, 1, 17, 300, 4095};
  const Buffer dpos = to_device(*device, pos);
  for (const bool neox : {false, true}) {
    for (const int32_t n_dims : {40, 16}) {
      for (const float ext : {0.0f, 1.0f}) {
        SCOPED_TRACE(std::string(neox ? "neox" : "normal") + ", dims " + std::to_string(n_dims) + ", ext " + std::to_string(ext));
        RopeParams p;
        p.n_dims = n_dims;
        p.neox = neox;
        p.freq_base = 1000000.0f;
        if (ext != 0.0f) {
          p.freq_scale = 0.25f;
          p.ext_factor = ext;
          p.n_ctx_orig = 4096;
        }
        const std::vector<float> x = random_floats(static_cast<size_t>(tokens * stride), 21);
        std::vector<float> want = x;
        cpu->rope(want.data(), tokens, stride, heads, head_dim, pos.data(), p);
        Buffer dx = to_device(*device, x);
        ops.rope(all(dx), tokens, stride, heads, head_dim, all(dpos), p);
        device->submit();
        EXPECT_LE(nmse(want, from_device(*device, dx, x.size())), 1e-6);
      }
    }
  }
}

// Two sequences' F16 caches in pages of 8 positions, laid out for the CPU (a page
// pointer per page) and for the device (pages at scattered row indices of one buffer).
TEST(VulkanOps, AttentionOverPagedF16CacheMatchesCpu) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  auto cpu = make_cpu_backend(1);
  const int64_t n_head = 4, n_kv = 2, dk = 40, dv = 24;
  const int page_shift = 3, page_rows = 1 << page_shift;
  const int64_t k_row = n_kv * dk, v_row = n_kv * dv;
  const std::vector<int32_t> lengths = {37, 5};
  // Device rows: each page of each sequence at its own place, in reverse order.
  std::vector<std::vector<uint32_t>> device_pages(lengths.size());
  int64_t total_pages = 0;
  for (int32_t n : lengths) total_pages += (n + page_rows - 1) / page_rows;
  std::vector<uint16_t> k_rows(static_cast<size_t>(total_pages * page_rows * k_row));
  std::vector<uint16_t> v_rows(static_cast<size_t>(total_pages * page_rows * v_row));
  std::vector<std::vector<const uint8_t*>> k_pages(lengths.size()), v_pages(lengths.size());
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  int64_t next_page = total_pages - 1;
  for (size_t s = 0; s < lengths.size(); ++s) {
    for (int32_t first = 0; first < lengths[s]; first += page_rows, --next_page) {
      device_pages[s].push_back(static_cast<uint32_t>(next_page * page_rows));
      uint16_t* kp = k_rows.data() + next_page * page_rows * k_row;
      uint16_t* vp = v_rows.data() + next_page * page_rows * v_row;
      for (int64_t i = 0; i < page_rows * k_row; ++i) kp[i] = fp32_to_fp16(dist(rng));
      for (int64_t i = 0; i < page_rows * v_row; ++i) vp[i] = fp32_to_fp16(dist(rng));
      k_pages[s].push_back(reinterpret_cast<const uint8_t*>(kp));
      v_pages[s].push_back(reinterpret_cast<const uint8_t*>(vp));
    }
  }
  std::vector<uint32_t> table;
  std::vector<uint32_t> table_start;
  for (const auto& pages : device_pages) {
    table_start.push_back(static_cast<uint32_t>(table.size()));
    table.insert(table.end(), pages.begin(), pages.end());
  }
  const Buffer dk_rows = to_device(*device, k_rows), dv_rows = to_device(*device, v_rows), dtable = to_device(*device, table);
  const DeviceKvLayer kv{&dk_rows, &dv_rows, n_kv, dk, dv, page_shift};
  const auto cpu_view = [&](size_t s) {
    state::KvLayerView view;
    view.k_pages = k_pages[s].data();
    view.v_pages = v_pages[s].data();
    view.page_shift = page_shift;
    view.page_mask = page_rows - 1;
    view.k_row_bytes = static_cast<size_t>(k_row) * 2;
    view.v_row_bytes = static_cast<size_t>(v_row) * 2;
    view.n_pos = lengths[s];
    view.n_kv_heads = n_kv;
    view.head_dim_k = dk;
    view.head_dim_v = dv;
    return view;
  };
  // Queries: a prompt's last 4 positions of sequence 0, sequence 1's last, sequence 0's first.
  const std::vector<std::pair<size_t, int32_t>> asked = {{0, 33}, {0, 34}, {0, 35}, {0, 36}, {1, 4}, {0, 0}};
  const int64_t stride = n_head * dk + 8;
  const std::vector<float> q = random_floats(asked.size() * static_cast<size_t>(stride), 23);
  const Buffer dq = to_device(*device, q);
  std::vector<AttentionQuery> cpu_queries;
  std::vector<DeviceQuery> device_queries;
  for (const auto& [s, pos] : asked) {
    cpu_queries.push_back({pos, cpu_view(s)});
    device_queries.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(lengths[s]), table_start[s], 0});
  }
  const Buffer dqueries = to_device(*device, device_queries.data(), device_queries.size() * sizeof(DeviceQuery));
  const size_t out_count = asked.size() * static_cast<size_t>(n_head * dv);
  Buffer dout = device->allocate(out_count * sizeof(float));
  for (const auto& [window, softcap] : {std::pair<int32_t, float>{0, 0.0f}, {6, 0.0f}, {0, 5.0f}}) {
    SCOPED_TRACE("window " + std::to_string(window) + ", softcap " + std::to_string(softcap));
    AttentionParams p;
    p.n_head = n_head;
    p.n_head_kv = n_kv;
    p.head_dim_k = dk;
    p.head_dim_v = dv;
    p.scale = 1.0f / std::sqrt(static_cast<float>(dk));
    p.window = window;
    p.softcap = softcap;
    std::vector<float> want(out_count);
    cpu->attention(q.data(), stride, cpu_queries, p, want.data());
    ops.attention(all(dq), stride, kv, all(dqueries), all(dtable), static_cast<int64_t>(asked.size()), 37, p, all(dout));
    device->submit();
    const std::vector<float> got = from_device(*device, dout, out_count);
    EXPECT_LE(nmse(want, got), 5e-4);
    // Each query alone gives the same floats as in the batch.
    for (size_t i = 0; i < asked.size(); ++i) {
      // (Own buffers: an offset into the batch's may not meet the device's alignment.)
      const Buffer one_query = to_device(*device, &device_queries[i], sizeof(DeviceQuery));
      const Buffer one_q = to_device(*device, q.data() + i * static_cast<size_t>(stride), static_cast<size_t>(stride) * 4);
      Buffer alone = device->allocate(static_cast<size_t>(n_head * dv) * sizeof(float));
      ops.attention(all(one_q), stride, kv, all(one_query), all(dtable), 1, 37, p, all(alone));
      device->submit();
      const std::vector<float> single = from_device(*device, alone, static_cast<size_t>(n_head * dv));
      EXPECT_EQ(0, std::memcmp(single.data(), got.data() + i * static_cast<size_t>(n_head * dv), single.size() * 4))
          << "query " << i;
    }
  }
}

// Two sequences (a prompt of 6 rows, a decoding step of 1) with states carried in.
TEST(VulkanOps, RecurrentOpsMatchCpuAndUpdateTheirStates) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  auto cpu = make_cpu_backend(1);
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{0, 6}, {6, 1}};  // first row, rows
  const int64_t rows = 7;
  {
    const int64_t channels = 100, taps = 4, held = taps - 1;
    const std::vector<float> x = random_floats(static_cast<size_t>(rows * channels), 31);
    const std::vector<float> w = random_floats(static_cast<size_t>(taps * channels), 32);
    std::vector<float> states = random_floats(static_cast<size_t>(2 * held * channels), 33);
    const Buffer dx = to_device(*device, x), dw = to_device(*device, w), dstates = to_device(*device, states);
    std::vector<RecurrentSequence> cpu_seqs;
    std::vector<DeviceSequence> device_seqs;
    for (size_t s = 0; s < seqs.size(); ++s) {
      cpu_seqs.push_back({seqs[s].first, seqs[s].second, states.data() + s * held * channels, nullptr});
      device_seqs.push_back({static_cast<uint32_t>(seqs[s].first), static_cast<uint32_t>(seqs[s].second),
                             static_cast<uint32_t>(s * held * channels), 0});
    }
    const Buffer dseqs = to_device(*device, device_seqs.data(), device_seqs.size() * sizeof(DeviceSequence));
    std::vector<float> want(x.size());
    cpu->ssm_conv(x.data(), channels, w.data(), taps, cpu_seqs, want.data());
    Buffer dy = device->allocate(x.size() * sizeof(float));
    ops.ssm_conv(all(dx), channels, all(dw), taps, all(dseqs), 2, dstates, rows, all(dy));
    device->submit();
    EXPECT_LE(nmse(want, from_device(*device, dy, want.size())), 1e-6) << "ssm_conv";
    EXPECT_LE(nmse(states, from_device(*device, dstates, states.size())), 0.0) << "ssm_conv's states";
  }
  for (const bool grouped : {false, true}) {
    SCOPED_TRACE(grouped ? "grouped heads" : "tiled heads");
    const int64_t d = 24, hk = 2, hv = 4, stride = 3 * hv * d;
    const std::vector<float> qkv = random_floats(static_cast<size_t>(rows * stride), 41, 0.3f);
    std::vector<float> log_decay = random_floats(static_cast<size_t>(rows * hv), 42, 0.5f);
    for (float& g : log_decay) g = -std::fabs(g);
    std::vector<float> beta = random_floats(static_cast<size_t>(rows * hv), 43);
    for (float& b : beta) b = 1.0f / (1.0f + std::exp(-b));
    std::vector<float> states = random_floats(static_cast<size_t>(2 * hv * d * d), 44, 0.1f);
    const Buffer dqkv = to_device(*device, qkv), ddecay = to_device(*device, log_decay), dbeta = to_device(*device, beta);
    const Buffer dstates = to_device(*device, states);
    std::vector<RecurrentSequence> cpu_seqs;
    std::vector<DeviceSequence> device_seqs;
    for (size_t s = 0; s < seqs.size(); ++s) {
      cpu_seqs.push_back({seqs[s].first, seqs[s].second, nullptr, states.data() + s * hv * d * d});
      device_seqs.push_back({static_cast<uint32_t>(seqs[s].first), static_cast<uint32_t>(seqs[s].second), 0,
                             static_cast<uint32_t>(s * hv * d * d)});
    }
    const Buffer dseqs = to_device(*device, device_seqs.data(), device_seqs.size() * sizeof(DeviceSequence));
    DeltaRuleParams p;
    p.n_k_heads = hk;
    p.n_v_heads = hv;
    p.head_dim = d;
    p.grouped_heads = grouped;
    // q, k and v share rows: q at 0, k at hv * d, v at 2 * hv * d.
    std::vector<float> want(static_cast<size_t>(rows * hv * d));
    cpu->delta_rule(qkv.data(), qkv.data() + hv * d, qkv.data() + 2 * hv * d, stride, log_decay.data(), beta.data(),
                    cpu_seqs, p, want.data());
    Buffer dout = device->allocate(want.size() * sizeof(float));
    // (K and V as buffers of their own that start where they do in the rows: an offset
    // into one buffer may not meet the device's alignment.)
    const Buffer dk = to_device(*device, qkv.data() + hv * d, (qkv.size() - static_cast<size_t>(hv * d)) * 4);
    const Buffer dv = to_device(*device, qkv.data() + 2 * hv * d, (qkv.size() - static_cast<size_t>(2 * hv * d)) * 4);
    ops.delta_rule(all(dqkv), all(dk), all(dv), stride, all(ddecay), all(dbeta), all(dseqs), 2, dstates, p, rows, all(dout));
    device->submit();
    EXPECT_LE(nmse(want, from_device(*device, dout, want.size())), 1e-6) << "delta_rule";
    EXPECT_LE(nmse(states, from_device(*device, dstates, states.size())), 1e-6) << "delta_rule's states";
  }
}

TEST(VulkanDevice, WorkIsRecordedAndSubmittedOnce) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  const std::vector<float> a = random_floats(1000, 1);
  const Buffer da = to_device(*device, a);
  Buffer dy = device->allocate(a.size() * sizeof(float));
  const uint64_t submissions = device->submissions();
  for (int i = 0; i < 10; ++i) ops.silu(all(i == 0 ? da : dy), 1000, all(dy));
  device->submit();
  EXPECT_EQ(device->submissions() - submissions, 1u);
}

TEST(VulkanDevice, MisuseIsRefusedWithAReason) {
  REQUIRE_DEVICE(device);
  Buffer small = device->allocate(16);
  const BufferRange past[] = {{&small, 0, 64}, {&small, 0, 0}};
  EXPECT_THROW(device->dispatch(Shader::unary, past, nullptr, 0, 1), std::invalid_argument);
  const BufferRange one[] = {{&small, 0, 0}};
  EXPECT_THROW(device->dispatch(Shader::unary, one, nullptr, 0, 1), std::invalid_argument);
  std::vector<float> big(8);
  EXPECT_THROW(device->upload(small, 0, big.data(), big.size() * sizeof(float)), std::out_of_range);
  Ops ops(*device);
  const HostWeight unsupported = make_weight(GgmlType::IQ4_XS, 256, 2, 1);
  EXPECT_THROW(ops.upload(unsupported.weight), std::invalid_argument);
}

TEST(VulkanDevice, ListsDevicesWithWhatTheShadersNeed) {
  std::string error;
  const auto devices = list_devices(&error);
  if (devices.empty()) GTEST_SKIP() << "no Vulkan device: " << error;
  for (const DeviceInfo& d : devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.subgroup_size, 0u) << d.name;
    EXPECT_GT(d.max_storage_range, 0u) << d.name;
    EXPECT_EQ(d.usable, d.unusable_reason.empty()) << d.name;
  }
}

// A MoE FFN's expert stacks of `type`: 8 experts, n_embd 256, n_ff 256 (K-quant rows).
struct HostExperts {
  HostWeight gate, up, down;
  ExpertWeights weights;
};
HostExperts make_experts(GgmlType type, int64_t n_embd, int64_t n_ff, int64_t n_expert) {
  HostExperts h;
  h.gate = make_weight(type, n_embd, n_ff * n_expert, 21);
  h.up = make_weight(type, n_embd, n_ff * n_expert, 22);
  h.down = make_weight(type, n_ff, n_embd * n_expert, 23);
  h.weights.gate = ExpertStack{type, h.gate.bytes.data(), n_embd, n_ff, n_expert};
  h.weights.up = ExpertStack{type, h.up.bytes.data(), n_embd, n_ff, n_expert};
  h.weights.down = ExpertStack{type, h.down.bytes.data(), n_ff, n_embd, n_expert};
  return h;
}

TEST(VulkanOps, MoeRouteChoosesTheCpusExpertsWithItsWeights) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  auto cpu = make_cpu_backend(1);
  const int64_t n_expert = 37, tokens = 70, k = 5;  // tokens over one workgroup
  const std::vector<float> logits = random_floats(static_cast<size_t>(n_expert * tokens), 31, 2.0f);
  const Buffer dl = to_device(*device, logits);
  for (bool normalize : {false, true}) {
    SCOPED_TRACE(normalize ? "normalized" : "probabilities");
    std::vector<int32_t> want_experts(static_cast<size_t>(tokens * k));
    std::vector<float> want_weights(want_experts.size());
    cpu->moe_route(logits.data(), n_expert, tokens, k, normalize, want_experts.data(), want_weights.data());
    Buffer de = device->allocate(want_experts.size() * 4), dw = device->allocate(want_weights.size() * 4);
    ops.moe_route(all(dl), n_expert, tokens, k, normalize, all(de), all(dw));
    device->submit();
    std::vector<int32_t> got_experts(want_experts.size());
    device->download(de, 0, got_experts.data(), got_experts.size() * 4);
    EXPECT_EQ(want_experts, got_experts);
    EXPECT_LE(nmse(want_weights, from_device(*device, dw, want_weights.size())), 1e-6);
  }
}

class MoeTypes : public ::testing::TestWithParam<GgmlType> {};

// The device FFN against the CPU's on the CPU's routing; then each token alone gives
// its batch result bit for bit.
TEST_P(MoeTypes, FfnMatchesCpuAndATokenAloneItsBatchResult) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  auto cpu = make_cpu_backend(1);
  const int64_t n_embd = 256, n_ff = 256, n_expert = 8, tokens = 6, k = 3;
  const HostExperts experts = make_experts(GetParam(), n_embd, n_ff, n_expert);
  const std::vector<float> x = random_floats(static_cast<size_t>(n_embd * tokens), 41);
  const std::vector<float> logits = random_floats(static_cast<size_t>(n_expert * tokens), 42, 2.0f);
  std::vector<int32_t> chosen(static_cast<size_t>(tokens * k));
  std::vector<float> weights(chosen.size());
  cpu->moe_route(logits.data(), n_expert, tokens, k, true, chosen.data(), weights.data());
  std::vector<float> want(static_cast<size_t>(n_embd * tokens));
  cpu->moe_ffn(experts.weights, x.data(), tokens, chosen.data(), weights.data(), k, want.data());

  const DeviceExperts dexp = ops.upload(experts.weights);
  const Buffer dx = to_device(*device, x), dc = to_device(*device, chosen), dw = to_device(*device, weights);
  Buffer scratch = device->allocate(ops.moe_scratch_bytes(dexp, tokens, k));
  Buffer dy = device->allocate(want.size() * sizeof(float));
  ops.moe_ffn(dexp, all(dx), tokens, all(dc), all(dw), k, scratch, all(dy));
  device->submit();
  const std::vector<float> batch = from_device(*device, dy, want.size());
  EXPECT_LE(nmse(want, batch), 5e-4);

  for (int64_t t = 0; t < tokens; ++t) {
    const auto row = [&](const auto& v, int64_t width) {
      return std::vector(v.begin() + t * width, v.begin() + (t + 1) * width);
    };
    const Buffer x1 = to_device(*device, row(x, n_embd)), c1 = to_device(*device, row(chosen, k)),
                 w1 = to_device(*device, row(weights, k));
    Buffer s1 = device->allocate(ops.moe_scratch_bytes(dexp, 1, k));
    Buffer y1 = device->allocate(static_cast<size_t>(n_embd) * sizeof(float));
    ops.moe_ffn(dexp, all(x1), 1, all(c1), all(w1), k, s1, all(y1));
    device->submit();
    const std::vector<float> alone = from_device(*device, y1, static_cast<size_t>(n_embd));
    EXPECT_EQ(0, std::memcmp(alone.data(), batch.data() + t * n_embd, alone.size() * sizeof(float))) << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MoeTypes,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                                           GgmlType::Q4_K, GgmlType::Q6_K),
                         [](const auto& param_info) { return std::string(type_traits(param_info.param).name); });

TEST(VulkanOps, ExpertShapesThatDoNotFitTogetherAreRefused) {
  REQUIRE_DEVICE(device);
  Ops ops(*device);
  HostExperts experts = make_experts(GgmlType::F32, 32, 16, 2);
  experts.weights.down.cols = 8;
  EXPECT_THROW(ops.upload(experts.weights), std::invalid_argument);
}

}  // namespace
}  // namespace pico::backend::vulkan
