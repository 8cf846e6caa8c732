// bulk_gemm: out(M, N) = act(M, K) @ W(N, K)^T, bf16 in, fp32 accumulation, any M <= 8*NT, any N, K % 8.
// Built for fused-A (N = 2112 = 132 x 16: one 16-row CTA per H200 SM, each streaming 229 KB of weights).
//
// Design (the weights are one long stream; the CTA only has to keep enough of it in flight):
//  * A CTA owns 16 weight rows over the whole K. K is cut into chunks of KC; a stage of the ring
//    holds one chunk of the 16 rows and of the M activation rows.
//  * Warp 0 is the loader: its lanes issue one 1-D bulk copy (cp.async.bulk, the TMA engine) per
//    row and chunk, KC*2 contiguous bytes each, completing on the stage's "full" mbarrier. Large
//    contiguous requests, no tensor map, no per-16-byte instruction. Weights of the first STAGES
//    chunks are requested before griddepcontrol.wait (PDL), the activation after it.
//  * Warps 1..CW compute: each takes every CW-th 32-k block of a stage, reads its fragments with
//    128-bit shared loads (K-permuted swap-AB layout of skinny_gemm.cuh: thread (g, t) owns
//    k = 8t..8t+7 of weight rows g, g+8 and token g) and issues mma.sync.m16n8k16; then it
//    arrives on the stage's "empty" mbarrier, and the loader reuses the stage.
//  * Row pitch in shared memory is KC*2 + 64 bytes: the 8 lanes of a 128-bit load phase (two rows)
//    hit 32 distinct banks.
//  * Rows past N and tokens past M are never copied: their stale shared memory only reaches output
//    rows/tokens that are never stored (an MMA output element reads one row of A and one column of
//    B). Chunks past K inside the last 32-k block are zeroed in registers.
//  * The compute warps' partials are summed in a fixed order (reduce.cuh): bit-identical repeats.
//
// Launch contract (slim_kernel/jit/catalogue.py, family "bulk"):
//   grid (ceil(N / 16), 1, 1), block 32 * (CW + 1), dynamic smem = bulk_smem_bytes(NT, KC, STAGES, CW).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "reduce.cuh"

namespace slim {

__host__ __device__ constexpr int bulk_pitch(int kc) { return kc * 2 + 64; }
__host__ __device__ constexpr int bulk_barrier_bytes(int stages) { return (stages * 16 + 127) / 128 * 128; }
__host__ __device__ constexpr int bulk_stage_bytes(int nt, int kc) { return (16 + 8 * nt) * bulk_pitch(kc); }
__host__ __device__ constexpr int bulk_smem_bytes(int nt, int kc, int stages, int cw) {
    return bulk_barrier_bytes(stages) + stages * bulk_stage_bytes(nt, kc) + cw * nt * 512;
}

template <int NT, int KC, int STAGES, int CW, bool OUT_BF16>
__device__ __forceinline__ void bulk_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                          void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert(NT >= 1 && NT <= 8 && KC % 64 == 0 && KC >= 64 && STAGES >= 2 && CW >= 1, "bad bulk config");
    constexpr int ROWS = 16;
    constexpr int PITCH = bulk_pitch(KC);
    constexpr int STAGE = bulk_stage_bytes(NT, KC);
    constexpr int BLOCKS = KC / 32;  // 32-k blocks per chunk

    extern __shared__ __align__(128) unsigned char smem[];
    pdl_launch_dependents();
    require_smem((unsigned)bulk_smem_bytes(NT, KC, STAGES, CW));

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const unsigned bars = smem_addr(smem);  // full[s] at bars + 8s, empty[s] at bars + 8(STAGES + s)
    const unsigned ring = bars + bulk_barrier_bytes(STAGES);
    const int row0 = blockIdx.x * ROWS;
    const int rows = N - row0 < ROWS ? N - row0 : ROWS;
    const int m_used = M < NT * 8 ? M : NT * 8;
    const int chunks = (K + KC - 1) / KC;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (STAGES + s), CW);
        }
        fence_mbar_init();
    }
    __syncthreads();

    if (warp == 0) {
        auto kbytes = [&](int c) { return (K - c * KC < KC ? K - c * KC : KC) * 2; };
        auto expect = [&](int c, int s) {
            if (lane == 0) mbar_arrive_expect_tx(bars + 8 * s, (unsigned)(kbytes(c) * (rows + m_used)));
            __syncwarp();
        };
        auto weights = [&](int c, int s) {
            for (int r = lane; r < rows; r += 32)
                bulk_g2s(ring + s * STAGE + r * PITCH, w + (long long)(row0 + r) * ldw + c * KC, kbytes(c), bars + 8 * s);
        };
        auto tokens = [&](int c, int s) {
            for (int r = lane; r < m_used; r += 32)
                bulk_g2s(ring + s * STAGE + (ROWS + r) * PITCH, act + (long long)r * lda + c * KC, kbytes(c),
                         bars + 8 * s);
        };
        const int pre = chunks < STAGES ? chunks : STAGES;
        for (int c = 0; c < pre; ++c) {
            expect(c, c);
            weights(c, c);
        }
        pdl_wait();  // weights are parameters; the activation is the previous grid's output
        for (int c = 0; c < pre; ++c) tokens(c, c);
        for (int c = pre; c < chunks; ++c) {
            const int s = c % STAGES;
            mbar_wait(bars + 8 * (STAGES + s), (unsigned)((c / STAGES - 1) & 1));
            expect(c, s);
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
        const int klen = K - c * KC < KC ? K - c * KC : KC;
        mbar_wait(bars + 8 * s, (unsigned)((c / STAGES) & 1));
        const unsigned base = ring + s * STAGE + 16 * t;
#pragma unroll
        for (int j = cw; j < BLOCKS; j += CW) {
            if (j * 32 >= klen) break;  // uniform over the warp
            const bool kok = j * 32 + 8 * t < klen;
            unsigned lo[4], hi[4], b[NT][4];
            lds128(base + g * PITCH + j * 64, lo);
            lds128(base + (g + 8) * PITCH + j * 64, hi);
#pragma unroll
            for (int n = 0; n < NT; ++n) lds128(base + (ROWS + 8 * n + g) * PITCH + j * 64, b[n]);
            if (!kok) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    lo[i] = hi[i] = 0u;
#pragma unroll
                    for (int n = 0; n < NT; ++n) b[n][i] = 0u;
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    mma_bf16_16816(acc[0][n], lo[2 * h], hi[2 * h], lo[2 * h + 1], hi[2 * h + 1], b[n][2 * h],
                                   b[n][2 * h + 1]);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (STAGES + s));
    }

    // Fixed-order sum of the compute warps' partials (their own region: the loader may still be
    // landing the last stages while a fast warp gets here).
    float* red = reinterpret_cast<float*>(smem + bulk_barrier_bytes(STAGES) + STAGES * STAGE);
    store_partials<1, NT>(red, cw, lane, acc);
    named_barrier_sync(1, CW * 32);
    const int outs = m_used * ROWS;
    for (int o = threadIdx.x - 32; o < outs; o += CW * 32) {
        const float v = sum_partials<1, NT>(red, CW, o);
        const int tok = o / ROWS, rl = o - tok * ROWS;
        if (rl < rows) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, v);
    }
}

}  // namespace slim
