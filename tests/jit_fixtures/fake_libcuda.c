// A fake CUDA driver (libcuda.so.1) for CPU tests of the launchers: it implements the few entry
// points the native launcher and cuda-python's launch path use, checks the rules a real driver
// enforces that a launcher can get wrong (a context must be current, the function's context must
// be the current one, block size limits, attribute values), and records the last launch so a
// test can compare what both launchers handed to cuLaunchKernelEx.
//
//   cc -shared -fPIC -o libcuda.so.1 fake_libcuda.c -Wl,-soname,libcuda.so.1
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef void* CUcontext;
typedef struct {
  CUcontext ctx;
  char name[128];
} FakeFunc;

typedef struct {
  int id;
  char pad[4];
  union {
    char raw[64];
    void* align;
    struct {
      unsigned x, y, z;
    } clusterDim;
    int programmaticStreamSerializationAllowed;
    unsigned sharedMemCarveout;
  } value;
} LaunchAttribute;

typedef struct {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  void* hStream;
  LaunchAttribute* attrs;
  unsigned numAttrs;
} LaunchConfig;

enum { CAPTURE_UNSUPPORTED = 900, OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_DEVICE = 101, INVALID_IMAGE = 200,
       INVALID_CONTEXT = 201, NO_BINARY_FOR_GPU = 209, UNSUPPORTED_PTX_VERSION = 222, NOT_FOUND = 500 };

static int g_initialized;
static __thread CUcontext t_stack[16];
static __thread int t_depth;
static char g_contexts[2];  // two fake devices; a context is the address of one of these
static FakeFunc g_funcs[64];
static int g_nfuncs;
static int g_nparams;  // the parameter count of the next launches (8-byte slots each)
static char g_last[16384];
static int g_smem_attr[64];
static int g_carveout_attr[64];
static int g_launches;
static int g_capturing;          // a global-mode capture is in progress (fake_set_capturing)
static __thread int t_mode;      // this thread's capture mode: 0 global, 1 thread-local, 2 relaxed

// Module loads and function attributes are "potentially unsafe" during a global-mode capture.
static int unsafe_now(void) { return g_capturing && t_mode != 2; }
void fake_set_capturing(int on) { g_capturing = on; }

static CUcontext current(void) { return t_depth ? t_stack[t_depth - 1] : NULL; }

void fake_set_nparams(int n) { g_nparams = n < 0 || n > 64 ? 0 : n; }
const char* fake_last_launch(void) { return g_last; }
int fake_launch_count(void) { return g_launches; }
int fake_ctx_depth(void) { return t_depth; }
int fake_capture_mode(void) { return t_mode; }

CUresult cuInit(unsigned flags) { (void)flags; g_initialized = 1; return OK; }
static int g_driver_version = 13000;
void fake_set_driver_version(int v) { g_driver_version = v; }
CUresult cuDriverGetVersion(int* v) { *v = g_driver_version; return OK; }
CUresult cuGetErrorName(CUresult r, const char** s) {
  switch (r) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
    case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return OK;
    case INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return OK;
    case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
    case CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; return OK;
    case NO_BINARY_FOR_GPU: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; return OK;
    case UNSUPPORTED_PTX_VERSION: *s = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; return OK;
    default: *s = NULL; return INVALID_VALUE;
  }
}
CUresult cuGetErrorString(CUresult r, const char** s) {
  *s = r == INVALID_CONTEXT ? "invalid device context" : r == INVALID_VALUE ? "invalid argument" : "fake error";
  return OK;
}
CUresult cuDeviceGet(int* dev, int ordinal) {
  if (!g_initialized) return NOT_INITIALIZED;
  if (ordinal < 0 || ordinal > 1) return INVALID_DEVICE;
  *dev = ordinal;
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, int dev) {
  if (dev < 0 || dev > 1) return INVALID_DEVICE;
  *ctx = &g_contexts[dev];
  return OK;
}
CUresult cuCtxGetCurrent(CUcontext* ctx) { *ctx = current(); return OK; }
CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (t_depth == 16) return INVALID_VALUE;
  t_stack[t_depth++] = ctx;
  return OK;
}
CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  if (!t_depth) return INVALID_CONTEXT;
  CUcontext c = t_stack[--t_depth];
  if (ctx) *ctx = c;
  return OK;
}
CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  int previous = t_mode;
  t_mode = *mode;
  *mode = previous;
  return OK;
}
static int g_load_error;  // what the next module loads return (a newer toolkit's cubin on an older driver)
void fake_set_load_error(int code) { g_load_error = code; }
CUresult cuModuleLoadData(void** mod, const void* image) {
  if (!current()) return INVALID_CONTEXT;
  if (unsafe_now()) return CAPTURE_UNSUPPORTED;
  if (g_load_error) return g_load_error;
  if (memcmp(image, "\x7f" "ELF", 4) != 0) return INVALID_IMAGE;
  *mod = current();  // the "module" remembers its context
  return OK;
}
CUresult cuModuleGetFunction(void** fn, void* mod, const char* name) {
  if (!current() || current() != mod) return INVALID_CONTEXT;
  if (g_nfuncs == 64) return INVALID_VALUE;
  FakeFunc* f = &g_funcs[g_nfuncs++];
  f->ctx = mod;
  snprintf(f->name, sizeof f->name, "%s", name);
  *fn = f;
  return OK;
}
CUresult cuFuncSetAttribute(void* fn, int attr, int value) {
  FakeFunc* f = fn;
  if (current() != f->ctx) return INVALID_CONTEXT;
  if (unsafe_now()) return CAPTURE_UNSUPPORTED;
  if (attr == 8) {  // MAX_DYNAMIC_SHARED_SIZE_BYTES
    if (value > 227 * 1024) return INVALID_VALUE;
    g_smem_attr[f - g_funcs] = value;
  }
  if (attr == 9) {  // PREFERRED_SHARED_MEMORY_CARVEOUT: -1 (the driver's choice) or a percent
    if (value < -1 || value > 100) return INVALID_VALUE;
    g_carveout_attr[f - g_funcs] = value;
  }
  return OK;
}
static int g_max_threads = 1024;  // MAX_THREADS_PER_BLOCK of every function (fewer: a register-heavy one)
void fake_set_max_threads(int n) { g_max_threads = n; }
CUresult cuFuncGetAttribute(int* value, int attr, void* fn) {
  FakeFunc* f = fn;
  if (current() != f->ctx) return INVALID_CONTEXT;
  *value = attr == 0 ? g_max_threads : attr == 8 ? g_smem_attr[f - g_funcs] : attr == 9 ? g_carveout_attr[f - g_funcs] : 0;
  return OK;
}
CUresult cuLaunchKernelEx(const LaunchConfig* cfg, void* fn, void** params, void** extra) {
  FakeFunc* f = fn;
  if (current() != f->ctx) return INVALID_CONTEXT;
  if (extra) return INVALID_VALUE;
  if ((unsigned long long)cfg->blockDimX * cfg->blockDimY * cfg->blockDimZ > 1024) return INVALID_VALUE;
  unsigned limit = g_smem_attr[f - g_funcs] > 48 * 1024 ? (unsigned)g_smem_attr[f - g_funcs] : 48 * 1024;
  if (cfg->sharedMemBytes > limit) return INVALID_VALUE;
  for (unsigned i = 0; i < cfg->numAttrs; ++i) {
    const LaunchAttribute* a = &cfg->attrs[i];
    if (a->id == 14 && (g_driver_version < 12060 || a->value.sharedMemCarveout > 100)) return INVALID_VALUE;
  }
  int n = snprintf(g_last, sizeof g_last,
                   "{\"entry\": \"%s\", \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u], \"smem\": %u, "
                   "\"stream\": %llu, \"attrs\": [",
                   f->name, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY,
                   cfg->blockDimZ, cfg->sharedMemBytes, (unsigned long long)(uintptr_t)cfg->hStream);
  for (unsigned i = 0; i < cfg->numAttrs; ++i) {
    const LaunchAttribute* a = &cfg->attrs[i];
    if (a->id == 4)
      n += snprintf(g_last + n, sizeof g_last - n, "%s[4, %u, %u, %u]", i ? ", " : "", a->value.clusterDim.x,
                    a->value.clusterDim.y, a->value.clusterDim.z);
    else
      n += snprintf(g_last + n, sizeof g_last - n, "%s[%d, %d]", i ? ", " : "", a->id,
                    a->value.programmaticStreamSerializationAllowed);
  }
  n += snprintf(g_last + n, sizeof g_last - n, "], \"params\": [");
  for (int i = 0; i < g_nparams; ++i) {
    unsigned long long v;
    memcpy(&v, params[i], 8);  // the launchers keep 8-byte slots; the kernel reads its own size
    n += snprintf(g_last + n, sizeof g_last - n, "%s\"%016llx\"", i ? ", " : "", v);
  }
  snprintf(g_last + n, sizeof g_last - n, "]}");
  ++g_launches;
  return OK;
}

// libnvrtc looks this up when a driver is present; "no export tables here" keeps it on its own.
CUresult cuGetExportTable(const void** table, const void* uuid) {
  (void)uuid;
  *table = NULL;
  return NOT_FOUND;
}

// cuda-python resolves every driver entry point through cuGetProcAddress.
typedef struct {
  const char* name;
  void* fn;
} Entry;
static const Entry kEntries[] = {
    {"cuInit", (void*)cuInit},
    {"cuDriverGetVersion", (void*)cuDriverGetVersion},
    {"cuGetErrorName", (void*)cuGetErrorName},
    {"cuGetErrorString", (void*)cuGetErrorString},
    {"cuDeviceGet", (void*)cuDeviceGet},
    {"cuDevicePrimaryCtxRetain", (void*)cuDevicePrimaryCtxRetain},
    {"cuCtxGetCurrent", (void*)cuCtxGetCurrent},
    {"cuCtxPushCurrent", (void*)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent", (void*)cuCtxPopCurrent_v2},
    {"cuModuleLoadData", (void*)cuModuleLoadData},
    {"cuModuleGetFunction", (void*)cuModuleGetFunction},
    {"cuFuncSetAttribute", (void*)cuFuncSetAttribute},
    {"cuFuncGetAttribute", (void*)cuFuncGetAttribute},
    {"cuLaunchKernelEx", (void*)cuLaunchKernelEx},
    {"cuThreadExchangeStreamCaptureMode", (void*)cuThreadExchangeStreamCaptureMode},
};

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status) {
  (void)version;
  (void)flags;
  for (size_t i = 0; i < sizeof kEntries / sizeof kEntries[0]; ++i) {
    if (strcmp(symbol, kEntries[i].name) == 0) {
      *pfn = kEntries[i].fn;
      if (status) *status = 0;
      return OK;
    }
  }
  *pfn = NULL;
  if (status) *status = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
  return NOT_FOUND;
}
CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, unsigned long long flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
