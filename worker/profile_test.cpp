// The profile's two encodings (the cache's JSON, Capabilities.profile): what goes in
// comes out, and what is malformed is refused naming what is wrong.
#include "profile.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

namespace pico::worker {
namespace {

WorkerProfile sample_profile() {
  WorkerProfile p;
  p.model_hash = 0x0123456789abcdefULL;
  p.backend = "vulkan";
  p.device_index = 1;
  p.device = "llvmpipe, Mesa";
  p.isa = "avx2";
  p.threads = 3;
  p.batch = 64;
  p.batches = profile_batches(64);
  p.layers = {{0.5e-3, {0.4e-3, 0.3e-3, 0.2e-3, 0.15e-3, 0.12e-3, 0.1e-3}},
              {0.25e-3, {0.2e-3, 0.15e-3, 0.1e-3, 0.08e-3, 0.07e-3, 0.0625e-3}}};
  p.head = {2e-3, {1.9e-3, 1.8e-3, 1.6e-3, 1.4e-3, 1.2e-3, 1e-3}};
  p.memory_bytes = 123456;
  return p;
}

void expect_same_times(const WorkerProfile& a, const WorkerProfile& b) {
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].decode_seconds, b.layers[i].decode_seconds);
    EXPECT_EQ(a.layers[i].seconds_per_token, b.layers[i].seconds_per_token);
  }
  EXPECT_EQ(a.head.decode_seconds, b.head.decode_seconds);
  EXPECT_EQ(a.head.seconds_per_token, b.head.seconds_per_token);
  EXPECT_EQ(a.batch, b.batch);
  EXPECT_EQ(a.batches, b.batches);
}

TEST(WorkerProfile, JsonRoundTrips) {
  const WorkerProfile p = sample_profile();
  const WorkerProfile q = profile_from_json(profile_to_json(p));
  expect_same_times(p, q);
  EXPECT_EQ(q.model_hash, p.model_hash);
  EXPECT_EQ(q.backend, p.backend);
  EXPECT_EQ(q.device_index, 1);
  EXPECT_EQ(q.device, p.device);
  EXPECT_EQ(q.isa, p.isa);
  EXPECT_EQ(q.threads, 3);
}

TEST(WorkerProfile, MalformedJsonIsRefusedNamingWhat) {
  const auto error_of = [](const std::string& text) -> std::string {
    try {
      profile_from_json(text);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(error_of("[1, 2").find("not a JSON object"), std::string::npos);
  std::string good = profile_to_json(sample_profile());
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_NE(error_of(with("\"version\": 3", "\"version\": 2")).find("version"), std::string::npos);
  EXPECT_NE(error_of(with("\"batch\": 64", "\"batch\": 0")).find("batch"), std::string::npos);
  EXPECT_NE(error_of(with("\"batch\": 64", "\"batches\": 64")).find("no 'batch'"), std::string::npos);
  EXPECT_NE(error_of(with("\"threads\": 3", "\"threads\": 1e300")).find("'threads' is not an integer"),
            std::string::npos);
  EXPECT_NE(error_of(with("\"threads\": 3", "\"threads\": 3.5")).find("'threads'"), std::string::npos);
  EXPECT_NE(error_of(with("0.0005", "-0.0005")).find("layer 0"), std::string::npos);
  EXPECT_NE(error_of(with("\"isa\": \"avx2\"", "\"isa\": 2")), "(accepted)");
  // The batches measured and a time for each of them.
  const auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(good);
    edit(j);
    return error_of(j.dump());
  };
  EXPECT_EQ(edited([](nlohmann::json&) {}), "(accepted)");
  EXPECT_NE(edited([](nlohmann::json& j) { j["batches"] = {2, 4, 8, 16, 64}; }).find("batches"), std::string::npos);
  EXPECT_NE(edited([](nlohmann::json& j) { j.erase("batches"); }).find("no 'batches'"), std::string::npos);
  EXPECT_NE(edited([](nlohmann::json& j) { j["layers"][1][1].erase(0); }).find("layer 1"), std::string::npos);
  EXPECT_NE(edited([](nlohmann::json& j) { j["head"][1][3] = "x"; }).find("head"), std::string::npos);
  EXPECT_NE(edited([](nlohmann::json& j) { j["layers"][0][1][5] = -1; }).find("layer 0"), std::string::npos);
  EXPECT_NE(error_of(with("\"model_hash\": \"0123456789abcdef\"", "\"model_hash\": \"xyz\"")), "(accepted)");
}

TEST(WorkerProfile, CapabilitiesCarryItAndTheReaderChecksIt) {
  const WorkerProfile p = sample_profile();
  protocol::Builder b;
  write_profile(p, b.envelope().getBody().initCapabilities().initProfile());
  const std::vector<uint8_t> bytes = b.encode();
  protocol::Decoded d(bytes);
  const auto in = d.envelope().getBody().getCapabilities().getProfile();
  const auto q = read_profile(in, 2);
  ASSERT_TRUE(q);
  expect_same_times(p, *q);
  EXPECT_EQ(q->memory_bytes, 123456u);
  EXPECT_THROW(read_profile(in, 3), std::invalid_argument);  // not every layer of the model

  protocol::Builder none;
  none.envelope().getBody().initCapabilities();
  const std::vector<uint8_t> none_bytes = none.encode();
  protocol::Decoded nd(none_bytes);
  EXPECT_FALSE(read_profile(nd.envelope().getBody().getCapabilities().getProfile(), 2));  // batch 0: none

  WorkerProfile bad = p;
  bad.layers[1].seconds_per_token[2] = std::numeric_limits<double>::infinity();
  protocol::Builder c;
  write_profile(bad, c.envelope().getBody().initCapabilities().initProfile());
  const std::vector<uint8_t> c_bytes = c.encode();
  protocol::Decoded cd(c_bytes);
  EXPECT_THROW(read_profile(cd.envelope().getBody().getCapabilities().getProfile(), 2), std::invalid_argument);
}

}  // namespace
}  // namespace pico::worker
