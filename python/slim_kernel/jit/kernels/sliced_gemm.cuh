// sliced_gemm: out(M, N) = act(M, K) @ W(N, K)^T for few tokens (M <= 8*NT, NT 1..2), bf16 in, fp32 accumulation.
//
// narrow_gemm.cuh's shape of work (a CTA owns ROWS output rows over the whole K: no cluster, no cross-CTA
// reduction) on the tensor cores instead of CUDA-core FMAs. One mma.m16n8k16 multiplies 16 tokens (its rows) by
// 8 columns; a CTA has only ROWS (1, 2, 4 or 8) weight rows, so the 8 columns hold its rows' SL = 8 / ROWS K-slices:
// column c is row c / SL over k in [s*KS, (s+1)*KS) with s = c % SL, KS = K / SL rounded up to 8. For each slice
// s the tokens' k of slice s multiply all 8 columns and only the columns of slice s keep their products (SL times
// the MMAs, which cost little). With 8 rows (no slicing) a token is read once per 8 rows and the time grows ~0.18 us
// a token at E=896 on the H100 against narrow's 0.4-0.6; fewer rows lost to narrow everywhere (benchmark/DESIGN.md).
//  * Every lane loads real bytes: lane (g, t) loads 16 bytes of column g (row g / SL, slice g % SL) per 32-k block,
//    k 8t..8t+7 of the block (reduce.cuh's K permutation, the same for both operands), and of tokens g and g + 8
//    (NT = 2) for every slice.
//  * Weights are parameters: a round's weight loads all issue at entry, before griddepcontrol.wait (PDL); the
//    tokens follow in batches of up to 64 registers per lane, every load of a batch before its MMAs.
//  * Sums in a fixed order (the lanes of a row by shuffles, then the warps in order): repeated runs are
//    bit-identical.
//
// Launch contract (slim_kernel/jit/catalogue.py, family "sliced"):
//   grid (ceil(N / ROWS)), block 32 * WARPS threads, dynamic smem = sliced_smem_bytes(ROWS, NT, WARPS).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "ptx.cuh"

namespace slim {

__host__ __device__ constexpr int sliced_smem_bytes(int rows, int nt, int warps) { return warps * 8 * nt * rows * 4; }

template <int ROWS, int NT, int WARPS, int BPW, bool OUT_BF16, int EXACTK = 0>
__device__ __forceinline__ void sliced_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert((ROWS == 1 || ROWS == 2 || ROWS == 4 || ROWS == 8) && (NT == 1 || NT == 2) && WARPS >= 1 &&
                      WARPS <= 32 && BPW >= 1 && BPW <= 16 && EXACTK % 8 == 0, "bad sliced config");
    constexpr int SL = 8 / ROWS;  // K-slices per row: the MMA's 8 columns are ROWS rows x SL slices
    constexpr int MT = 8 * NT;
    // blocks per batch: 64 registers of token fragments per lane, 32 for two halves (ptxas overlaps the batches) or
    // in the generic body (its addresses take more)
    constexpr int PER_BATCH = (EXACTK ? 64 : 32) / NT / (SL * 4);
    constexpr int TBB = PER_BATCH < 1 ? 1 : PER_BATCH > BPW ? BPW : PER_BATCH;
    // EXACTK > 0: the caller checked K == EXACTK and N % ROWS == 0 (its own instance), so the slice length is a
    // constant, every load's address a per-lane base plus an immediate, and where the slices are whole and the
    // rounds tile them the predicates past K fold away (as narrow_gemm.cuh's straight-line body).
    constexpr int KS_EXACT = EXACTK ? ((EXACTK >> 3) + SL - 1) / SL * 8 : 0;
    constexpr bool whole = EXACTK && KS_EXACT * SL == EXACTK;  // no slice reaches past K
    constexpr bool tiled = whole && KS_EXACT % (32 * WARPS * BPW) == 0;  // every lane's every block inside its slice
    extern __shared__ __align__(16) float red[];  // [WARPS][MT * ROWS]
    pdl_launch_dependents();
    require_smem((unsigned)sliced_smem_bytes(ROWS, NT, WARPS));

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * ROWS;
    const int ks = EXACTK ? KS_EXACT : ((K >> 3) + SL - 1) / SL * 8;  // slice length, a multiple of 8
    const int nb = (ks + 31) >> 5;                                   // 32-k blocks per slice
    const int m_used = M < MT ? M : MT;
    const int lane_k = warp * 32 + 8 * t;                  // this lane's k in a round's first block
    const int col_row = g / SL, col_slice = g % SL;        // this lane's weight column
    const bool row_ok = EXACTK || row0 + col_row < N;
    const __nv_bfloat16* wl = w + (long long)(row_ok ? row0 + col_row : 0) * ldw + col_slice * ks + lane_k;
    const __nv_bfloat16* xl = act + lane_k;

    float acc[SL][4];
#pragma unroll
    for (int s = 0; s < SL; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.f;

#pragma unroll(EXACTK ? 4 : 1)  // the generic body: one round's registers at a time
    for (int r0 = 0; r0 < nb; r0 += WARPS * BPW) {
        unsigned wv[BPW][4];
        bool in_slice[BPW];  // block i of this round lies inside the slice (and K) for this lane
#pragma unroll
        for (int i = 0; i < BPW; ++i) {
            const int kb = (r0 + i * WARPS) * 32;  // block i's k past lane_k
            in_slice[i] = tiled || lane_k + kb < ks;
            ldg_na128_or_zero(wl + kb, in_slice[i] && row_ok && (whole || col_slice * ks + lane_k + kb < K), wv[i]);
        }
        if (r0 == 0) pdl_wait();  // weights are parameters; the activation is the previous grid's output
        // Token batches: half h (tokens g + 8h) of TBB blocks, every slice; the other half's MMA rows are zeros.
#pragma unroll
        for (int h = 0; h < NT; ++h) {
            const bool tok_ok = g + 8 * h < m_used;
            const __nv_bfloat16* xh = xl + (long long)(tok_ok ? g + 8 * h : 0) * lda;
#pragma unroll
            for (int i0 = 0; i0 < BPW; i0 += TBB) {
                unsigned xv[TBB][SL][4];
#pragma unroll
                for (int i = 0; i < TBB; ++i)
#pragma unroll
                    for (int s = 0; s < SL; ++s) {
                        const int kb = (r0 + (i0 + i) * WARPS) * 32;
                        const bool ok = i0 + i < BPW && tok_ok && in_slice[i0 + i < BPW ? i0 + i : 0] &&
                                        (whole || s * ks + lane_k + kb < K);
                        ldg_na128_or_zero(xh + s * ks + kb, ok, xv[i][s]);
                    }
#pragma unroll
                for (int i = 0; i < TBB; ++i) {
                    if (i0 + i >= BPW) break;
#pragma unroll
                    for (int s = 0; s < SL; ++s)
#pragma unroll
                        for (int q = 0; q < 2; ++q) {  // the block's two k16 steps
                            const unsigned lo = xv[i][s][2 * q], hi = xv[i][s][2 * q + 1];
                            mma_bf16_16816(acc[s], h ? 0u : lo, h ? lo : 0u, h ? 0u : hi, h ? hi : 0u, wv[i0 + i][2 * q],
                                           wv[i0 + i][2 * q + 1]);
                        }
                }
            }
        }
    }

    // Lane (g, t) holds tokens g, g + 8 x columns 2t, 2t + 1 of every slice's products; column c's own slice is
    // c % SL. Keep those (compile-time indices: a runtime one would put acc in local memory).
    float v[4];  // (token g, col 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int own = (2 * t + (j & 1)) % SL;
        v[j] = 0.f;
#pragma unroll
        for (int s = 0; s < SL; ++s) v[j] = s == own ? acc[s][j] : v[j];
    }
    float* mine = red + warp * MT * ROWS;
    if constexpr (SL == 1) {  // 8 rows: columns 2t, 2t + 1 are rows of their own
#pragma unroll
        for (int j = 0; j < 2 * NT; ++j) mine[(g + 8 * (j >> 1)) * ROWS + 2 * t + (j & 1)] = v[j];
    } else {  // the row's SL columns: this lane's two, then its neighbours' (SL / 2 lanes)
        float lo = v[0] + v[1], hi = v[2] + v[3];
#pragma unroll
        for (int d = 1; d < SL / 2; d <<= 1) {
            lo += __shfl_xor_sync(0xffffffffu, lo, d);
            hi += __shfl_xor_sync(0xffffffffu, hi, d);
        }
        if (t % (SL / 2) == 0) {
            const int row = 2 * t / SL;
            mine[g * ROWS + row] = lo;
            if (NT > 1) mine[(g + 8) * ROWS + row] = hi;
        }
    }
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
// The instance the catalogue compiles (-D SK_ROWS, SK_NT, SK_CW, SK_BPW; optional SK_EXACTK), called by both ops'
// entry points.
#ifndef SK_EXACTK
#define SK_EXACTK 0  // the body compiled for K == SK_EXACTK (and N % SK_ROWS == 0) only
#endif
template <bool OUT_BF16>
__device__ __forceinline__ void sliced_instance(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                                void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    // The exact instance is the catalogue's pick for its K alone (Sliced.instance); a uniform check.
    if (SK_EXACTK && (K != SK_EXACTK || N % SK_ROWS != 0)) asm volatile("trap;");
    sliced_gemm<SK_ROWS, SK_NT, SK_CW, SK_BPW, OUT_BF16, SK_EXACTK>(act, w, out, M, N, K, lda, ldw, ldo);
}
#endif

}  // namespace slim
