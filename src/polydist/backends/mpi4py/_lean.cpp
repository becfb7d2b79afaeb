// The torch-level all_reduce of polydist's MPI group, compiled: torch.distributed.all_reduce (and every C++ caller
// of ProcessGroup::allreduce) reaches MPI_Allreduce without the interpreter in between.
//
// Optional: setup.py builds it where torch's headers and a C++ compiler are found at install time; process_group.py
// uses the Python group otherwise. LeanGroup is a torch ProcessGroup (a subclass of torch's own trampoline,
// PyProcessGroup, so every other operation still reaches the Python group's methods) whose allreduce takes the
// common blocking call itself: one contiguous CPU tensor of a (dtype, op) the group has reduced before (the plan
// process_group.py's _reduce_plan learns, as _mpi.PLANS), nothing queued on the group's lane, no profiler or
// dispatch mode watching torch's dispatcher (the call then takes it: backends/dispatch.py), no polydist call's record
// open. It records and watches the call as the Python lean path does (the compiled
// recorder's run_recorded, polydist/collectives/_record.c) and calls the MPI library's MPI_Allreduce, whose address
// and handles mpi4py gives (so any MPI ABI: int handles as MPICH's, pointers as Open MPI's), the GIL released while
// MPI runs. Anything else is the Python group's own allreduce (_allreduce_python), unchanged.
// tests/backends/mpi4py/test_lean.py holds both to the same results and records, and checks the error path.
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#if __has_include(<torch/csrc/distributed/c10d/PyProcessGroup.hpp>)
#include <torch/csrc/distributed/c10d/PyProcessGroup.hpp>
#else  // torch 2.14 moved the Python bindings' headers into c10d/py/ (built and tested on 2.13.0 and 2.14.1)
#include <torch/csrc/distributed/c10d/py/PyProcessGroup.hpp>
#endif
#include <torch/csrc/Dtype.h>
#include <torch/version.h>

#include <cstdint>
#include <string>

#ifndef POLYDIST_LEAN_SOURCE  // setup.py defines it: the SHA-256 of this file, which process_group.py compares
#define POLYDIST_LEAN_SOURCE ""
#endif

namespace py = pybind11;

namespace {

// What _reduce_plan learnt for (torch scalar type, RedOpType): the MPI datatype and op handles, whether AVG divides
// after the sum, and the op's name as the record gives it. Shared by every group, as _mpi.PLANS is.
struct Plan {
  uintptr_t datatype = 0, op = 0;
  bool avg = false;
  PyObject* name = nullptr;  // owned; nullptr: not learnt
};
constexpr int kTypes = 64, kOps = 16;
Plan plans[kTypes][kOps];

// configure(): the MPI library's MPI_Allreduce and MPI_IN_PLACE, and the Python objects the fast path consults.
// MPI handles come as unsigned words (mpi4py's .handle, masked to 64 bits); MPICH's, 32-bit ints, are cut back to
// int at the call.
using AllreduceInt = int (*)(const void*, void*, int, int, int, int);  // MPICH's ABI: handles are ints
using AllreducePtr = int (*)(const void*, void*, int, void*, void*, void*);  // Open MPI's, the standard ABI's
void* mpi_allreduce = nullptr;
bool enabled = true;  // use(False): every call takes the Python group's allreduce (tests, benchmarks)
bool int_handles = true;
intptr_t in_place = 0;
PyObject *one, *mpi_exception, *recorder, *watchdog, *run_recorded, *profiling, *call_now;
PyObject *s_pending, *s_outer, *s_on, *s_enabled, *s_seq, *s_all_reduce, *s_completed, *s_done, *s_fallback, *s_lane, *s_tag;

// The call run_recorded makes (call_now, below): this thread's, set just before; run_recorded calls it at once.
struct Call {
  void* buffer;
  int count;
  uintptr_t datatype, op, comm;
};
thread_local Call pending_call;

int allreduce_now(const Call& c) {
  if (int_handles)
    return reinterpret_cast<AllreduceInt>(mpi_allreduce)(reinterpret_cast<const void*>(in_place), c.buffer, c.count,
                                                           static_cast<int>(c.datatype), static_cast<int>(c.op),
                                                           static_cast<int>(c.comm));
  return reinterpret_cast<AllreducePtr>(mpi_allreduce)(reinterpret_cast<const void*>(in_place), c.buffer, c.count,
                                                       reinterpret_cast<void*>(c.datatype),
                                                       reinterpret_cast<void*>(c.op), reinterpret_cast<void*>(c.comm));
}

// run_recorded's fn: MPI_Allreduce of this thread's pending call, the GIL released; None, or nullptr with mpi4py's
// MPI.Exception set (as the Python group raises it).
PyObject* call_now_impl(PyObject*, PyObject*) {
  int code;
  Py_BEGIN_ALLOW_THREADS
  code = allreduce_now(pending_call);
  Py_END_ALLOW_THREADS
  if (code == 0)
    Py_RETURN_NONE;
  PyObject* number = PyLong_FromLong(code);
  PyObject* error = number == nullptr ? nullptr : PyObject_CallOneArg(mpi_exception, number);
  Py_XDECREF(number);
  if (error != nullptr) {
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error)), error);
    Py_DECREF(error);
  }
  return nullptr;
}
PyMethodDef call_now_def = {"allreduce_now", call_now_impl, METH_NOARGS, "MPI_Allreduce of the pending call"};

int truthy(PyObject* obj, PyObject* name) {  // obj.name's truth, -1 on error
  PyObject* value = PyObject_GetAttr(obj, name);
  if (value == nullptr)
    return -1;
  int yes = PyObject_IsTrue(value);
  Py_DECREF(value);
  return yes;
}

// The fast path, GIL held, for the Python group ``self`` over communicator ``comm`` of ``size`` ranks: a new
// reference to the group's completed handle; nullptr without an error set where the call is not the common one
// (the caller takes the Python group's allreduce); nullptr with one on error. ``x``: the tensor as a Python
// object; ``list``: the caller's list of it, or nullptr; Py_None: return Py_None, no handle made.
PyObject* lean(uintptr_t comm, int size, PyObject* self, PyObject* x, PyObject* list, const at::Tensor& t,
               const c10d::AllreduceOptions& opts) {
  if (!enabled || opts.asyncOp || comm == 0 || !t.defined() || t.layout() != c10::kStrided || !t.device().is_cpu() ||
      !t.is_contiguous() || t.numel() > INT32_MAX)  // MPI's count is an int: mpi4py's large-count calls take more
    return nullptr;
  int type = static_cast<int>(t.scalar_type()), kind = static_cast<int>(opts.reduceOp.op_);
  if (type >= kTypes || kind >= kOps || plans[type][kind].name == nullptr)
    return nullptr;
  const Plan& plan = plans[type][kind];
  py::object lane = py::reinterpret_steal<py::object>(PyObject_GetAttr(self, s_lane));
  if (!lane)
    return nullptr;
  int busy = truthy(lane.ptr(), s_pending);  // operations queued on the lane go first: take the lane
  if (busy != 0 || c10::impl::TorchDispatchModeTLS::stack_len() > 0)  // a dispatch mode watches: the dispatcher's op
    return nullptr;
  PyObject* on = PyObject_CallNoArgs(profiling);  // the profiler's events come from the lane's path
  if (on == nullptr)
    return nullptr;
  busy = PyObject_IsTrue(on);
  Py_DECREF(on);
  if (busy != 0)
    return nullptr;
  py::object outer = py::reinterpret_steal<py::object>(PyObject_GetAttr(recorder, s_outer));
  if (!outer || !outer.is_none())  // a polydist call's record open: the Python path adopts it
    return nullptr;

  // The group's sequence number, the same count on every member whoever called (python_group's _seq).
  PyObject* seq = PyObject_GetAttr(self, s_seq);
  if (seq == nullptr)
    return nullptr;
  PyObject* next = PyNumber_Add(seq, one);
  Py_DECREF(seq);
  if (next == nullptr || PyObject_SetAttr(self, s_seq, next) < 0) {
    Py_XDECREF(next);
    return nullptr;
  }
  py::object number = py::reinterpret_steal<py::object>(next);
  pending_call = Call{t.data_ptr(), static_cast<int>(t.numel()), plan.datatype, plan.op, comm};
  int recording = truthy(recorder, s_on), watched = recording > 0 ? 1 : truthy(watchdog, s_enabled);
  if (recording < 0 || watched < 0)
    return nullptr;
  py::object done;
  if (watched) {  // record, shown to the watchdog while MPI runs, completed or failed: the compiled recorder's
    py::object tag = py::reinterpret_steal<py::object>(PyObject_GetAttr(self, s_tag));
    if (!tag)
      return nullptr;
    PyObject* args[] = {recorder, lane.ptr(), tag.ptr(), s_all_reduce, number.ptr(), plan.name, x,
                        recording ? Py_True : Py_False, call_now};
    done = py::reinterpret_steal<py::object>(PyObject_Vectorcall(run_recorded, args, 9, nullptr));
  } else {  // neither recorded nor watched: the MPI call alone
    done = py::reinterpret_steal<py::object>(call_now_impl(nullptr, nullptr));
  }
  if (!done)
    return nullptr;
  if (plan.avg) {
    at::Tensor out = t;
    out.div_(size);
  }
  if (list == Py_None)  // the caller makes the handle (backends/_dispatch.cpp, a C++ one)
    return Py_NewRef(Py_None);
  // The lane's one completed handle (work.DoneWork), holding this call's tensors as its result.
  py::object held = py::reinterpret_borrow<py::object>(list);
  if (!held) {  // a C++ caller's: a list of the tensor
    held = py::reinterpret_steal<py::object>(PyList_New(1));
    if (!held)
      return nullptr;
    PyList_SET_ITEM(held.ptr(), 0, Py_NewRef(x));
  }
  py::object handle = py::reinterpret_steal<py::object>(PyObject_GetAttr(lane.ptr(), s_done));
  return handle ? PyObject_CallMethodOneArg(handle.ptr(), s_completed, held.ptr()) : nullptr;
}

class LeanGroup : public c10d::PyProcessGroup {
 public:
  using PyProcessGroup::PyProcessGroup;

  // Set by the Python group (_lean_setup): its communicator's handle and size. Its lane and watchdog tag are read
  // from it at each call (_lane, _tag: set_timeout replaces the tag).
  uintptr_t comm = 0;
  int size = 1;

  // torch's allreduce from C++ (DDP's reducer, functional collectives): the same call, the GIL taken here.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    py::gil_scoped_acquire gil;
    py::handle self = py::detail::get_object_handle(this, py::detail::get_type_info(typeid(LeanGroup)));
    if (!self)
      throw std::runtime_error("polydist: the MPI group's Python object is gone");
    py::object work;
    if (tensors.size() == 1) {
      py::object x = py::reinterpret_steal<py::object>(THPVariable_Wrap(tensors[0]));
      work = py::reinterpret_steal<py::object>(lean(comm, size, self.ptr(), x.ptr(), nullptr, tensors[0], opts));
      if (!work && PyErr_Occurred())
        throw py::error_already_set();
    }
    if (!work)
      work = self.attr(s_fallback)(tensors, opts);
    return c10::make_intrusive<PyWorkHolder>(work);
  }
};

// LeanGroup.allreduce as torch.distributed.all_reduce calls it (group.allreduce([tensor], opts)), the GIL held:
// the fast path where the arguments are the common call's, else the Python group's allreduce.
py::object allreduce_py(py::handle self, py::handle tensors, py::handle opts) {
  LeanGroup* group = py::cast<LeanGroup*>(self);
  if (PyList_CheckExact(tensors.ptr()) && PyList_GET_SIZE(tensors.ptr()) == 1 &&
      THPVariable_Check(PyList_GET_ITEM(tensors.ptr(), 0)) && py::isinstance<c10d::AllreduceOptions>(opts)) {
    PyObject* x = PyList_GET_ITEM(tensors.ptr(), 0);
    const at::Tensor& t = THPVariable_Unpack(x);
    PyObject* work = lean(group->comm, group->size, self.ptr(), x, tensors.ptr(), t,
                          py::cast<const c10d::AllreduceOptions&>(opts));
    if (work != nullptr)
      return py::reinterpret_steal<py::object>(work);
    if (PyErr_Occurred())
      throw py::error_already_set();
  }
  return self.attr(s_fallback)(tensors, opts);
}

PyObject* intern(const char* s) {
  PyObject* name = PyUnicode_InternFromString(s);
  if (name == nullptr)
    throw py::error_already_set();
  return name;
}

}  // namespace

PYBIND11_MODULE(_lean, m) {
  // Built against one torch: a ProcessGroup's layout is torch's own, so another torch must not load it.
  std::string built = TORCH_VERSION;
  std::string running = py::module_::import("torch").attr("__version__").cast<std::string>();
  if (running.rfind(built, 0) != 0)
    throw py::import_error("polydist.backends.mpi4py._lean was built for torch " + built + ", this is torch " +
                           running + ": rebuild it (pip install --no-build-isolation -e .)");
  m.attr("SOURCE") = POLYDIST_LEAN_SOURCE;
  s_pending = intern("pending");
  s_outer = intern("outer");
  s_on = intern("on");
  s_enabled = intern("enabled");
  s_seq = intern("_seq");
  s_all_reduce = intern("all_reduce");
  s_completed = intern("completed");
  s_done = intern("done");
  s_fallback = intern("_allreduce_python");
  s_lane = intern("_lane");
  s_tag = intern("_tag");
  call_now = PyCFunction_New(&call_now_def, nullptr);
  one = PyLong_FromLong(1);

  m.def(
      "configure",
      [](py::object rec, py::object dog, py::object recorded, py::object prof, py::object error, uintptr_t function,
         int handle_size, intptr_t in_place_value) {
        if (function == 0)
          throw py::value_error("MPI_Allreduce's address is 0");
        if (handle_size != 4 && handle_size != static_cast<int>(sizeof(void*)))
          throw py::value_error("MPI handles of " + std::to_string(handle_size) + " bytes");
        for (PyObject** slot : {&recorder, &watchdog, &run_recorded, &profiling, &mpi_exception})
          Py_CLEAR(*slot);
        recorder = rec.release().ptr();
        watchdog = dog.release().ptr();
        run_recorded = recorded.release().ptr();
        profiling = prof.release().ptr();
        mpi_exception = error.release().ptr();
        mpi_allreduce = reinterpret_cast<void*>(function);
        int_handles = handle_size == 4;
        in_place = in_place_value;
      },
      "configure(recorder, watchdog, run_recorded, profiling, mpi_exception, MPI_Allreduce address, handle size, "
      "MPI_IN_PLACE): once, before a group's allreduce takes the fast path");
  m.def(
      "learn",
      [](py::handle dtype, int kind, uintptr_t datatype, uintptr_t op, bool avg, py::str name) {
        if (!THPDtype_Check(dtype.ptr()))
          throw py::type_error("learn: expected a torch.dtype");
        int type = static_cast<int>(reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type);
        if (type < 0 || type >= kTypes || kind < 0 || kind >= kOps)
          return;
        Plan& plan = plans[type][kind];
        Py_XSETREF(plan.name, name.inc_ref().ptr());
        plan.datatype = datatype, plan.op = op, plan.avg = avg;
      },
      "learn(dtype, RedOpType value, MPI datatype handle, MPI op handle, AVG, op name): the fast path's plan");
  m.def("use", [](bool on) { enabled = on; }, "use(False): every call takes the Python group's allreduce");
  // The fast path for the Backend behind a torch-made ProcessGroup (backends/_dispatch.cpp's set_fast).
  m.attr("ALLREDUCE") = py::capsule(reinterpret_cast<void*>(&lean), "polydist.backends.mpi4py._lean.allreduce");

  // The metaclass of torch's ProcessGroup (torch's own, not pybind's default): a Python class derives from both.
  py::handle meta = py::type::of(py::module_::import("torch._C._distributed_c10d").attr("ProcessGroup"));
  py::class_<LeanGroup, c10d::ProcessGroup, c10::intrusive_ptr<LeanGroup>> group(m, "LeanGroup", py::metaclass(meta));
  group.def(py::init<int, int>(), py::arg("rank"), py::arg("size"))
      .def(
          "_lean_setup",
          [](LeanGroup& g, uintptr_t comm, int size) { g.comm = comm, g.size = size; },
          "the group's communicator handle and size");
  // Not .def: that would chain it after torch's own allreduce overloads, which pybind tries first.
  group.attr("allreduce") = py::cpp_function(
      &allreduce_py, py::name("allreduce"), py::is_method(group), py::arg("tensors"), py::arg("opts") = py::none(),
      "allreduce(tensors, opts=None) -> Work: torch's all_reduce (torch.distributed.all_reduce calls it), each tensor\n"
      "reduced in place on every rank by opts.reduceOp. tensors: a list of CPU tensors; the common blocking call (one\n"
      "contiguous tensor of a dtype and op the group has reduced before, opts.asyncOp False) is reduced by\n"
      "MPI_Allreduce on this thread, recorded and watched, and returns the group's completed handle; any other call is\n"
      "_allreduce_python's. Errors as that method's: InvalidArgumentError for a CUDA tensor, TypeError for an op\n"
      "undefined on the dtype (raised before anything is sent); mpi4py.MPI.Exception for an MPI error, raised here\n"
      "by the common call, by wait() otherwise.");
}
