// Host entry points of the AOT baseline, named like the retired sgl-kernel ops and exported
// (default visibility) the way an AOT op library exports them, so the audit sees them in .dynsym.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace slim_aot {

// One launch of a skinny-GEMM kernel instance: the instance key, the kernel arguments in the JIT
// signature "pppiiiiii" (act, w, out, M, N, K, ld_act, ld_w, ld_out) and the launch geometry.
struct GemmLaunch {
  const char* key;
  const void* act;
  const void* w;
  void* out;
  int m, n, k, ld_act, ld_w, ld_out;
  unsigned grid[3], block[3], cluster[3];  // cluster {1,1,1} = no cluster attribute
  unsigned smem;
  bool pdl;
  void* stream;  // cudaStream_t
};

// bmm_fp8: D(b,m,n) = (A(b,m,k) * A_scale) @ (B(b,k,n) * B_scale); A row-major, B column-major,
// D row-major; fp8 e4m3/e5m2 in (not both e5m2), bf16/fp16 out (cudaDataType_t codes).
struct Fp8BmmCall {
  const void* a;
  const void* b;
  void* d;
  const float* a_scale;
  const float* b_scale;
  void* workspace;
  size_t workspace_bytes;
  int batch, m, n, k;
  int a_type, b_type, d_type;
  void* cublas_handle;  // cublasLtHandle_t; nullptr = a per-thread, per-device handle of our own
  void* stream;         // cudaStream_t
};

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// cuBLASLt: the path of the loaded library and its version (loads it on first use).
std::string cublaslt_library();
size_t cublaslt_version();

}  // namespace slim_aot

#define SLIM_AOT_EXPORT __attribute__((visibility("default")))

SLIM_AOT_EXPORT void dsv3_router_gemm(const slim_aot::GemmLaunch& call);
SLIM_AOT_EXPORT void dsv3_fused_a_gemm(const slim_aot::GemmLaunch& call);
SLIM_AOT_EXPORT void bmm_fp8(const slim_aot::Fp8BmmCall& call);
