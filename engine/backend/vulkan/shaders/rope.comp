#version 450
// RoPE in place: one invocation per (token, head, pair), WG pairs of a token to a
// workgroup. The angle
// of pair i0 is pos * theta_scale^(i0/2) as the CPU backend forms it (the product
// taken i0/2 times in order); YaRN's ramp mixes the interpolated and extrapolated
// angles; mscale (attn_factor and YaRN's magnitude) comes from the host.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) buffer Data { float x[]; };
layout(std430, binding = 1) readonly buffer Positions { int pos[]; };
layout(push_constant) uniform Push {
  uint row_stride; uint heads; uint head_dim; uint n_dims; uint neox;
  float theta_scale; float freq_scale; float ext_factor; float corr_low; float corr_high; float mscale;
} p;

void main() {
  const uint pairs = p.n_dims / 2;
  const uint groups_per_token = (p.heads * pairs + WG - 1) / WG;
  const uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint t = g / groups_per_token;
  const uint k = (g % groups_per_token) * WG + gl_LocalInvocationID.x;
  if (k < p.heads * pairs) {
    const uint h = k / pairs, i0 = (k % pairs) * 2;
    float theta = float(pos[t]);
    for (uint j = 0; j < i0 / 2; ++j) theta *= p.theta_scale;
    const float theta_interp = p.freq_scale * theta;
    float th = theta_interp;
    if (p.ext_factor != 0.0) {
      const float y = (float(i0 / 2) - p.corr_low) / max(0.001, p.corr_high - p.corr_low);
      const float ramp_mix = (1.0 - min(1.0, max(0.0, y))) * p.ext_factor;
      th = theta_interp * (1.0 - ramp_mix) + theta * ramp_mix;
    }
    const float c = cos(th) * p.mscale, s = sin(th) * p.mscale;
    const uint base = t * p.row_stride + h * p.head_dim;
    const uint a = base + (p.neox != 0 ? i0 / 2 : i0);
    const uint b = base + (p.neox != 0 ? i0 / 2 + p.n_dims / 2 : i0 + 1);
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}
