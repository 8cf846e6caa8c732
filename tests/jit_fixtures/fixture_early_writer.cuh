// Test producer for PDL consumers: dst = src over n bf16 elements, written after a delay, with the
// dependents' launch triggered at entry. A consumer launched with PDL that reads dst before its
// griddepcontrol.wait sees dst's old contents.
// slim:limits max_registers=32 max_spill_bytes=0 max_smem_static=0
#include "fixture_common.cuh"

extern "C" __global__ void fixture_early_writer(const __nv_bfloat16* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                                                long long n, long long delay_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  for (long long t = 0; t < delay_ns; t += 1000) __nanosleep(1000);
#endif
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}
