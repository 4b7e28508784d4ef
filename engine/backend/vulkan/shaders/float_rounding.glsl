// Roundings that give the same bits on every device. GLSL leaves the rounding of
// packHalf2x16 to the implementation (NVIDIA's driver does not round to nearest even)
// and lets a division be off by 2.5 ulp, while the CPU backend rounds both to nearest,
// ties to even: these do it in integers. Multiplication, addition and roundEven are
// exact on every Vulkan device already.

// f32 -> f16 bits: quant/float_convert.hpp's fp32_to_fp16 (nearest, ties to even;
// overflow to infinity; NaN made the quiet 0x7e00, sign kept).
uint to_half_bits(float f) {
  const uint bits = floatBitsToUint(f);
  const uint sign = (bits >> 16) & 0x8000u;
  const uint magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up: the tie goes to infinity
  if (magnitude < 0x38800000u) {
    // Below 2^-14: units of 2^-24, the mantissa shifted right by 126 - exponent.
    const uint exponent = magnitude >> 23;
    const uint shift = 126u - exponent;
    if (exponent == 0u || shift > 24u) return sign;
    const uint mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    uint q = mantissa >> shift;
    const uint rest = mantissa & ((1u << shift) - 1u), half_unit = 1u << (shift - 1u);
    if (rest > half_unit || (rest == half_unit && (q & 1u) != 0u)) q += 1u;
    return sign | q;
  }
  const uint odd = (magnitude >> 13) & 1u;
  return sign | ((magnitude + 0xfffu + odd - ((127u - 15u) << 23)) >> 13);
}

// f rounded to the nearest F16 value, as a float (the widening is exact).
float round_to_half(float f) { return unpackHalf2x16(to_half_bits(f)).x; }

// A finite float's significand with its leading one, in [2^23, 2^24), subnormals
// normalized (zero gives 0), and the biased exponent that goes with it (below 1 for a
// subnormal).
uint significand_of(uint bits) {
  const uint mantissa = bits & 0x7fffffu;
  if ((bits & 0x7f800000u) != 0u) return mantissa | 0x800000u;
  return mantissa == 0u ? 0u : mantissa << uint(23 - findMSB(mantissa));
}
int exponent_of(uint bits) {
  const uint mantissa = bits & 0x7fffffu;
  if ((bits & 0x7f800000u) != 0u || mantissa == 0u) return int((bits >> 23) & 0xffu);
  return 1 - (23 - findMSB(mantissa));
}

// a / b rounded to nearest, ties to even, by long division of the significands;
// subnormal quotients rounded once, overflow to infinity. Infinities, NaNs and a zero
// divisor are left to the device's division (no caller passes them).
float divide_exact(float a, float b) {
  const uint a_bits = floatBitsToUint(a), b_bits = floatBitsToUint(b);
  if ((a_bits & 0x7f800000u) == 0x7f800000u || (b_bits & 0x7f800000u) == 0x7f800000u || b == 0.0) return a / b;
  const uint sign = (a_bits ^ b_bits) & 0x80000000u;
  uint dividend = significand_of(a_bits);
  const uint divisor = significand_of(b_bits);
  if (dividend == 0u) return uintBitsToFloat(sign);
  int exponent = exponent_of(a_bits) - exponent_of(b_bits) + 127;  // biased, for a quotient in [1, 2)
  if (dividend < divisor) {
    dividend <<= 1;
    --exponent;
  }
  // 24 bits of quotient; then twice the remainder, against the divisor, says how the
  // dropped part compares with one half.
  uint quotient = 0u, rest = dividend;
  for (int i = 0; i < 24; ++i) {
    quotient <<= 1;
    if (rest >= divisor) {
      rest -= divisor;
      quotient |= 1u;
    }
    rest <<= 1;
  }
  if (exponent >= 255) return uintBitsToFloat(sign | 0x7f800000u);
  if (exponent <= 0) {  // subnormal: drop 1 - exponent more bits, rounding once
    const int shift = 1 - exponent;
    if (shift > 24) return uintBitsToFloat(sign);  // below half the smallest subnormal
    uint kept = quotient >> uint(shift);
    const uint dropped = quotient & ((1u << uint(shift)) - 1u), half_unit = 1u << uint(shift - 1);
    if (dropped > half_unit || (dropped == half_unit && (rest != 0u || (kept & 1u) != 0u))) kept += 1u;
    return uintBitsToFloat(sign | kept);  // kept == 2^23 is the smallest normal's encoding
  }
  if (rest > divisor || (rest == divisor && (quotient & 1u) != 0u)) quotient += 1u;
  if (quotient == 0x1000000u) {
    quotient >>= 1;
    ++exponent;
    if (exponent >= 255) return uintBitsToFloat(sign | 0x7f800000u);
  }
  return uintBitsToFloat(sign | (uint(exponent) << 23) | (quotient & 0x7fffffu));
}
