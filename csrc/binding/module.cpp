// module.cpp -- the Python module ascender_torch._C. Importing it loads the library, whose
// TORCH_LIBRARY_IMPL blocks register the kernels of the ops (ascender_torch/_ops.py defines the
// ops' schemas from ascender_torch/_spec.py). It also exports what this build was compiled with,
// so that _ops can check it against the spec: CUDA_BUILT, EPS_TAU, EPS_STD, EPS_NORM, EPS_HEADING,
// SCALAR_NAMES (the order of dscalars) and STAT_NAMES (the columns of stats); and, in a CUDA build,
// cuda_fits, the shared-memory question of the backend choice.
#include <Python.h>

#include <cstdint>
#include <exception>

#include "../ascender.h"

#ifdef ASCENDER_WITH_CUDA
namespace asc_binding {
// ascender_cuda.cpp: whether the CUDA kernels of a call of these sizes fit the shared memory of a device
bool cuda_call_fits(int device, const char* dtype, bool paper, int64_t k_neighbors, int64_t d, int64_t dv, int64_t dz,
                    int64_t da, bool backward);
}
#endif

namespace {

PyObject* names_tuple(const char* const* names, int n) {
  PyObject* t = PyTuple_New(n);
  for (int i = 0; t && i < n; i++) {
    PyObject* s = PyUnicode_FromString(names[i]);
    if (!s) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, i, s);
  }
  return t;
}

const char* const kScalarNames[] = {
#define ASC_NAME_(name) #name,
    ASC_SCALARS(ASC_NAME_)
#undef ASC_NAME_
};
const char* const kStatNames[] = {
#define ASC_NAME_(name) #name,
    ASC_STATS(ASC_NAME_)
#undef ASC_NAME_
};

static_assert(sizeof(kScalarNames) / sizeof(kScalarNames[0]) == ASC_NSCALAR, "ASC_SCALARS and ASC_NSCALAR");

#ifdef ASCENDER_WITH_CUDA
constexpr long kCudaBuilt = 1;

// cuda_fits(device, dtype, paper, k_neighbors, d, dv, dz, da, backward) -> bool: whether the CUDA kernels a
// call of these sizes gets find their shared memory on device `device` (dtype: "float32", "float64",
// "float16" or "bfloat16"; backward: its backward too). ascender_torch.backends asks it before choosing them.
PyObject* cuda_fits(PyObject*, PyObject* args) {
  int device = 0, paper = 0, backward = 0;
  const char* dtype = nullptr;
  long long k = 0, d = 0, dv = 0, dz = 0, da = 0;
  if (!PyArg_ParseTuple(args, "ispLLLLLp", &device, &dtype, &paper, &k, &d, &dv, &dz, &da, &backward)) return nullptr;
  try {
    return PyBool_FromLong(asc_binding::cuda_call_fits(device, dtype, paper, k, d, dv, dz, da, backward));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyMethodDef kMethods[] = {
    {"cuda_fits", cuda_fits, METH_VARARGS, "whether a call's CUDA kernels fit the device's shared memory"},
    {nullptr, nullptr, 0, nullptr}};
#else
constexpr long kCudaBuilt = 0;
PyMethodDef kMethods[] = {{nullptr, nullptr, 0, nullptr}};
#endif

}  // namespace

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", nullptr, -1, kMethods, nullptr, nullptr, nullptr, nullptr};
  PyObject* module = PyModule_Create(&module_def);
  if (!module) return nullptr;
  const bool ok = PyModule_AddIntConstant(module, "CUDA_BUILT", kCudaBuilt) == 0 &&
                  PyModule_AddObject(module, "EPS_TAU", PyFloat_FromDouble(ASC_EPS_TAU)) == 0 &&
                  PyModule_AddObject(module, "EPS_STD", PyFloat_FromDouble(ASC_EPS_STD)) == 0 &&
                  PyModule_AddObject(module, "EPS_NORM", PyFloat_FromDouble(ASC_EPS_NORM)) == 0 &&
                  PyModule_AddObject(module, "EPS_HEADING", PyFloat_FromDouble(ASC_EPS_HEADING)) == 0 &&
                  PyModule_AddObject(module, "SCALAR_NAMES", names_tuple(kScalarNames, ASC_NSCALAR)) == 0 &&
                  PyModule_AddObject(module, "STAT_NAMES", names_tuple(kStatNames, ASC_NSTAT)) == 0;
  if (!ok) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
