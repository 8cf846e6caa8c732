// Shared helpers for the JIT runtime's own test kernels.
#pragma once
#include <cuda_bf16.h>

__device__ __forceinline__ float slim_fixture_scale(float x, float a) { return a * x; }
