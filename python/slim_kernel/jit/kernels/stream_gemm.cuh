// stream_gemm: out(M, N) = act(M, K) @ W(N, K)^T, bf16 in, fp32 accumulation, M <= 8*NT (NT <= 4), any N, K % 8.
//
// Design (fused-A: 7168 -> 2112 is 132 CTAs of 16 weight rows, one per H200 SM, no split-K; RT = 2: 32
// rows per CTA, so N past one wave of 16-row CTAs (GLM-5's 6144 -> 2624: 164) is one wave again (82)):
//  * 256 threads in three roles: warps 0-1 copy the CTA's 16*RT weight rows, warps 2-3 the tokens,
//    warps 4-7 compute (swap-AB mma.sync.m16n8k16, fragments read with ldmatrix).
//  * Ring stage s holds k [KS*s, KS*(s + 1)) of every row, KS = 256P: P contiguous 512-byte pieces
//    (P = 1 or 2); compute warp w takes k [KS*s + 64Pw, +64P). One loader warp instruction copies
//    one piece of a row (lane = 16-byte chunk): whole lines, each requested once, so the copies
//    prefetch 128 bytes into L2, not 256. Longer pieces in fewer stages stream faster: at M <= 16
//    two pieces in 4 stages beat one piece in 8 (the same ring bytes) by 0.1-0.25 us, and one piece
//    beat four 128-byte lines from four K regions (sglang's order, and ours before) by 0.05-0.2 us
//    in the decode step.
//  * A row takes 512P bytes of a stage; chunk c of row r sits at chunk c ^ (r % 8), so the
//    ldmatrix reads of 8 rows at one k hit 8 different bank groups.
//  * Every loader thread signals a stage's "full" mbarrier with cp.async.mbarrier.arrive.noinc:
//    no loader waits for its own copies, the whole ring is in flight. Compute warps release a
//    stage through its "empty" mbarrier.
//  * Tokens >= M and rows >= N are never copied: their stale shared memory only reaches
//    accumulator rows and columns that are never stored. k >= K reads zeros on both sides.
//  * PDL: the weight loaders start at entry, the token loaders after griddepcontrol.wait (the
//    compute warps and the stores follow the token copies, so they also follow the wait). Dependents
//    are triggered once every copy is issued (loaders) and the ring's last fill is reached (compute
//    warps), about a ring's worth of stages before the end: the next kernel's launch stays hidden, and
//    it does not sit on the SMs for the whole GEMM. Triggered at entry, a PDL-aware RMSNorm after the
//    GEMM started 8-13 us before its end and the GEMM ran 0.1-0.5 us longer (H200, a kernel timeline).
//  * The four compute warps' partials are summed in a fixed order (reduce.cuh).
//
// Launch contract (slim_kernel/jit/catalogue.py, family "stream"):
//   grid (ceil(N / (16 * RT)), 1, 1), block 256 threads, dynamic smem = stream_smem_bytes(NT, STAGES, P, RT).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include "reduce.cuh"

namespace slim {

constexpr int kStreamThreads = 256;
constexpr int kStreamBarrierBytes = 1024;  // the full and empty mbarriers of up to 64 stages, first
__host__ __device__ constexpr int stream_stage_bytes(int nt, int p, int rt = 1) { return (16 * rt + 8 * nt) * 512 * p; }
__host__ __device__ constexpr int stream_smem_bytes(int nt, int stages, int p, int rt = 1) {
    return kStreamBarrierBytes + stages * stream_stage_bytes(nt, p, rt) + partials_bytes(rt, nt, 4);
}

// Shared-memory offset, in a tile of ROW-byte rows, of 16-byte chunk c of row r.
template <int ROW>
__device__ __forceinline__ unsigned stream_slot(int r, int c) { return (unsigned)(r * ROW + ((c ^ (r & 7)) << 4)); }

// One loader warp's side of the ring: rows wr + 2j (j < J, only those < valid) of src, the
// lane's chunk of each of the stage's P pieces, into the tile at `tile` of every stage.
template <int J, int STAGES, int STAGE, int P>
__device__ __forceinline__ void stream_load(const __nv_bfloat16* __restrict__ src, int ld, int wr, int valid, int lane,
                                            int K, int nst, unsigned full, unsigned empty, unsigned tile) {
    constexpr int KS = 256 * P;  // k per stage
    int k = lane * 8;            // this lane's k of the stage's first piece
    // Fixed before the loop, which only advances one pointer: rows are rstep bytes apart, and to[j]
    // is where row j's chunk goes in stage 0 (piece i sits 512i bytes further, the swizzle keeps it).
    const char* row = reinterpret_cast<const char*>(src + (long long)wr * ld);
    const char* from = row + 2 * k;
    const long long rstep = 4LL * ld;  // bytes between rows wr + 2j and wr + 2j + 2
    unsigned to[J];
#pragma unroll
    for (int j = 0; j < J; ++j) to[j] = tile + stream_slot<512 * P>(wr + 2 * j, lane);
    const int rows = valid - wr > 0 ? (valid - wr + 1) / 2 : 0;  // rows j < rows are copied
    for (int s = 0; s < nst; ++s, k += KS, from += 2 * KS) {
        const int slot = s % STAGES;
        if (s >= STAGES) mbar_wait(empty + 8 * slot, ((s / STAGES) & 1) ^ 1);
        const unsigned base = (unsigned)(slot * STAGE);
#pragma unroll
        for (int i = 0; i < P; ++i) {
            const bool in = k + 256 * i < K;  // zeros past K, from an address inside the row
            const char* at = in ? from + 512 * i : row;
#pragma unroll
            for (int j = 0; j < J; ++j)
                if (j < rows) cp_async16_l2_128(base + to[j] + 512 * i, at + j * rstep, in ? 16 : 0);
        }
        cp_async_mbar_arrive_noinc(full + 8 * slot);
    }
}

template <int NT, int STAGES, bool OUT_BF16, int P, int RT = 1>
__device__ __forceinline__ void stream_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert(NT >= 1 && NT <= 4 && STAGES >= 2 && 16 * STAGES <= kStreamBarrierBytes && (P == 1 || P == 2)
                  && (RT == 1 || RT == 2), "bad stream config");
    constexpr int STAGE = stream_stage_bytes(NT, P, RT), ROW = 512 * P, WTILE = 16 * RT * ROW;

    extern __shared__ __align__(1024) unsigned char smem[];
    require_smem((unsigned)stream_smem_bytes(NT, STAGES, P, RT));
    if (blockDim.x != kStreamThreads) asm volatile("trap;");

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const unsigned full = smem_addr(smem);    // STAGES mbarriers: the stage's copies landed
    const unsigned empty = full + 8 * STAGES;  // STAGES mbarriers: the compute warps are done with it
    const unsigned ring = full + kStreamBarrierBytes;
    float* red = reinterpret_cast<float*>(smem + kStreamBarrierBytes + STAGES * STAGE);
    const int row0 = blockIdx.x * 16 * RT;
    const int nst = (K + 256 * P - 1) / (256 * P);
    const int m_used = M < 8 * NT ? M : 8 * NT;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 128);  // the 4 loader warps' threads
            mbar_init(empty + 8 * s, 4);   // one arrival per compute warp
        }
    }
    __syncthreads();

    if (warp < 2) {
        stream_load<8 * RT, STAGES, STAGE, P>(w + (long long)row0 * ldw, ldw, warp, N - row0, lane, K, nst, full, empty,
                                              ring);
        pdl_launch_dependents();
    } else if (warp < 4) {
        pdl_wait();
        stream_load<4 * NT, STAGES, STAGE, P>(act, lda, warp - 2, m_used, lane, K, nst, full, empty, ring + WTILE);
        pdl_launch_dependents();
    } else {
        const int cw = warp - 4;  // k [64P*cw, +64P) of every stage
        float acc[RT][NT][4];
        zero_acc<RT, NT>(acc);
        // ldmatrix row addresses. A (weights, 16 x 16 per k16 step j): lanes 0-15 rows 0-15 at
        // k 0-7 of the step, lanes 16-31 the same rows at k 8-15. B (8 tokens x 32 k per x4):
        // lane group i = lane / 8 gives chunk i, i.e. k16 steps 2h (b0, b1) and 2h + 1.
        const int ar = lane & 15, ac = 8 * P * cw + (lane >> 4);
        const int br = lane & 7, bc = 8 * P * cw + (lane >> 3);
        const int last_fill = nst > STAGES ? nst - STAGES : 0;
        for (int s = 0; s < nst; ++s) {
            const int slot = s % STAGES;
            if (s == last_fill) pdl_launch_dependents();
            mbar_wait(full + 8 * slot, (s / STAGES) & 1);
            const unsigned base = ring + (unsigned)(slot * STAGE);
            unsigned a[RT][4 * P][4], b[NT][2 * P][4];
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int j = 0; j < 4 * P; ++j) ldsm_x4(base + stream_slot<ROW>(16 * r + ar, ac + 2 * j), a[r][j]);
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int h = 0; h < 2 * P; ++h)
                    ldsm_x4(base + WTILE + stream_slot<ROW>(8 * n + br, bc + 4 * h), b[n][h]);
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int j = 0; j < 4 * P; ++j)
#pragma unroll
                    for (int n = 0; n < NT; ++n)
                        mma_bf16_16816(acc[r][n], a[r][j][0], a[r][j][1], a[r][j][2], a[r][j][3],
                                       b[n][j >> 1][2 * (j & 1)], b[n][j >> 1][2 * (j & 1) + 1]);
            __syncwarp();  // every lane's fragments were consumed by the MMAs above
            if (lane == 0) mbar_arrive(empty + 8 * slot);
        }
        store_partials<RT, NT>(red, cw, lane, acc);
    }
    __syncthreads();
    store_tile_sums<NT, OUT_BF16, RT>(red, 4, m_used, out, ldo, row0, N);
}

}  // namespace slim
