// narrow_gemm: out(M, N) = act(M, K) @ W(N, K)^T for few tokens (M <= MT <= 16), fp32 accumulation.
// The catalogue compiles MT = M (registers and FMAs track M).
//
// A CTA owns ROWS (1..8) output rows over the whole K, so no CTA waits for another: no cluster,
// no cross-CTA reduction, one short chain from launch to store (the router at M <= ~4, where skinny_gemm's
// cluster split-K costs more than it saves; fused-A at M <= ~3 and weights too thin for stream_gemm's 16-row CTAs
// to fill the SMs).
//  * Thread tid owns the 16-byte chunks c = tid + j*THREADS (j < CPT) of every row: all of the
//    CTA's weight bytes are requested at entry, before griddepcontrol.wait (PDL), one round of
//    THREADS*CPT chunks at a time (one round covers K <= 8*CPT*THREADS).
//  * Tokens are read after the wait, in batches of up to 8 whose loads all issue before their fp32
//    FMAs (CUDA cores; ROWS*M*K per CTA is small for few rows and tokens).
//  * Loads are coherent ld.global.L1::no_allocate (ptx.cuh: why not .nc), or (PLAIN) L1-allocating.
//    After a PDL-aware producer PLAIN was 0.05-0.16 us faster for one row per CTA at M 2-4, after a
//    PDL-unaware one 0.05-0.25 us slower (H200, when only PLAIN kept the weight loads before the wait).
//  * EXACT > 0: the caller checked K == EXACT, M == MT and N % ROWS == 0 (its own instance), so the round loop, the
//    chunk, row and token predicates and the per-token branches fold away (a straight-line body,
//    as sglang's tiny_gemm is by being compiled per K, N and M). K alone: 0.05-0.2 us faster at
//    M 1-3. The catalogue compiles it for any K that one round of THREADS = K / (8 CPT) covers
//    where the configuration's own K is one round (K-fitted: Narrow.fitted_threads).
//  * LATE: the PDL trigger after the FMAs instead of at entry (the next kernel's CTAs do not
//    take SMs while this one still needs them). Under the 72-register cap it is the pick at M=6;
//    uncapped it gained nothing.
//  * Reduction in a fixed order: every thread's ROWS*M partials go to shared memory (value-major,
//    conflict-free), then warp w sums outputs w, w+WARPS, ...: each lane adds WARPS partials,
//    then a butterfly over the lanes. Repeated runs are bit-identical.
//
// Launch contract (slim_kernel/jit/catalogue.py, family "narrow"):
//   grid (ceil(N / ROWS)), block THREADS, dynamic smem = narrow_smem_bytes(ROWS, MT, THREADS).
//   Requirements: K % 8 == 0, lda % 8 == 0, ldw % 8 == 0, act/w 16-byte aligned, M <= MT.
#pragma once
#include "ptx.cuh"

namespace slim {

__host__ __device__ constexpr int narrow_smem_bytes(int rows, int mt, int threads) { return rows * mt * threads * 4; }

__device__ __forceinline__ void bf16x8_to_f32(const unsigned (&v)[4], float (&f)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(v[i] << 16);
        f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    }
}

template <bool PLAIN>
__device__ __forceinline__ void narrow_load(const __nv_bfloat16* p, unsigned (&v)[4]) {
    if constexpr (PLAIN) {
        ldg128(p, v);
    } else {
        ldg_na128(p, v);
    }
}

template <int ROWS, int MT, int CPT, int THREADS, bool PLAIN, bool LATE, bool OUT_BF16, int EXACT = 0>
__device__ __forceinline__ void narrow_gemm(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                            void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    static_assert(ROWS >= 1 && ROWS <= 8 && MT >= 1 && MT <= 16 && CPT >= 1 && THREADS % 32 == 0, "bad narrow config");
    constexpr int WARPS = THREADS / 32;
    constexpr int TB = MT <= 8 ? MT : 4;  // tokens per load batch (16 tokens in 4: no spills at 448 threads)
    extern __shared__ __align__(16) float red[];  // [ROWS * MT][THREADS]

    if (!LATE) pdl_launch_dependents();
    require_smem((unsigned)narrow_smem_bytes(ROWS, MT, THREADS));

    const int tid = threadIdx.x;
    const int row0 = blockIdx.x * ROWS;
    const int nchunk = EXACT ? EXACT >> 3 : K >> 3;
    const int m_used = EXACT ? MT : M < MT ? M : MT;
    // Exact: every thread's chunks lie inside K when the rounds tile it (tid < THREADS by the launch contract).
    constexpr bool all_chunks = EXACT && (EXACT >> 3) % (THREADS * CPT) == 0;
    constexpr bool rows_full = EXACT != 0;

    float acc[ROWS][MT];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

    for (int c0 = 0; c0 < nchunk; c0 += THREADS * CPT) {
        unsigned wv[ROWS][CPT][4];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                const int c = c0 + j * THREADS + tid;
                if ((all_chunks || c < nchunk) && (rows_full || row0 + r < N)) {
                    narrow_load<PLAIN>(w + (long long)(row0 + r) * ldw + 8 * c, wv[r][j]);
                } else {
                    wv[r][j][0] = wv[r][j][1] = wv[r][j][2] = wv[r][j][3] = 0u;
                }
            }
        if (c0 == 0) pdl_wait();  // weights are parameters; the activation is the previous grid's output
        // Tokens in batches of TB: every load of a batch is issued before its FMAs, so a batch
        // costs one L2 round trip, not one per token.
#pragma unroll
        for (int m0 = 0; m0 < MT; m0 += TB) {
            if (m0 >= m_used) break;
            unsigned xv[TB][CPT][4];
#pragma unroll
            for (int i = 0; i < TB; ++i)
#pragma unroll
                for (int j = 0; j < CPT; ++j) {
                    const int c = c0 + j * THREADS + tid;
                    if (m0 + i < m_used && (all_chunks || c < nchunk)) {
                        narrow_load<PLAIN>(act + (long long)(m0 + i) * lda + 8 * c, xv[i][j]);
                    } else {
                        xv[i][j][0] = xv[i][j][1] = xv[i][j][2] = xv[i][j][3] = 0u;
                    }
                }
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                float wf[ROWS][8];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) bf16x8_to_f32(wv[r][j], wf[r]);
#pragma unroll
                for (int i = 0; i < TB; ++i) {
                    if (m0 + i >= m_used) break;  // uniform: no FMAs for the tokens past M
                    float xf[8];
                    bf16x8_to_f32(xv[i][j], xf);
#pragma unroll
                    for (int r = 0; r < ROWS; ++r)
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[r][m0 + i] = fmaf(wf[r][e], xf[e], acc[r][m0 + i]);
                }
            }
        }
    }
    if (LATE) pdl_launch_dependents();

#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m)
            if (m < m_used) red[(r * MT + m) * THREADS + tid] = acc[r][m];
    __syncthreads();

    const int lane = tid & 31;
    const int outs = ROWS * m_used;
    constexpr bool one_pass = ROWS * MT <= WARPS;  // a warp sums at most one output: no loop
    for (int v = tid >> 5; v < outs; v += WARPS) {
        const int r = v / m_used, m = v - r * m_used;
        const float* col = red + (r * MT + m) * THREADS;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) s += col[i * 32 + lane];
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
        if (lane == 0 && (rows_full || row0 + r < N)) store_out<OUT_BF16>(out, (long long)m * ldo + row0 + r, s);
        if (one_pass) break;
    }
}

#if defined(SK_FAMILY) && SK_FAMILY == 1
// The instance the catalogue compiles (-D SK_ROWS, SK_MT, SK_CPT, SK_THREADS; optional SK_PLAIN, SK_LATE and
// SK_EXACTK), called by both ops' entry points.
#ifndef SK_EXACTK
#define SK_EXACTK 0  // the body compiled for K == SK_EXACTK (and M == SK_MT, N % SK_ROWS == 0) only
#endif
#ifndef SK_PLAIN
#define SK_PLAIN 0  // 1 = L1-allocating loads instead of L1::no_allocate
#endif
#ifndef SK_LATE
#define SK_LATE 0  // 1 = the PDL trigger after the FMAs instead of at entry
#endif
// the entry point's bound: the compile-time block, one CTA per SM, or a register cap (ptxas refuses both)
#ifdef SK_MAXNREG
#define SK_NARROW_BOUNDS __maxnreg__(SK_MAXNREG)
#else
#define SK_NARROW_BOUNDS __launch_bounds__(SK_THREADS, 1)
#endif
template <bool OUT_BF16>
__device__ __forceinline__ void narrow_instance(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ w,
                                                void* __restrict__ out, int M, int N, int K, int lda, int ldw, int ldo) {
    // The straight-line instance is the catalogue's pick for its shape alone (Narrow.exact_for); a uniform check.
    if (SK_EXACTK && (K != SK_EXACTK || M != SK_MT || N % SK_ROWS != 0 || blockDim.x != SK_THREADS)) asm volatile("trap;");
    narrow_gemm<SK_ROWS, SK_MT, SK_CPT, SK_THREADS, SK_PLAIN != 0, SK_LATE != 0, OUT_BF16, SK_EXACTK>(act, w, out, M, N, K,
                                                                                                  lda, ldw, ldo);
}
#endif

}  // namespace slim
