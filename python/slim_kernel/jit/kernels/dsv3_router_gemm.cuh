// dsv3_router_gemm: logits(M, E) = hidden_states(M, K) bf16 @ router_weight(E, K)^T, fp32 accumulation,
// fp32 or bf16 logits. M <= 16, any E (256/384 tuned), K % 8 == 0 (7168 tuned).
// Kernel body: slim::skinny_gemm in common.cuh (design notes there).
// slim:limits max_registers=168 max_spill_bytes=0 max_smem_static=0
//
// Compile-time parameters (-D):
//   SK_NT       token tiles of 8 (1: M <= 8, 2: M <= 16)
//   SK_RT       16-row weight tiles per CTA (default 1)
//   SK_STAGES   cp.async ring depth per warp, in 32-k blocks (default 8)
//   SK_OUT_BF16 1: bf16 logits, 0: fp32 logits
//   SK_PUSH     cluster reduction: 0 pull (barrier + ld.shared::cluster), 1 push (st.async + mbarrier)
//   SK_BULK     1: slim::skinny_bulk (2 producer warps + cp.async.bulk ring, block 32*(W+2));
//               0: slim::skinny_gemm (per-thread cp.async ring)
//   SK_KC       bulk: k per stage (multiple of 32, default 256)
//   SK_ACTW     bulk: 0 activations through the ring; W > 0 consumers (W warps) load them directly
//   SK_ROT      1: each CTA walks K starting at an offset of its own (spreads HBM channels)
// Runtime: grid (ceil(E / (16*SK_RT)), S), cluster (1, S, 1), block 32*W, smem from jit.py.
#include "common.cuh"

#ifndef SK_RT
#define SK_RT 1
#endif
#ifndef SK_STAGES
#define SK_STAGES 8
#endif
#ifndef SK_OUT_BF16
#define SK_OUT_BF16 0
#endif

extern "C" __global__ void __launch_bounds__(320, 1)
dsv3_router_gemm_kernel(const __nv_bfloat16* __restrict__ hidden_states, const __nv_bfloat16* __restrict__ router_weights,
                        void* __restrict__ out, int M, int E, int K, int ld_hidden, int ld_weight, int ld_out) {
#if SK_BULK
    slim::skinny_bulk<SK_RT, SK_NT, SK_KC, SK_STAGES, SK_OUT_BF16 != 0, SK_ACTW, SK_ROT != 0>(hidden_states, router_weights, out, M, E, K, ld_hidden,
                                                                ld_weight, ld_out);
#else
    slim::skinny_gemm<SK_RT, SK_NT, SK_STAGES, SK_OUT_BF16 != 0, SK_PUSH != 0, SK_ROT != 0>(hidden_states, router_weights, out, M, E, K,
                                                                 ld_hidden, ld_weight, ld_out);
#endif
}
