// PTX wrappers shared by the GEMM bodies (skinny, narrow, ring, direct, stream and sliced: *_gemm.cuh).
// Device code only, no host code and no std headers: NVRTC, nvcc -cubin and the AOT baseline
// all compile it. Everything here needs SM >= 9.0 (griddepcontrol, clusters).
#pragma once
#include <cuda_bf16.h>

namespace slim {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return static_cast<unsigned>(a);
}

// The dynamic shared memory this launch got: a host formula that disagrees with the kernel's
// layout must fail loudly (trap), never read or write past the allocation.
__device__ __forceinline__ unsigned dynamic_smem_size() {
    unsigned r;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void require_smem(unsigned bytes) {
    if (dynamic_smem_size() < bytes) asm volatile("trap;");
}

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// The same with a 128-byte L2 prefetch: for streams whose warp instructions each read whole
// 128-byte lines of four places (stream_gemm.cuh), where a 256-byte prefetch fetches lines twice.
__device__ __forceinline__ void cp_async16_l2_128(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

__device__ __forceinline__ void lds128(unsigned addr, unsigned (&v)[4]) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr));
}
// Four 8x8 b16 matrices from shared memory: lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned (&v)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr));
}
// 16-byte global load that does not allocate in L1 (weights and activations are read once per CTA).
// Coherent, not ld.global.nc: ptxas keeps coherent loads in program order around griddepcontrol.wait,
// but not .nc ones. With .nc it sank the wait below the activation loads (direct, narrow_r7: a read
// of the previous grid's output before it is complete) and hoisted it above the weight loads
// (narrow: no weight prefetch under PDL); tests/test_kernels_gpu.py has the early-trigger producer.
__device__ __forceinline__ void ldg_na128(const void* p, unsigned (&v)[4]) {
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(p));
}

// The same, or zeros without reading where !ok (past K, N or M).
__device__ __forceinline__ void ldg_na128_or_zero(const void* p, bool ok, unsigned (&v)[4]) {
    if (ok) {
        ldg_na128(p, v);
    } else {
        v[0] = v[1] = v[2] = v[3] = 0u;
    }
}

// Plain 16-byte global load (coherent path, L1-allocating), as a compiler-generated vector load.
__device__ __forceinline__ void ldg128(const void* p, unsigned (&v)[4]) {
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(p));
}

// D += A(16x16, row) * B(16x8, col), bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Programmatic dependent launch: wait for the previous grid on the stream (a no-op when this
// launch was not made with PDL), and let the next grid start its prologue.
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

// mbarriers, for ring_gemm.cuh and stream_gemm.cuh.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// An arrival on bar once every cp.async this thread issued so far has landed (the barrier's
// expected count is not raised: it was set at init).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}
// The bulk-copy (TMA, no tensor map) side of an mbarrier ring (benchmark/floor_probe.cuh):
// an arrival on bar that also raises the phase's expected transaction bytes by `bytes`, made by the thread
// that then issues the copies of those bytes, so the phase completes once the arrivals are in and the bytes
// have landed.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
// `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned) in one bulk copy,
// completing on bar's transaction count. A CTA's own shared::cta address is a shared::cluster one.
__device__ __forceinline__ void cp_async_bulk_g2s(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// After mbar_init of barriers a bulk copy completes on: the initialisation made visible to the async proxy.
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
    unsigned done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done != 0;
}
__device__ __forceinline__ unsigned long long globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}
// Waits for the phase of `parity` to complete. A phase that never completes (a layout bug) traps
// after 20 s instead of hanging the stream; no producer kernel of a decode step runs that long.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    if (mbar_try_wait(bar, parity)) return;
    const unsigned long long t0 = globaltimer_ns();
    while (!mbar_try_wait(bar, parity))
        if (globaltimer_ns() - t0 > 20000000000ull) asm volatile("trap;");
}

template <bool OUT_BF16>
__device__ __forceinline__ void store_out(void* out, long long idx, float v) {
    if constexpr (OUT_BF16) {
        static_cast<__nv_bfloat16*>(out)[idx] = __float2bfloat16_rn(v);
    } else {
        static_cast<float*>(out)[idx] = v;
    }
}

}  // namespace slim
