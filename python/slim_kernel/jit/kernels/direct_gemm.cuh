// direct_gemm: out(M, N) = act(M, K) @ W(N, K)^T, bf16 in, fp32 accumulation, M <= 8*NT (NT 1..2), any N, K % 8.
//
// ring_gemm.cuh's split-K (a cluster of S CTAs shares one 16-row tile's K) and swap-AB mma.sync
// fragments, without its ring: every lane loads its own fragments from global memory straight into
// registers, a round's weight loads all before griddepcontrol.wait and its token loads all right
// after, so a CTA's bytes are one round trip in flight, as in narrow_gemm.cuh. Against narrow, one
// MMA does 16 rows x 8 tokens x 16 k, and a token is read once per 16-row tile rather than once per
// CTA of 1-3 rows (ncu at router E=384 M=8: narrow's 2.15M instructions and 23.7 MB of L2
// traffic against 5.6 MB of weights).
//  * The rank's share of 32-k blocks [b0, b1) is dealt round-robin: block b0 + i*WARPS + warp to
//    warp `warp`, BPW blocks per warp and round. Lane (g, t) loads k 8t..8t+7 of the block for
//    weight rows g, g+8 and token 8n+g (reduce.cuh's fragment layout); what lies past K, N or M
//    reads as zeros.
//  * Partials are reduced in a fixed order (reduce.cuh): warps, then cluster ranks.
//
// Launch contract (slim_kernel/jit/catalogue.py, family "direct"):
//   grid (ceil(N / 16), S, 1), cluster (1, S, 1) when S > 1, block 32 * WARPS threads,
//   dynamic smem = direct_smem_bytes(NT, WARPS).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "reduce.cuh"

namespace slim {

__host__ __device__ constexpr int direct_smem_bytes(int nt, int warps) { return partials_bytes(1, nt, warps); }

template <int NT, int WARPS, int BPW, bool OUT_BF16>
__device__ __forceinline__ void direct_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert(NT >= 1 && NT <= 2 && WARPS >= 1 && WARPS <= 8 && BPW >= 1 && BPW <= 16, "bad direct config");
    constexpr int PER_ROUND = WARPS * BPW;  // 32-k blocks per CTA and round
    extern __shared__ __align__(16) float red[];
    pdl_launch_dependents();
    require_smem((unsigned)direct_smem_bytes(NT, WARPS));

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const unsigned crank = cluster_rank();
    const unsigned csize = cluster_size();
    const int row0 = blockIdx.x * 16;
    const int nb = (K + 31) / 32;
    const int b0 = (int)((long long)crank * nb / csize);
    const int b1 = (int)((long long)(crank + 1) * nb / csize);
    const int rounds = (b1 - b0 + PER_ROUND - 1) / PER_ROUND;  // uniform over the CTA; at least one waits below
    const bool lo_ok = row0 + g < N, hi_ok = row0 + g + 8 < N;
    const __nv_bfloat16* w_lo = w + (long long)(lo_ok ? row0 + g : 0) * ldw;
    const __nv_bfloat16* w_hi = w + (long long)(hi_ok ? row0 + g + 8 : 0) * ldw;

    float acc[1][NT][4];
    zero_acc<1, NT>(acc);
    for (int r = 0; r < (rounds > 0 ? rounds : 1); ++r) {
        unsigned v[BPW][2 + NT][4];  // per block: weight rows g, g+8, then the token tiles
        int kb[BPW];                 // this lane's k in each block, or -1 past the rank's share or K
#pragma unroll
        for (int i = 0; i < BPW; ++i) {
            const int b = b0 + r * PER_ROUND + i * WARPS + warp;
            const int k = b * 32 + 8 * t;
            kb[i] = b < b1 && k < K ? k : -1;
            ldg_na128_or_zero(w_lo + (kb[i] < 0 ? 0 : kb[i]), kb[i] >= 0 && lo_ok, v[i][0]);
            ldg_na128_or_zero(w_hi + (kb[i] < 0 ? 0 : kb[i]), kb[i] >= 0 && hi_ok, v[i][1]);
        }
        if (r == 0) pdl_wait();  // weights are parameters; the activation is the previous grid's output
#pragma unroll
        for (int i = 0; i < BPW; ++i)
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int tok = 8 * n + g;
                const bool ok = kb[i] >= 0 && tok < M;
                ldg_na128_or_zero(act + (ok ? (long long)tok * lda + kb[i] : 0), ok, v[i][2 + n]);
            }
#pragma unroll
        for (int i = 0; i < BPW; ++i) mma_block<1, NT>(acc, v[i]);
    }
    store_partials<1, NT>(red, warp, lane, acc);
    __syncthreads();
    store_split_tile<NT, OUT_BF16>(red, WARPS, M, out, ldo, row0, N);
}

}  // namespace slim
