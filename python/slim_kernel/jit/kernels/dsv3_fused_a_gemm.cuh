// dsv3_fused_a_gemm: out(M, N) bf16 = mat_a(M, K) bf16 @ mat_b(K, N), mat_b column-major, i.e. the
// contiguous (N, K) weight W read row by row; fp32 accumulation. M <= 64 (stream: 32), K % 8 == 0, any N
// (7168 -> 2112 tuned: 2112 / 16 = 132 row tiles, one 16-row CTA per H200 SM).
// Kernel bodies: skinny_gemm.cuh (SK_FAMILY 0), narrow_gemm.cuh (1: M <= 16, thin weights whose 16-row tiles
// would leave SMs idle) and stream_gemm.cuh (3); design notes there.
// Instances, launch geometry and shared memory: slim_kernel/jit/catalogue.py.
// slim:limits max_registers=168 max_spill_bytes=0 max_smem_static=0
//
// Compile-time parameters (-D), all passed by the catalogue:
//   SK_FAMILY   0 skinny, 1 narrow, 3 stream
//   skinny: SK_NT (token tiles of 8), SK_RT (16-row weight tiles per CTA), SK_STAGES (cp.async ring depth)
//   narrow: SK_ROWS, SK_MT, SK_CPT, SK_THREADS and the optional SK_PLAIN, SK_LATE, SK_MAXNREG, SK_EXACTK as in
//           dsv3_router_gemm.cuh
//   stream: SK_NT, SK_STAGES (mbarrier ring depth), SK_PIECES (contiguous 512-byte pieces of each row per stage),
//           SK_RT (optional: 16-row weight tiles per CTA, 1 or 2)
#include "narrow_gemm.cuh"
#include "skinny_gemm.cuh"
#include "stream_gemm.cuh"

#ifndef SK_RT
#define SK_RT 1
#endif

#if SK_FAMILY != 0 && SK_FAMILY != 1 && SK_FAMILY != 3
#error "dsv3_fused_a_gemm has the skinny (SK_FAMILY 0), narrow (1) and stream (3) kernels"
#endif

// skinny, stream: 320 threads = 10 warps, the most a skinny configuration launches (catalogue.Skinny: warps <= 10;
// stream launches 256); one CTA per SM, so ptxas may use up to 204 registers (the limits line above caps them at
// 168). narrow: its own bound (narrow_gemm.cuh).
#if SK_FAMILY == 1
#define SK_BOUNDS SK_NARROW_BOUNDS
#else
#define SK_BOUNDS __launch_bounds__(320, 1)
#endif

extern "C" __global__ void SK_BOUNDS
dsv3_fused_a_gemm_kernel(const __nv_bfloat16* __restrict__ mat_a, const __nv_bfloat16* __restrict__ weight,
                         __nv_bfloat16* __restrict__ out, int M, int N, int K, int ld_a, int ld_weight, int ld_out) {
#if SK_FAMILY == 0
    slim::skinny_gemm<SK_RT, SK_NT, SK_STAGES, true>(mat_a, weight, out, M, N, K, ld_a, ld_weight, ld_out);
#elif SK_FAMILY == 1
    slim::narrow_instance<true>(mat_a, weight, out, M, N, K, ld_a, ld_weight, ld_out);
#else
    slim::stream_gemm<SK_NT, SK_STAGES, true, SK_PIECES, SK_RT>(mat_a, weight, out, M, N, K, ld_a, ld_weight, ld_out);
#endif
}
