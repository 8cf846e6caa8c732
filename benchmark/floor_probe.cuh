// floor_probe (benchmark/bench_floor.py): how fast one kernel can stream `bytes` of global memory into shared
// memory in a decode step, the way a GEMM streams its weights, with nothing else to do.
//
// Each CTA reads its contiguous share of the bytes (1/gridDim.x, in 16-byte words) through a ring of FP_STAGES
// stages of FP_STAGE bytes: one thread waits until a slot is free, arms its "full" mbarrier for the stage's bytes
// (mbarrier.arrive.expect_tx) and issues the stage's bulk copies (cp.async.bulk, FP_COPY bytes each, the last one
// shorter where the share ends); four reader warps xor every 32-bit word of the stage into one register and
// release the slot through its "empty" mbarrier. The CTA stores the xor of its share, out[blockIdx.x], so no copy
// is dead and the host can check that every byte was read once.
// slim:limits max_registers=64 max_spill_bytes=0 max_smem_static=0
//
// Compile-time parameters (-D): FP_STAGES (ring depth, 2..48), FP_STAGE (bytes per stage), FP_COPY (bytes per
// bulk copy: a multiple of 16 dividing FP_STAGE).
// Launch: block kProbeThreads, dynamic smem kProbeBarrierBytes + FP_STAGES * FP_STAGE; bytes % 16 == 0 and src
// 16-byte aligned (the host checks both).
#include "ptx.cuh"

#if !defined(FP_STAGES) || !defined(FP_STAGE) || !defined(FP_COPY)
#error "floor_probe needs FP_STAGES, FP_STAGE and FP_COPY"
#endif

constexpr int kProbeReaders = 4;                      // reader warps, after the loader warp
constexpr int kProbeThreads = 32 * (1 + kProbeReaders);
constexpr int kProbeBarrierBytes = 1024;              // full and empty mbarriers, then the CTA's xor word

extern "C" __global__ void __launch_bounds__(kProbeThreads)
floor_probe(const unsigned char* __restrict__ src, long long bytes, unsigned* __restrict__ out) {
    static_assert(FP_STAGES >= 2 && FP_STAGES <= 48 && FP_COPY % 16 == 0 && FP_COPY > 0 && FP_STAGE % FP_COPY == 0,
                  "bad floor_probe config");
    extern __shared__ __align__(1024) unsigned char smem[];
    slim::require_smem(kProbeBarrierBytes + FP_STAGES * FP_STAGE);
    if (blockDim.x != kProbeThreads) asm volatile("trap;");
    const unsigned full = slim::smem_addr(smem), empty = full + 8 * FP_STAGES, ring = full + kProbeBarrierBytes;
    unsigned* word = reinterpret_cast<unsigned*>(smem + 16 * FP_STAGES);

    const long long units = bytes >> 4, per = (units + gridDim.x - 1) / gridDim.x;  // 16-byte words
    const long long lo = (blockIdx.x * per < units ? blockIdx.x * per : units) << 4;
    const long long hi = ((blockIdx.x + 1) * per < units ? (blockIdx.x + 1) * per : units) << 4;
    const long long mine = hi - lo;
    const int nst = (int)((mine + FP_STAGE - 1) / FP_STAGE);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        for (int s = 0; s < FP_STAGES; ++s) {
            slim::mbar_init(full + 8 * s, 1);               // the loader thread's arrival (with the stage's bytes)
            slim::mbar_init(empty + 8 * s, kProbeReaders);  // one arrival per reader warp
        }
        *word = 0u;
        slim::fence_mbar_init();
    }
    __syncthreads();

    if (warp == 0) {
        if (lane == 0) {
            const unsigned char* from = src + lo;
            for (int s = 0; s < nst; ++s, from += FP_STAGE) {
                const int slot = s % FP_STAGES;
                if (s >= FP_STAGES) slim::mbar_wait(empty + 8 * slot, ((s / FP_STAGES) & 1) ^ 1);
                const long long left = mine - (long long)s * FP_STAGE;
                const int sb = left < FP_STAGE ? (int)left : FP_STAGE;
                slim::mbar_arrive_expect_tx(full + 8 * slot, (unsigned)sb);
                for (int c = 0; c < sb; c += FP_COPY)
                    slim::cp_async_bulk_g2s(ring + (unsigned)(slot * FP_STAGE + c), from + c,
                                            (unsigned)(sb - c < FP_COPY ? sb - c : FP_COPY), full + 8 * slot);
            }
        }
    } else {
        const int t = threadIdx.x - 32;
        unsigned acc = 0u;
        for (int s = 0; s < nst; ++s) {
            const int slot = s % FP_STAGES;
            slim::mbar_wait(full + 8 * slot, (s / FP_STAGES) & 1);
            const long long left = mine - (long long)s * FP_STAGE;
            const int sb = left < FP_STAGE ? (int)left : FP_STAGE;
            const unsigned base = ring + (unsigned)(slot * FP_STAGE);
            for (int off = 16 * t; off < sb; off += 16 * 32 * kProbeReaders) {
                unsigned v[4];
                slim::lds128(base + (unsigned)off, v);
                acc ^= v[0] ^ v[1] ^ v[2] ^ v[3];
            }
            __syncwarp();
            if (lane == 0) slim::mbar_arrive(empty + 8 * slot);
        }
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, d);
        if (lane == 0) atomicXor(word, acc);
    }
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = *word;
}
