// module.cpp -- the Python module ascender_torch._C. Importing it loads the library, whose
// TORCH_LIBRARY_IMPL blocks register the kernels of the ops (ascender_torch/_ops.py defines the
// ops' schemas from ascender_torch/_spec.py). It also exports what this build was compiled with,
// so that _ops can check it against the spec: CUDA_BUILT, EPS_TAU, EPS_STD, EPS_NORM, EPS_HEADING,
// SCALAR_NAMES (the order of dscalars) and STAT_NAMES (the columns of stats).
#include <Python.h>

#include "../ascender.h"

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
#else
constexpr long kCudaBuilt = 0;
#endif

}  // namespace

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
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
