// stream_gemm: out(M, N) = act(M, K) @ W(N, K)^T, bf16 in, fp32 accumulation, M <= 8*NT (NT <= 4), any N, K % 8.
//
// Design (fused-A: 7168 -> 2112 is 132 CTAs of 16 weight rows, one per H200 SM, no split-K):
//  * 256 threads in three roles: warps 0-1 copy the CTA's 16 weight rows, warps 2-3 the tokens,
//    warps 4-7 compute (swap-AB mma.sync.m16n8k16, fragments read with ldmatrix).
//  * K is cut into four regions of R = ceil(K / 256) * 64, one per compute warp; ring stage s
//    holds k [r*R + 64s, r*R + 64s + 64) of every region r. One loader warp instruction copies
//    a row's four 128-byte lines of a stage (lane = 16-byte chunk, lane / 8 = region): whole
//    lines, each requested once, so the copies prefetch 128 bytes into L2, not 256.
//    CONTIG: stage s holds k [256s, 256s + 256) instead, one contiguous 512-byte piece of each
//    row (compute warp w takes its k [256s + 64w, +64)); the shared-memory layout is the same.
//  * A row takes 512 bytes of a stage; chunk c of row r sits at chunk c ^ (r % 8), so the
//    ldmatrix reads of 8 rows at one k hit 8 different bank groups.
//  * Every loader thread signals a stage's "full" mbarrier with cp.async.mbarrier.arrive.noinc:
//    no loader waits for its own copies, the whole ring is in flight. Compute warps release a
//    stage through its "empty" mbarrier.
//  * Tokens >= M and rows >= N are never copied: their stale shared memory only reaches
//    accumulator rows and columns that are never stored. k >= K reads zeros on both sides.
//  * PDL: the weight loaders start at entry, the token loaders after griddepcontrol.wait (the
//    compute warps and the stores follow the token copies, so they also follow the wait).
//  * The four compute warps' partials are summed in a fixed order (reduce.cuh).
//
// Launch contract (slim_kernel/jit/catalogue.py, family "stream"):
//   grid (ceil(N / 16), 1, 1), block 256 threads, dynamic smem = stream_smem_bytes(NT, STAGES).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "reduce.cuh"

namespace slim {

constexpr int kStreamThreads = 256;
constexpr int kStreamBarrierBytes = 1024;    // the full and empty mbarriers of up to 64 stages, first
constexpr int kStreamWeightTile = 16 * 512;  // bytes of the 16 weight rows in a stage
__host__ __device__ constexpr int stream_stage_bytes(int nt) { return (16 + 8 * nt) * 512; }
__host__ __device__ constexpr int stream_smem_bytes(int nt, int stages) {
    return kStreamBarrierBytes + stages * stream_stage_bytes(nt) + partials_bytes(1, nt, 4);
}

// Shared-memory offset, in a 512-byte-row tile, of 16-byte chunk c (0..31) of row r.
__device__ __forceinline__ unsigned stream_slot(int r, int c) { return (unsigned)(r * 512 + ((c ^ (r & 7)) << 4)); }

// One loader warp's side of the ring: rows wr + 2j (j < J, only those < valid) of src, the
// lane's chunk of each region, into the tile at `tile` of every stage.
template <int J, int STAGES, int STAGE, bool CONTIG>
__device__ __forceinline__ void stream_load(const __nv_bfloat16* __restrict__ src, int ld, int wr, int valid, int lane,
                                            int R, int K, int nst, unsigned full, unsigned empty, unsigned tile) {
    constexpr int kstep = CONTIG ? 256 : 64;  // k between one stage's copies and the next's
    int k = CONTIG ? lane * 8 : (lane >> 3) * R + (lane & 7) * 8;  // this lane's k in the current stage
    // Fixed before the loop, which only advances one pointer: rows are rstep bytes apart, and to[j]
    // is where row j's chunk goes in stage 0.
    const char* row = reinterpret_cast<const char*>(src + (long long)wr * ld);
    const char* from = row + 2 * k;
    const long long rstep = 4LL * ld;  // bytes between rows wr + 2j and wr + 2j + 2
    unsigned to[J];
#pragma unroll
    for (int j = 0; j < J; ++j) to[j] = tile + stream_slot(wr + 2 * j, lane);
    const int rows = valid - wr > 0 ? (valid - wr + 1) / 2 : 0;  // rows j < rows are copied
    for (int s = 0; s < nst; ++s, k += kstep, from += 2 * kstep) {
        const int slot = s % STAGES;
        if (s >= STAGES) mbar_wait(empty + 8 * slot, ((s / STAGES) & 1) ^ 1);
        const int bytes = k < K ? 16 : 0;  // zeros past K, from an address inside the row
        const char* at = k < K ? from : row;
        const unsigned base = (unsigned)(slot * STAGE);
#pragma unroll
        for (int j = 0; j < J; ++j)
            if (j < rows) cp_async16_l2_128(base + to[j], at + j * rstep, bytes);
        cp_async_mbar_arrive_noinc(full + 8 * slot);
    }
}

template <int NT, int STAGES, bool OUT_BF16, bool CONTIG = false>
__device__ __forceinline__ void stream_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert(NT >= 1 && NT <= 4 && STAGES >= 2 && 16 * STAGES <= kStreamBarrierBytes, "bad stream config");
    constexpr int STAGE = stream_stage_bytes(NT);

    extern __shared__ __align__(1024) unsigned char smem[];
    pdl_launch_dependents();
    require_smem((unsigned)stream_smem_bytes(NT, STAGES));
    if (blockDim.x != kStreamThreads) asm volatile("trap;");

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const unsigned full = smem_addr(smem);    // STAGES mbarriers: the stage's copies landed
    const unsigned empty = full + 8 * STAGES;  // STAGES mbarriers: the compute warps are done with it
    const unsigned ring = full + kStreamBarrierBytes;
    float* red = reinterpret_cast<float*>(smem + kStreamBarrierBytes + STAGES * STAGE);
    const int row0 = blockIdx.x * 16;
    const int R = (K + 255) / 256 * 64;
    const int nst = R / 64;
    const int m_used = M < 8 * NT ? M : 8 * NT;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 128);  // the 4 loader warps' threads
            mbar_init(empty + 8 * s, 4);   // one arrival per compute warp
        }
    }
    __syncthreads();

    if (warp < 2) {
        stream_load<8, STAGES, STAGE, CONTIG>(w + (long long)row0 * ldw, ldw, warp, N - row0, lane, R, K, nst, full, empty, ring);
    } else if (warp < 4) {
        pdl_wait();
        stream_load<4 * NT, STAGES, STAGE, CONTIG>(act, lda, warp - 2, m_used, lane, R, K, nst, full, empty,
                                           ring + kStreamWeightTile);
    } else {
        const int cw = warp - 4;  // region
        float acc[1][NT][4];
        zero_acc<1, NT>(acc);
        // ldmatrix row addresses. A (weights, 16 x 16 per k16 step j): lanes 0-15 rows 0-15 at
        // k 0-7 of the step, lanes 16-31 the same rows at k 8-15. B (8 tokens x 32 k per x4):
        // lane group i = lane / 8 gives chunk i, i.e. k16 steps 2h (b0, b1) and 2h + 1.
        const int ar = lane & 15, ac = 8 * cw + (lane >> 4);
        const int br = lane & 7, bc = 8 * cw + (lane >> 3);
        for (int s = 0; s < nst; ++s) {
            const int slot = s % STAGES;
            mbar_wait(full + 8 * slot, (s / STAGES) & 1);
            const unsigned base = ring + (unsigned)(slot * STAGE);
            unsigned a[4][4], b[NT][2][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) ldsm_x4(base + stream_slot(ar, ac + 2 * j), a[j]);
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    ldsm_x4(base + kStreamWeightTile + stream_slot(8 * n + br, bc + 4 * h), b[n][h]);
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    mma_bf16_16816(acc[0][n], a[j][0], a[j][1], a[j][2], a[j][3], b[n][j >> 1][2 * (j & 1)],
                                   b[n][j >> 1][2 * (j & 1) + 1]);
            __syncwarp();  // every lane's fragments were consumed by the MMAs above
            if (lane == 0) mbar_arrive(empty + 8 * slot);
        }
        store_partials<1, NT>(red, cw, lane, acc);
    }
    __syncthreads();
    store_tile_sums<NT, OUT_BF16>(red, 4, m_used, out, ldo, row0, N);
}

}  // namespace slim
