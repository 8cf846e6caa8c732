// Compile-time proof that cublaslt_api.h matches the real cuBLASLt header (built only when CMake
// finds cublasLt.h; no code, only static_asserts).
#include <cublasLt.h>

#include <cstddef>
#include <type_traits>

#include "cublaslt_api.h"

namespace lt = slim_aot::lt;

static_assert(lt::kSuccess == CUBLAS_STATUS_SUCCESS && lt::kNotSupported == CUBLAS_STATUS_NOT_SUPPORTED);
static_assert(lt::kCompute32F == CUBLAS_COMPUTE_32F && lt::kOpN == CUBLAS_OP_N && lt::kOpT == CUBLAS_OP_T);
static_assert(lt::kR32F == CUDA_R_32F && lt::kR16F == CUDA_R_16F && lt::kR16BF == CUDA_R_16BF &&
              lt::kR8F_E4M3 == CUDA_R_8F_E4M3 && lt::kR8F_E5M2 == CUDA_R_8F_E5M2);
static_assert(lt::kDescTransA == CUBLASLT_MATMUL_DESC_TRANSA && lt::kDescTransB == CUBLASLT_MATMUL_DESC_TRANSB &&
              lt::kDescAScalePointer == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER &&
              lt::kDescBScalePointer == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER &&
              lt::kDescFastAccum == CUBLASLT_MATMUL_DESC_FAST_ACCUM);
static_assert(lt::kLayoutBatchCount == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT &&
              lt::kLayoutStridedBatchOffset == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
static_assert(lt::kPrefMaxWorkspaceBytes == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);

static_assert(sizeof(lt::MatmulDescOpaque) == sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(lt::MatrixLayoutOpaque) == sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(lt::MatmulPreferenceOpaque) == sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(lt::MatmulAlgo) == sizeof(cublasLtMatmulAlgo_t));
static_assert(sizeof(lt::HeuristicResult) == sizeof(cublasLtMatmulHeuristicResult_t));
static_assert(offsetof(lt::HeuristicResult, workspaceSize) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize));
static_assert(offsetof(lt::HeuristicResult, state) == offsetof(cublasLtMatmulHeuristicResult_t, state));
static_assert(sizeof(lt::Status) == sizeof(cublasStatus_t));

// The real signatures are the ones lt::Api mirrors (enums as int, cudaStream_t as void*).
static_assert(std::is_same_v<decltype(&cublasLtCreate), cublasStatus_t (*)(cublasLtHandle_t*)>);
static_assert(std::is_same_v<decltype(&cublasLtMatmulDescCreate),
                             cublasStatus_t (*)(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t)>);
static_assert(std::is_same_v<decltype(&cublasLtMatrixLayoutCreate),
                             cublasStatus_t (*)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t, uint64_t, int64_t)>);
static_assert(std::is_same_v<decltype(&cublasLtMatmulAlgoGetHeuristic),
                             cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                                cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t*,
                                                int*)>);
static_assert(std::is_same_v<decltype(&cublasLtMatmul),
                             cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                                                cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t,
                                                const void*, const void*, cublasLtMatrixLayout_t, void*,
                                                cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t,
                                                cudaStream_t)>);
static_assert(sizeof(int) == sizeof(cublasComputeType_t) && sizeof(int) == sizeof(cudaDataType_t) &&
              sizeof(int) == sizeof(cublasLtMatmulDescAttributes_t) &&
              sizeof(int) == sizeof(cublasLtMatrixLayoutAttribute_t) &&
              sizeof(int) == sizeof(cublasLtMatmulPreferenceAttributes_t));
