#version 450
// Mixture-of-experts routing, an invocation per token (backend.hpp's moe_route): the
// softmax over the experts, the k most probable (ties: the lower index), their
// probabilities, divided by their sum (at least 2^-14) when normalize.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) buffer Experts { int experts[]; };
layout(std430, binding = 2) buffer Weights { float weights[]; };
layout(push_constant) uniform Push { uint n_expert; uint tokens; uint k; uint normalize; uint groups_x; } p;

void main() {
  const uint t = gl_GlobalInvocationID.x + gl_WorkGroupID.y * p.groups_x * WG;
  if (t >= p.tokens) return;
  const uint row = t * p.n_expert;
  float m = uintBitsToFloat(0xff800000u);
  for (uint e = 0; e < p.n_expert; ++e) m = max(m, logits[row + e]);
  float sum = 0.0;
  for (uint e = 0; e < p.n_expert; ++e) sum += exp(logits[row + e] - m);
  float chosen = 0.0;
  for (uint j = 0; j < p.k; ++j) {
    int best = -1;
    float best_p = -1.0;
    for (uint e = 0; e < p.n_expert; ++e) {
      bool taken = false;
      for (uint i = 0; i < j; ++i) taken = taken || experts[t * p.k + i] == int(e);
      const float pe = exp(logits[row + e] - m) / sum;
      if (!taken && pe > best_p) {
        best_p = pe;
        best = int(e);
      }
    }
    experts[t * p.k + j] = best;
    weights[t * p.k + j] = best_p;
    chosen += best_p;
  }
  if (p.normalize != 0) {
    const float divisor = max(chosen, 1.0 / 16384.0);
    for (uint j = 0; j < p.k; ++j) weights[t * p.k + j] /= divisor;
  }
}
