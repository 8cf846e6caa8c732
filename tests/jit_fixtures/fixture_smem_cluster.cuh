// Test kernel for the JIT runtime's launch options: dynamic shared memory above 48 KiB and
// thread-block clusters. Block b fills `words` floats of dynamic shared memory, then writes them
// reversed to out[b * words ...]; thread 0 also records (cluster rank, cluster size) in info[2b..].
// slim:limits max_registers=32 max_spill_bytes=0 max_smem_static=0
#include "fixture_common.cuh"

extern "C" __global__ void fixture_smem_cluster(float* __restrict__ out, int* __restrict__ info, int words) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < words; i += blockDim.x) buf[i] = slim_fixture_scale((float)i, 2.0f) + blockIdx.x;
  __syncthreads();
  for (int i = threadIdx.x; i < words; i += blockDim.x) out[(long long)blockIdx.x * words + i] = buf[words - 1 - i];
  if (threadIdx.x == 0) {
    unsigned rank = 0, size = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
#endif
    info[2 * blockIdx.x] = (int)rank;
    info[2 * blockIdx.x + 1] = (int)size;
  }
}
