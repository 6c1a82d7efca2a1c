// The fused elementwise tile loop for AVX512 (see fused_kernels.inc). Only
// this unit is compiled for AVX512; fused_elementwise.cpp checks the CPU.
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl")
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
#ifndef __AVX512F__
#define __AVX512F__ 1
#endif
#ifndef __AVX512BW__
#define __AVX512BW__ 1
#endif
#ifndef __AVX512DQ__
#define __AVX512DQ__ 1
#endif
#ifndef __AVX512VL__
#define __AVX512VL__ 1
#endif
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#define FUSED_RUN run_avx512
#define FUSED_ROWS run_rows_avx512
#define FUSED_LN_ROW layer_norm_row_avx512
#define FUSED_CE_BACKWARD ce_backward_avx512
#define FUSED_LN_BACKWARD ln_backward_avx512
#include "executors/tpu/fused_kernels.inc"
