// normalize_embedding against values worked out by hand for each of llama-server's
// embd_normalize kinds.
#include "http/embedding_normalize.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace pico::coordinator::http_api {
namespace {

TEST(NormalizeEmbedding, EachKindAsLlamaServerDefinesIt) {
  const std::vector<float> v{3.0f, -4.0f, 0.0f, 12.0f};
  auto normalized = [&](int norm) {
    std::vector<float> out = v;
    normalize_embedding(out, norm);
    return out;
  };
  EXPECT_EQ(normalized(-1), v);
  // Euclidean: |v| = 13.
  const std::vector<float> e = normalized(2);
  EXPECT_FLOAT_EQ(e[0], 3.0f / 13);
  EXPECT_FLOAT_EQ(e[1], -4.0f / 13);
  EXPECT_FLOAT_EQ(e[3], 12.0f / 13);
  // Taxicab: 19.
  EXPECT_FLOAT_EQ(normalized(1)[1], -4.0f / 19);
  // Max absolute, to the int16 range: 12 becomes 32760.
  EXPECT_FLOAT_EQ(normalized(0)[3], 32760.0f);
  EXPECT_FLOAT_EQ(normalized(0)[0], 3.0f * 32760 / 12);
  // p = 3: (27 + 64 + 1728)^(1/3).
  EXPECT_NEAR(normalized(3)[3], 12.0 / std::cbrt(1819.0), 1e-6);
  // Zero stays zero.
  std::vector<float> zero(4, 0.0f);
  normalize_embedding(zero, 2);
  EXPECT_EQ(zero, std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace pico::coordinator::http_api
