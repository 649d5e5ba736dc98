// call_site.cpp: where in the Python program a collective was issued (MCCL_CHECK_CALL_SITES=1).
//
// Collectives are matched by their order in the communicator. A rank that skips one pairs its next
// collective with the others' skipped one, and if the two have the same size, dtype and op they
// combine without an error (docs/FAILURES.md). With the check on, the shim tags each collective
// with its call site, the innermost Python frame outside torch's own package (so the user's
// `dist.all_reduce(x)` line, or the `loss.backward()` that let DDP issue its buckets), and the
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

// torch's package folder with a trailing '/' ("" if unknown). Called with the GIL held.
const std::string& torchDir() {
  static std::string dir;
  static bool known = false;
  if (known) return dir;
  known = true;
  PyObject* torch = PyImport_AddModule("torch");  // borrowed; torch is imported: mccl needs it
  PyObject* file = torch != nullptr ? PyObject_GetAttrString(torch, "__file__") : nullptr;
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

}  // namespace

uint32_t pythonCallSite(std::string* where) {
  where->clear();
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  const std::string& skip = torchDir();
  uint32_t tag = 0;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed: this thread's innermost frame
  Py_XINCREF(frame);
  while (frame != nullptr && tag == 0) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    if (file != nullptr && (skip.empty() || std::strncmp(file, skip.c_str(), skip.size()) != 0)) {
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
  PyGILState_Release(gil);
  return tag;
}

}  // namespace mccl
