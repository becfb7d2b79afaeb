/* The flight recorder's per-call path, compiled: what polydist/collectives/recorder.py's record_op and
 * polydist/backends/lane.py's run_recorded do, record for record, at a fraction of the interpreter's cost.
 *
 * Optional: setup.py builds it where a C compiler is found (CPython 3.11+), and polydist uses the Python
 * functions otherwise. tests/trace/test_record_compiled.py checks that both make the same records.
 *
 * The caller's frame (the first one outside polydist and torch) is found on CPython 3.11 by reading the
 * interpreter's frames directly (internal/pycore_frame.h, whose layout is fixed within a minor version): the
 * public API (PyFrame_GetBack) creates a frame object for every frame it passes, and those objects were most of
 * the record's cost. Other versions take the public API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#ifndef POLYDIST_RECORD_SOURCE /* setup.py defines it: the SHA-256 of this file, which polydist compares */
#define POLYDIST_RECORD_SOURCE ""
#endif

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define INTERNAL_WALK 1
#define Py_BUILD_CORE 1
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE
#else
#define INTERNAL_WALK 0
#endif

/* Fields of a record: polydist/collectives/recorder.py's ID, NAME, ... */
enum { ID, NAME, RES, SEQ, OP, ROOT, DTYPE, SHAPE, CODE, LASTI, START, END, STATE, ERROR, ASYNC, FIELDS };

/* A record, read and written by index as recorder.py's lists are (record[END] = ..., record[STATE] is STARTED).
 * One allocation that holds its numbers and the tensor's shape itself: the ring keeps 2,000 records, and the one a
 * new record replaces is cold in the cache; a list record frees eight objects of its own there (the list, its
 * items, the shape, two times, three ints), which cost more than the rest of the record together on a loaded
 * machine. Its other fields are objects every record shares (names, the group's tag, dtypes, code objects).
 * Not tracked by the cycle collector: nothing a record holds refers back to it. */
#define INLINE_DIMS 8
typedef struct {
    PyObject_HEAD
    PyObject *name, *res, *op, *root, *dtype, *code, *state, *error, *async_op;
    PyObject *shapes; /* the argument's shapes as an object (several tensors, a value, > INLINE_DIMS dims), or NULL */
    long long id, seq;
    double start, end;
    int lasti, ndim, has_seq, has_end;
    long long dims[INLINE_DIMS];
} Record;

static PyTypeObject RecordType;
static PyObject *size_type; /* torch.Size: what record[SHAPE] gives for one tensor */

/* Set once by configure(): the recorder module's objects. */
static PyObject *tensor_type, *many, *tensors_of, *classify, *started, *completed;
static PyObject *s_fail, *s_dtype, *s_shape;
/* The Recorder's and the Lane's fields (Python __slots__), read and written at their offsets in the object: an
 * attribute lookup costs ten times as much. configure() finds them; the calls check the objects' exact types. */
static PyTypeObject *recorder_type, *lane_type;
static Py_ssize_t off_count, off_size, off_slots, off_keep, off_current, off_since;
#define FIELD(obj, off) (*(PyObject **)((char *)(obj) + (off)))
static int public_walk = !INTERNAL_WALK;
/* torch.Tensor's dtype and shape getters, called directly (an attribute lookup costs as much as the getter):
 * the same getters the attribute would reach, since a tensor's instance dict cannot shadow a data descriptor. */
static PyGetSetDef *get_dtype, *get_shape;
static PyObject *held_getters[2]; /* their descriptors, held */

/* Whether a code object's file is polydist's or torch's, learnt once per code object: a direct-mapped table
 * that holds its code objects (so an address is never reused while its entry lives). */
#define KNOWN_SIZE 1024
static struct {
    PyObject *code;
    int inside;
} known[KNOWN_SIZE];

static int in_libraries(PyObject *code) {
    size_t slot = ((size_t)code >> 4) & (KNOWN_SIZE - 1);
    if (known[slot].code == code)
        return known[slot].inside;
    PyObject *answer = PyObject_CallOneArg(classify, code);
    if (answer == NULL)
        return -1;
    int inside = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    if (inside < 0)
        return -1;
    Py_INCREF(code);
    Py_XSETREF(known[slot].code, code);
    known[slot].inside = inside;
    return inside;
}

/* The first frame from the caller's up that is outside polydist and torch (the outermost if every one is):
 * its code (a new reference) and instruction offset (frame.f_lasti). 0 on success, -1 with an exception set. */
static int caller(PyObject **code, int *lasti) {
#if INTERNAL_WALK
    if (!public_walk) {
        _PyInterpreterFrame *f = PyThreadState_Get()->cframe->current_frame;
        while (f != NULL && _PyFrame_IsIncomplete(f))
            f = f->previous;
        if (f == NULL) {
            *code = NULL;
            return 0;
        }
        for (;;) {
            _PyInterpreterFrame *back = f->previous;
            while (back != NULL && _PyFrame_IsIncomplete(back))
                back = back->previous;
            if (back == NULL)
                break;
            int inside = in_libraries((PyObject *)f->f_code);
            if (inside < 0)
                return -1;
            if (!inside)
                break;
            f = back;
        }
        *code = Py_NewRef((PyObject *)f->f_code);
        int index = _PyInterpreterFrame_LASTI(f);
        *lasti = index < 0 ? -1 : index * (int)sizeof(_Py_CODEUNIT); /* frame.f_lasti */
        return 0;
    }
#endif
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    if (frame == NULL) {
        *code = NULL;
        return 0;
    }
    Py_INCREF(frame);
    for (;;) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        if (back == NULL)
            break;
        PyCodeObject *c = PyFrame_GetCode(frame);
        int inside = in_libraries((PyObject *)c);
        Py_DECREF(c);
        if (inside <= 0) {
            Py_DECREF(back);
            if (inside < 0) {
                Py_DECREF(frame);
                return -1;
            }
            break;
        }
        Py_SETREF(frame, back);
    }
    *code = (PyObject *)PyFrame_GetCode(frame);
    *lasti = PyFrame_GetLasti(frame);
    Py_DECREF(frame);
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time()'s clock */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Field ``name`` at ``off`` in ``obj`` (borrowed), or NULL with AttributeError if unset. */
static PyObject *field(PyObject *obj, Py_ssize_t off, const char *name) {
    PyObject *value = FIELD(obj, off);
    if (value == NULL)
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(obj)->tp_name, name);
    return value;
}

/* Set the field at ``off`` in ``obj`` to ``value`` (a new reference taken here); the old value is released after. */
static void set_field(PyObject *obj, Py_ssize_t off, PyObject *value) {
    PyObject *old = FIELD(obj, off);
    FIELD(obj, off) = Py_NewRef(value);
    Py_XDECREF(old);
}

static Py_ssize_t field_ssize(PyObject *obj, Py_ssize_t off, const char *name) {
    PyObject *value = field(obj, off, name);
    return value == NULL ? -1 : PyLong_AsSsize_t(value);
}

/* Fill ``r``'s shape from tensor ``x``: its sizes, or the shape object itself where they do not fit; 0, or -1
 * with an exception set. */
static int take_shape(Record *r, PyObject *x) {
    PyObject *shape = get_shape != NULL ? get_shape->get(x, get_shape->closure) : PyObject_GetAttr(x, s_shape);
    if (shape == NULL)
        return -1;
    Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : INLINE_DIMS + 1;
    if (ndim > INLINE_DIMS) {
        r->shapes = shape; /* kept whole */
        return 0;
    }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        r->dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (r->dims[i] == -1 && PyErr_Occurred()) { /* not a plain int (a symbolic size): kept whole */
            PyErr_Clear();
            r->shapes = shape;
            return 0;
        }
    }
    r->ndim = (int)ndim;
    Py_DECREF(shape);
    return 0;
}

/* record_op's work; ring as a C truth value. A new reference, or NULL with an exception set. */
static PyObject *make_record(PyObject *rec, PyObject *res, PyObject *name, PyObject *seq, PyObject *op,
                             PyObject *root, PyObject *x, PyObject *async_op, int ring) {
    Record *r = PyObject_New(Record, &RecordType);
    if (r == NULL)
        return NULL;
    r->name = Py_NewRef(name);
    r->res = Py_NewRef(res);
    r->op = Py_NewRef(op);
    r->root = Py_NewRef(root);
    r->async_op = Py_NewRef(async_op);
    r->state = Py_NewRef(started);
    r->error = Py_NewRef(Py_None);
    r->dtype = r->code = r->shapes = NULL;
    r->id = -1;
    r->ndim = r->lasti = r->has_end = 0;
    r->end = 0.0;
    r->has_seq = seq != Py_None;
    r->seq = r->has_seq ? PyLong_AsLongLong(seq) : 0;
    if (r->has_seq && r->seq == -1 && PyErr_Occurred())
        goto fail;
    if (Py_IS_TYPE(x, (PyTypeObject *)tensor_type)) {
        r->dtype = get_dtype != NULL ? get_dtype->get(x, get_dtype->closure) : PyObject_GetAttr(x, s_dtype);
        if (r->dtype == NULL || take_shape(r, x) < 0)
            goto fail;
    } else {
        r->dtype = Py_NewRef(many);
        if ((r->shapes = PyObject_CallOneArg(tensors_of, x)) == NULL)
            goto fail;
    }
    if (caller(&r->code, &r->lasti) < 0)
        goto fail;
    PyObject *slots = NULL; /* borrowed */
    Py_ssize_t n = -1, size = 0;
    if (ring) {
        n = field_ssize(rec, off_count, "count");
        size = n < 0 ? -1 : field_ssize(rec, off_size, "size");
        if (size <= 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "the flight recorder's ring has no room (size <= 0)");
            goto fail;
        }
        slots = field(rec, off_slots, "slots");
        if (slots == NULL)
            goto fail;
        if (!PyList_CheckExact(slots) || PyList_GET_SIZE(slots) != size) {
            PyErr_SetString(PyExc_ValueError, "the flight recorder's slots are not a list of its size");
            goto fail;
        }
        PyObject *count = PyLong_FromSsize_t(n + 1);
        if (count == NULL)
            goto fail;
        set_field(rec, off_count, count);
        Py_DECREF(count);
        r->id = n;
    }
    r->start = now();
    if (ring) {
        Py_INCREF(slots); /* the old record's release may run code; the list stays */
        PyList_SetItem(slots, n % size, Py_NewRef((PyObject *)r)); /* steals the new reference */
        /* The next call frees the record after this one's slot: the oldest in the ring, out of the cache by then.
         * Fetching it now, while this call's operation runs, takes the misses off the next call's path. */
#if defined(__GNUC__) || defined(__clang__)
        PyObject *next = PyList_GET_ITEM(slots, (n + 1) % size);
        for (Py_ssize_t line = 0; next != NULL && line < Py_TYPE(next)->tp_basicsize; line += 64)
            __builtin_prefetch((char *)next + line, 1);
#endif
        Py_DECREF(slots);
    }
    return (PyObject *)r;
fail:
    Py_DECREF(r);
    return NULL;
}

static int check_configured(PyObject *rec) {
    if (started == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "polydist.collectives._record: configure() was not called");
        return -1;
    }
    if (!Py_IS_TYPE(rec, recorder_type)) {
        PyErr_Format(PyExc_TypeError, "expected a %s, got %s", recorder_type->tp_name, Py_TYPE(rec)->tp_name);
        return -1;
    }
    return 0;
}

static int arity(const char *name, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most) {
    if (nargs >= least && nargs <= most)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd positional arguments (%zd given)", name, least, most, nargs);
    return -1;
}

/* record_op(recorder, res, name, seq, op, root, x, async_op, ring) -> record */
static PyObject *record_op(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("record_op", nargs, 9, 9) < 0 || check_configured(args[0]) < 0)
        return NULL;
    int ring = PyObject_IsTrue(args[8]);
    if (ring < 0)
        return NULL;
    return make_record(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], ring);
}

/* run_recorded(recorder, lane, res, name, seq, op, x, ring, fn, *args) -> None */
static PyObject *run_recorded(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("run_recorded", nargs, 9, PY_SSIZE_T_MAX) < 0 || check_configured(args[0]) < 0)
        return NULL;
    PyObject *rec = args[0], *lane = args[1];
    if (lane_type == NULL || !Py_IS_TYPE(lane, lane_type)) {
        if (lane_type == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "polydist.collectives._record: configure_lane() was not called");
            return NULL;
        }
        PyErr_Format(PyExc_TypeError, "expected a %s, got %s", lane_type->tp_name, Py_TYPE(lane)->tp_name);
        return NULL;
    }
    int ring = PyObject_IsTrue(args[7]);
    if (ring < 0)
        return NULL;
    Record *record = (Record *)make_record(rec, args[2], args[3], args[4], args[5], Py_None, args[6], Py_False, ring);
    if (record == NULL)
        return NULL;
    PyObject *since = PyFloat_FromDouble(record->start);
    if (since == NULL) {
        Py_DECREF(record);
        return NULL;
    }
    set_field(lane, off_since, since); /* since first: the watchdog reads current, then since */
    Py_DECREF(since);
    set_field(lane, off_current, (PyObject *)record);
    PyObject *result = PyObject_Vectorcall(args[8], args + 9, nargs - 9, NULL);
    set_field(lane, off_current, Py_None);
    if (result == NULL) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL)
            PyException_SetTraceback(value, traceback);
        PyObject *done = PyObject_CallMethodObjArgs(rec, s_fail, (PyObject *)record, value, NULL);
        Py_XDECREF(done);
        PyErr_Clear(); /* the transport's error is the one to raise */
        PyErr_Restore(type, value, traceback);
        Py_DECREF(record);
        return NULL;
    }
    Py_DECREF(result);
    if (record->state == started) { /* not failed by the watchdog meanwhile: Recorder.end */
        record->end = now();
        record->has_end = 1;
        Py_SETREF(record->state, Py_NewRef(completed));
        PyObject *keep = field(rec, off_keep, "keep");
        if (keep == NULL || (keep != Py_None && PyList_Append(keep, (PyObject *)record) < 0)) {
            Py_DECREF(record);
            return NULL;
        }
    }
    Py_DECREF(record);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- the record type */

static void record_dealloc(Record *r) {
    Py_XDECREF(r->name);
    Py_XDECREF(r->res);
    Py_XDECREF(r->op);
    Py_XDECREF(r->root);
    Py_XDECREF(r->dtype);
    Py_XDECREF(r->code);
    Py_XDECREF(r->state);
    Py_XDECREF(r->error);
    Py_XDECREF(r->async_op);
    Py_XDECREF(r->shapes);
    PyObject_Free(r);
}

static Py_ssize_t record_length(PyObject *self) { return FIELDS; }

static PyObject *or_none(PyObject *obj) { return Py_NewRef(obj != NULL ? obj : Py_None); }

static PyObject *record_item(PyObject *self, Py_ssize_t i) {
    Record *r = (Record *)self;
    switch (i) {
    case ID: return PyLong_FromLongLong(r->id);
    case NAME: return or_none(r->name);
    case RES: return or_none(r->res);
    case SEQ: return r->has_seq ? PyLong_FromLongLong(r->seq) : Py_NewRef(Py_None);
    case OP: return or_none(r->op);
    case ROOT: return or_none(r->root);
    case DTYPE: return or_none(r->dtype);
    case SHAPE: {
        if (r->shapes != NULL)
            return Py_NewRef(r->shapes);
        PyObject *dims = PyTuple_New(r->ndim);
        for (int d = 0; dims != NULL && d < r->ndim; d++) {
            PyObject *n = PyLong_FromLongLong(r->dims[d]);
            if (n == NULL)
                Py_CLEAR(dims);
            else
                PyTuple_SET_ITEM(dims, d, n);
        }
        if (dims == NULL)
            return NULL;
        PyObject *shape = PyObject_CallOneArg(size_type, dims);
        Py_DECREF(dims);
        return shape;
    }
    case CODE: return or_none(r->code);
    case LASTI: return PyLong_FromLong(r->lasti);
    case START: return PyFloat_FromDouble(r->start);
    case END: return r->has_end ? PyFloat_FromDouble(r->end) : Py_NewRef(Py_None);
    case STATE: return or_none(r->state);
    case ERROR: return or_none(r->error);
    case ASYNC: return or_none(r->async_op);
    }
    PyErr_SetString(PyExc_IndexError, "record index out of range");
    return NULL;
}

static int set_number(PyObject *value, long long *slot, int *present) {
    if (value == Py_None && present != NULL) {
        *present = 0;
        return 0;
    }
    long long n = PyLong_AsLongLong(value);
    if (n == -1 && PyErr_Occurred())
        return -1;
    *slot = n;
    if (present != NULL)
        *present = 1;
    return 0;
}

static int record_ass_item(PyObject *self, Py_ssize_t i, PyObject *value) {
    Record *r = (Record *)self;
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "a record's fields cannot be deleted");
        return -1;
    }
    PyObject **slot = NULL;
    switch (i) {
    case ID: return set_number(value, &r->id, NULL);
    case SEQ: return set_number(value, &r->seq, &r->has_seq);
    case LASTI: {
        long n = PyLong_AsLong(value);
        if (n == -1 && PyErr_Occurred())
            return -1;
        r->lasti = (int)n;
        return 0;
    }
    case START:
    case END: {
        if (i == END && value == Py_None) {
            r->has_end = 0;
            return 0;
        }
        double t = PyFloat_AsDouble(value);
        if (t == -1.0 && PyErr_Occurred())
            return -1;
        if (i == START)
            r->start = t;
        else {
            r->end = t;
            r->has_end = 1;
        }
        return 0;
    }
    case SHAPE: slot = &r->shapes; break;
    case NAME: slot = &r->name; break;
    case RES: slot = &r->res; break;
    case OP: slot = &r->op; break;
    case ROOT: slot = &r->root; break;
    case DTYPE: slot = &r->dtype; break;
    case CODE: slot = &r->code; break;
    case STATE: slot = &r->state; break;
    case ERROR: slot = &r->error; break;
    case ASYNC: slot = &r->async_op; break;
    default:
        PyErr_SetString(PyExc_IndexError, "record assignment index out of range");
        return -1;
    }
    Py_XSETREF(*slot, Py_NewRef(value));
    return 0;
}

static PyObject *record_subscript(PyObject *self, PyObject *key) {
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    return record_item(self, i < 0 ? i + FIELDS : i);
}

static int record_ass_subscript(PyObject *self, PyObject *key, PyObject *value) {
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return -1;
    return record_ass_item(self, i < 0 ? i + FIELDS : i, value);
}

static PyObject *record_repr(PyObject *self) {
    PyObject *items = PyList_New(FIELDS);
    for (Py_ssize_t i = 0; items != NULL && i < FIELDS; i++) {
        PyObject *item = record_item(self, i);
        if (item == NULL)
            Py_CLEAR(items);
        else
            PyList_SET_ITEM(items, i, item);
    }
    if (items == NULL)
        return NULL;
    PyObject *text = PyUnicode_FromFormat("Record(%R)", items);
    Py_DECREF(items);
    return text;
}

static PySequenceMethods record_as_sequence = {.sq_length = record_length, .sq_item = record_item,
                                               .sq_ass_item = record_ass_item};
static PyMappingMethods record_as_mapping = {.mp_length = record_length, .mp_subscript = record_subscript,
                                             .mp_ass_subscript = record_ass_subscript};

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "polydist.collectives._record.Record",
    .tp_basicsize = sizeof(Record),
    .tp_dealloc = (destructor)record_dealloc,
    .tp_repr = record_repr,
    .tp_as_sequence = &record_as_sequence,
    .tp_as_mapping = &record_as_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A flight-recorder record made by the compiled path: a fixed sequence of the fields recorder.py's "
              "lists hold, read and written by index.",
};

/* The getter of data descriptor ``name`` of ``type``, if it is a C getset (torch's are), held; else NULL. */
static PyGetSetDef *find_getter(PyObject *type, PyObject *name) {
    PyObject *descr = _PyType_Lookup((PyTypeObject *)type, name); /* borrowed */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyGetSetDescr_Type))
        return NULL;
    Py_INCREF(descr);
    Py_XSETREF(held_getters[name == s_dtype ? 0 : 1], descr);
    PyGetSetDef *def = ((PyGetSetDescrObject *)descr)->d_getset;
    return def->get != NULL ? def : NULL;
}

/* The offset of ``type``'s __slots__ field ``name``, or -1 with an exception set. */
static Py_ssize_t slot_offset(PyTypeObject *type, const char *name) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type) && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX)
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ field", type->tp_name, name);
    Py_DECREF(descr);
    return offset;
}

/* configure(tensor_type, many, tensors_of, classify, started, completed, recorder_type, size_type) */
static PyObject *configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("configure", nargs, 8, 8) < 0)
        return NULL;
    if (!PyType_Check(args[0]) || !PyType_Check(args[6]) || !PyType_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "configure: the tensor, recorder and shape types must be types");
        return NULL;
    }
    PyTypeObject *rtype = (PyTypeObject *)args[6];
    if ((off_count = slot_offset(rtype, "count")) < 0 || (off_size = slot_offset(rtype, "size")) < 0 ||
        (off_slots = slot_offset(rtype, "slots")) < 0 || (off_keep = slot_offset(rtype, "keep")) < 0)
        return NULL;
    Py_XSETREF(recorder_type, (PyTypeObject *)Py_NewRef(args[6]));
    Py_XSETREF(size_type, Py_NewRef(args[7]));
    Py_XSETREF(tensor_type, Py_NewRef(args[0]));
    get_dtype = find_getter(args[0], s_dtype);
    get_shape = find_getter(args[0], s_shape);
    Py_XSETREF(many, Py_NewRef(args[1]));
    Py_XSETREF(tensors_of, Py_NewRef(args[2]));
    Py_XSETREF(classify, Py_NewRef(args[3]));
    Py_XSETREF(started, Py_NewRef(args[4]));
    Py_XSETREF(completed, Py_NewRef(args[5]));
    for (int i = 0; i < KNOWN_SIZE; i++)
        Py_CLEAR(known[i].code);
    Py_RETURN_NONE;
}

/* configure_lane(lane_type): polydist.backends.lane.Lane, whose current and since run_recorded sets */
static PyObject *configure_lane(PyObject *module, PyObject *type) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure_lane: the lane type must be a type");
        return NULL;
    }
    Py_ssize_t current = slot_offset((PyTypeObject *)type, "current"), since;
    if (current < 0 || (since = slot_offset((PyTypeObject *)type, "since")) < 0)
        return NULL;
    off_current = current;
    off_since = since;
    Py_XSETREF(lane_type, (PyTypeObject *)Py_NewRef(type));
    Py_RETURN_NONE;
}

/* use_public_walk(flag) -> the previous setting: find the caller through the public API (tests compare both) */
static PyObject *use_public_walk(PyObject *module, PyObject *flag) {
    int was = public_walk, want = PyObject_IsTrue(flag);
    if (want < 0)
        return NULL;
    public_walk = want || !INTERNAL_WALK;
    return PyBool_FromLong(was);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(tensor_type, many, tensors_of, classify, started, completed, recorder_type, size_type): the "
     "objects of polydist.collectives.recorder it works with."},
    {"configure_lane", configure_lane, METH_O, "configure_lane(lane_type): polydist.backends.lane.Lane."},
    {"record_op", (PyCFunction)(void (*)(void))record_op, METH_FASTCALL,
     "record_op(recorder, res, name, seq, op, root, x, async_op, ring) -> record: recorder.record_op, compiled."},
    {"run_recorded", (PyCFunction)(void (*)(void))run_recorded, METH_FASTCALL,
     "run_recorded(recorder, lane, res, name, seq, op, x, ring, fn, *args): work.run_recorded, compiled."},
    {"use_public_walk", use_public_walk, METH_O,
     "use_public_walk(flag) -> bool: find callers through PyFrame_GetBack (tests); returns the previous setting."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_record",
                                        "The flight recorder's per-call path, compiled (see _record.c).", -1, methods};

PyMODINIT_FUNC PyInit__record(void) {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {{&s_fail, "fail"}, {&s_dtype, "dtype"}, {&s_shape, "shape"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    }
    if (PyType_Ready(&RecordType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module != NULL && (PyModule_AddObjectRef(module, "Record", (PyObject *)&RecordType) < 0 ||
                           PyModule_AddIntConstant(module, "INTERNAL_WALK", INTERNAL_WALK) < 0 ||
                           PyModule_AddStringConstant(module, "SOURCE", POLYDIST_RECORD_SOURCE) < 0)) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
