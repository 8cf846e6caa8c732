// tma_gemm: out(M, N) = act(M, K) @ W(N, K)^T, bf16 in, fp32 accumulation, M <= 8*NT, any N, K % 8.
// Built for fused-A (N = 2112 = 132 x 16: one 16-row CTA per H200 SM, each streaming 229 KB of weights).
//
// Design (the weights are one long stream; the CTA only has to keep enough of it in flight, in few
// large requests):
//  * A CTA owns 16 weight rows over the whole K. K is cut into chunks of NB boxes of BK k; a
//    stage of the ring holds one chunk of the 16 rows and of the activation rows.
//  * One loader thread issues, per box, one 2-D tensor-map copy (cp.async.bulk.tensor, the TMA
//    engine) of 16 rows x BK k (7-8 KB) of W and one of MT tokens x BK k of the activation,
//    completing on the stage's "full" mbarrier. Few large copies matter: a version with one 1-D
//    bulk copy per row and chunk (16 + M copies of 0.5-2 KB per stage) took 20.1 / 11.8 / 10.5 us
//    at M=1 for 0.5 / 1 / 2 KB copies, about 45 ns per copy in each SM's TMA engine, and grew with M
//    (H200 run 16, NOTES_kernels.md). Here a stage is 2 * NB copies. Rows past N, tokens past M and
//    k past K arrive as zeros (out-of-bounds fill), so every tail is exact. Weights of the first
//    STAGES chunks are requested before griddepcontrol.wait (PDL), the activation after it.
//  * Warps 1..CW compute: each takes every CW-th 32-k block of a stage, reads its fragments with
//    128-bit shared loads (K-permuted swap-AB layout of skinny_gemm.cuh: thread (g, t) owns
//    k = 8t..8t+7 of weight rows g, g+8 and token g) and issues mma.sync.m16n8k16; then it
//    arrives on the stage's "empty" mbarrier, and the loader refills the stage.
//  * BK = 224 makes a box row 448 bytes (= 64 mod 128): the 8 lanes of a 128-bit load phase (two
//    rows x 64 bytes) hit 32 distinct banks with no padding (TMA boxes land densely). BK = 256
//    keeps every row 128-byte aligned in global memory, at a 2-way bank conflict.
//  * The compute warps' partials are summed in a fixed order (reduce.cuh): bit-identical repeats.
//
// Launch contract (slim_kernel/jit/catalogue.py, family "tma"):
//   grid (ceil(N / 16), 1, 1), block 32 * (CW + 1), dynamic smem = tma_smem_bytes(NT, NB, STAGES, CW);
//   act_map: bf16 dims (K, M), row stride lda * 2 bytes, box (BK, 8 * NT), no swizzle;
//   w_map: bf16 dims (K, N), row stride ldw * 2 bytes, box (BK, 16), no swizzle.
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "reduce.cuh"

namespace slim {

__host__ __device__ constexpr int tma_barrier_bytes(int stages) { return (stages * 16 + 127) / 128 * 128; }
__host__ __device__ constexpr int tma_stage_bytes(int nt, int nb, int bk) { return nb * (16 + 8 * nt) * bk * 2; }
__host__ __device__ constexpr int tma_smem_bytes(int nt, int nb, int bk, int stages, int cw) {
    return tma_barrier_bytes(stages) + stages * tma_stage_bytes(nt, nb, bk) + cw * nt * 512;
}

// CUtensorMap as the kernel sees it (NVRTC has no cuda.h).
struct __align__(64) TmaDesc {
    unsigned long long v[16];
};

template <int NT, int NB, int BK, int STAGES, int CW, bool OUT_BF16>
__device__ __forceinline__ void tma_gemm(const TmaDesc* act_map, const TmaDesc* w_map, void* __restrict__ out, int M,
                                         int N, int K, int ldo) {
    static_assert(NT >= 1 && NT <= 8 && NB >= 1 && BK % 32 == 0 && BK <= 256 && STAGES >= 2 && CW >= 1, "bad tma config");
    constexpr int ROWS = 16;
    constexpr int MT = 8 * NT;
    constexpr int PITCH = BK * 2;
    constexpr int WBOX = ROWS * PITCH;  // bytes of one weight box
    constexpr int XBOX = MT * PITCH;    // bytes of one activation box
    constexpr int STAGE = tma_stage_bytes(NT, NB, BK);
    constexpr int KC = NB * BK;  // k per stage
    constexpr int BPB = BK / 32;  // 32-k blocks per box

    extern __shared__ __align__(128) unsigned char smem[];
    pdl_launch_dependents();
    require_smem((unsigned)tma_smem_bytes(NT, NB, BK, STAGES, CW));

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const unsigned bars = smem_addr(smem);  // full[s] at bars + 8s, empty[s] at bars + 8(STAGES + s)
    const unsigned ring = bars + tma_barrier_bytes(STAGES);
    const int row0 = blockIdx.x * ROWS;
    const int chunks = (K + KC - 1) / KC;

    if (threadIdx.x == 0) {
        prefetch_tensormap(act_map);
        prefetch_tensormap(w_map);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (STAGES + s), CW);
        }
        fence_mbar_init();
    }
    __syncthreads();

    if (warp == 0) {
        if (lane != 0) return;
        // Stage layout: NB weight boxes [16 rows][BK k], then NB activation boxes [MT][BK k].
        auto weights = [&](int c, int s) {
            mbar_arrive_expect_tx(bars + 8 * s, (unsigned)STAGE);
            for (int b = 0; b < NB; ++b)
                tma_load_2d(ring + s * STAGE + b * WBOX, w_map, c * KC + b * BK, row0, bars + 8 * s);
        };
        auto tokens = [&](int c, int s) {
            for (int b = 0; b < NB; ++b)
                tma_load_2d(ring + s * STAGE + NB * WBOX + b * XBOX, act_map, c * KC + b * BK, 0, bars + 8 * s);
        };
        const int pre = chunks < STAGES ? chunks : STAGES;
        for (int c = 0; c < pre; ++c) weights(c, c);
        pdl_wait();  // weights are parameters; the activation is the previous grid's output
        for (int c = 0; c < pre; ++c) tokens(c, c);
        for (int c = pre; c < chunks; ++c) {
            const int s = c % STAGES;
            mbar_wait(bars + 8 * (STAGES + s), (unsigned)((c / STAGES - 1) & 1));
            weights(c, s);
            tokens(c, s);
        }
        return;
    }

    const int cw = warp - 1;
    const int g = lane >> 2;
    const int t = lane & 3;
    float acc[1][NT][4];
    zero_acc<1, NT>(acc);
    for (int c = 0; c < chunks; ++c) {
        const int s = c % STAGES;
        const int klen = K - c * KC < KC ? K - c * KC : KC;  // blocks past K hold zeros: skip them
        mbar_wait(bars + 8 * s, (unsigned)((c / STAGES) & 1));
        const unsigned base = ring + s * STAGE + 16 * t;
        for (int j = cw; j < NB * BPB && j * 32 < klen; j += CW) {
            const int b = j / BPB, off = (j - b * BPB) * 64;
            const unsigned wb = base + b * WBOX + off;
            const unsigned xb = base + NB * WBOX + b * XBOX + off;
            unsigned lo[4], hi[4], x[NT][4];
            lds128(wb + g * PITCH, lo);
            lds128(wb + (g + 8) * PITCH, hi);
#pragma unroll
            for (int n = 0; n < NT; ++n) lds128(xb + (8 * n + g) * PITCH, x[n]);
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    mma_bf16_16816(acc[0][n], lo[2 * h], hi[2 * h], lo[2 * h + 1], hi[2 * h + 1], x[n][2 * h],
                                   x[n][2 * h + 1]);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (STAGES + s));
    }

    // Fixed-order sum of the compute warps' partials, in their own region (the loader may still
    // be landing the last stages while a fast warp gets here).
    float* red = reinterpret_cast<float*>(smem + tma_barrier_bytes(STAGES) + STAGES * STAGE);
    store_partials<1, NT>(red, cw, lane, acc);
    named_barrier_sync(1, CW * 32);
    const int m_used = M < MT ? M : MT;
    const int rows = N - row0 < ROWS ? N - row0 : ROWS;
    for (int o = threadIdx.x - 32; o < m_used * ROWS; o += CW * 32) {
        const float v = sum_partials<1, NT>(red, CW, o);
        const int tok = o / ROWS, rl = o - tok * ROWS;
        if (rl < rows) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, v);
    }
}

}  // namespace slim
