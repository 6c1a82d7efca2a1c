// The fused elementwise tile loop for AVX2 (see fused_kernels.inc). Only
// this unit is compiled for AVX2; fused_elementwise.cpp checks the CPU.
#pragma GCC target("avx2,fma")
// The pragma enables the instructions; SLEEF's header also looks at the macros.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#define FUSED_RUN run_avx2
#define FUSED_ROWS run_rows_avx2
#define FUSED_LN_ROW layer_norm_row_avx2
#define FUSED_CE_BACKWARD ce_backward_avx2
#define FUSED_LN_BACKWARD ln_backward_avx2
#include "executors/tpu/fused_kernels.inc"
