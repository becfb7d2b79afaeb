// Torch's dispatcher ops (torch.ops.c10d.allreduce_, ...) for polydist's Python groups, taken while a tool watches
// the dispatcher, so that CommDebugMode, the profiler's c10d events and tracing modes see the same program on
// polydist's backends as on gloo, and skipped otherwise, where they cost more than the MPI call.
//
// Optional, as _lean.cpp: setup.py builds it where torch's headers and a C++ compiler are found; without it a
// Python group stands beside the dispatcher (backends/dispatch.py). torch 2.13 gives Python no Backend it can
// subclass (no trampoline: "No constructor defined"), hence C++. Three parts:
// - GroupBackend, a c10d Backend registered as the Python group's own CPU backend (as torch's ProcessGroupMPI is
//   registered behind its ProcessGroup): the dispatcher's kernels reach the group through it. Each operation takes
//   the GIL and calls the group's method of torch's ProcessGroup name (allreduce, _allgather_base, alltoall_base,
//   recv_anysource, ...), which keeps the groups' records, watchdog, lanes and errors as they are; its Python work
//   handle comes back as a GroupWork. A fast all_reduce can be plugged in (set_fast: _lean.cpp's common call).
// - the module's functions of torch's names (allreduce(pg, tensors, opts), ...): torch's own ProcessGroup method,
//   which calls the dispatcher op, on a Python group whose method of that name overrides it (dispatch.py's doors).
// - watched(): whether a tool watches the dispatcher on this thread (a dispatch mode, or the profiler).
#include <atomic>
#include <torch/csrc/autograd/python_variable.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/profiler/orchestration/observer.h>
#if __has_include(<torch/csrc/distributed/c10d/PyProcessGroup.hpp>)
#include <torch/csrc/distributed/c10d/PyProcessGroup.hpp>
#else  // torch 2.14 moved the Python bindings' headers into c10d/py/ (built and tested on 2.13.0 and 2.14.1)
#include <torch/csrc/distributed/c10d/py/PyProcessGroup.hpp>
#endif
#include <torch/version.h>

#include <pybind11/chrono.h>

#include <string>

#ifndef POLYDIST_DISPATCH_SOURCE  // setup.py defines it: the SHA-256 of this file, which dispatch.py compares
#define POLYDIST_DISPATCH_SOURCE ""
#endif

namespace py = pybind11;

namespace {

using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// torch's ProcessGroup and Backend operations of one list and options (ONE: name, options) or of outputs, inputs and
// options (TWO: name, outputs, inputs, options); allreduce, alltoall_base, point-to-point and barrier are spelt out.
// RENAMED: the Backend's name and the name torch 2.13's ProcessGroup calls the dispatcher under (its old name, kept,
// forwards to the new one, which a Python group overrides too), outputs, inputs, options.
#define POLYDIST_OPS(ONE, TWO, RENAMED)                                                         \
  ONE(broadcast, BroadcastOptions)                                                              \
  ONE(allreduce_coalesced, AllreduceCoalescedOptions)                                           \
  ONE(reduce, ReduceOptions)                                                                    \
  TWO(allgather, TensorLists, Tensors, AllgatherOptions)                                        \
  TWO(allgather_coalesced, TensorLists, Tensors, AllgatherOptions)                              \
  TWO(gather, TensorLists, Tensors, GatherOptions)                                              \
  TWO(scatter, Tensors, TensorLists, ScatterOptions)                                            \
  TWO(reduce_scatter, Tensors, TensorLists, ReduceScatterOptions)                               \
  TWO(alltoall, Tensors, Tensors, AllToAllOptions)                                              \
  RENAMED(_allgather_base, all_gather_single, at::Tensor, at::Tensor, AllgatherOptions)         \
  RENAMED(allgather_into_tensor_coalesced, all_gather_single_coalesced, Tensors, Tensors, AllgatherOptions) \
  RENAMED(_reduce_scatter_base, reduce_scatter_single, at::Tensor, at::Tensor, ReduceScatterOptions)       \
  RENAMED(reduce_scatter_tensor_coalesced, reduce_scatter_single_coalesced, Tensors, Tensors, ReduceScatterOptions)

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
#define POLYDIST_CALLED(OLD, NEW) NEW
#define POLYDIST_ALLTOALL all_to_all_single
#else
#define POLYDIST_CALLED(OLD, NEW) OLD
#define POLYDIST_ALLTOALL alltoall_base
#endif

// _lean.cpp's common all_reduce, as its capsule gives it (``list`` Py_None: no Python handle made): a new reference
// to None once done, or nullptr (with a Python error set on error, without one where the call is not the common one).
using FastAllreduce = PyObject* (*)(uintptr_t comm, int size, PyObject* group, PyObject* x, PyObject* list,
                                    const at::Tensor& t, const c10d::AllreduceOptions& opts);
constexpr const char* kFastCapsule = "polydist.backends.mpi4py._lean.allreduce";

// A Python group's work handle (work.LaneWork) for torch's C++: wait and the future through torch's Work trampoline
// (PyWorkHolder), and what torch's Python asks of a handle beyond those (the sender of a recv from any source, the
// result, completion) from the Python object.
class GroupWork : public c10d::PyProcessGroup::PyWorkHolder {
 public:
  explicit GroupWork(py::object work) : PyWorkHolder(work), py_(work) {}
  ~GroupWork() override {
    py::gil_scoped_acquire gil;
    py_ = py::object();
  }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_completed")().cast<bool>();
  }
  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_success")().cast<bool>();
  }
  int sourceRank() const override {
    py::gil_scoped_acquire gil;
    return py_.attr("_source_rank")().cast<int>();
  }
  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    return py_.attr("result")().cast<std::vector<at::Tensor>>();
  }

 private:
  py::object py_;
};

// The fast all_reduce's handle: its tensors were reduced in place before it was made (no Python object to keep).
class CompletedWork : public c10d::Work {
 public:
  explicit CompletedWork(std::vector<at::Tensor> tensors)
      : Work(-1, c10d::OpType::ALLREDUCE), tensors_(std::move(tensors)) {
    finish();
  }
  bool isCompleted() override {
    return true;
  }
  bool isSuccess() const override {
    return true;
  }
  bool wait(std::chrono::milliseconds) override {
    return true;
  }
  std::vector<at::Tensor> result() override {
    return tensors_;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(tensors_));
    return future;
  }

 private:
  std::vector<at::Tensor> tensors_;
};

class GroupBackend : public c10d::Backend {
 public:
  // A weak reference: the group holds this Backend (registered as its CPU backend), which must not keep it alive.
  GroupBackend(py::object group, int rank, int size, std::string name)
      : Backend(rank, size), group_(py::weakref(group)), name_(std::move(name)) {}
  ~GroupBackend() override {
    if (!Py_IsInitialized()) {  // the interpreter is gone: leak the reference rather than touch it
      group_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    group_ = py::weakref();
  }

  // The group, the GIL held; RuntimeError once it is gone.
  py::object group() const {
    py::object group = group_();
    if (group.is_none())
      throw std::runtime_error("polydist: the Python group behind this Backend is gone");
    return group;
  }
  void setFast(FastAllreduce fast, uintptr_t comm, int size) {
    fast_ = fast, comm_ = comm, size_ = size;
  }

  const std::string getBackendName() const override {
    return name_;
  }

  // The count of operations this group started, for torch's desync checker (TORCH_DISTRIBUTED_DEBUG=DETAIL wraps
  // a plugin backend in ProcessGroupWrapper, which asks for it before each collective): equal on every rank that
  // ran the same operations, as gloo's.
  void setSequenceNumberForGroup() override {
    seq_ = 0;
  }
  uint64_t getSequenceNumberForGroup() override {
    return seq_;
  }

  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> forward(const char* method, Args&&... args) {
    ++seq_;
    py::gil_scoped_acquire gil;
    return c10::make_intrusive<GroupWork>(group().attr(method)(std::forward<Args>(args)...));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (fast_ == nullptr || tensors.size() != 1)
      return forward("allreduce", tensors, opts);
    ++seq_;
    py::gil_scoped_acquire gil;
    py::object self = group();
    py::object x = py::reinterpret_steal<py::object>(THPVariable_Wrap(tensors[0]));
    PyObject* done = fast_(comm_, size_, self.ptr(), x.ptr(), Py_None, tensors[0], opts);
    if (done != nullptr) {
      Py_DECREF(done);
      return c10::make_intrusive<CompletedWork>(tensors);
    }
    if (PyErr_Occurred())
      throw py::error_already_set();
    return c10::make_intrusive<GroupWork>(self.attr("_allreduce_python")(tensors, opts));
  }
  // torch's Backend methods of one list and options (ONE) or outputs, inputs and options (TWO), each forwarded to
  // the Python group's method of the same name.
#define POLYDIST_ONE(NAME, OPTIONS)                                                                           \
  c10::intrusive_ptr<c10d::Work> NAME(std::vector<at::Tensor>& tensors, const c10d::OPTIONS& opts) override { \
    return forward(#NAME, tensors, opts);                                                                      \
  }
#define POLYDIST_TWO(NAME, OUTPUTS, INPUTS, OPTIONS)                                                       \
  c10::intrusive_ptr<c10d::Work> NAME(OUTPUTS& outputs, INPUTS& inputs, const c10d::OPTIONS& opts) override { \
    return forward(#NAME, outputs, inputs, opts);                                                            \
  }
#define POLYDIST_RENAMED(NAME, NEW, OUTPUTS, INPUTS, OPTIONS) POLYDIST_TWO(NAME, OUTPUTS, INPUTS, OPTIONS)
  POLYDIST_OPS(POLYDIST_ONE, POLYDIST_TWO, POLYDIST_RENAMED)
#undef POLYDIST_ONE
#undef POLYDIST_TWO
#undef POLYDIST_RENAMED
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override {
    return forward("alltoall_base", output, input, outputSplits, inputSplits, opts);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return forward("send", tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return forward("recv", tensors, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return forward("recv_anysource", tensors, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return forward("barrier", opts);
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    group().attr("_set_default_timeout")(timeout);
  }
  void setGroupUid(const std::string& name) override {
    Backend::setGroupUid(name);
    py::gil_scoped_acquire gil;
    group().attr("_set_group_name")(name);
  }
  // Ending a group that is already gone (its ProcessGroup destroyed first) ends nothing.
  void shutdown() override {
    py::gil_scoped_acquire gil;
    py::object group = group_();
    if (!group.is_none())
      group.attr("shutdown")();
  }
  void abort() override {
    py::gil_scoped_acquire gil;
    py::object group = group_();
    if (!group.is_none())
      group.attr("abort")();
  }

 private:
  py::weakref group_;
  std::string name_;
  std::atomic<uint64_t> seq_{0};
  FastAllreduce fast_ = nullptr;
  uintptr_t comm_ = 0;
  int size_ = 1;
};

}  // namespace

PYBIND11_MODULE(_dispatch, m) {
  // Built against one torch: a Backend's layout is torch's own, so another torch must not load it.
  std::string built = TORCH_VERSION;
  std::string running = py::module_::import("torch").attr("__version__").cast<std::string>();
  if (running.rfind(built, 0) != 0)
    throw py::import_error("polydist.backends._dispatch was built for torch " + built + ", this is torch " + running +
                           ": rebuild it (pip install --no-build-isolation -e .)");
  m.attr("SOURCE") = POLYDIST_DISPATCH_SOURCE;
  py::class_<GroupBackend, c10d::Backend, c10::intrusive_ptr<GroupBackend>>(m, "GroupBackend")
      .def(py::init<py::object, int, int, std::string>(), py::arg("group"), py::arg("rank"), py::arg("size"),
           py::arg("name"),
           "GroupBackend(group, rank, size, name): torch's Backend for Python group ``group`` (a PythonProcessGroup),\n"
           "every operation forwarded to its method of torch's name; ``name``: what getBackendName() says.")
      .def_property_readonly("group", &GroupBackend::group, "the Python group behind it")
      .def(
          "set_fast",
          [](GroupBackend& b, py::capsule fast, uintptr_t comm, int size) {
            if (std::string(fast.name()) != kFastCapsule)
              throw py::value_error(std::string("set_fast: expected the capsule ") + kFastCapsule);
            b.setFast(reinterpret_cast<FastAllreduce>(fast.get_pointer()), comm, size);
          },
          py::arg("fast"), py::arg("comm"), py::arg("size"),
          "set_fast(capsule, comm, size): the all_reduce's common call compiled (_lean.ALLREDUCE, over the MPI\n"
          "communicator handle ``comm`` of ``size`` ranks); any other call is the group's _allreduce_python.");

  m.def(
      "watched",
      [] { return c10::impl::TorchDispatchModeTLS::stack_len() > 0 || torch::profiler::impl::profilerEnabled(); },
      "watched(): whether a tool watches torch's dispatcher on this thread (a dispatch mode such as CommDebugMode or\n"
      "a tracing mode, or the profiler): then a torch-level call takes torch's dispatcher op.");
  // torch's own ProcessGroup method of each name, called past the Python group's override of it: the dispatcher op,
  // whose kernel reaches the group's registered GroupBackend. The GIL stays held (a Python mode handles the op).
#define POLYDIST_ONE(NAME, OPTIONS)                                                                \
  m.def(                                                                                           \
      #NAME,                                                                                       \
      [](c10d::ProcessGroup& pg, Tensors& tensors, const c10d::OPTIONS& opts) {                    \
        return pg.c10d::ProcessGroup::NAME(tensors, opts);                                         \
      },                                                                                           \
      py::arg("pg"), py::arg("tensors"), py::arg("opts") = c10d::OPTIONS());
#define POLYDIST_AS(PYNAME, NAME, OUTPUTS, INPUTS, OPTIONS)                                        \
  m.def(                                                                                           \
      PYNAME,                                                                                      \
      [](c10d::ProcessGroup& pg, OUTPUTS& outputs, INPUTS& inputs, const c10d::OPTIONS& opts) {    \
        return pg.c10d::ProcessGroup::NAME(outputs, inputs, opts);                                 \
      },                                                                                           \
      py::arg("pg"), py::arg("outputs"), py::arg("inputs"), py::arg("opts") = c10d::OPTIONS());
#define POLYDIST_TWO(NAME, OUTPUTS, INPUTS, OPTIONS) POLYDIST_AS(#NAME, NAME, OUTPUTS, INPUTS, OPTIONS)
#define POLYDIST_RENAMED(NAME, NEW, OUTPUTS, INPUTS, OPTIONS)                       \
  POLYDIST_AS(#NAME, POLYDIST_CALLED(NAME, NEW), OUTPUTS, INPUTS, OPTIONS)          \
  POLYDIST_AS(#NEW, POLYDIST_CALLED(NAME, NEW), OUTPUTS, INPUTS, OPTIONS)
  POLYDIST_OPS(POLYDIST_ONE, POLYDIST_TWO, POLYDIST_RENAMED)
  POLYDIST_ONE(allreduce, AllreduceOptions)
#undef POLYDIST_ONE
#undef POLYDIST_TWO
#undef POLYDIST_RENAMED
#undef POLYDIST_AS
  for (const char* name : {"alltoall_base", "all_to_all_single"})
    m.def(
        name,
        [](c10d::ProcessGroup& pg, at::Tensor& output, at::Tensor& input, std::vector<int64_t> outputSplits,
           std::vector<int64_t> inputSplits, const c10d::AllToAllOptions& opts) {
          return pg.c10d::ProcessGroup::POLYDIST_ALLTOALL(output, input, outputSplits, inputSplits, opts);
        },
        py::arg("pg"), py::arg("output"), py::arg("input"), py::arg("output_split_sizes"),
        py::arg("input_split_sizes"), py::arg("opts") = c10d::AllToAllOptions());
  m.def(
      "send", [](c10d::ProcessGroup& pg, Tensors& tensors, int dst, int tag) { return pg.c10d::ProcessGroup::send(tensors, dst, tag); },
      py::arg("pg"), py::arg("tensors"), py::arg("dst"), py::arg("tag"));
  m.def(
      "recv", [](c10d::ProcessGroup& pg, Tensors& tensors, int src, int tag) { return pg.c10d::ProcessGroup::recv(tensors, src, tag); },
      py::arg("pg"), py::arg("tensors"), py::arg("src"), py::arg("tag"));
  m.def(
      "recv_anysource",
      [](c10d::ProcessGroup& pg, Tensors& tensors, int tag) { return pg.c10d::ProcessGroup::recvAnysource(tensors, tag); },
      py::arg("pg"), py::arg("tensors"), py::arg("tag"));
  m.def(
      "barrier", [](c10d::ProcessGroup& pg, const c10d::BarrierOptions& opts) { return pg.c10d::ProcessGroup::barrier(opts); },
      py::arg("pg"), py::arg("opts") = c10d::BarrierOptions());
}
