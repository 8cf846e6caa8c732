// Test kernel for the JIT runtime: out[i] = alpha * x[i] + y[i] + BIAS, over n bf16 elements.
// slim:limits max_registers=32 max_spill_bytes=0 max_smem_static=0
#include "fixture_common.cuh"

#ifndef BIAS
#define BIAS 0
#endif

extern "C" __global__ void fixture_axpby(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ y,
                                         __nv_bfloat16* __restrict__ out, long long n, float alpha, int repeat) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float acc = __bfloat162float(y[i]) + (float)BIAS;
    for (int r = 0; r < repeat; ++r) acc += slim_fixture_scale(__bfloat162float(x[i]), alpha);
    out[i] = __float2bfloat16(acc);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
