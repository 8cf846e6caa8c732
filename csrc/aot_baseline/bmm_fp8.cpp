// bmm_fp8 through cuBLASLt, as the retired AOT op did (it wrapped flashinfer's cuBLASLt bmm_fp8):
// the same descriptors (row-major D as D^T = B^T A in cuBLASLt's column-major view, TRANSA = T,
// fast accumulation, per-tensor scale pointers, strided batches), the first heuristic algorithm
// for the given workspace size, alpha 1 and beta 0. Same inputs and workspace size -> the same
// algorithm -> bit-identical output to flashinfer.bmm_fp8(..., backend="cublas").
//
// libcublasLt is opened with dlopen on first use: one already in the process first (torch's or
// flashinfer's, so both sides share one library version), else by soname or $SLIM_KERNEL_CUBLASLT.

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "aot_baseline.h"
#include "cublaslt_api.h"

namespace slim_aot {
namespace {

struct Loaded {
  lt::Api api;
  std::string path, error;
};

template <typename T>
void bind(void* lib, const char* name, T& fn, std::string& error) {
  fn = reinterpret_cast<T>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("libcublasLt has no symbol ") + name;
}

Loaded load() {
  Loaded out;
  const char* sonames[] = {"libcublasLt.so.13", "libcublasLt.so.12"};
  void* lib = nullptr;
  std::string tried;
  if (const char* env = std::getenv("SLIM_KERNEL_CUBLASLT"); env && *env) {
    lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      out.error = std::string("SLIM_KERNEL_CUBLASLT=") + env + " cannot be loaded: " + (why ? why : "?");
      return out;
    }
  }
  for (const char* name : sonames)  // one the process already has (torch, flashinfer)
    if (!lib) lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  for (const char* name : sonames) {
    if (lib) break;
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      tried += std::string("\n  ") + (why ? why : name);
    }
  }
  if (!lib) {
    out.error = "cannot load libcublasLt (install the CUDA toolkit's cuBLAS or the nvidia-cublas wheel, or set "
                "SLIM_KERNEL_CUBLASLT=/path/to/libcublasLt.so.13):" + tried;
    return out;
  }
  std::string& e = out.error;
  lt::Api& a = out.api;
  bind(lib, "cublasLtCreate", a.Create, e);
  bind(lib, "cublasLtMatmulDescCreate", a.MatmulDescCreate, e);
  bind(lib, "cublasLtMatmulDescDestroy", a.MatmulDescDestroy, e);
  bind(lib, "cublasLtMatmulDescSetAttribute", a.MatmulDescSetAttribute, e);
  bind(lib, "cublasLtMatrixLayoutCreate", a.MatrixLayoutCreate, e);
  bind(lib, "cublasLtMatrixLayoutDestroy", a.MatrixLayoutDestroy, e);
  bind(lib, "cublasLtMatrixLayoutSetAttribute", a.MatrixLayoutSetAttribute, e);
  bind(lib, "cublasLtMatmulPreferenceCreate", a.MatmulPreferenceCreate, e);
  bind(lib, "cublasLtMatmulPreferenceDestroy", a.MatmulPreferenceDestroy, e);
  bind(lib, "cublasLtMatmulPreferenceSetAttribute", a.MatmulPreferenceSetAttribute, e);
  bind(lib, "cublasLtMatmulAlgoGetHeuristic", a.MatmulAlgoGetHeuristic, e);
  bind(lib, "cublasLtMatmul", a.Matmul, e);
  bind(lib, "cublasLtGetStatusString", a.GetStatusString, e);
  bind(lib, "cublasLtGetVersion", a.GetVersion, e);
  Dl_info info{};
  out.path = (a.Create && dladdr(reinterpret_cast<void*>(a.Create), &info) && info.dli_fname) ? info.dli_fname : "?";
  return out;  // the library stays open for the life of the process
}

const Loaded& loaded() {
  static Loaded once = load();
  if (!once.error.empty()) throw CudaError("slim_kernel._aot_baseline: " + once.error);
  return once;
}

const lt::Api& api() { return loaded().api; }

void check(lt::Status s, const char* what) {
  if (s == lt::kSuccess) return;
  const char* text = api().GetStatusString ? api().GetStatusString(s) : nullptr;
  throw CudaError(std::string("slim_kernel._aot_baseline: bmm_fp8: ") + what + " failed: " +
                  (text ? text : "cublasStatus_t " + std::to_string(s)));
}

// RAII descriptors (destroyed even when a later step throws).
template <typename T>
struct Owned {
  T raw = nullptr;
  lt::Status (*destroy)(T);
  explicit Owned(lt::Status (*d)(T)) : destroy(d) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (raw) destroy(raw);
  }
};

template <typename V>
void set_desc(lt::MatmulDesc d, int attr, const V& v) {
  check(api().MatmulDescSetAttribute(d, attr, &v, sizeof(V)), "cublasLtMatmulDescSetAttribute");
}
template <typename V>
void set_layout(lt::MatrixLayout l, int attr, const V& v) {
  check(api().MatrixLayoutSetAttribute(l, attr, &v, sizeof(V)), "cublasLtMatrixLayoutSetAttribute");
}

// Column-major rows x cols with leading dimension ld; `t` swaps rows and cols (stored transposed).
void make_layout(Owned<lt::MatrixLayout>& l, int type, uint64_t rows, uint64_t cols, int64_t ld, bool t, int batch, int64_t stride) {
  check(api().MatrixLayoutCreate(&l.raw, type, t ? cols : rows, t ? rows : cols, ld), "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    set_layout(l.raw, lt::kLayoutBatchCount, batch);
    set_layout(l.raw, lt::kLayoutStridedBatchOffset, stride);
  }
}

lt::Handle own_handle() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw CudaError("slim_kernel._aot_baseline: bmm_fp8: cudaGetDevice failed");
  // Never destroyed (a thread_local destructor may run after CUDA teardown), like torch's pool.
  static thread_local std::unordered_map<int, lt::Handle> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  lt::Handle h = nullptr;
  check(api().Create(&h), "cublasLtCreate");
  handles.emplace(device, h);
  return h;
}

bool is_fp8(int t) { return t == lt::kR8F_E4M3 || t == lt::kR8F_E5M2; }

}  // namespace

std::string cublaslt_library() { return loaded().path; }

size_t cublaslt_version() { return api().GetVersion ? api().GetVersion() : 0; }

}  // namespace slim_aot

using namespace slim_aot;

void bmm_fp8(const Fp8BmmCall& c) {
  if (!is_fp8(c.a_type) || !is_fp8(c.b_type))
    throw std::invalid_argument("bmm_fp8: A and B must be float8_e4m3fn or float8_e5m2");
  if (c.a_type == lt::kR8F_E5M2 && c.b_type == lt::kR8F_E5M2)
    throw std::invalid_argument("bmm_fp8: A and B cannot both be float8_e5m2");
  if (c.d_type != lt::kR16BF && c.d_type != lt::kR16F)
    throw std::invalid_argument("bmm_fp8: D must be bfloat16 or float16");
  if (c.batch < 1 || c.m < 1 || c.n < 1 || c.k < 1)
    throw std::invalid_argument("bmm_fp8: batch, m, n and k must be positive");
  if (!c.a || !c.b || !c.d || !c.a_scale || !c.b_scale)
    throw std::invalid_argument("bmm_fp8: null tensor pointer");
  const lt::Api& a = api();
  lt::Handle handle = c.cublas_handle ? static_cast<lt::Handle>(c.cublas_handle) : own_handle();

  // cuBLASLt is column-major: the row-major D(m, n) is D^T(n, m) = B^T(n, k) A^T(k, m). Its "A" is
  // our B (stored (n, k) row-major = k x n column-major, transposed), its "B" is our A.
  const int m = c.n, n = c.m, k = c.k;
  Owned<lt::MatmulDesc> desc(a.MatmulDescDestroy);
  check(a.MatmulDescCreate(&desc.raw, lt::kCompute32F, lt::kR32F), "cublasLtMatmulDescCreate");
  set_desc(desc.raw, lt::kDescTransA, int32_t{lt::kOpT});
  set_desc(desc.raw, lt::kDescTransB, int32_t{lt::kOpN});
  set_desc(desc.raw, lt::kDescFastAccum, int8_t{1});
  set_desc(desc.raw, lt::kDescAScalePointer, static_cast<const void*>(c.b_scale));
  set_desc(desc.raw, lt::kDescBScalePointer, static_cast<const void*>(c.a_scale));
  Owned<lt::MatrixLayout> la(a.MatrixLayoutDestroy), lb(a.MatrixLayoutDestroy), ld(a.MatrixLayoutDestroy);
  make_layout(la, c.b_type, m, k, k, true, c.batch, int64_t{m} * k);
  make_layout(lb, c.a_type, k, n, k, false, c.batch, int64_t{k} * n);
  make_layout(ld, c.d_type, m, n, m, false, c.batch, int64_t{m} * n);
  Owned<lt::MatmulPreference> pref(a.MatmulPreferenceDestroy);
  check(a.MatmulPreferenceCreate(&pref.raw), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = c.workspace_bytes;
  check(a.MatmulPreferenceSetAttribute(pref.raw, lt::kPrefMaxWorkspaceBytes, &ws, sizeof(ws)),
        "cublasLtMatmulPreferenceSetAttribute");
  lt::HeuristicResult result{};
  int returned = 0;
  check(a.MatmulAlgoGetHeuristic(handle, desc.raw, la.raw, lb.raw, ld.raw, ld.raw, pref.raw, 1, &result, &returned),
        "cublasLtMatmulAlgoGetHeuristic");
  if (returned == 0) check(lt::kNotSupported, "cublasLtMatmulAlgoGetHeuristic (no algorithm)");
  const float alpha = 1.0f, beta = 0.0f;
  check(a.Matmul(handle, desc.raw, &alpha, c.b, la.raw, c.a, lb.raw, &beta, nullptr, ld.raw, c.d, ld.raw,
                 &result.algo, c.workspace, c.workspace_bytes, c.stream),
        "cublasLtMatmul");
}
