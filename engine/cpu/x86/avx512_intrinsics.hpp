// <immintrin.h> for the AVX-512 files. GCC 12's AVX-512 intrinsics pass an
// "undefined" vector as the unused merge operand and then warn about it (GCC bug
// 105593): those two warnings are off for the rest of the including file; include
// this header before the others.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>
