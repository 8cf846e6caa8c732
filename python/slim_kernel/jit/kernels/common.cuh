// Skinny bf16 GEMM for decode: out(M, N) = act(M, K) @ W(N, K)^T, fp32 accumulation, M <= 16.
//
// Shared by dsv3_router_gemm (W = router weight, N = experts, out fp32 or bf16) and
// dsv3_fused_a_gemm (W = mat_b^T, the contiguous (N, K) weight, out bf16). Device code only,
// no host code and no std headers, so NVRTC, nvcc -cubin and an AOT build all compile it.
//
// Design (swap-AB, mma.sync.m16n8k16 bf16 -> fp32):
//  * Weight rows are the MMA "M" dimension (16 rows per row tile), tokens the "N" dimension
//    (NT tiles of 8 tokens: NT = 1 for M <= 8, 2 for M <= 16).
//  * K-permuted fragments: the sum over K does not care about the order of k, as long as the
//    A and B fragments use the same permutation. In a block of 32 k, thread (g = lane/4,
//    t = lane%4) owns k = 8t..8t+7 of weight rows g and g+8 and of token g: one 16-byte load
//    each, which feed two k16 MMA steps directly (no ldmatrix, no shuffles, no smem sharing).
//  * Each thread streams its own 16-byte chunks through a private cp.async ring in shared
//    memory (STAGES deep) -- shared memory is only an in-flight buffer, so there is no
//    __syncthreads in the main loop and registers do not limit the bytes in flight.
//  * A CTA owns RT row tiles (RT*16 rows) and one K slice; its warps split that slice
//    (intra-CTA split-K). The CTAs of a thread-block cluster (dims (1, S, 1)) split K further.
//    Partials are reduced in a fixed order: warps through shared memory, then cluster ranks
//    through distributed shared memory. No atomics: repeated runs are bit-identical.
//  * PDL: weights are model parameters and are fetched before griddepcontrol.wait; the
//    activation only after it. launch_dependents is signalled at entry (dependents still
//    wait for this grid's completion in their own griddepcontrol.wait).
//
// Launch contract (see slim_kernel/backends/jit.py):
//   grid (ceil(N / (16*RT)), S, 1), cluster (1, S, 1) when S > 1, block 32*W threads,
//   dynamic smem = skinny_smem_bytes(RT, NT, STAGES, W) (host mirror in jit.py).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= 8*NT.
#pragma once
#include <cuda_bf16.h>

// Defaults of the -D parameters both entry files share (each sets its own SK_RT and SK_STAGES;
// the JIT backend passes every parameter it tunes).
#ifndef SK_NT
#define SK_NT 2
#endif
#ifndef SK_PUSH
#define SK_PUSH 0
#endif
#ifndef SK_BULK
#define SK_BULK 0
#endif
#ifndef SK_KC
#define SK_KC 256
#endif
#ifndef SK_ACTW
#define SK_ACTW 0
#endif
#ifndef SK_ROT
#define SK_ROT 0
#endif

namespace slim {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return static_cast<unsigned>(a);
}

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

__device__ __forceinline__ void lds128(unsigned addr, unsigned (&v)[4]) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr));
}

// D += A(16x16, row) * B(16x8, col), bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" :::); }

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned cluster_size() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
}
// Release/acquire cluster barrier: makes this CTA's shared-memory writes visible to the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Execution-only cluster barrier (no memory ordering): used to keep shared memory alive.
__device__ __forceinline__ void cluster_sync_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
// Read a float from a shared::cluster address (from mapa).
__device__ __forceinline__ float ld_dsmem_f32(unsigned cluster_addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(cluster_addr) : "memory");
    return v;
}

__device__ __forceinline__ unsigned mapa(unsigned local_addr, unsigned rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
    return remote;
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_init(unsigned mbar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(mbar), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned mbar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(mbar), "r"(bytes) : "memory");
}
// Wait for phase 0 of a local mbarrier, acquiring the cluster's st.async writes. Never hangs:
// a lost transfer traps (an error the caller sees) after ~seconds of spinning.
__device__ __forceinline__ void mbar_wait_phase0(unsigned mbar) {
    for (unsigned spins = 0;; ++spins) {
        unsigned done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(mbar) : "memory");
        if (done) return;
        if (spins > (1u << 22)) asm volatile("trap;");
    }
}
// Asynchronous 4-byte store into another CTA's shared memory, signalling its mbarrier.
__device__ __forceinline__ void st_async_f32(unsigned remote_addr, float v, unsigned remote_mbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];\n"
                 :: "r"(remote_addr), "f"(v), "r"(remote_mbar) : "memory");
}
__device__ __forceinline__ void st_shared_f32(unsigned addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;\n" :: "r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(unsigned addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}

template <bool OUT_BF16>
__device__ __forceinline__ void store_out(void* out, long long idx, float v) {
    if constexpr (OUT_BF16) {
        static_cast<__nv_bfloat16*>(out)[idx] = __float2bfloat16_rn(v);
    } else {
        static_cast<float*>(out)[idx] = v;
    }
}

// Shared memory (mirrored in backends/jit.py smem_bytes):
//   main = max(pipeline ring, warp partials + CTA sums); PUSH with a cluster adds an mbarrier
//   (16 B) and the receive buffer (split * ceil(NT*8*RT*16 / split) floats) after main.
__host__ __device__ constexpr int skinny_ring_bytes(int rt, int nt, int stages, int warps) {
    return stages * warps * (2 * rt + nt) * 512;
}
__host__ __device__ constexpr int skinny_reduce_bytes(int rt, int nt, int warps) {
    return (warps + 1) * rt * nt * 128 * 4;
}
__host__ __device__ constexpr int skinny_main_bytes(int rt, int nt, int stages, int warps) {
    return skinny_ring_bytes(rt, nt, stages, warps) > skinny_reduce_bytes(rt, nt, warps)
               ? skinny_ring_bytes(rt, nt, stages, warps) : skinny_reduce_bytes(rt, nt, warps);
}

template <int RT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[RT][NT][4]) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][n][i] = 0.f;
}

constexpr int kMaxSplit = 16;

// Pull reduction over a cluster (both kernel bodies): this rank finalises outputs
// [mine_lo, mine_lo + mine_n) of the tokens x ROWS tile, summing every rank's partials in rank
// order (deterministic, no atomics), all remote loads issued before the sum.
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


// Cluster reduction modes (PUSH template flag):
//  false: every rank stores its CTA sums locally; barrier.cluster (release/acquire); rank r reads
//         its share of the outputs from all ranks (ld.shared::cluster); a relaxed cluster barrier
//         keeps shared memory alive until all reads are done.
//  true:  each rank pushes its CTA sums to the owning rank with st.async, which completes bytes on
//         the owner's mbarrier (initialised and armed at kernel entry; one relaxed cluster barrier
//         arrive at entry / wait before the first push). No fence, no trailing barrier.
template <int RT, int NT, int STAGES, bool OUT_BF16, bool PUSH, bool ROT>
__device__ __forceinline__ void skinny_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert(RT >= 1 && NT >= 1 && NT <= 2 && STAGES >= 2, "bad tile config");
    constexpr int L = 2 * RT + NT;  // 16-byte chunks per thread per 32-k block: weight rows g, g+8 per tile; tokens
    constexpr int FR = RT * NT * 4;  // accumulator floats per thread
    constexpr int ROWS = RT * 16;

    extern __shared__ __align__(16) unsigned char smem[];

    pdl_launch_dependents();

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
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
    unsigned mbar = 0, recv = 0;
    if constexpr (PUSH) {
        if (csize > 1) {
            mbar = smem_addr(smem) + (unsigned)skinny_main_bytes(RT, NT, STAGES, nwarps);
            recv = mbar + 16;
            if (threadIdx.x == 0) {
                mbar_init(mbar, 1);
                mbar_arrive_expect_tx(mbar, (csize - 1) * (unsigned)mine * 4u);
            }
            cluster_arrive_relaxed();
        }
    }

    // ROT: CTA x walks its blocks starting at block (x mod nblk), so the SMs do not all read the
    // same K offset of rows 14336 B apart at the same time (one HBM channel group in lockstep).
    const int rot = ROT && nblk > 0 ? (int)(blockIdx.x % (unsigned)nblk) : 0;
    auto issue = [&](int stage, int blk, int lo, int hi) {
        int rb = blk + rot;
        rb = rb >= nblk ? rb - nblk : rb;
        const int k = (b0 + rb) * 32;  // thread's chunk starts at k + 8t (src already has + 8t)
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
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    mma_bf16_16816(acc[r][n], v[2 * r][2 * s], v[2 * r + 1][2 * s], v[2 * r][2 * s + 1],
                                   v[2 * r + 1][2 * s + 1], v[2 * RT + n][2 * s], v[2 * RT + n][2 * s + 1]);
        rd = rd + 1 == STAGES ? 0 : rd + 1;
        wr = wr + 1 == STAGES ? 0 : wr + 1;
    }
    cp_async_wait<0>();
    __syncthreads();  // ring is reused for the partials below

    // Warp partials, fragment-major so the writes are conflict-free.
    float* red = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[(warp * FR + (r * NT + n) * 4 + i) * 32 + lane] = acc[r][n][i];
    __syncthreads();

    // CTA sums (fixed warp order) in (token, row) order.
    float* csum = red + nwarps * FR * 32;
    if constexpr (PUSH) {
        if (csize > 1) cluster_wait();  // every rank's mbarrier is initialised and armed
    }
    for (int o = threadIdx.x; o < outs; o += blockDim.x) {
        const int tok = o / ROWS, rl = o - tok * ROWS;
        const int rr = rl & 15, tt = tok & 7;
        const int p = (((rl >> 4) * NT + (tok >> 3)) * 4 + (rr >> 3) * 2 + (tt & 1)) * 32 + (rr & 7) * 4 + (tt >> 1);
        float s = 0.f;
#pragma unroll 4
        for (int wi = 0; wi < nwarps; ++wi) s += red[wi * FR * 32 + p];
        if (csize == 1) {
            if (row0 + rl < N) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, s);
        } else if constexpr (PUSH) {
            const unsigned owner = (unsigned)(o / per);
            const unsigned slot = recv + (unsigned)((crank * per + (o - (int)owner * per)) * 4);
            if (owner == crank) st_shared_f32(slot, s);
            else st_async_f32(mapa(slot, owner), s, mapa(mbar, owner));
        } else {
            csum[o] = s;
        }
    }
    if (csize == 1) return;

    if constexpr (PUSH) {
        __syncthreads();        // this rank's own partials are in recv
        mbar_wait_phase0(mbar);  // and every other rank's have arrived
        for (int j = threadIdx.x; j < mine; j += blockDim.x) {
            const int o = mine_lo + j;
            const int tok = o / ROWS, rl = o - tok * ROWS;
            float v[kMaxSplit];
#pragma unroll
            for (int rk = 0; rk < kMaxSplit; ++rk) v[rk] = rk < (int)csize ? ld_shared_f32(recv + (rk * per + j) * 4) : 0.f;
            float s = 0.f;
#pragma unroll
            for (int rk = 0; rk < kMaxSplit; ++rk) s += rk < (int)csize ? v[rk] : 0.f;
            if (row0 + rl < N) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, s);
        }
        return;
    } else {
        cluster_pull_reduce<ROWS, OUT_BF16>(csum, csize, mine_lo, mine, out, ldo, row0, N);
    }
}


// ------------------------------------------------------------------------------------------------
// Bulk-copy variant (SK_BULK=1): two producer warps stream the CTA's 16*RT weight rows and the
// activation rows into a STAGES-deep shared-memory ring with 1-D cp.async.bulk copies (one copy
// per row and stage, KC k wide), completing on a "full" mbarrier per stage; CW consumer warps
// split each stage's 32-k blocks, run the same K-permuted swap-AB mma.sync as above, and release
// the stage on an "empty" mbarrier (CW arrivals). Bytes in flight per SM = STAGES * 16*RT * KC * 2
// (64 KB at RT=1, KC=256, STAGES=8) instead of one thread's cp.async groups: what a
// bandwidth-bound fused-A needs (Little's law: ~4.1 TB/s x ~1 us / 132 SMs = ~32 KB per SM).
// Rows >= N and tokens >= M are not copied: their smem holds stale data that only reaches
// outputs that are never stored. A partial last 32-k block is masked (both operands zeroed).
// Cluster split-K (grid.y = cluster size S) reduces like the pull mode above.
// Shared memory: ring | full[STAGES] | empty[STAGES] | warp partials | CTA sums (bulk_smem_bytes).
__host__ __device__ constexpr int bulk_row_bytes(int kc) { return kc * 2 + 64; }  // 64-B pad: conflict-free lds128
// actw > 0 ("direct activations"): the ring holds weights only; consumers load their token chunks
// straight from global memory (L2-resident) into registers before waiting for the stage.
__host__ __device__ constexpr int bulk_stage_bytes(int rt, int nt, int kc, int actw) {
    return (16 * rt + (actw ? 0 : 8 * nt)) * bulk_row_bytes(kc);
}
__host__ __device__ constexpr int bulk_smem_bytes(int rt, int nt, int kc, int stages, int cw, int actw) {
    return stages * bulk_stage_bytes(rt, nt, kc, actw) + stages * 16 + cw * rt * nt * 4 * 32 * 4 + 8 * nt * 16 * rt * 4;
}
__device__ __forceinline__ void ldg_nc128(const void* p, unsigned (&v)[4]) {
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(p));
}

__device__ __forceinline__ void mbar_init_cta(unsigned mbar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(mbar), "r"(count) : "memory");
}
// Wait for the phase of a local mbarrier with this parity. Callers have passed griddepcontrol.wait,
// so this only waits for this CTA's own copies/consumers: a wait of seconds is a bug and traps.
__device__ __forceinline__ void mbar_wait_parity(unsigned mbar, unsigned parity) {
    for (unsigned spins = 0;; ++spins) {
        unsigned done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(mbar), "r"(parity) : "memory");
        if (done) return;
        if (spins > (1u << 24)) asm volatile("trap;");
    }
}
// One lane of the (converged) warp gets true.
__device__ __forceinline__ bool elect_one() {
    unsigned p;
    asm volatile("{\n.reg .pred P;\n.reg .b32 r;\nelect.sync r|P, 0xffffffff;\nselp.u32 %0, 1, 0, P;\n}\n" : "=r"(p));
    return p != 0;
}
__device__ __forceinline__ void mbar_arrive_cta(unsigned mbar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(mbar) : "memory");
}
// 1-D bulk copy global -> this CTA's shared memory (bytes % 16 == 0, both addresses 16-B aligned).
__device__ __forceinline__ void bulk_g2s(unsigned dst, const void* src, unsigned bytes, unsigned mbar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(mbar) : "memory");
}

template <int RT, int NT, int KC, int STAGES, bool OUT_BF16, int ACTW, bool ROT>
__device__ __forceinline__ void skinny_bulk(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert(RT >= 1 && NT >= 1 && NT <= 2 && STAGES >= 2 && KC % 32 == 0 && KC >= 32, "bad bulk config");
    constexpr int ROWB = bulk_row_bytes(KC);
    constexpr int STAGE_B = bulk_stage_bytes(RT, NT, KC, ACTW);
    constexpr int BPW = ACTW > 0 ? (KC / 32 + ACTW - 1) / (ACTW > 0 ? ACTW : 1) : 1;  // 32-k blocks per consumer warp
    constexpr int ROWS = 16 * RT;
    constexpr int TOK = 8 * NT;
    constexpr int FR = RT * NT * 4;

    extern __shared__ __align__(128) unsigned char smem[];

    pdl_launch_dependents();

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int cw = ACTW > 0 ? ACTW : (int)(blockDim.x >> 5) - 2;  // consumer warps; the last two produce
    const int g = lane >> 2;
    const int t = lane & 3;
    const unsigned crank = cluster_rank();
    const unsigned csize = cluster_size();
    const int row0 = blockIdx.x * ROWS;
    const int rows = N - row0 < ROWS ? N - row0 : ROWS;
    const int toks = M < TOK ? M : TOK;

    // This CTA's K range: 32-k blocks balanced over the cluster ranks.
    const int nb = (K + 31) >> 5;
    const int kb = (int)((long long)crank * nb / csize) * 32;
    int ke = (int)((long long)(crank + 1) * nb / csize) * 32;
    ke = ke < K ? ke : K;
    const int klen = ke > kb ? ke - kb : 0;
    const int nst = (klen + KC - 1) / KC;
    // ROT: CTA x takes its K chunks in the order x mod nst, x+1 mod nst, ... (see skinny_gemm).
    const int rot = ROT && nst > 0 ? (int)(blockIdx.x % (unsigned)nst) : 0;
    auto chunk_k0 = [&](int i) {
        int j = i + rot;
        j = j >= nst ? j - nst : j;
        return kb + j * KC;
    };

    const unsigned base = smem_addr(smem);
    const unsigned full = base + (unsigned)(STAGES * STAGE_B);
    const unsigned empty = full + (unsigned)(STAGES * 8);
    float* red = reinterpret_cast<float*>(smem + STAGES * STAGE_B + STAGES * 16);
    float* csum = red + cw * FR * 32;

    if (threadIdx.x == 0) {
#pragma unroll 1
        for (int s = 0; s < STAGES; ++s) {
            mbar_init_cta(full + 8 * s, ACTW > 0 ? 1 : 2);
            mbar_init_cta(empty + 8 * s, (unsigned)cw);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    float acc[RT][NT][4];
    zero_acc<RT, NT>(acc);

    if (warp >= cw) {
        // Two producer warps: cw streams the weight rows, cw + 1 the token rows; each arms the
        // stage's full barrier (2 arrivals) with its own byte count. Each warp runs one warp-uniform
        // loop and one elected lane issues each copy, so the operands live in uniform registers (a
        // per-lane issue serialises through R2UR, measured ~45 ns per copy). Weights are parameters
        // and are streamed without waiting for the previous grid (PDL); activations after it.
        const bool wts = warp == cw;
        if (!wts) pdl_wait();
        const int nrow = wts ? rows : toks;
        const int nloop = wts || ACTW == 0 ? nst : 0;  // direct activations: the second warp idles
        const __nv_bfloat16* src0 = wts ? w + (long long)row0 * ldw : act;
        const long long ld = wts ? ldw : lda;
        const unsigned dst0 = base + (unsigned)((wts ? 0 : ROWS) * ROWB);
#pragma unroll 1
        for (int i = 0; i < nloop; ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) mbar_wait_parity(empty + 8 * s, (unsigned)(((i / STAGES) - 1) & 1));
            const int k0 = chunk_k0(i);
            const unsigned bytes = (unsigned)((ke - k0 < KC ? ke - k0 : KC) * 2);
            const unsigned bar = full + 8 * s;
            const unsigned dst = dst0 + (unsigned)(s * STAGE_B);
            const __nv_bfloat16* src = src0 + k0;
            if (elect_one()) mbar_arrive_expect_tx(bar, (unsigned)nrow * bytes);
            __syncwarp();
#pragma unroll
            for (int c = 0; c < (ROWS > TOK ? ROWS : TOK); ++c)
                if (c < nrow && elect_one()) bulk_g2s(dst + (unsigned)(c * ROWB), src + c * ld, bytes, bar);
            __syncwarp();
        }
        if (wts) pdl_wait();  // before this warp takes part in the output stores below
    } else {
        pdl_wait();
#pragma unroll 1
        for (int i = 0; i < nst; ++i) {
            const int s = i % STAGES;
            const int k0 = chunk_k0(i);
            const int len = ke - k0 < KC ? ke - k0 : KC;
            unsigned av[BPW][NT][4];  // direct activations: this warp's token chunks of the stage
            if constexpr (ACTW > 0) {
#pragma unroll
                for (int b = 0; b < BPW; ++b) {
                    const int kk = k0 + (b * ACTW + warp) * 32 + 8 * t;
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        const int tok = 8 * n + g;
                        if (b * ACTW + warp < KC / 32 && kk < ke && tok < M)
                            ldg_nc128(act + (long long)tok * lda + kk, av[b][n]);
                        else
                            av[b][n][0] = av[b][n][1] = av[b][n][2] = av[b][n][3] = 0u;
                    }
                }
            }
            mbar_wait_parity(full + 8 * s, (unsigned)((i / STAGES) & 1));
            const unsigned sb = base + (unsigned)(s * STAGE_B) + (unsigned)(16 * t);
            constexpr int NB = ACTW > 0 ? BPW : KC / 32;  // loop bound (direct: av[] needs constant b)
            constexpr int UNR = ACTW > 0 ? BPW : (KC / 32 < 8 ? KC / 32 : 8);
#pragma unroll UNR
            for (int b = 0; b < NB; b += 1) {
                const int bb = b * cw + warp;  // interleaved 32-k blocks across the consumer warps
                if (bb >= KC / 32 || bb * 32 >= len) break;
                const unsigned off = sb + (unsigned)(bb * 64);
                unsigned a[RT][2][4], bt[NT][4];
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    lds128(off + (16 * r + g) * ROWB, a[r][0]);
                    lds128(off + (16 * r + g + 8) * ROWB, a[r][1]);
                }
                if constexpr (ACTW > 0) {
#pragma unroll
                    for (int n = 0; n < NT; ++n)
#pragma unroll
                        for (int j = 0; j < 4; ++j) bt[n][j] = av[b < BPW ? b : 0][n][j];
                } else {
#pragma unroll
                    for (int n = 0; n < NT; ++n) lds128(off + (ROWS + 8 * n + g) * ROWB, bt[n]);
                }
                if (bb * 32 + 8 * t >= len) {  // partial last block: this thread's chunk is past K
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
#pragma unroll
                        for (int r = 0; r < RT; ++r) a[r][0][j] = a[r][1][j] = 0u;
#pragma unroll
                        for (int n = 0; n < NT; ++n) bt[n][j] = 0u;
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int r = 0; r < RT; ++r)
#pragma unroll
                        for (int n = 0; n < NT; ++n)
                            mma_bf16_16816(acc[r][n], a[r][0][2 * h], a[r][1][2 * h], a[r][0][2 * h + 1],
                                           a[r][1][2 * h + 1], bt[n][2 * h], bt[n][2 * h + 1]);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive_cta(empty + 8 * s);
        }
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) red[(warp * FR + (r * NT + n) * 4 + i) * 32 + lane] = acc[r][n][i];
    }
    __syncthreads();

    // CTA sums over the consumer warps (fixed order), in (token, row) order.
    const int outs = toks * ROWS;
    for (int o = threadIdx.x; o < outs; o += blockDim.x) {
        const int tok = o / ROWS, rl = o - tok * ROWS;
        const int rr = rl & 15, tt = tok & 7;
        const int p = (((rl >> 4) * NT + (tok >> 3)) * 4 + (rr >> 3) * 2 + (tt & 1)) * 32 + (rr & 7) * 4 + (tt >> 1);
        float s = 0.f;
#pragma unroll 4
        for (int wi = 0; wi < cw; ++wi) s += red[wi * FR * 32 + p];
        if (csize == 1) {
            if (rl < rows) store_out<OUT_BF16>(out, (long long)tok * ldo + row0 + rl, s);
        } else {
            csum[o] = s;
        }
    }
    if (csize == 1) return;

    // Pull reduction over the cluster: rank r finalises its share, summing ranks in order.
    const int per = (outs + (int)csize - 1) / (int)csize;
    const int mine_lo = (int)crank * per;
    const int mine_n = outs - mine_lo < per ? (outs - mine_lo > 0 ? outs - mine_lo : 0) : per;
    cluster_pull_reduce<ROWS, OUT_BF16>(csum, csize, mine_lo, mine_n, out, ldo, row0, row0 + rows);
}

}  // namespace slim
