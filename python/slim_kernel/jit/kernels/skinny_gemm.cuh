// skinny_gemm: out(M, N) = act(M, K) @ W(N, K)^T, bf16 in, fp32 accumulation, M <= 64 (8*NT), any N, K % 8.
//
// Design (swap-AB, mma.sync.m16n8k16 bf16 -> fp32):
//  * Weight rows are the MMA "M" dimension (16 rows per row tile), tokens the "N" dimension
//    (NT tiles of 8 tokens: NT = 1, 2, 4, 8 for M <= 8, 16, 32, 64).
//  * K-permuted fragments: the sum over K does not care about the order of k, as long as the
//    A and B fragments use the same permutation. In a block of 32 k, thread (g = lane/4,
//    t = lane%4) owns k = 8t..8t+7 of weight rows g and g+8 and of token g: one 16-byte load
//    each, which feed two k16 MMA steps directly (no ldmatrix, no shuffles, no smem sharing).
//  * Each thread streams its own 16-byte chunks through a private cp.async ring in shared
//    memory (STAGES deep) -- shared memory is only an in-flight buffer, so there is no
//    __syncthreads in the main loop and registers do not limit the bytes in flight.
//  * A CTA owns RT row tiles (RT*16 rows) and one K slice; its warps split that slice
//    (intra-CTA split-K). The CTAs of a thread-block cluster (dims (1, S, 1)) split K further.
//    Partials are reduced in a fixed order (reduce.cuh): warps through shared memory, then
//    cluster ranks through distributed shared memory.
//  * PDL: weights are model parameters and are fetched before griddepcontrol.wait; the
//    activation only after it. launch_dependents is signalled at entry (dependents still
//    wait for this grid's completion in their own griddepcontrol.wait).
//
// Launch contract (slim_kernel/jit/catalogue.py, family "skinny"):
//   grid (ceil(N / (16*RT)), S, 1), cluster (1, S, 1) when S > 1, block 32*W threads,
//   dynamic smem = skinny_smem_bytes(RT, NT, STAGES, W).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "reduce.cuh"

namespace slim {

__host__ __device__ constexpr int skinny_ring_bytes(int rt, int nt, int stages, int warps) {
    return stages * warps * (2 * rt + nt) * 512;
}
// The ring is reused for the partials once the main loop is done.
__host__ __device__ constexpr int skinny_smem_bytes(int rt, int nt, int stages, int warps) {
    return skinny_ring_bytes(rt, nt, stages, warps) > partials_bytes(rt, nt, warps)
               ? skinny_ring_bytes(rt, nt, stages, warps) : partials_bytes(rt, nt, warps);
}

template <int RT, int NT, int STAGES, bool OUT_BF16>
__device__ __forceinline__ void skinny_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert(RT >= 1 && NT >= 1 && NT <= 8 && STAGES >= 2, "bad tile config");
    constexpr int L = 2 * RT + NT;  // 16-byte chunks per thread per 32-k block: weight rows g, g+8 per tile; tokens
    constexpr int ROWS = RT * 16;

    extern __shared__ __align__(16) unsigned char smem[];

    pdl_launch_dependents();

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    require_smem((unsigned)skinny_smem_bytes(RT, NT, STAGES, nwarps));
    const int g = lane >> 2;
    const int t = lane & 3;
    const unsigned crank = cluster_rank();
    const unsigned csize = cluster_size();
    const int row0 = blockIdx.x * ROWS;

    // Per-chunk source rows (element offsets) and validity; out-of-range rows/tokens read zeros.
    const __nv_bfloat16* src[L];
    bool ok[L];
#pragma unroll
    for (int l = 0; l < L; ++l) {
        if (l < 2 * RT) {
            const int row = row0 + (l >> 1) * 16 + g + 8 * (l & 1);
            ok[l] = row < N;
            src[l] = w + (long long)(ok[l] ? row : 0) * ldw + 8 * t;
        } else {
            const int tok = (l - 2 * RT) * 8 + g;
            ok[l] = tok < M;
            src[l] = act + (long long)(ok[l] ? tok : 0) * lda + 8 * t;
        }
    }

    // This warp's K range, in 32-k blocks, balanced over all warps of the cluster.
    const int nb = (K + 31) >> 5;
    const int parts = (int)csize * nwarps;
    const int q = (int)crank * nwarps + warp;
    const int b0 = (int)((long long)q * nb / parts);
    const int nblk = (int)((long long)(q + 1) * nb / parts) - b0;

    const unsigned ring = smem_addr(smem) + (unsigned)(warp * STAGES * L * 512 + lane * 16);

    // Output bookkeeping: outputs o = token * ROWS + row_local, rank r finalises [r*per, r*per+per).
    const int m_used = M < NT * 8 ? M : NT * 8;
    const int outs = m_used * ROWS;
    const int per = (outs + (int)csize - 1) / (int)csize;
    const int mine_lo = (int)crank * per;
    const int mine = outs - mine_lo < per ? (outs - mine_lo > 0 ? outs - mine_lo : 0) : per;

    auto issue = [&](int stage, int blk, int lo, int hi) {
        const int k = (b0 + blk) * 32;  // thread's chunk starts at k + 8t (src already has + 8t)
        const bool kok = k + 8 * t < K;
        const unsigned dst = ring + (unsigned)(stage * L * 512);
#pragma unroll
        for (int l = 0; l < L; ++l) {
            if (l >= lo && l < hi) cp_async16(dst + l * 512, src[l] + (kok ? k : 0), (ok[l] && kok) ? 16 : 0);
        }
    };

    // Prologue: weights of the first STAGES-1 blocks before the PDL wait, then the activation.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        if (s < nblk) issue(s, s, 0, 2 * RT);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nblk) issue(s, s, 2 * RT, L);
        cp_async_commit();
    }

    float acc[RT][NT][4];
    zero_acc<RT, NT>(acc);

    int rd = 0;           // ring stage read this iteration
    int wr = STAGES - 1;  // ring stage refilled this iteration (read in the previous one)
    for (int i = 0; i < nblk; ++i) {
        if (i + STAGES - 1 < nblk) issue(wr, i + STAGES - 1, 0, L);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();  // block i has landed (own copies are visible to this thread)
        unsigned v[L][4];
        const unsigned base = ring + (unsigned)(rd * L * 512);
#pragma unroll
        for (int l = 0; l < L; ++l) lds128(base + l * 512, v[l]);
        mma_block<RT, NT>(acc, v);
        rd = rd + 1 == STAGES ? 0 : rd + 1;
        wr = wr + 1 == STAGES ? 0 : wr + 1;
    }
    cp_async_wait<0>();
    __syncthreads();  // ring is reused for the partials below

    float* red = reinterpret_cast<float*>(smem);
    store_partials<RT, NT>(red, warp, lane, acc);
    __syncthreads();

    // CTA sums (fixed warp order) in (token, row) order.
    float* csum = red + nwarps * RT * NT * 4 * 32;
    for (int o = threadIdx.x; o < outs; o += blockDim.x) {
        const float s = sum_partials<RT, NT>(red, nwarps, o);
        const int tok = o / ROWS, rl = o - tok * ROWS;
        if (csize == 1) {
            if (row0 + rl < N) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, s);
        } else {
            csum[o] = s;
        }
    }
    if (csize == 1) return;
    cluster_pull_reduce<ROWS, OUT_BF16>(csum, csize, mine_lo, mine, out, ldo, row0, N);
}

}  // namespace slim
