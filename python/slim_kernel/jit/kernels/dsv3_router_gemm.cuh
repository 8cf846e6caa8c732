// dsv3_router_gemm: logits(M, E) = hidden_states(M, K) bf16 @ router_weight(E, K)^T, fp32 accumulation,
// fp32 or bf16 logits. M <= 64 (narrow, direct: 16, ring: 32), any E (256/384 tuned), K % 8 == 0 (7168 tuned).
// Kernel bodies: skinny_gemm.cuh (SK_FAMILY 0), narrow_gemm.cuh (1), ring_gemm.cuh (2), direct_gemm.cuh (4)
// and sliced_gemm.cuh (5); design notes there.
// Instances, launch geometry and shared memory: slim_kernel/jit/catalogue.py.
// slim:limits max_registers=168 max_spill_bytes=0 max_smem_static=0
//
// Compile-time parameters (-D), all passed by the catalogue:
//   SK_FAMILY   0 skinny, 1 narrow, 2 ring, 4 direct, 5 sliced
//   SK_OUT_BF16 1: bf16 logits, 0: fp32 logits
//   skinny: SK_NT (token tiles of 8), SK_RT (16-row weight tiles per CTA), SK_STAGES (cp.async ring depth)
//   narrow: SK_ROWS (rows per CTA), SK_MT (max tokens), SK_CPT (16-byte chunks per thread per row),
//           SK_THREADS (block size), SK_PLAIN (optional: plain loads), SK_LATE (optional: the PDL
//           trigger after the FMAs), SK_MAXNREG (optional: a register cap), SK_EXACTK (optional:
//           the straight-line body for K == SK_EXACTK, M == SK_MT and E % SK_ROWS == 0 only)
//   ring:   SK_NT, SK_TK (k per stage), SK_STAGES, SK_CW (compute warps), SK_LW (weight-loader warps)
//   direct: SK_NT, SK_CW (warps), SK_BPW (32-k blocks per warp and round)
//   sliced: SK_NT, SK_CW, SK_BPW, SK_EXACTK (optional: the body for K == SK_EXACTK and E % 8 == 0 only)
#include "direct_gemm.cuh"
#include "narrow_gemm.cuh"
#include "ring_gemm.cuh"
#include "skinny_gemm.cuh"
#include "sliced_gemm.cuh"

// The block bound: 10 warps, the most a skinny configuration launches (catalogue.Skinny: warps
// <= 10), the ring's compute + loader warps, or narrow's own (narrow_gemm.cuh); one CTA per SM is the design point.
#if SK_FAMILY == 0
#define SK_BOUNDS __launch_bounds__(320, 1)
#elif SK_FAMILY == 1
#define SK_BOUNDS SK_NARROW_BOUNDS
#elif SK_FAMILY == 4 || SK_FAMILY == 5
#define SK_BOUNDS __launch_bounds__(32 * SK_CW, 1)
#else
#define SK_BOUNDS __launch_bounds__(32 * (SK_CW + SK_LW + 1), 1)
#endif

extern "C" __global__ void SK_BOUNDS
dsv3_router_gemm_kernel(const __nv_bfloat16* __restrict__ hidden_states, const __nv_bfloat16* __restrict__ router_weights,
                        void* __restrict__ out, int M, int E, int K, int ld_hidden, int ld_weight, int ld_out) {
#if SK_FAMILY == 0
    slim::skinny_gemm<SK_RT, SK_NT, SK_STAGES, SK_OUT_BF16 != 0>(hidden_states, router_weights, out, M, E, K, ld_hidden,
                                                                ld_weight, ld_out);
#elif SK_FAMILY == 1
    slim::narrow_instance<SK_OUT_BF16 != 0>(hidden_states, router_weights, out, M, E, K, ld_hidden, ld_weight, ld_out);
#elif SK_FAMILY == 4
    slim::direct_gemm<SK_NT, SK_CW, SK_BPW, SK_OUT_BF16 != 0>(hidden_states, router_weights, out, M, E, K, ld_hidden,
                                                             ld_weight, ld_out);
#elif SK_FAMILY == 5
    slim::sliced_instance<SK_OUT_BF16 != 0>(hidden_states, router_weights, out, M, E, K, ld_hidden, ld_weight, ld_out);
#else
    slim::ring_gemm<SK_NT, SK_TK, SK_STAGES, SK_CW, SK_LW, SK_OUT_BF16 != 0>(hidden_states, router_weights, out,
                                                                                       M, E, K, ld_hidden, ld_weight, ld_out);
#endif
}
