// sliced_gemm: out(M, N) = act(M, K) @ W(N, K)^T for few tokens (M <= 8*NT, NT 1..2), bf16 in, fp32 accumulation.
//
// narrow_gemm.cuh's shape of work (a CTA owns 8 output rows over the whole K: no cluster, no cross-CTA reduction) on
// the tensor cores instead of CUDA-core FMAs. One mma.m16n8k16 multiplies 16 tokens (its rows) by 8 columns, the
// CTA's 8 weight rows; each warp takes its own 32-k blocks of K (the "slices" of the name) and the warps' sums meet
// in shared memory. A token is read once per 8 rows: the time grows ~0.18 us a token at E=896 on the H100 against
// narrow's 0.4-0.6 (benchmark/DESIGN.md, with the configurations with fewer rows that lost).
//  * Every lane loads real bytes: lane (g, t) loads 16 bytes of row g per 32-k block, k 8t..8t+7 of the block
//    (reduce.cuh's K permutation, the same for both operands), and of tokens g and g + 8 (NT = 2).
//  * Weights are parameters: a round's weight loads all issue at entry, before griddepcontrol.wait (PDL); the
//    tokens follow in batches of up to 64 registers per lane, every load of a batch before its MMAs. More warps
//    (fewer blocks per warp, BPW) queue fewer loads per lane.
//  * Sums in a fixed order (the warps in order): repeated runs are bit-identical.
//
// Launch contract (slim_kernel/jit/catalogue.py, family "sliced"):
//   grid (ceil(N / 8)), block 32 * WARPS threads, dynamic smem = sliced_smem_bytes(NT, WARPS).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "ptx.cuh"

namespace slim {

constexpr int kSlicedRows = 8;  // weight rows per CTA: the MMA's 8 columns

__host__ __device__ constexpr int sliced_smem_bytes(int nt, int warps) { return warps * 8 * nt * kSlicedRows * 4; }

template <int NT, int WARPS, int BPW, bool OUT_BF16, int EXACTK = 0>
__device__ __forceinline__ void sliced_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert((NT == 1 || NT == 2) && WARPS >= 1 && WARPS <= 32 && BPW >= 1 && BPW <= 16 && EXACTK % 8 == 0,
                  "bad sliced config");
    constexpr int ROWS = kSlicedRows;
    constexpr int MT = 8 * NT;
    // blocks per batch: 64 registers of token fragments per lane, 32 for two halves (ptxas overlaps the batches) or
    // in the generic body (its addresses take more)
    constexpr int PER_BATCH = (EXACTK ? 64 : 32) / NT / 4;
    constexpr int TBB = PER_BATCH < 1 ? 1 : PER_BATCH > BPW ? BPW : PER_BATCH;
    // EXACTK > 0: the caller checked K == EXACTK and N % 8 == 0 (its own instance), so every load's address is a
    // per-lane base plus an immediate, and where the rounds tile K the predicates past K fold away (as
    // narrow_gemm.cuh's straight-line body).
    constexpr bool tiled = EXACTK && EXACTK % (32 * WARPS * BPW) == 0;  // every lane's every block inside K
    extern __shared__ __align__(16) float red[];  // [WARPS][MT * ROWS]
    pdl_launch_dependents();
    require_smem((unsigned)sliced_smem_bytes(NT, WARPS));

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * ROWS;
    const int k_len = EXACTK ? EXACTK : K;
    const int nb = (k_len + 31) >> 5;  // 32-k blocks
    const int m_used = M < MT ? M : MT;
    const int lane_k = warp * 32 + 8 * t;  // this lane's k in a round's first block
    const bool row_ok = EXACTK || row0 + g < N;
    const __nv_bfloat16* wl = w + (long long)(row_ok ? row0 + g : 0) * ldw + lane_k;
    const __nv_bfloat16* xl = act + lane_k;

    float acc[4] = {0.f, 0.f, 0.f, 0.f};

#pragma unroll(EXACTK ? 4 : 1)  // the generic body: one round's registers at a time
    for (int r0 = 0; r0 < nb; r0 += WARPS * BPW) {
        unsigned wv[BPW][4];
        bool in_k[BPW];  // block i of this round lies inside K for this lane
#pragma unroll
        for (int i = 0; i < BPW; ++i) {
            const int kb = (r0 + i * WARPS) * 32;  // block i's k past lane_k
            in_k[i] = tiled || lane_k + kb < k_len;
            ldg_na128_or_zero(wl + kb, in_k[i] && row_ok, wv[i]);
        }
        if (r0 == 0) pdl_wait();  // weights are parameters; the activation is the previous grid's output
        // Token batches: half h (tokens g + 8h) of TBB blocks; the other half's MMA rows are zeros.
#pragma unroll
        for (int h = 0; h < NT; ++h) {
            const bool tok_ok = g + 8 * h < m_used;
            const __nv_bfloat16* xh = xl + (long long)(tok_ok ? g + 8 * h : 0) * lda;
#pragma unroll
            for (int i0 = 0; i0 < BPW; i0 += TBB) {
                unsigned xv[TBB][4];
#pragma unroll
                for (int i = 0; i < TBB; ++i) {
                    const int kb = (r0 + (i0 + i) * WARPS) * 32;
                    const bool ok = i0 + i < BPW && tok_ok && in_k[i0 + i < BPW ? i0 + i : 0];
                    ldg_na128_or_zero(xh + kb, ok, xv[i]);
                }
#pragma unroll
                for (int i = 0; i < TBB; ++i) {
                    if (i0 + i >= BPW) break;
#pragma unroll
                    for (int q = 0; q < 2; ++q) {  // the block's two k16 steps
                        const unsigned lo = xv[i][2 * q], hi = xv[i][2 * q + 1];
                        mma_bf16_16816(acc, h ? 0u : lo, h ? lo : 0u, h ? 0u : hi, h ? hi : 0u, wv[i0 + i][2 * q],
                                       wv[i0 + i][2 * q + 1]);
                    }
                }
            }
        }
    }

    // Lane (g, t) holds tokens g, g + 8 x rows 2t, 2t + 1: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
    float* mine = red + warp * MT * ROWS;
#pragma unroll
    for (int j = 0; j < 2 * NT; ++j) mine[(g + 8 * (j >> 1)) * ROWS + 2 * t + (j & 1)] = acc[j];
    __syncthreads();
    for (int o = threadIdx.x; o < m_used * ROWS; o += blockDim.x) {
        float s = 0.f;
#pragma unroll 4
        for (int wi = 0; wi < WARPS; ++wi) s += red[wi * MT * ROWS + o];
        const int tok = o / ROWS, row = o - tok * ROWS;
        if (EXACTK || row0 + row < N) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + row, s);
    }
}

#if defined(SK_FAMILY) && SK_FAMILY == 5
// The instance the catalogue compiles (-D SK_NT, SK_CW, SK_BPW; optional SK_EXACTK), called by both ops' entry
// points.
#ifndef SK_EXACTK
#define SK_EXACTK 0  // the body compiled for K == SK_EXACTK (and N % 8 == 0) only
#endif
template <bool OUT_BF16>
__device__ __forceinline__ void sliced_instance(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                                void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    // The exact instance is the catalogue's pick for its K alone (Sliced.instance); a uniform check.
    if (SK_EXACTK && (K != SK_EXACTK || N % kSlicedRows != 0)) asm volatile("trap;");
    sliced_gemm<SK_NT, SK_CW, SK_BPW, OUT_BF16, SK_EXACTK>(act, w, out, M, N, K, lda, ldw, ldo);
}
#endif

}  // namespace slim
