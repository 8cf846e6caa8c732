// slim_kernel._native: load cubins and launch kernels through the CUDA driver API.
//
// libcuda is opened with dlopen on first use, so importing the module works on machines with
// no driver. A Kernel is one function of one cubin loaded into one device's primary context
// (the context torch uses). Kernel.launch parses the arguments by the kernel's signature
// (p = device pointer, i = int32, l = int64, f = float32) straight into parameter storage on the
// stack and calls cuLaunchKernelEx on the caller's stream, with optional programmatic stream
// serialization (PDL) and thread-block-cluster dimensions.
//
// The few driver types used here are declared locally (their layout is part of the driver's
// stable ABI), so neither the CUDA toolkit nor libtorch is needed to build or link this file.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

namespace nb = nanobind;

namespace {

// ---- driver API subset (cuda.h, CUDA >= 12.0) -------------------------------------------
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

constexpr int kAttrClusterDimension = 4;                      // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
constexpr int kAttrProgrammaticStreamSerialization = 6;       // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
constexpr int kAttrPreferredSharedMemoryCarveout = 14;        // CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
constexpr int kFuncMaxDynamicSharedSizeBytes = 8;             // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kFuncNonPortableClusterSizeAllowed = 14;        // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
constexpr unsigned kDefaultSmemLimit = 48 * 1024;
constexpr int kMaxArgs = 64;

struct LaunchAttribute {  // CUlaunchAttribute
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
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute layout");

struct LaunchConfig {  // CUlaunchConfig
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  LaunchAttribute* attrs;
  unsigned numAttrs;
};

struct Driver {
  std::string error;  // empty when loaded
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction) = nullptr;
  CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*) = nullptr;  // optional
};

template <typename T>
bool bind(void* lib, const char* name, T& fn, std::string& error) {
  fn = reinterpret_cast<T>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("libcuda.so.1 has no symbol ") + name + " (driver too old?)";
  return fn != nullptr;
}

Driver load_driver() {
  Driver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    d.error = std::string("cannot load the CUDA driver (libcuda.so.1): ") + (why ? why : "unknown error");
    return d;
  }
  std::string& e = d.error;
  bind(lib, "cuInit", d.cuInit, e);
  bind(lib, "cuGetErrorName", d.cuGetErrorName, e);
  bind(lib, "cuGetErrorString", d.cuGetErrorString, e);
  bind(lib, "cuDeviceGet", d.cuDeviceGet, e);
  bind(lib, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain, e);
  bind(lib, "cuCtxGetCurrent", d.cuCtxGetCurrent, e);
  bind(lib, "cuCtxPushCurrent_v2", d.cuCtxPushCurrent, e);
  bind(lib, "cuCtxPopCurrent_v2", d.cuCtxPopCurrent, e);
  bind(lib, "cuModuleLoadData", d.cuModuleLoadData, e);
  bind(lib, "cuModuleGetFunction", d.cuModuleGetFunction, e);
  bind(lib, "cuFuncSetAttribute", d.cuFuncSetAttribute, e);
  bind(lib, "cuFuncGetAttribute", d.cuFuncGetAttribute, e);
  bind(lib, "cuLaunchKernelEx", d.cuLaunchKernelEx, e);
  bind(lib, "cuDriverGetVersion", d.cuDriverGetVersion, e);
  d.cuThreadExchangeStreamCaptureMode =
      reinterpret_cast<CUresult (*)(int*)>(dlsym(lib, "cuThreadExchangeStreamCaptureMode"));
  return d;  // the library stays open for the life of the process
}

Driver& driver() {
  static Driver d = load_driver();
  return d;
}

std::string result_text(CUresult r) {
  Driver& d = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(r, &text);
  std::string out = name ? name : ("CUresult " + std::to_string(r));
  if (text) out += std::string(" (") + text + ")";
  return out;
}

[[noreturn]] void fail(const std::string& what, CUresult r) {
  throw std::runtime_error("slim_kernel: " + what + " failed: " + result_text(r));
}

void check(CUresult r, const char* what) {
  if (r != 0) fail(what, r);
}

Driver& ready_driver() {
  Driver& d = driver();
  if (!d.error.empty()) throw std::runtime_error("slim_kernel._native: " + d.error);
  static std::once_flag once;
  static CUresult init_result = 0;
  std::call_once(once, [&] { init_result = d.cuInit(0); });
  if (init_result != 0) fail("cuInit", init_result);
  return d;
}

// ---- argument parsing --------------------------------------------------------------------
void parse_dim3(PyObject* obj, const char* what, unsigned out[3]) {
  out[0] = out[1] = out[2] = 1;
  if (PyLong_Check(obj)) {
    long long v = PyLong_AsLongLong(obj);
    if (v <= 0 || v > 0xFFFFFFFFLL) throw nb::value_error((std::string(what) + " must be positive").c_str());
    out[0] = static_cast<unsigned>(v);
    return;
  }
  Py_ssize_t n = PySequence_Check(obj) ? PySequence_Size(obj) : -1;
  if (n < 1 || n > 3) {
    PyErr_Clear();
    throw nb::type_error((std::string(what) + " must be a tuple of 1 to 3 positive ints").c_str());
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_GetItem(obj, i);
    long long v = item ? PyLong_AsLongLong(item) : -1;
    Py_XDECREF(item);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw nb::type_error((std::string(what) + " must be a tuple of 1 to 3 positive ints").c_str());
    }
    if (v <= 0 || v > 0xFFFFFFFFLL)
      throw nb::value_error((std::string(what) + "[" + std::to_string(i) + "] must be positive, got " +
                             std::to_string(v)).c_str());
    out[i] = static_cast<unsigned>(v);
  }
}

[[noreturn]] void bad_arg(Py_ssize_t i, char code, const char* expected) {
  PyErr_Clear();
  throw nb::type_error(("kernel argument " + std::to_string(i) + " (signature '" + code + "') must be " +
                        expected).c_str());
}

// Packs args by signature: params[i] points at the 8-byte slots[i].
void pack_args(const std::string& signature, PyObject* args, uint64_t* slots, void** params) {
  if (!PyTuple_Check(args)) throw nb::type_error("args must be a tuple");
  Py_ssize_t n = PyTuple_Size(args);
  if (n != static_cast<Py_ssize_t>(signature.size()))
    throw nb::type_error(("kernel takes " + std::to_string(signature.size()) + " arguments (signature '" +
                          signature + "'), got " + std::to_string(n)).c_str());
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GetItem(args, i);  // borrowed
    char code = signature[static_cast<size_t>(i)];
    slots[i] = 0;
    switch (code) {
      case 'p': {
        if (!PyLong_Check(item)) bad_arg(i, code, "an int device pointer (tensor.data_ptr())");
        unsigned long long v = PyLong_AsUnsignedLongLong(item);
        if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) bad_arg(i, code, "a non-negative int address");
        slots[i] = v;
        break;
      }
      case 'i': {
        long long v = PyLong_AsLongLong(item);
        if (v == -1 && PyErr_Occurred()) bad_arg(i, code, "an int");
        if (v < INT32_MIN || v > INT32_MAX) bad_arg(i, code, "an int in the int32 range");
        int32_t v32 = static_cast<int32_t>(v);
        std::memcpy(&slots[i], &v32, sizeof v32);
        break;
      }
      case 'l': {
        long long v = PyLong_AsLongLong(item);
        if (v == -1 && PyErr_Occurred()) bad_arg(i, code, "an int in the int64 range");
        int64_t v64 = v;
        std::memcpy(&slots[i], &v64, sizeof v64);
        break;
      }
      case 'f': {
        double v = PyFloat_AsDouble(item);
        if (v == -1.0 && PyErr_Occurred()) bad_arg(i, code, "a float");
        float f = static_cast<float>(v);
        std::memcpy(&slots[i], &f, sizeof f);
        break;
      }
      default:
        throw nb::value_error("corrupt signature");
    }
    params[i] = &slots[i];
  }
}

void check_signature(const std::string& signature) {
  if (signature.size() > static_cast<size_t>(kMaxArgs))
    throw nb::value_error(("signature has more than " + std::to_string(kMaxArgs) + " parameters").c_str());
  for (char c : signature)
    if (c != 'p' && c != 'i' && c != 'l' && c != 'f')
      throw nb::value_error(("signature " + signature + " has a code outside 'pilf'").c_str());
}

// Makes ctx current for the scope when it is not already (torch normally made it current).
struct ContextScope {
  Driver& d;
  bool pushed = false;
  ContextScope(Driver& drv, CUcontext ctx) : d(drv) {
    CUcontext cur = nullptr;
    d.cuCtxGetCurrent(&cur);
    if (cur != ctx) {
      check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
      pushed = true;
    }
  }
  ~ContextScope() {
    if (pushed) {
      CUcontext popped = nullptr;
      d.cuCtxPopCurrent(&popped);
    }
  }
};

// Module loading and function attributes are "potentially unsafe" during a global-mode stream
// capture (torch.cuda.graph's default). They are not stream work, so when a kernel is first
// loaded or its smem limit first raised while the caller is capturing, this thread switches to
// relaxed capture mode for those calls and back.
struct RelaxedCapture {
  Driver& d;
  int previous = 0;
  bool active = false;
  explicit RelaxedCapture(Driver& drv) : d(drv) {
    if (!d.cuThreadExchangeStreamCaptureMode) return;
    int mode = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
    if (d.cuThreadExchangeStreamCaptureMode(&mode) == 0) {
      previous = mode;
      active = true;
    }
  }
  ~RelaxedCapture() {
    if (active) d.cuThreadExchangeStreamCaptureMode(&previous);
  }
};

class Kernel {
 public:
  Kernel(nb::bytes cubin, std::string entry, std::string signature, int device)
      : entry_(std::move(entry)), signature_(std::move(signature)), device_(device) {
    check_signature(signature_);
    if (cubin.size() < 4 || std::memcmp(cubin.c_str(), "\x7f" "ELF", 4) != 0)
      throw nb::value_error("cubin is not an ELF image");
    Driver& d = ready_driver();
    RelaxedCapture relaxed(d);
    CUdevice dev = 0;
    check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
    check(d.cuDevicePrimaryCtxRetain(&ctx_, dev), "cuDevicePrimaryCtxRetain");
    ContextScope scope(d, ctx_);
    check(d.cuModuleLoadData(&module_, cubin.c_str()), ("cuModuleLoadData for " + entry_).c_str());
    check(d.cuModuleGetFunction(&func_, module_, entry_.c_str()), ("cuModuleGetFunction(" + entry_ + ")").c_str());
    // The module stays loaded for the life of the process (kernels are memoized, and unloading
    // during interpreter shutdown can race the driver's own teardown).
  }

  void launch(nb::handle grid, nb::handle block, nb::handle args, uintptr_t stream, unsigned smem,
              nb::handle pdl_obj, nb::handle cluster, nb::handle carveout) {
    int pdl = PyObject_IsTrue(pdl_obj.ptr());  // any truthy value, like the fallback launcher
    if (pdl < 0) throw nb::python_error();
    unsigned g[3], b[3];
    parse_dim3(grid.ptr(), "grid", g);
    parse_dim3(block.ptr(), "block", b);
    uint64_t slots[kMaxArgs];
    void* params[kMaxArgs + 1];
    pack_args(signature_, args.ptr(), slots, params);
    Driver& d = driver();
    LaunchAttribute attrs[3];
    std::memset(attrs, 0, sizeof attrs);
    unsigned n_attrs = 0;
    unsigned c[3] = {1, 1, 1};
    if (pdl) {
      attrs[n_attrs].id = kAttrProgrammaticStreamSerialization;
      attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
      ++n_attrs;
    }
    if (!cluster.is_none()) {
      parse_dim3(cluster.ptr(), "cluster", c);
      attrs[n_attrs].id = kAttrClusterDimension;
      attrs[n_attrs].value.clusterDim = {c[0], c[1], c[2]};
      ++n_attrs;
    }
    long long pct = -1;  // the preferred shared-memory carveout of this launch (percent), over the function's
    if (!carveout.is_none()) {
      if (!PyLong_Check(carveout.ptr()) || PyBool_Check(carveout.ptr()))
        throw nb::type_error("carveout must be an int percent from 0 to 100 or None");
      pct = PyLong_AsLongLong(carveout.ptr());
      if (pct < 0 || pct > 100) {
        PyErr_Clear();
        throw nb::value_error("carveout must be an int percent from 0 to 100 or None");
      }
      attrs[n_attrs].id = kAttrPreferredSharedMemoryCarveout;
      attrs[n_attrs].value.sharedMemCarveout = static_cast<unsigned>(pct);
      ++n_attrs;
    }
    LaunchConfig cfg{g[0], g[1], g[2], b[0], b[1], b[2], smem, reinterpret_cast<CUstream>(stream),
                     n_attrs ? attrs : nullptr, n_attrs};
    CUresult r;
    {
      ContextScope scope(d, ctx_);
      if (smem > kDefaultSmemLimit && smem > smem_limit_) {  // once per new high-water mark
        RelaxedCapture relaxed(d);
        check(d.cuFuncSetAttribute(func_, kFuncMaxDynamicSharedSizeBytes, static_cast<int>(smem)),
              ("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES=" + std::to_string(smem) + ") for " + entry_).c_str());
        smem_limit_ = smem;
      }
      if (c[0] * c[1] * c[2] > 8 && !non_portable_cluster_) {
        RelaxedCapture relaxed(d);
        check(d.cuFuncSetAttribute(func_, kFuncNonPortableClusterSizeAllowed, 1),
              "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
        non_portable_cluster_ = true;
      }
      r = d.cuLaunchKernelEx(&cfg, func_, params, nullptr);
    }
    if (r != 0)
      fail("launch of " + entry_ + " (grid=(" + std::to_string(g[0]) + "," + std::to_string(g[1]) + "," +
               std::to_string(g[2]) + "), block=(" + std::to_string(b[0]) + "," + std::to_string(b[1]) + "," +
               std::to_string(b[2]) + "), smem=" + std::to_string(smem) + (pdl ? ", pdl" : "") +
               (cluster.is_none() ? "" : ", cluster") + (pct < 0 ? "" : ", carveout=" + std::to_string(pct)) + ")",
           r);
  }

  void set_attribute(int attr, int value) {
    Driver& d = driver();
    ContextScope scope(d, ctx_);
    RelaxedCapture relaxed(d);
    check(d.cuFuncSetAttribute(func_, attr, value),
          ("cuFuncSetAttribute(" + std::to_string(attr) + "=" + std::to_string(value) + ") for " + entry_).c_str());
  }

  int attribute(int attr) {
    Driver& d = driver();
    ContextScope scope(d, ctx_);
    int value = 0;
    check(d.cuFuncGetAttribute(&value, attr, func_), "cuFuncGetAttribute");
    return value;
  }

  const std::string& entry() const { return entry_; }
  const std::string& signature() const { return signature_; }
  int device() const { return device_; }
  unsigned smem_limit() const { return smem_limit_ > kDefaultSmemLimit ? smem_limit_ : kDefaultSmemLimit; }

 private:
  std::string entry_, signature_;
  int device_;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction func_ = nullptr;
  unsigned smem_limit_ = 0;
  bool non_portable_cluster_ = false;
};

nb::object driver_error() {
  Driver& d = driver();
  if (!d.error.empty()) return nb::str(d.error.c_str());
  return nb::none();
}

int driver_version() {
  Driver& d = ready_driver();
  int v = 0;
  check(d.cuDriverGetVersion(&v), "cuDriverGetVersion");
  return v;
}

// The parameter values launch() would pass, laid out like _pylauncher.layout(): an 8-byte slot
// per parameter.
nb::bytes pack_args_for_test(const std::string& signature, nb::handle args) {
  check_signature(signature);
  uint64_t slots[kMaxArgs];
  void* params[kMaxArgs + 1];
  pack_args(signature, args.ptr(), slots, params);
  return nb::bytes(reinterpret_cast<const char*>(slots), signature.size() * sizeof(uint64_t));
}

}  // namespace

NB_MODULE(_native, m) {
  // Kernels stay loaded until the process exits (runtime._KERNELS), by design: no leak report then.
  nb::set_leak_warnings(false);
  m.doc() = "slim-kernel native launcher: cubin loading and kernel launches through the CUDA driver API";
  m.def("driver_error", &driver_error,
        "None when libcuda.so.1 can be loaded, else why not (does not initialize the driver)");
  m.def("driver_version", &driver_version, "cuDriverGetVersion() (initializes the driver)");
  m.def("pack_args", &pack_args_for_test, nb::arg("signature"), nb::arg("args"),
        "the parameter values launch() would pass, laid out like _pylauncher.layout() (for tests)");
  nb::class_<Kernel>(m, "Kernel")
      .def(nb::init<nb::bytes, std::string, std::string, int>(), nb::arg("cubin"), nb::arg("entry"),
           nb::arg("signature"), nb::arg("device"))
      .def("launch", &Kernel::launch, nb::arg("grid"), nb::arg("block"), nb::arg("args"), nb::kw_only(),
           nb::arg("stream"), nb::arg("smem") = 0, nb::arg("pdl") = nb::bool_(false), nb::arg("cluster") = nb::none(),
           nb::arg("carveout") = nb::none(),
           "launch on the raw cudaStream_t `stream`; args are packed by the kernel's signature; carveout: this "
           "launch's preferred shared-memory carveout in percent (CUDA >= 12.6 drivers), None for the function's")
      .def("attribute", &Kernel::attribute, nb::arg("attr"), "cuFuncGetAttribute(attr)")
      .def("set_attribute", &Kernel::set_attribute, nb::arg("attr"), nb::arg("value"), "cuFuncSetAttribute(attr, value)")
      .def_prop_ro("entry", &Kernel::entry)
      .def_prop_ro("signature", &Kernel::signature)
      .def_prop_ro("device", &Kernel::device)
      .def_prop_ro("smem_limit", &Kernel::smem_limit);
}
