// tma_gemm: out(M, N) = act(M, K) @ W(N, K)^T, M <= 64, any N, fp32 accumulation, through the TMA engine.
//
// One CTA owns 16 weight rows over the whole K (N = 2112 -> 132 CTAs, one per H200 SM):
//  * a producer warp (the last one; one lane) streams STAGES-deep stages of KC k: KC/64 boxes of
//    W (16 rows x 64 k = 2 KB) and of the activation (8*NT tokens x 64 k) with 2-D tensor-map
//    copies (cp.async.bulk.tensor, 128-byte swizzle), completing on the stage's "full" mbarrier;
//    weights of the first STAGES stages are requested before griddepcontrol.wait (PDL);
//  * CW consumer warps split each stage's 32-k blocks and run the swap-AB mma.sync of
//    skinny_gemm.cuh on the same K-permuted fragments (thread (g, t) reads the 16-byte chunk t of
//    a 64-byte half-row; the swizzle makes those reads conflict-free), then release the stage on
//    its "empty" mbarrier (CW arrivals);
//  * rows >= N, tokens >= M and k >= K are zero-filled by the copy engine (out-of-bounds boxes);
//  * partials are summed over the consumer warps in a fixed order (reduce.cuh).
// Bytes in flight per SM = STAGES * 16 * KC * 2 of weights (128 KB at KC=512, STAGES=8) -- the
// per-thread cp.async ring of skinny_gemm keeps ~57 KB in flight, which measured ~3.3 TB/s.
//
// Launch contract (slim_kernel/jit/catalogue.py, family "tma"):
//   grid (ceil(N / 16)), block 32 * (CW + 1), dynamic smem = tma_smem_bytes(NT, KC, STAGES, CW);
//   w_map: dims {K, N}, box {64, 16}; x_map: dims {K, M}, box {64, 8*NT}; bf16, 128-byte swizzle.
#pragma once
#include "reduce.cuh"

namespace slim {

constexpr int kTmaBoxK = 64;        // k per box: 128 bytes, the 128-byte swizzle span
constexpr int kSwizzleAtom = 1024;  // the swizzle pattern repeats every 8 rows of 128 bytes

__host__ __device__ constexpr int tma_stage_bytes(int nt, int kc) { return (kc / kTmaBoxK) * (16 + 8 * nt) * 128; }
// + alignment slack for the 1024-byte swizzle atoms, the mbarriers and the warp partials.
__host__ __device__ constexpr int tma_smem_bytes(int nt, int kc, int stages, int cw) {
    return kSwizzleAtom + stages * tma_stage_bytes(nt, kc) + stages * 16 + partials_bytes(1, nt, cw);
}

template <int NT, int KC, int STAGES, int CW, bool OUT_BF16>
__device__ __forceinline__ void tma_gemm(const TmaDesc* w_map, const TmaDesc* x_map, void* __restrict__ out,
                                         int M, int N, int K, int ldo) {
    static_assert(NT >= 1 && NT <= 8 && KC % kTmaBoxK == 0 && STAGES >= 2 && CW >= 1, "bad tma config");
    constexpr int KB = KC / kTmaBoxK;
    constexpr int WBOX = 16 * 128;
    constexpr int XBOX = 8 * NT * 128;
    constexpr int STAGE_B = tma_stage_bytes(NT, KC);

    extern __shared__ __align__(1024) unsigned char smem[];

    pdl_launch_dependents();
    require_smem((unsigned)tma_smem_bytes(NT, KC, STAGES, CW));

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const unsigned raw = smem_addr(smem);
    const unsigned base = (raw + kSwizzleAtom - 1) & ~(unsigned)(kSwizzleAtom - 1);
    const unsigned full = base + STAGES * STAGE_B;
    const unsigned empty = full + STAGES * 8;
    float* red = reinterpret_cast<float*>(smem + (empty + STAGES * 8 - raw));
    const int row0 = blockIdx.x * 16;
    const int nst = (K + KC - 1) / KC;

    if (threadIdx.x == 0) {
#pragma unroll 1
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, CW);
        }
        mbar_init_fence();
    }
    __syncthreads();

    float acc[1][NT][4];
    zero_acc<1, NT>(acc);

    if (warp == CW) {
        if (lane == 0) {
            tma_prefetch_desc(w_map);
            tma_prefetch_desc(x_map);
            // boxes of stage i that start inside K (a box straddling K is zero-filled past it)
            auto boxes = [&](int i) { const int left = (K - i * KC + kTmaBoxK - 1) / kTmaBoxK; return left < KB ? left : KB; };
            auto load_w = [&](int i) {
                const unsigned s = (unsigned)(i % STAGES), bar = full + 8 * s, dst = base + s * STAGE_B;
                mbar_arrive_expect_tx(bar, (unsigned)(boxes(i) * (WBOX + XBOX)));
                for (int b = 0; b < boxes(i); ++b) tma_load_2d(dst + b * WBOX, w_map, i * KC + b * kTmaBoxK, row0, bar);
            };
            auto load_x = [&](int i) {
                const unsigned s = (unsigned)(i % STAGES), bar = full + 8 * s, dst = base + s * STAGE_B + KB * WBOX;
                for (int b = 0; b < boxes(i); ++b) tma_load_2d(dst + b * XBOX, x_map, i * KC + b * kTmaBoxK, 0, bar);
            };
            const int pre = nst < STAGES ? nst : STAGES;
#pragma unroll 1
            for (int i = 0; i < pre; ++i) load_w(i);
            pdl_wait();
#pragma unroll 1
            for (int i = 0; i < pre; ++i) load_x(i);
#pragma unroll 1
            for (int i = STAGES; i < nst; ++i) {
                mbar_wait(empty + 8 * (i % STAGES), (unsigned)(((i / STAGES) - 1) & 1));
                load_w(i);
                load_x(i);
            }
        }
    } else {
        pdl_wait();  // the stores below must follow the previous grid, which may still read `out`
        const int g = lane >> 2, t = lane & 3;
#pragma unroll 1
        for (int i = 0; i < nst; ++i) {
            const int s = i % STAGES;
            const int len = K - i * KC < KC ? K - i * KC : KC;
            mbar_wait(full + 8 * s, (unsigned)((i / STAGES) & 1));
            const unsigned sw = base + (unsigned)(s * STAGE_B), sx = sw + KB * WBOX;
#pragma unroll
            for (int b = warp; b < KC / 32; b += CW) {
                if (b * 32 >= len) break;
                // 16-byte chunk t of half (b & 1) of the 128-byte box row, swizzled by row % 8 (= g)
                const unsigned chunk = (unsigned)((((b & 1) * 4 + t) ^ g) << 4);
                const unsigned wb = sw + (unsigned)((b >> 1) * WBOX) + chunk, xb = sx + (unsigned)((b >> 1) * XBOX) + chunk;
                unsigned a0[4], a1[4], bt[NT][4];
                lds128(wb + g * 128, a0);
                lds128(wb + (g + 8) * 128, a1);
#pragma unroll
                for (int n = 0; n < NT; ++n) lds128(xb + (8 * n + g) * 128, bt[n]);
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int n = 0; n < NT; ++n)
                        mma_bf16_16816(acc[0][n], a0[2 * h], a1[2 * h], a0[2 * h + 1], a1[2 * h + 1], bt[n][2 * h],
                                       bt[n][2 * h + 1]);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + 8 * s);
        }
        store_partials<1, NT>(red, warp, lane, acc);
    }
    __syncthreads();

    const int m_used = M < NT * 8 ? M : NT * 8;
    for (int o = threadIdx.x; o < m_used * 16; o += blockDim.x) {
        const int tok = o / 16, rl = o - tok * 16;
        if (row0 + rl < N) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, sum_partials<1, NT>(red, CW, o));
    }
}

}  // namespace slim
