// cluster.toml's [security] and per-worker public keys, and the rule that a cluster's
// links are all CURVE or all open.
#include "cluster_config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

namespace pico::coordinator {
namespace {

// libzmq's CURVE test vector (a server public key).
const char* const kKey = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
const char* const kOtherKey = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID";

class ClusterConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("pico-cluster-config-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "keys");
    std::ofstream(dir_ / "keys" / "w1.public") << kOtherKey << "\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& text) {
    const auto path = dir_ / "cluster.toml";
    std::ofstream(path) << text;
    return path.string();
  }
  std::string error_of(const std::string& text) {
    try {
      load_cluster_config(write(text));
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(accepted)";
  }
  std::filesystem::path dir_;
};

TEST_F(ClusterConfigFile, ReadsSecurityAndWorkerKeys) {
  const auto c = load_cluster_config(write(std::string("[security]\nsecret_key = \"keys/coord.secret\"\n") +
                                           "[[worker]]\naddress = \"tcp://a:1\"\npublic_key = \"" + kKey + "\"\n" +
                                           "[[worker]]\naddress = \"tcp://b:1\"\npublic_key = \"keys/w1.public\"\n"));
  ASSERT_TRUE(c.secret_key);
  // Relative to the file's folder, not to the working directory.
  EXPECT_EQ(*c.secret_key, (dir_ / "keys/coord.secret").string());
  ASSERT_EQ(c.workers.size(), 2u);
  EXPECT_EQ(c.workers[0].public_key, kKey);       // the Z85 text itself
  EXPECT_EQ(c.workers[1].public_key, kOtherKey);  // read from the file
  const auto open = load_cluster_config(write("[[worker]]\naddress = \"tcp://a:1\"\n"));
  EXPECT_FALSE(open.secret_key);
  EXPECT_TRUE(open.workers[0].public_key.empty());
}

TEST_F(ClusterConfigFile, RefusesBadSecurityEntries) {
  EXPECT_NE(error_of("[security]\nsecret = \"x\"\n").find("[security] has no key 'secret'"), std::string::npos);
  EXPECT_NE(error_of("[security]\nsecret_key = 3\n").find("secret_key must be the path"), std::string::npos);
  const std::string missing = error_of("[[worker]]\naddress = \"tcp://a:1\"\npublic_key = \"keys/none.public\"\n");
  EXPECT_NE(missing.find("worker tcp://a:1: public_key"), std::string::npos) << missing;
  EXPECT_NE(missing.find("none.public"), std::string::npos) << missing;
  EXPECT_NE(error_of("[[worker]]\naddress = \"tcp://a:1\"\npublic_key = 7\n").find("must be a string"),
            std::string::npos);
}

std::string security_error(const std::vector<WorkerEntry>& workers, bool secret) {
  try {
    check_security(workers, secret);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ClusterSecurity, AllCurveOrAllOpen) {
  const WorkerEntry keyed_a{"tcp://a:1", std::nullopt, kKey, std::nullopt}, keyed_b{"tcp://b:1", std::nullopt, kOtherKey, std::nullopt};
  const WorkerEntry open_b{"tcp://b:1", std::nullopt, "", std::nullopt};
  EXPECT_EQ(security_error({keyed_a, keyed_b}, true), "(accepted)");
  EXPECT_EQ(security_error({open_b}, false), "(accepted)");
  EXPECT_EQ(security_error({}, false), "(accepted)");  // in-process
  EXPECT_NE(security_error({}, true).find("there are none"), std::string::npos);
  const std::string mixed = security_error({keyed_a, open_b}, true);
  EXPECT_NE(mixed.find("tcp://b:1 has none"), std::string::npos) << mixed;
  EXPECT_NE(security_error({keyed_a, keyed_b}, false).find("--secret-key"), std::string::npos);
  EXPECT_NE(security_error({open_b}, true).find("--worker-key"), std::string::npos);
}

TEST_F(ClusterConfigFile, AWorkersMemoryCapIsASize) {
  const ClusterConfig c = load_cluster_config(write(
      "[[worker]]\naddress = \"tcp://a:1\"\nmemory = \"1.5G\"\n[[worker]]\naddress = \"tcp://b:1\"\n"));
  ASSERT_EQ(c.workers.size(), 2u);
  EXPECT_EQ(c.workers[0].memory, uint64_t{3} << 29);
  EXPECT_FALSE(c.workers[1].memory);
  EXPECT_NE(error_of("[[worker]]\naddress = \"tcp://a:1\"\nmemory = 100\n").find("memory must be a string"),
            std::string::npos);
  EXPECT_NE(error_of("[[worker]]\naddress = \"tcp://a:1\"\nmemory = \"lots\"\n").find("worker tcp://a:1: memory"),
            std::string::npos);
}

}  // namespace
}  // namespace pico::coordinator
