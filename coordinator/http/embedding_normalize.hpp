// How llama-server normalises a pooled embedding (its embd_normalize parameter).
#pragma once

#include <vector>

namespace pico::coordinator::http_api {

// In place: -1 leaves it; 0 scales the largest magnitude to 32760 (an int16 range); 2
// divides by the euclidean norm; any other p > 0 by the p-norm (1: the sum of
// magnitudes). Sums in double; an all-zero vector stays zero.
void normalize_embedding(std::vector<float>& values, int norm);

}  // namespace pico::coordinator::http_api
