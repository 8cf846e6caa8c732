// dsv3_fused_a_gemm: out(M, N) bf16 = mat_a(M, K) bf16 @ mat_b(K, N), mat_b column-major, i.e. the
// contiguous (N, K) weight W read row by row; fp32 accumulation. M <= 16, K % 8 == 0, any N
// (7168 -> 2112 tuned: 2112 / 16 = 132 row tiles, one 16-row CTA per H200 SM: RT=1, no cluster,
// 8 warps splitting K; measured in benchmark/results/h200/NOTES_kernels.md).
// Kernel body: slim::skinny_gemm in common.cuh (design notes there).
// slim:limits max_registers=168 max_spill_bytes=0 max_smem_static=0
//
// Compile-time parameters (-D):
//   SK_NT       token tiles of 8 (1: M <= 8, 2: M <= 16)
//   SK_RT       16-row weight tiles per CTA (default 4)
//   SK_STAGES   cp.async ring depth per warp, in 32-k blocks (default 4)
//   SK_PUSH     cluster reduction: 0 pull (barrier + ld.shared::cluster), 1 push (st.async + mbarrier)
//   SK_BULK     1: slim::skinny_bulk (2 producer warps + cp.async.bulk ring, block 32*(W+2));
//               0: slim::skinny_gemm (per-thread cp.async ring)
//   SK_KC       bulk: k per stage (multiple of 32, default 256)
//   SK_ACTW     bulk: 0 activations through the ring; W > 0 consumers (W warps) load them directly
//   SK_ROT      1: each CTA walks K starting at an offset of its own (spreads HBM channels)
// Runtime: grid (ceil(N / (16*SK_RT)), S), cluster (1, S, 1), block 32*W, smem from jit.py.
#include "common.cuh"

#ifndef SK_RT
#define SK_RT 4
#endif
#ifndef SK_STAGES
#define SK_STAGES 4
#endif

extern "C" __global__ void __launch_bounds__(320, 1)
dsv3_fused_a_gemm_kernel(const __nv_bfloat16* __restrict__ mat_a, const __nv_bfloat16* __restrict__ weight,
                         __nv_bfloat16* __restrict__ out, int M, int N, int K, int ld_a, int ld_weight, int ld_out) {
#if SK_BULK
    slim::skinny_bulk<SK_RT, SK_NT, SK_KC, SK_STAGES, true, SK_ACTW, SK_ROT != 0>(mat_a, weight, out, M, N, K, ld_a, ld_weight, ld_out);
#else
    slim::skinny_gemm<SK_RT, SK_NT, SK_STAGES, true, SK_PUSH != 0, SK_ROT != 0>(mat_a, weight, out, M, N, K, ld_a, ld_weight, ld_out);
#endif
}
