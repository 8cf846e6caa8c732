// ring_gemm: out(M, N) = act(M, K) @ W(N, K)^T, bf16 in, fp32 accumulation, M <= 8*NT, any N, K % 8.
//
// Design (warp-specialised, swap-AB mma.sync.m16n8k16 as skinny_gemm.cuh, same K-permuted fragments;
// serves the router, where a cluster splits K: E = 256 is 16 row tiles x 8 ranks):
//  * A CTA owns 16 weight rows and a range of TK-wide K stages (all of K, or a cluster rank's
//    share). Its 16 rows are one contiguous block of the weight; a stage is 16 row pieces of
//    2*TK bytes, each read by one warp instruction (full 128-byte lines, no partial sectors).
//  * LW weight-loader warps and one activation-loader warp fill a STAGES-deep ring with 16-byte
//    cp.async and signal a stage's "full" mbarrier with cp.async.mbarrier.arrive.noinc: no
//    loader ever waits for its own copies, so the whole ring is in flight. Loaders wait only for
//    a stage's "empty" mbarrier before refilling it.
//  * The weight loaders start at entry, before griddepcontrol.wait (weights are model
//    parameters); the activation loader and the compute warps wait first. With PDL the ring
//    fills while the previous kernel finishes.
//  * CW compute warps split each stage's 32-k blocks, read their fragments with conflict-free
//    128-bit shared loads (the loaders write block b's lanes XOR 4 when b is odd, so a loader
//    warp's 32 chunks of one row also land conflict-free), and release the stage.
//  * Partials are reduced in a fixed order (reduce.cuh): compute warps, then cluster ranks.
//
// Launch contract (slim_kernel/jit/catalogue.py, family "ring"):
//   grid (ceil(N / 16), S, 1), cluster (1, S, 1) when S > 1, block 32 * (CW + LW + 1) threads,
//   dynamic smem = ring_smem_bytes(NT, TK, STAGES, CW).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "reduce.cuh"

namespace slim {

__host__ __device__ constexpr int ring_stage_bytes(int nt, int tk) { return (2 + nt) * tk * 16; }  // (16+8nt) rows
__host__ __device__ constexpr int ring_barrier_bytes(int stages) { return (stages * 16 + 127) / 128 * 128; }
__host__ __device__ constexpr int ring_smem_bytes(int nt, int tk, int stages, int cw) {
    return ring_barrier_bytes(stages) + stages * ring_stage_bytes(nt, tk) + partials_bytes(1, nt, cw);
}

// Shared-memory offset in a stage of the 16-byte chunk kc (k = 8*kc) of fragment row l (0: weight
// row g, 1: weight row g+8, 2+n: token 8n+g): 32-k block, fragment row, lane (g, t = kc % 4).
template <int L>
__device__ __forceinline__ unsigned ring_slot(int g, int l, int kc) {
    const int b = kc >> 2;
    return (unsigned)((b * L + l) * 512 + (((g << 2) | (kc & 3)) ^ ((b & 1) << 2)) * 16);
}

// One loader group's side of the ring: thread lt of nthreads copies chunks c = lt + j*nthreads
// (j < J) of every stage: row c / (TK/8) of src (rows >= rows_valid and K past the end read
// zeros), 16-byte chunk c % (TK/8), so consecutive threads read consecutive 16 bytes of one row.
// l0: the fragment row of source row 0 (0 weights, 2 tokens).
template <int J, int L, int TK, int STAGES>
__device__ __forceinline__ void ring_load(const __nv_bfloat16* __restrict__ src, int ld, int rows_valid, int l0, int lt,
                                          int nthreads, unsigned full, unsigned empty, unsigned ring, int s0, int nst,
                                          int K) {
    constexpr int CPR = TK / 8;
    for (int i = 0; i < nst; ++i) {
        const int s = i % STAGES;
        if (i >= STAGES) mbar_wait(empty + 8 * s, ((i / STAGES) & 1) ^ 1);
        const int k0 = (s0 + i) * TK;
        const unsigned base = ring + (unsigned)(s * ring_stage_bytes(L - 2, TK));
#pragma unroll
        for (int j = 0; j < J; ++j) {  // addresses recomputed per stage: few registers at any J
            const int c = lt + j * nthreads;
            const int r = c / CPR, kc = c % CPR;
            const bool ok = r < rows_valid && k0 + 8 * kc < K;
            cp_async16(base + ring_slot<L>(r & 7, l0 + (r >> 3), kc), src + (ok ? (long long)r * ld + k0 + 8 * kc : 0),
                       ok ? 16 : 0);
        }
        cp_async_mbar_arrive_noinc(full + 8 * s);
    }
}

template <int NT, int TK, int STAGES, int CW, int LW, bool OUT_BF16>
__device__ __forceinline__ void ring_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                          void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    constexpr int L = 2 + NT;         // fragment rows per 32-k block
    constexpr int BLK = TK / 32;      // 32-k blocks per stage
    constexpr int CPR = TK / 8;       // 16-byte chunks per row per stage
    constexpr int WJ = 16 * CPR / (32 * LW);  // weight chunks per weight-loader thread per stage
    constexpr int AJ = 8 * NT * CPR / 32;     // activation chunks per activation-loader thread per stage
    constexpr int STAGE = ring_stage_bytes(NT, TK);
    static_assert(NT >= 1 && NT <= 8 && STAGES >= 2 && LW >= 1 && CW >= 1, "bad ring config");
    static_assert(TK % 32 == 0 && BLK % CW == 0 && (16 * CPR) % (32 * LW) == 0, "bad ring tile");

    extern __shared__ __align__(128) unsigned char smem[];
    pdl_launch_dependents();
    require_smem((unsigned)ring_smem_bytes(NT, TK, STAGES, CW));

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const unsigned full = smem_addr(smem);        // STAGES mbarriers: the stage's copies landed
    const unsigned empty = full + STAGES * 8;     // STAGES mbarriers: the compute warps are done with it
    const unsigned ring = full + ring_barrier_bytes(STAGES);
    float* red = reinterpret_cast<float*>(smem + ring_barrier_bytes(STAGES) + STAGES * STAGE);
    const unsigned crank = cluster_rank();
    const unsigned csize = cluster_size();
    const int row0 = blockIdx.x * 16;
    const int ns = (K + TK - 1) / TK;
    const int s0 = (int)((long long)crank * ns / csize);
    const int nst = (int)((long long)(crank + 1) * ns / csize) - s0;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 32 * (LW + 1));
            mbar_init(empty + 8 * s, CW);
        }
    }
    __syncthreads();

    if (warp >= CW + LW) {
        pdl_wait();
        ring_load<AJ, L, TK, STAGES>(act, lda, M, 2, lane, 32, full, empty, ring, s0, nst, K);
    } else if (warp >= CW) {
        ring_load<WJ, L, TK, STAGES>(w + (long long)row0 * ldw, ldw, N - row0, 0, threadIdx.x - 32 * CW, 32 * LW, full,
                                     empty, ring, s0, nst, K);
    } else {
        pdl_wait();
        float acc[1][NT][4];
        zero_acc<1, NT>(acc);
        for (int i = 0; i < nst; ++i) {
            const int s = i % STAGES;
            mbar_wait(full + 8 * s, (i / STAGES) & 1);
            const unsigned base = ring + (unsigned)(s * STAGE);
#pragma unroll
            for (int bi = 0; bi < BLK / CW; ++bi) {
                const int b = warp + bi * CW;
                const unsigned blk = base + (unsigned)(b * L * 512 + ((lane ^ ((b & 1) << 2)) * 16));
                unsigned v[L][4];
#pragma unroll
                for (int l = 0; l < L; ++l) lds128(blk + l * 512, v[l]);
                mma_block<1, NT>(acc, v);
            }
            __syncwarp();  // every lane's fragments are in registers (consumed by the MMAs above)
            if (lane == 0) mbar_arrive(empty + 8 * s);
        }
        store_partials<1, NT>(red, warp, lane, acc);
    }
    __syncthreads();

    store_split_tile<NT, OUT_BF16>(red, CW, M, out, ldo, row0, N);
}

}  // namespace slim
