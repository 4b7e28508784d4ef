// The shader a type's file makes, by the define it is compiled with: get_rows
// (GET_ROWS), the experts' matmul (MATMUL_ID, in matmul_body.glsl), or matmul.
#ifdef GET_ROWS
#include "get_rows_body.glsl"
#else
#include "matmul_body.glsl"
#endif
