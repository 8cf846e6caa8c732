// Test kernel for tensor-map ('t') parameters: block b copies one BOX_COLS x BOX_ROWS bf16 tile
// at (column 0, row row0 + b * BOX_ROWS) from each of two tensors through TMA into shared memory,
// and writes both tiles as they landed there (swizzled when the maps swizzle) to
// out[b * 2 * TILE ...]: first the tile of `a`, then the one of `b`. Rows past a tensor's end
// arrive as zeros (OOB fill). Launch with one block of 128 threads per tile row-block.
// slim:limits max_registers=40 max_spill_bytes=0 max_smem_static=2056
#include "fixture_common.cuh"

#ifndef BOX_COLS
#define BOX_COLS 64  // 128 bytes of bf16: the 128B swizzle span
#endif
#ifndef BOX_ROWS
#define BOX_ROWS 8
#endif
#define TILE (BOX_COLS * BOX_ROWS)

// CUtensorMap as the kernel sees it (NVRTC has no cuda.h).
struct __align__(64) TmaDesc {
  unsigned long long v[16];
};

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

extern "C" __global__ void fixture_tma(const __grid_constant__ TmaDesc a, int row0, const __grid_constant__ TmaDesc b,
                                       __nv_bfloat16* __restrict__ out) {
  // 128B swizzling works on 1024-byte atoms of shared memory: align each tile to one.
  __shared__ __align__(1024) __nv_bfloat16 tile_a[TILE];
  __shared__ __align__(1024) __nv_bfloat16 tile_b[TILE];
  __shared__ __align__(8) unsigned long long bar;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  int row = row0 + (int)blockIdx.x * BOX_ROWS;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 ::"r"(smem_u32(&bar)), "r"((unsigned)(2 * TILE * sizeof(__nv_bfloat16))) : "memory");
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(smem_u32(tile_a)), "l"(&a), "r"(0), "r"(row), "r"(smem_u32(&bar)) : "memory");
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(smem_u32(tile_b)), "l"(&b), "r"(0), "r"(row), "r"(smem_u32(&bar)) : "memory");
  }
  unsigned done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_u32(&bar)) : "memory");
  __nv_bfloat16* dst = out + (long long)blockIdx.x * 2 * TILE;
  for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
    dst[i] = tile_a[i];
    dst[TILE + i] = tile_b[i];
  }
#endif
}
