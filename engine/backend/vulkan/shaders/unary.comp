#version 450
#extension GL_GOOGLE_include_directive : require
// y = f(x) elementwise, f chosen by `op` (the values of enum UnaryOp, vulkan_ops.cpp):
// 0 SiLU, 1 sigmoid, 2 softplus (x itself above 20), 3 GELU (tanh form, through F16
// as the CPU's table: the input and the result rounded to F16), 4 GELU with erf,
// 5 scale by `factor`.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Input { float x[]; };
layout(std430, binding = 1) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint count; uint op; float factor; } p;

#include "float_rounding.glsl"

// erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7).
float erf_approx(float v) {
  const float t = 1.0 / (1.0 + 0.3275911 * abs(v));
  const float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  return sign(v) * (1.0 - poly * exp(-v * v));
}

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * WG + gl_LocalInvocationID.x;
  if (i >= p.count) return;
  const float v = x[i];
  float r;
  switch (p.op) {
    case 0: r = v / (1.0 + exp(-v)); break;
    case 1: r = 1.0 / (1.0 + exp(-v)); break;
    case 2: r = v > 20.0 ? v : log(1.0 + exp(v)); break;
    case 3: {
      if (v <= -10.0) { r = 0.0; break; }
      if (v >= 10.0) { r = v; break; }
      const float h = round_to_half(v);
      r = round_to_half(0.5 * h * (1.0 + tanh(0.79788456080286535588 * h * (1.0 + 0.044715 * h * h))));
      break;
    }
    case 4: r = 0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752440)); break;
    default: r = v * p.factor; break;
  }
  y[i] = r;
}
