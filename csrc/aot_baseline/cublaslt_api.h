// The subset of the cuBLASLt C API that bmm_fp8 uses, declared here so the baseline builds
// without cuBLAS headers (the CUDA toolkit in CI has none; the nvidia-cublas wheel is 421 MB).
// libcublasLt is opened with dlopen at run time (bmm_fp8.cpp). Values and layouts are those of
// cublasLt.h / cublas_api.h / library_types.h (CUDA 12 and 13 agree); cublaslt_abi_check.cpp
// static_asserts every one of them against the real header whenever the build finds one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slim_aot::lt {

using Status = int;  // cublasStatus_t
using Handle = struct cublasLtContext*;
struct MatmulDescOpaque { uint64_t data[32]; };
struct MatrixLayoutOpaque { uint64_t data[8]; };
struct MatmulPreferenceOpaque { uint64_t data[8]; };
using MatmulDesc = MatmulDescOpaque*;
using MatrixLayout = MatrixLayoutOpaque*;
using MatmulPreference = MatmulPreferenceOpaque*;
struct MatmulAlgo { uint64_t data[8]; };
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  MatmulAlgo algo;
  size_t workspaceSize;
  Status state;
  float wavesCount;
  int reserved[4];
};

constexpr Status kSuccess = 0;        // CUBLAS_STATUS_SUCCESS
constexpr Status kNotSupported = 15;  // CUBLAS_STATUS_NOT_SUPPORTED
constexpr int kCompute32F = 68;       // CUBLAS_COMPUTE_32F
constexpr int kOpN = 0, kOpT = 1;     // CUBLAS_OP_N, CUBLAS_OP_T
// cudaDataType_t
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14, kR8F_E4M3 = 28, kR8F_E5M2 = 29;
// cublasLtMatmulDescAttributes_t
constexpr int kDescTransA = 3, kDescTransB = 4, kDescAScalePointer = 17, kDescBScalePointer = 18,
              kDescFastAccum = 25;
// cublasLtMatrixLayoutAttribute_t
constexpr int kLayoutBatchCount = 5, kLayoutStridedBatchOffset = 6;
// cublasLtMatmulPreferenceAttributes_t
constexpr int kPrefMaxWorkspaceBytes = 1;

struct Api {
  Status (*Create)(Handle*) = nullptr;
  Status (*MatmulDescCreate)(MatmulDesc*, int, int) = nullptr;
  Status (*MatmulDescDestroy)(MatmulDesc) = nullptr;
  Status (*MatmulDescSetAttribute)(MatmulDesc, int, const void*, size_t) = nullptr;
  Status (*MatrixLayoutCreate)(MatrixLayout*, int, uint64_t, uint64_t, int64_t) = nullptr;
  Status (*MatrixLayoutDestroy)(MatrixLayout) = nullptr;
  Status (*MatrixLayoutSetAttribute)(MatrixLayout, int, const void*, size_t) = nullptr;
  Status (*MatmulPreferenceCreate)(MatmulPreference*) = nullptr;
  Status (*MatmulPreferenceDestroy)(MatmulPreference) = nullptr;
  Status (*MatmulPreferenceSetAttribute)(MatmulPreference, int, const void*, size_t) = nullptr;
  Status (*MatmulAlgoGetHeuristic)(Handle, MatmulDesc, MatrixLayout, MatrixLayout, MatrixLayout, MatrixLayout,
                                   MatmulPreference, int, HeuristicResult*, int*) = nullptr;
  Status (*Matmul)(Handle, MatmulDesc, const void*, const void*, MatrixLayout, const void*, MatrixLayout,
                   const void*, const void*, MatrixLayout, void*, MatrixLayout, const MatmulAlgo*, void*, size_t,
                   void* /* cudaStream_t */) = nullptr;
  const char* (*GetStatusString)(Status) = nullptr;
  size_t (*GetVersion)() = nullptr;
};

}  // namespace slim_aot::lt
