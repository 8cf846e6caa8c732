// The swap-AB mma.sync GEMM bodies' shared steps (skinny_gemm.cuh, ring_gemm.cuh, direct_gemm.cuh,
// stream_gemm.cuh): the MMAs of one 32-k block of K-permuted fragments, and deterministic reductions
// (warp partials, cluster sums).
//
// Fragment layout: a warp's swap-AB accumulators acc[RT][NT][4] hold, for row tile r and token
// tile n, D(16 weight rows x 8 tokens) of mma.m16n8k16: lane (g = lane/4, t = lane%4) has
// rows g, g+8 x tokens 2t, 2t+1. Sums run in a fixed order (warps, then cluster ranks), with no
// atomics, so repeated runs are bit-identical.
#pragma once
#include "ptx.cuh"

namespace slim {

template <int RT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[RT][NT][4]) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][n][i] = 0.f;
}

// The MMAs of one 32-k block: v[2r], v[2r+1] hold weight rows g, g+8 of row tile r and v[2RT+n]
// token g of token tile n, 8 consecutive k each (lane (g, t) owns k = 8t..8t+7); the two k16
// steps take k pairs {0,1},{2,3} and {4,5},{6,7} of them, the same permutation for A and B.
template <int RT, int NT>
__device__ __forceinline__ void mma_block(float (&acc)[RT][NT][4], const unsigned (&v)[2 * RT + NT][4]) {
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int n = 0; n < NT; ++n)
                mma_bf16_16816(acc[r][n], v[2 * r][2 * s], v[2 * r + 1][2 * s], v[2 * r][2 * s + 1], v[2 * r + 1][2 * s + 1],
                               v[2 * RT + n][2 * s], v[2 * RT + n][2 * s + 1]);
}

// Shared memory for the warp partials and the CTA sums (floats).
__host__ __device__ constexpr int partials_bytes(int rt, int nt, int warps) {
    return (warps + 1) * rt * nt * 128 * 4;
}

// Writes this warp's partials fragment-major (conflict-free) into red[warp][...].
template <int RT, int NT>
__device__ __forceinline__ void store_partials(float* red, int warp, int lane, const float (&acc)[RT][NT][4]) {
    constexpr int FR = RT * NT * 4;
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[(warp * FR + (r * NT + n) * 4 + i) * 32 + lane] = acc[r][n][i];
}

// The sum over warps [0, nwarps) of output o = token * ROWS + row_local (fixed warp order).
template <int RT, int NT>
__device__ __forceinline__ float sum_partials(const float* red, int nwarps, int o) {
    constexpr int FR = RT * NT * 4;
    constexpr int ROWS = RT * 16;
    const int tok = o / ROWS, rl = o - tok * ROWS;
    const int rr = rl & 15, tt = tok & 7;
    const int p = (((rl >> 4) * NT + (tok >> 3)) * 4 + (rr >> 3) * 2 + (tt & 1)) * 32 + (rr & 7) * 4 + (tt >> 1);
    float s = 0.f;
#pragma unroll 4
    for (int wi = 0; wi < nwarps; ++wi) s += red[wi * FR * 32 + p];
    return s;
}

// Sums the warp partials of one tile of 16*RT rows (fixed warp order) and stores outputs o = token *
// 16*RT + row_local for the m_used tokens and the rows below N.
template <int NT, bool OUT_BF16, int RT = 1>
__device__ __forceinline__ void store_tile_sums(const float* red, int nwarps, int m_used, void* __restrict__ out, int ldo,
                                                int row0, int N) {
    constexpr int ROWS = 16 * RT;
    for (int o = threadIdx.x; o < m_used * ROWS; o += blockDim.x) {
        const int tok = o / ROWS, rl = o - tok * ROWS;
        if (row0 + rl < N) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, sum_partials<RT, NT>(red, nwarps, o));
    }
}

// Largest cluster the pull reduction sums (MAX_SPLIT in slim_kernel/jit/catalogue.py).
constexpr int kMaxSplit = 16;

// Pull reduction over a cluster: this rank finalises outputs [mine_lo, mine_lo + mine_n) of the
// tokens x ROWS tile, summing every rank's partials in rank order, all remote loads issued before
// the sum.
template <int ROWS, bool OUT_BF16>
__device__ __forceinline__ void cluster_pull_reduce(const float* csum, unsigned csize, int mine_lo, int mine_n,
                                                    void* __restrict__ out, int ldo, int row0, int row_end) {
    cluster_sync();
    const unsigned csum_addr = smem_addr(csum);
    for (int j = threadIdx.x; j < mine_n; j += blockDim.x) {
        const int o = mine_lo + j;
        const int tok = o / ROWS, rl = o - tok * ROWS;
        float v[kMaxSplit];
#pragma unroll
        for (int rk = 0; rk < kMaxSplit; ++rk) v[rk] = rk < (int)csize ? ld_dsmem_f32(mapa(csum_addr + o * 4, rk)) : 0.f;
        float s = 0.f;
#pragma unroll
        for (int rk = 0; rk < kMaxSplit; ++rk) s += rk < (int)csize ? v[rk] : 0.f;
        if (row0 + rl < row_end) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, s);
    }
    cluster_sync_relaxed();  // keep this CTA's shared memory alive until every rank has read it
}

// The end of a split-K 16-row tile (ring_gemm.cuh, direct_gemm.cuh): after __syncthreads, the CTA sums of
// the nwarps warps' partials (fixed warp order) in (token, row) order, stored directly without a
// cluster, else summed over the cluster's ranks (each rank finalises a 1/csize share).
template <int NT, bool OUT_BF16>
__device__ __forceinline__ void store_split_tile(float* red, int nwarps, int M, void* __restrict__ out, int ldo, int row0,
                                                 int N) {
    const unsigned crank = cluster_rank();
    const unsigned csize = cluster_size();
    const int m_used = M < NT * 8 ? M : NT * 8;
    const int outs = m_used * 16;
    float* csum = red + nwarps * NT * 4 * 32;
    for (int o = threadIdx.x; o < outs; o += blockDim.x) {
        const float v = sum_partials<1, NT>(red, nwarps, o);
        const int tok = o >> 4, rl = o & 15;
        if (csize == 1) {
            if (row0 + rl < N) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, v);
        } else {
            csum[o] = v;
        }
    }
    if (csize == 1) return;
    const int per = (outs + (int)csize - 1) / (int)csize;
    const int mine_lo = (int)crank * per;
    const int mine = outs - mine_lo < per ? (outs - mine_lo > 0 ? outs - mine_lo : 0) : per;
    cluster_pull_reduce<16, OUT_BF16>(csum, csize, mine_lo, mine, out, ldo, row0, N);
}

}  // namespace slim
