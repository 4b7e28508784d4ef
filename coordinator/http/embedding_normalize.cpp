#include "http/embedding_normalize.hpp"

#include <algorithm>
#include <cmath>

namespace pico::coordinator::http_api {

void normalize_embedding(std::vector<float>& values, int norm) {
  double size = 0.0;
  if (norm < 0) return;
  if (norm == 0) {
    for (const float v : values) size = std::max(size, static_cast<double>(std::fabs(v)));
    size /= 32760.0;
  } else if (norm == 2) {
    for (const float v : values) size += static_cast<double>(v) * v;
    size = std::sqrt(size);
  } else {
    for (const float v : values) size += std::pow(std::fabs(static_cast<double>(v)), norm);
    size = std::pow(size, 1.0 / norm);
  }
  const double scale = size > 0.0 ? 1.0 / size : 0.0;
  for (float& v : values) v = static_cast<float>(v * scale);
}

}  // namespace pico::coordinator::http_api
