// module.cpp: the Python module mccl._C: exposes ProcessGroupMCCL to torch.distributed.
#include <pybind11/chrono.h>
#include <torch/csrc/jit/python/pybind_utils.h>  // PythonFutureWrapper: the C++ Future of a torch Future
#include <torch/csrc/utils/pybind.h>

#include "ProcessGroupMCCL.hpp"

namespace py = pybind11;

#ifdef MCCL_WITH_MPS
namespace mccl {
bool registerMps();  // device_mps.mm
}
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "MCCL's torch.distributed backend (C++ shim over the C library)";
  // c10d's Python types must exist before a subclass of Backend is declared.
  py::module::import("torch.distributed");
  py::class_<mccl::ProcessGroupMCCL, c10d::Backend, c10::intrusive_ptr<mccl::ProcessGroupMCCL>>(
      m, "ProcessGroupMCCL")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds,
                    const std::string&, const std::string&>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("peer_hint") = "", py::arg("label") = "", py::call_guard<py::gil_scoped_release>(),
           "Create a communicator over `store` (collective over all ranks); `label` names it in "
           "log lines and errors (e.g. \"group 1\").");
  m.attr("version") = py::make_tuple(MCCL_VERSION_MAJOR, MCCL_VERSION_MINOR, MCCL_VERSION_PATCH);

  // Order marks for callbacks (python/mccl/_order.py; ProcessGroupMCCL.cpp explains them).
  using FutureWrapper = std::shared_ptr<torch::jit::PythonFutureWrapper>;
  py::class_<mccl::OrderMark, std::shared_ptr<mccl::OrderMark>>(m, "_OrderMark")
      .def("__enter__", [](mccl::OrderMark& mark) { mark.enter(); })
      .def("__exit__", [](mccl::OrderMark& mark, py::args) { mark.exit(); return false; });
  m.def("_order_mark", [](const FutureWrapper& fut) -> py::object {
        std::shared_ptr<mccl::OrderMark> mark = mccl::OrderMark::forCallbackOf(fut->fut);
        return mark ? py::cast(mark) : py::none();
      }, py::arg("future"),
      "An order mark for a callback about to be attached to `future`, or None if it needs none.");
  m.def("_is_mccl_future", [](const FutureWrapper& fut) { return mccl::OrderMark::isMcclFuture(fut->fut); },
        py::arg("future"));
  m.def("_completions_at_exit", &mccl::completionsAtExit, py::arg("seconds"),
        "Python's atexit hook: wait up to `seconds` for issued collectives and their completions "
        "(Future callbacks) before the interpreter finalizes.");
  m.def("_derived_future", [](const FutureWrapper& child) { mccl::OrderMark::derived(child->fut); },
        py::arg("child"), "`child`, returned by then() on an mccl Future, counts as one too.");
#ifdef MCCL_WITH_MPS
  // MPS tensors: the device kind and c10d's dispatcher kernels for the MPS key (macOS builds).
  m.attr("has_mps") = mccl::registerMps();
#else
  m.attr("has_mps") = false;
#endif
}
