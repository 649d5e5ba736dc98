// call_site.cpp: where in the Python program a collective was issued (MCCL_CHECK_CALL_SITES=1).
//
// Collectives are matched by their order in the communicator. A rank that skips one pairs its next
// collective with the others' skipped one, and if the two have the same size, dtype and op they
// combine without an error (docs/FAILURES.md). With the check on, the shim tags each collective
// with its call site, the innermost Python frame outside torch's and mccl's own packages (so the
// user's `dist.all_reduce(x)` line, or the `loss.backward()` that let DDP issue its buckets), and the
// tag travels in every frame (mcclOpOptions_t.call_site): the same collective issued from two
// places fails every rank with mcclMismatch.
//
// The tag hashes the file's base name (ranks may run the script from different folders), the
// function's name and the line (FNV-1a, 32 bits). A thread that never ran Python (a C++ thread
// issuing for DDP) or runs no Python frame now gets 0, which matches any tag (wire.c).
#include "ProcessGroupMCCL.hpp"

#include <Python.h>

#include <cstring>
#include <string>

namespace mccl {
namespace {

uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;  // FNV-1a's 32-bit offset basis and prime (Fowler, Noll, Vo)
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h == 0 ? 1 : h;
}

// The folder of imported package `name` with a trailing '/' ("" if unknown). Called with the GIL
// held.
std::string packageDir(const char* name) {
  std::string dir;
  PyObject* key = PyUnicode_FromString(name);
  // A new reference to the imported module, or nullptr (never creates one, unlike
  // PyImport_AddModule).
  PyObject* module = key != nullptr ? PyImport_GetModule(key) : nullptr;
  Py_XDECREF(key);
  PyObject* file = module != nullptr ? PyObject_GetAttrString(module, "__file__") : nullptr;
  Py_XDECREF(module);
  const char* path = file != nullptr && PyUnicode_Check(file) ? PyUnicode_AsUTF8(file) : nullptr;
  if (path != nullptr) {
    dir = path;
    size_t slash = dir.find_last_of("/\\");
    dir = slash == std::string::npos ? std::string() : dir.substr(0, slash + 1);
  }
  Py_XDECREF(file);
  PyErr_Clear();
  return dir;
}

// Frames in these folders are not call sites: torch's (the distributed_c10d wrappers, DDP,
// FSDP) and mccl's own (python/mccl/_order.py runs a Future's callback from one of two lines,
// depending on whether the Future had completed: a callback defined in torch, such as DDP's
// PowerSGD hook, would otherwise be tagged differently on different ranks).
bool skipped(const char* file) {
  static const std::string dirs[2] = {packageDir("torch"), packageDir("mccl")};  // under the GIL
  for (const std::string& dir : dirs)
    if (!dir.empty() && std::strncmp(file, dir.c_str(), dir.size()) == 0) return true;
  return false;
}

}  // namespace

uint32_t pythonCallSite(std::string* where) {
  where->clear();
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type, *value, *traceback;  // an exception already set stays set
  PyErr_Fetch(&type, &value, &traceback);
  uint32_t tag = 0;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed: this thread's innermost frame
  Py_XINCREF(frame);
  while (frame != nullptr && tag == 0) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    if (file != nullptr && !skipped(file)) {
      const char* base = std::strrchr(file, '/');
      base = base != nullptr ? base + 1 : file;
      const char* name = PyUnicode_AsUTF8(code->co_name);
      std::string key = std::string(base) + ":" + std::to_string(PyFrame_GetLineNumber(frame)) + " (in " +
                        (name != nullptr ? name : "?") + ")";
      tag = fnv1a(key);
      *where = key;
    }
    Py_DECREF(code);
    PyFrameObject* back = tag == 0 ? PyFrame_GetBack(frame) : nullptr;  // a new reference
    Py_DECREF(frame);
    frame = back;
  }
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
  PyGILState_Release(gil);
  return tag;
}

}  // namespace mccl
