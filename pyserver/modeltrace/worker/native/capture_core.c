/* The capture's per-call path in C (`worker/capture.py`), part of the `modeltrace_moments` extension module
 * (included by moments.c where it is built against Python's headers).
 *
 * `Wrapper` stands in for one module's `_call_impl` while a capture runs, as the Python closure that
 * `ModuleCapture._make_call` makes would (the closure is kept in it, and runs instead wherever this path does not
 * apply). `Session` is what a capture that this path serves hands its wrappers: the capture's records, call stack,
 * call counts and summary cache, and the Python functions for everything off the common path.
 *
 * With statistics only, a call costs what the closure's Python would in a fraction of the time: the call count,
 * the call site (the first frame of model code, through `source_map`'s caches), the walk over its arguments and
 * output (`_summarize_arguments`, `_summarize_all` and `iter_tensor_leaves`: the same keys, order and limits), the
 * summaries of a tensor the pass has seen (`SummaryCache`'s dicts, read here) or of a new contiguous float32 CPU
 * tensor (this module's kernel, then `stats.summary_from_moments`'s arithmetic, so the numbers are the Python
 * path's to the bit), and the `ModuleCall` record, made as its __init__ would. Every other case calls the same
 * Python the closure calls (`SummaryCache.copy`, `_view_summary`, `summarize_new`, `source_map.frame_location`),
 * so both paths make the same records, objects and caches.
 */
#include <frameobject.h>
#include <structmember.h>

static PyObject *core_str_version, *core_str_dtype, *core_str_shape, *core_str_data_ptr, *core_str_numel,
    *core_str_is_contiguous, *core_str_is_cpu, *core_str_is_neg, *core_str_key, *core_str_f_trace,
    *core_str_finished, *core_str_empty, *core_str_cpu, *core_str_slots, *core_one, *core_zero;

/* the fields of records.TensorSummary and records.ModuleCall, in their order (checked when a Session is made) */
#define SUMMARY_FIELDS 15
#define RECORD_FIELDS 12
static const char *summary_field_names[SUMMARY_FIELDS] = {
    "key", "shape", "dtype", "device", "mean", "std", "min", "max", "abs_max", "nan_count", "inf_count",
    "positive_fraction", "tensor", "not_stored", "placement"};
static const char *record_field_names[RECORD_FIELDS] = {
    "index", "path", "class_name", "defined_at", "called_at", "call_index", "parent", "finish_order", "call_site",
    "inputs", "outputs", "device"};
enum { RECORD_FINISH_ORDER = 7, RECORD_OUTPUTS = 10, RECORD_DEVICE = 11, SUMMARY_PLACEMENT = 14 };

/* The offsets of `names` in a class made by `@dataclass(slots=True)`: each must be a slot of its own. */
static int slot_offsets(PyObject *type, const char **names, int count, Py_ssize_t *offsets) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "expected a class");
        return -1;
    }
    /* NOTE: an interned name: a new string per lookup would stay in the type attribute cache */
    PyObject *fields = PyObject_GetAttr(type, core_str_slots);
    if (fields == NULL)
        return -1;
    Py_ssize_t found = PySequence_Size(fields);
    Py_DECREF(fields);
    if (found != count) {
        PyErr_Format(PyExc_TypeError, "%s has %zd slots, the C call path knows %d: rebuild it beside the records",
                     ((PyTypeObject *)type)->tp_name, found, count);
        return -1;
    }
    for (int index = 0; index < count; index++) {
        PyObject *descriptor = PyDict_GetItemString(((PyTypeObject *)type)->tp_dict, names[index]);
        if (descriptor == NULL || Py_TYPE(descriptor) != &PyMemberDescr_Type ||
            ((PyMemberDescrObject *)descriptor)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot: the C call path cannot make its records",
                         ((PyTypeObject *)type)->tp_name, names[index]);
            return -1;
        }
        offsets[index] = ((PyMemberDescrObject *)descriptor)->d_member->offset;
    }
    return 0;
}

/* A new instance of a slotted class with `values` (borrowed) in its fields, as its __init__ would leave it. */
static PyObject *new_slotted(PyObject *type, const Py_ssize_t *offsets, PyObject **values, int count) {
    PyObject *object = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    if (object == NULL)
        return NULL;
    for (int index = 0; index < count; index++) {
        Py_INCREF(values[index]);
        *(PyObject **)((char *)object + offsets[index]) = values[index];
    }
    return object;
}

/* Replace one field of an object made by new_slotted (the reference to `value` is taken over). */
static void set_slot(PyObject *object, Py_ssize_t offset, PyObject *value) {
    PyObject **slot = (PyObject **)((char *)object + offset);
    PyObject *old = *slot;
    *slot = value;
    Py_XDECREF(old);
}

static PyObject *slot(PyObject *object, Py_ssize_t offset) { return *(PyObject **)((char *)object + offset); }

typedef struct {
    PyObject_HEAD
    PyObject *capture;            /* the ModuleCapture */
    PyObject *records, *stack, *counts, *devices;
    PyObject *entries, *spans, *copies; /* SummaryCache._entries, ._spans, ._copies */
    PyObject *copy;               /* SummaryCache.copy(summary, key) */
    PyObject *view_summary;       /* SummaryCache._view_summary(entry, tensor, key, version, contiguous) */
    PyObject *summarize_new;      /* SummaryCache.summarize_new(tensor, key, version, pending) */
    PyObject *pending;
    PyObject *max_leaves_object, *max_nesting_object; /* capture.MAX_LEAVES_PER_SIDE, capture.MAX_NESTING */
    PyObject *module_call;        /* the ModuleCall class */
    PyObject *plumbing_cache, *plumbing; /* source_map._plumbing_cache, source_map._plumbing(code) */
    PyObject *location_cache, *frame_location; /* source_map._location_cache, source_map.frame_location(frame) */
    PyObject *tensor_type, *parameter_type, *float32, *float32_name;
    PyObject *summary_type;       /* TensorSummary */
    PyObject *late_copies;        /* SummaryCache._late_copies */
    double cancellation_ratio;    /* stats._CANCELLATION_RATIO */
    Py_ssize_t max_leaves, max_nesting;
    /* where each field of a TensorSummary and of a ModuleCall lives in the object (their __slots__), so that
     * the records are made here as their __init__ would make them, without running it */
    Py_ssize_t summary_offsets[SUMMARY_FIELDS], record_offsets[RECORD_FIELDS];
} Session;

static int session_init(Session *self, PyObject *args, PyObject *kwds) {
    PyObject **fields[] = {&self->capture,        &self->records,         &self->stack,
                           &self->counts,         &self->devices,         &self->entries,
                           &self->spans,          &self->copies,          &self->copy,
                           &self->view_summary,   &self->summarize_new,   &self->pending,
                           &self->max_leaves_object, &self->max_nesting_object,
                           &self->module_call,    &self->plumbing_cache,  &self->plumbing,
                           &self->location_cache, &self->frame_location,  &self->tensor_type,
                           &self->parameter_type, &self->float32,         &self->float32_name,
                           &self->summary_type,   &self->late_copies};
    const Py_ssize_t count = sizeof fields / sizeof fields[0];
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "Session takes positional arguments only");
        return -1;
    }
    /* the fields above, then stats._CANCELLATION_RATIO */
    if (PyTuple_GET_SIZE(args) != count + 1) {
        PyErr_Format(PyExc_TypeError, "Session takes %zd arguments, got %zd", count + 1, PyTuple_GET_SIZE(args));
        return -1;
    }
    self->cancellation_ratio = PyFloat_AsDouble(PyTuple_GET_ITEM(args, count));
    if (self->cancellation_ratio == -1.0 && PyErr_Occurred())
        return -1;
    self->max_leaves = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, 12));
    self->max_nesting = self->max_leaves < 0 ? -1 : PyLong_AsSsize_t(PyTuple_GET_ITEM(args, 13));
    if (self->max_leaves < 0 || self->max_nesting < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "Session: the limits on leaves and nesting must be counts");
        return -1;
    }
    if (!PyList_Check(PyTuple_GET_ITEM(args, count - 1))) {
        PyErr_SetString(PyExc_TypeError, "Session: the late copies must be a list");
        return -1;
    }
    if (slot_offsets(PyTuple_GET_ITEM(args, 14), record_field_names, RECORD_FIELDS, self->record_offsets) < 0 ||
        slot_offsets(PyTuple_GET_ITEM(args, count - 2), summary_field_names, SUMMARY_FIELDS,
                     self->summary_offsets) < 0)
        return -1;
    if (!PyList_Check(PyTuple_GET_ITEM(args, 1)) || !PyList_Check(PyTuple_GET_ITEM(args, 2)) ||
        !PyDict_Check(PyTuple_GET_ITEM(args, 3)) || !PyDict_Check(PyTuple_GET_ITEM(args, 4)) ||
        !PyDict_Check(PyTuple_GET_ITEM(args, 5)) || !PyDict_Check(PyTuple_GET_ITEM(args, 6)) ||
        !PyDict_Check(PyTuple_GET_ITEM(args, 7)) || !PyDict_Check(PyTuple_GET_ITEM(args, 15)) ||
        !PyDict_Check(PyTuple_GET_ITEM(args, 17))) {
        PyErr_SetString(PyExc_TypeError, "Session: records and stack must be lists, the caches dicts");
        return -1;
    }
    for (Py_ssize_t index = 0; index < count; index++) {
        PyObject *value = PyTuple_GET_ITEM(args, index);
        Py_INCREF(value);
        Py_XSETREF(*fields[index], value);
    }
    return 0;
}

static int session_traverse(Session *self, visitproc visit, void *arg) {
    Py_VISIT(self->capture); Py_VISIT(self->records); Py_VISIT(self->stack); Py_VISIT(self->counts);
    Py_VISIT(self->devices); Py_VISIT(self->entries); Py_VISIT(self->spans); Py_VISIT(self->copies);
    Py_VISIT(self->copy); Py_VISIT(self->view_summary); Py_VISIT(self->summarize_new); Py_VISIT(self->pending);
    Py_VISIT(self->max_leaves_object); Py_VISIT(self->max_nesting_object);
    Py_VISIT(self->module_call); Py_VISIT(self->plumbing_cache); Py_VISIT(self->plumbing);
    Py_VISIT(self->location_cache); Py_VISIT(self->frame_location); Py_VISIT(self->tensor_type);
    Py_VISIT(self->parameter_type); Py_VISIT(self->float32); Py_VISIT(self->float32_name);
    Py_VISIT(self->summary_type); Py_VISIT(self->late_copies);
    return 0;
}

static int session_clear(Session *self) {
    Py_CLEAR(self->capture); Py_CLEAR(self->records); Py_CLEAR(self->stack); Py_CLEAR(self->counts);
    Py_CLEAR(self->devices); Py_CLEAR(self->entries); Py_CLEAR(self->spans); Py_CLEAR(self->copies);
    Py_CLEAR(self->copy); Py_CLEAR(self->view_summary); Py_CLEAR(self->summarize_new); Py_CLEAR(self->pending);
    Py_CLEAR(self->max_leaves_object); Py_CLEAR(self->max_nesting_object);
    Py_CLEAR(self->module_call); Py_CLEAR(self->plumbing_cache); Py_CLEAR(self->plumbing);
    Py_CLEAR(self->location_cache); Py_CLEAR(self->frame_location); Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->parameter_type); Py_CLEAR(self->float32); Py_CLEAR(self->float32_name);
    Py_CLEAR(self->summary_type); Py_CLEAR(self->late_copies);
    return 0;
}

static void session_dealloc(Session *self) {
    PyObject_GC_UnTrack(self);
    session_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *summary_of(Session *session, PyObject *tensor, PyObject *key);

/* Session.summary(tensor, key, index, side): `ModuleCapture._summary` for statistics, for the Python walks over
 * argument lists and outputs (`_summarize_all`) while this session serves the capture. */
static PyObject *session_summary(Session *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "summary(tensor, key, index, side)");
        return NULL;
    }
    if (self->entries == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a cleared capture session");
        return NULL;
    }
    return summary_of(self, args[0], args[1]);
}

static PyMethodDef session_methods[] = {
    {"summary", (PyCFunction)(void (*)(void))session_summary, METH_FASTCALL,
     "the summary of a tensor under a key, as ModuleCapture._summary makes it (statistics only)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "modeltrace_moments.Session",
    .tp_doc = "What a capture served by the C call path hands its wrappers (see capture_core.c).",
    .tp_basicsize = sizeof(Session),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)session_init,
    .tp_traverse = (traverseproc)session_traverse,
    .tp_clear = (inquiry)session_clear,
    .tp_dealloc = (destructor)session_dealloc,
    .tp_methods = session_methods,
};

/* What the weak reference `ref` points to, as a new (strong) reference; NULL, with no error set, where it is gone
 * or `ref` is not a weak reference. Strong, because a borrowed target can be freed under the caller by any call
 * that runs Python or allocates (a collection); `PyWeakref_GetRef` where there is one (3.13: the borrowing
 * `PyWeakref_GET_OBJECT` is deprecated there, to be removed). */
static PyObject *weak_target(PyObject *ref) {
    if (!PyWeakref_Check(ref))
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return target;
#else
    PyObject *target = PyWeakref_GET_OBJECT(ref);
    return target == Py_None ? NULL : Py_NewRef(target);
#endif
}

/* Whether the weak reference `ref` points to `object` (an identity test: nothing is kept). */
static int weak_target_is(PyObject *ref, PyObject *object) {
    PyObject *target = weak_target(ref);
    Py_XDECREF(target);
    return target == object;
}

/* A tensor's version counter, -1 for an inference tensor (which raises RuntimeError); -2 with another error set. */
static long tensor_version(PyObject *tensor) {
    PyObject *value = PyObject_GetAttr(tensor, core_str_version);
    if (value == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError))
            return -2;
        PyErr_Clear();
        return -1;
    }
    long version = PyLong_AsLong(value);
    Py_DECREF(value);
    if (version == -1 && PyErr_Occurred())
        return -2;
    return version;
}

/* entries[id] = (weakref, version, summary), and spans[span] too when `span` is given (a contiguous tensor). */
static int cache_summary(Session *session, PyObject *identity, PyObject *tensor, long version, PyObject *summary,
                         PyObject *span) {
    if (version < 0)
        return 0;
    PyObject *reference = PyWeakref_NewRef(tensor, NULL);
    if (reference == NULL)
        return -1;
    PyObject *entry = Py_BuildValue("(NlO)", reference, version, summary);
    if (entry == NULL)
        return -1;
    int status = PyDict_SetItem(session->entries, identity, entry);
    if (status == 0 && span != NULL)
        status = PyDict_SetItem(session->spans, span, entry);
    Py_DECREF(entry);
    return status;
}

/* `stats.summary_from_moments` (key, shape, "float32", count, moments): the same summary to the bit, or Py_None
 * where it gives None (new references). Its arithmetic is Python's, one IEEE operation at a time: the volatile
 * temporaries keep the compiler from fusing a product into a subtraction (FMA) or reordering, which this build's
 * flags (-fassociative-math, -fno-signed-zeros) would otherwise allow. */
static PyObject *summary_from_moments(Session *session, PyObject *key, PyObject *shape, long long count,
                                      const double *moments) {
    double total = moments[0], squares = moments[1], minimum = moments[3], maximum = moments[4];
    volatile double positive_fraction = moments[2] / (double)count;
    volatile double zero = 0.0;
    double mean, deviation;
    if (minimum == maximum && isfinite(total) && isfinite(squares)) {
        mean = minimum + zero; /* every value equal: `float(minimum) + 0.0`, a -0.0 made 0.0 */
        deviation = 0.0;
    } else {
        volatile double average = total / (double)count;
        volatile double product = total * average;
        volatile double difference = squares - product;
        volatile double variance = difference / (double)(count - 1);
        volatile double mean_square = average * average;
        volatile double bound = session->cancellation_ratio * variance;
        if (!(0 < variance && variance < INFINITY && mean_square <= bound))
            Py_RETURN_NONE;
        mean = average;
        deviation = sqrt(variance);
    }
    double negated = -minimum;
    PyObject *numbers[6] = {PyFloat_FromDouble(mean), PyFloat_FromDouble(deviation), PyFloat_FromDouble(minimum),
                            PyFloat_FromDouble(maximum), PyFloat_FromDouble(negated > maximum ? negated : maximum),
                            PyFloat_FromDouble(positive_fraction)};
    PyObject *summary = NULL;
    if (numbers[0] && numbers[1] && numbers[2] && numbers[3] && numbers[4] && numbers[5]) {
        PyObject *values[SUMMARY_FIELDS] = {key,        shape,      session->float32_name, core_str_cpu,
                                            numbers[0], numbers[1], numbers[2],            numbers[3],
                                            numbers[4], core_zero,  core_zero,             numbers[5],
                                            Py_None,    Py_None,    Py_None};
        summary = new_slotted(session->summary_type, session->summary_offsets, values, SUMMARY_FIELDS);
    }
    for (int index = 0; index < 6; index++)
        Py_XDECREF(numbers[index]);
    return summary;
}

/* `SummaryCache.copy(source, key)`: the summary under another key, shared per source and key (new reference). */
static PyObject *copy_summary(Session *session, PyObject *source, PyObject *key, PyObject *copy_key) {
    PyObject *values[SUMMARY_FIELDS];
    values[0] = key;
    for (int index = 1; index < SUMMARY_FIELDS; index++)
        values[index] = slot(source, session->summary_offsets[index]);
    values[SUMMARY_PLACEMENT] = Py_None; /* as the Python method: a copy does not carry a placement */
    for (int index = 1; index < SUMMARY_FIELDS; index++)
        if (values[index] == NULL) { /* a field never set: the Python method says what is wrong */
            return PyObject_CallFunctionObjArgs(session->copy, source, key, NULL);
        }
    PyObject *copy = new_slotted(session->summary_type, session->summary_offsets, values, SUMMARY_FIELDS);
    if (copy == NULL)
        return NULL;
    PyObject *pair = PyTuple_Pack(2, source, copy);
    if (pair == NULL || PyDict_SetItem(session->copies, copy_key, pair) < 0) {
        Py_XDECREF(pair);
        Py_DECREF(copy);
        return NULL;
    }
    Py_DECREF(pair);
    /* statistics still to come (a device tensor's, at PendingStats.resolve): the copy gets them in clear() */
    if (values[11] == Py_None && values[4] == Py_None) {
        PyObject *late = PyTuple_Pack(2, source, copy);
        if (late == NULL || PyList_Append(session->late_copies, late) < 0) {
            Py_XDECREF(late);
            Py_DECREF(copy);
            return NULL;
        }
        Py_DECREF(late);
    }
    return copy;
}

/* `SummaryCache._view_summary` for a contiguous `tensor` over the span of a summarised one (`entry`): its summary
 * copied (not shared) under `key` with the view's own shape, or Py_None where the source is gone or either was
 * changed since (new references). */
static PyObject *view_summary(Session *session, PyObject *entry, PyObject *tensor, PyObject *key, long version) {
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3)
        Py_RETURN_NONE;
    long recorded = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
    if (recorded == -1 && PyErr_Occurred())
        return NULL;
    if (version < 0 || version != recorded)
        Py_RETURN_NONE;
    PyObject *source = weak_target(PyTuple_GET_ITEM(entry, 0));
    if (source == NULL)
        Py_RETURN_NONE;
    long source_version = tensor_version(source);
    Py_DECREF(source);
    if (source_version == -2)
        return NULL;
    if (source_version != version)
        Py_RETURN_NONE;
    PyObject *cached = PyTuple_GET_ITEM(entry, 2);
    if (Py_TYPE(cached) != (PyTypeObject *)session->summary_type)
    {
        PyObject *version_object = PyLong_FromLong(version);
        PyObject *view = version_object == NULL ? NULL
            : PyObject_CallFunctionObjArgs(session->view_summary, entry, tensor, key, version_object, Py_True, NULL);
        Py_XDECREF(version_object);
        return view;
    }
    PyObject *shape = PyObject_GetAttr(tensor, core_str_shape);
    PyObject *shape_list = shape ? PySequence_List(shape) : NULL;
    Py_XDECREF(shape);
    if (shape_list == NULL)
        return NULL;
    PyObject *values[SUMMARY_FIELDS];
    values[0] = key;
    for (int index = 1; index < SUMMARY_FIELDS; index++)
        values[index] = slot(cached, session->summary_offsets[index]);
    values[1] = shape_list;
    values[12] = Py_None;                /* tensor: a view is never the stored tensor */
    values[SUMMARY_PLACEMENT] = Py_None;
    for (int index = 0; index < SUMMARY_FIELDS; index++)
        if (values[index] == NULL) {
            Py_DECREF(shape_list);
            PyErr_SetString(PyExc_AttributeError, "a summary with a field never set");
            return NULL;
        }
    PyObject *copy = new_slotted(session->summary_type, session->summary_offsets, values, SUMMARY_FIELDS);
    Py_DECREF(shape_list);
    if (copy != NULL && values[11] == Py_None && values[4] == Py_None) {
        PyObject *late = PyTuple_Pack(2, cached, copy);
        if (late == NULL || PyList_Append(session->late_copies, late) < 0)
            Py_CLEAR(copy);
        Py_XDECREF(late);
    }
    return copy;
}

/* SummaryCache.summarize_new's common case (a plain contiguous float32 CPU tensor, nothing shares its span):
 * the summary, cached; NULL with no error set where the Python method must decide instead. */
static PyObject *summarize_float32(Session *session, PyObject *tensor, PyObject *key, long version,
                                   PyObject *identity) {
    PyTypeObject *type = Py_TYPE(tensor);
    if ((PyObject *)type != session->tensor_type && (PyObject *)type != session->parameter_type)
        return NULL;
    PyObject *result = NULL, *dtype = NULL, *is_cpu = NULL, *address = NULL, *numel = NULL, *contiguous = NULL;
    PyObject *span = NULL, *negative = NULL, *shape = NULL, *shape_list = NULL;
    is_cpu = PyObject_GetAttr(tensor, core_str_is_cpu);
    if (is_cpu != Py_True)
        goto done;
    dtype = PyObject_GetAttr(tensor, core_str_dtype);
    if (dtype == NULL)
        goto done;
    address = PyObject_CallMethodNoArgs(tensor, core_str_data_ptr);
    if (address == NULL) {
        PyErr_Clear(); /* a tensor without storage: the Python method knows what to do with it */
        goto done;
    }
    numel = PyObject_CallMethodNoArgs(tensor, core_str_numel);
    contiguous = numel ? PyObject_CallMethodNoArgs(tensor, core_str_is_contiguous) : NULL;
    if (contiguous == NULL)
        goto done;
    span = PyTuple_Pack(3, address, numel, dtype);
    if (span == NULL)
        goto done;
    if (PyDict_GET_SIZE(session->spans) > 0) {
        PyObject *entry = PyDict_GetItemWithError(session->spans, span);
        if (entry == NULL && PyErr_Occurred())
            goto done;
        if (entry != NULL) {
            /* a view of a summarised tensor: its summary, with the view's shape (a strided one: the Python
             * method, which checks that it is dense over the span) */
            PyObject *view;
            if (contiguous == Py_True) {
                view = view_summary(session, entry, tensor, key, version);
            } else {
                PyObject *version_object = PyLong_FromLong(version);
                view = version_object == NULL ? NULL
                    : PyObject_CallFunctionObjArgs(session->view_summary, entry, tensor, key, version_object,
                                                   contiguous, NULL);
                Py_XDECREF(version_object);
            }
            if (view == NULL)
                goto done;
            if (view == Py_None) {
                /* not shareable (most often a tensor gone whose memory the allocator gave this one): summarised
                 * anew below, as the Python method does, and its span entry replaced */
                Py_DECREF(view);
                goto fresh;
            }
            PyObject *reference = PyWeakref_NewRef(tensor, NULL);
            PyObject *cached = reference ? Py_BuildValue("(NlO)", reference, version, view) : NULL;
            if (cached == NULL || PyDict_SetItem(session->entries, identity, cached) < 0) {
                Py_XDECREF(cached);
                Py_DECREF(view);
                goto done;
            }
            Py_DECREF(cached);
            result = view;
            goto done;
        }
    }
fresh:
    if (dtype != session->float32 || contiguous != Py_True)
        goto done;
    long long count = PyLong_AsLongLong(numel);
    if (count <= 1 || PyErr_Occurred())
        goto done;
    negative = PyObject_CallMethodNoArgs(tensor, core_str_is_neg);
    if (negative != Py_False)
        goto done;
    const float *values = PyLong_AsVoidPtr(address);
    if (values == NULL)
        goto done;
    double out[5];
    if (count >= PARALLEL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        modeltrace_moments_f32(values, count, out);
        Py_END_ALLOW_THREADS
    } else {
        modeltrace_moments_f32(values, count, out);
    }
    shape = PyObject_GetAttr(tensor, core_str_shape);
    shape_list = shape ? PySequence_List(shape) : NULL;
    if (shape_list == NULL)
        goto done;
    PyObject *summary = summary_from_moments(session, key, shape_list, count, out);
    if (summary == NULL)
        goto done;
    if (summary == Py_None) {
        Py_DECREF(summary); /* not exact from the moments: the Python method's general path */
        goto done;
    }
    if (cache_summary(session, identity, tensor, version, summary, span) < 0) {
        Py_DECREF(summary);
        goto done;
    }
    result = summary;
done:
    Py_XDECREF(dtype); Py_XDECREF(is_cpu); Py_XDECREF(address); Py_XDECREF(numel); Py_XDECREF(contiguous);
    Py_XDECREF(span); Py_XDECREF(negative); Py_XDECREF(shape); Py_XDECREF(shape_list);
    return result;
}

/* `ModuleCapture._summary` for statistics only: the summary of `tensor` under `key` (new reference) or NULL. */
static PyObject *summary_of(Session *session, PyObject *tensor, PyObject *key) {
    long version = tensor_version(tensor);
    if (version == -2)
        return NULL;
    PyObject *identity = PyLong_FromVoidPtr(tensor);
    if (identity == NULL)
        return NULL;
    PyObject *result = NULL;
    PyObject *entry = PyDict_GetItemWithError(session->entries, identity);
    if (entry == NULL && PyErr_Occurred())
        goto done;
    if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 3 &&
        PyLong_AsLong(PyTuple_GET_ITEM(entry, 1)) == version &&
        weak_target_is(PyTuple_GET_ITEM(entry, 0), tensor)) {
        PyObject *summary = PyTuple_GET_ITEM(entry, 2);
        PyObject *own_key = PyObject_GetAttr(summary, core_str_key);
        if (own_key == NULL)
            goto done;
        int same = PyObject_RichCompareBool(own_key, key, Py_EQ);
        Py_DECREF(own_key);
        if (same < 0)
            goto done;
        if (same) {
            Py_INCREF(summary);
            result = summary;
            goto done;
        }
        /* under another key: the copy the cache shares per summary and key, else the Python method makes it */
        PyObject *source_identity = PyLong_FromVoidPtr(summary);
        PyObject *copy_key = source_identity ? PyTuple_Pack(2, source_identity, key) : NULL;
        Py_XDECREF(source_identity);
        if (copy_key == NULL)
            goto done;
        PyObject *shared = PyDict_GetItemWithError(session->copies, copy_key);
        if (shared == NULL && PyErr_Occurred()) {
            Py_DECREF(copy_key);
            goto done;
        }
        if (shared != NULL && PyTuple_CheckExact(shared) && PyTuple_GET_SIZE(shared) == 2 &&
            PyTuple_GET_ITEM(shared, 0) == summary) {
            result = PyTuple_GET_ITEM(shared, 1);
            Py_INCREF(result);
        } else if (Py_TYPE(summary) == (PyTypeObject *)session->summary_type) {
            result = copy_summary(session, summary, key, copy_key);
        } else {
            result = PyObject_CallFunctionObjArgs(session->copy, summary, key, NULL);
        }
        Py_DECREF(copy_key);
        goto done;
    }
    if (PyErr_Occurred())
        goto done;
    result = summarize_float32(session, tensor, key, version, identity);
    if (result == NULL && !PyErr_Occurred()) {
        PyObject *version_object = PyLong_FromLong(version);
        if (version_object != NULL)
            result = PyObject_CallFunctionObjArgs(session->summarize_new, tensor, key, version_object,
                                                  session->pending, NULL);
        Py_XDECREF(version_object);
    }
done:
    Py_DECREF(identity);
    return result;
}

/* Whether `code` is plumbing (torch, modeltrace, transformers' wrappers), through source_map's cache: 1, 0, -1. */
static int is_plumbing(Session *session, PyCodeObject *code) {
    PyObject *identity = PyLong_FromVoidPtr(code);
    if (identity == NULL)
        return -1;
    PyObject *known = PyDict_GetItemWithError(session->plumbing_cache, identity);
    Py_DECREF(identity);
    if (known != NULL && PyTuple_CheckExact(known) && PyTuple_GET_SIZE(known) == 2 &&
        PyTuple_GET_ITEM(known, 0) == (PyObject *)code)
        return PyObject_IsTrue(PyTuple_GET_ITEM(known, 1));
    if (PyErr_Occurred())
        return -1;
    PyObject *answer = PyObject_CallOneArg(session->plumbing, (PyObject *)code);
    if (answer == NULL)
        return -1;
    int result = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return result;
}

/* `source_map.caller_location(2)` from inside the wrapper: sets *location and *offset (new references; None, None
 * where no frame is model code). Returns -1 with an error set. */
static int call_site(Session *session, PyObject **location, PyObject **offset) {
    PyFrameObject *frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int plumbing = is_plumbing(session, code);
        if (plumbing < 0) {
            Py_DECREF(code);
            Py_DECREF(frame);
            return -1;
        }
        if (!plumbing) {
            int lasti = PyFrame_GetLasti(frame);
            PyObject *trace = PyObject_GetAttr((PyObject *)frame, core_str_f_trace);
            PyObject *found = NULL;
            if (trace == Py_None) {
                /* an untraced frame: its line follows from the offset, so the cached location is shared */
                PyObject *identity = PyLong_FromVoidPtr(code);
                PyObject *lasti_object = PyLong_FromLong(lasti);
                PyObject *cache_key = identity && lasti_object ? PyTuple_Pack(2, identity, lasti_object) : NULL;
                PyObject *cached = cache_key ? PyDict_GetItemWithError(session->location_cache, cache_key) : NULL;
                if (cached != NULL && PyTuple_CheckExact(cached) && PyTuple_GET_SIZE(cached) == 2 &&
                    PyTuple_GET_ITEM(cached, 0) == (PyObject *)code) {
                    *location = PyTuple_GET_ITEM(cached, 1);
                    Py_INCREF(*location);
                    *offset = lasti_object;
                    lasti_object = NULL;
                    found = Py_None;
                }
                Py_XDECREF(identity);
                Py_XDECREF(lasti_object);
                Py_XDECREF(cache_key);
            }
            Py_XDECREF(trace);
            Py_DECREF(code);
            if (found == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(frame);
                    return -1;
                }
                /* a traced frame (line capture), or a site not cached yet: the Python function decides */
                PyObject *pair = PyObject_CallOneArg(session->frame_location, (PyObject *)frame);
                Py_DECREF(frame);
                if (pair == NULL)
                    return -1;
                if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
                    Py_DECREF(pair);
                    PyErr_SetString(PyExc_TypeError, "frame_location must return (location, offset)");
                    return -1;
                }
                *location = PyTuple_GET_ITEM(pair, 0);
                *offset = PyTuple_GET_ITEM(pair, 1);
                Py_INCREF(*location);
                Py_INCREF(*offset);
                Py_DECREF(pair);
                return 0;
            }
            Py_DECREF(frame);
            return 0;
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    *location = Py_None;
    *offset = Py_None;
    return 0;
}

typedef struct {
    PyObject_HEAD
    PyObject *live;           /* [session]: None, the Python session tuple, or (…, Session) */
    PyObject *fallback;       /* the Python closure */
    PyObject *module_ref;     /* weak: the cache of wrappers must not keep the model alive */
    PyObject *call_impl;      /* the class's `_call_impl` */
    PyObject *path, *class_name, *class_location, *first_name, *parameter_names;
} Wrapper;

static int wrapper_init(Wrapper *self, PyObject *args, PyObject *kwds) {
    PyObject *live, *fallback, *module_ref, *call_impl, *path, *class_name, *class_location, *first_name, *names;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "Wrapper takes positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!OOOUUOOO!", &PyList_Type, &live, &fallback, &module_ref, &call_impl, &path,
                          &class_name, &class_location, &first_name, &PyList_Type, &names))
        return -1;
    if (!PyWeakref_CheckRef(module_ref)) {
        PyErr_SetString(PyExc_TypeError, "Wrapper: module_ref must be a weak reference");
        return -1;
    }
    if (PyList_GET_SIZE(live) != 1) {
        PyErr_SetString(PyExc_ValueError, "Wrapper: live must be a list of one item");
        return -1;
    }
    PyObject **fields[] = {&self->live,       &self->fallback,       &self->module_ref,
                           &self->call_impl,  &self->path,           &self->class_name,
                           &self->class_location, &self->first_name, &self->parameter_names};
    PyObject *values[] = {live, fallback, module_ref, call_impl, path, class_name, class_location, first_name, names};
    for (size_t index = 0; index < sizeof values / sizeof values[0]; index++) {
        Py_INCREF(values[index]);
        Py_XSETREF(*fields[index], values[index]);
    }
    return 0;
}

static int wrapper_traverse(Wrapper *self, visitproc visit, void *arg) {
    Py_VISIT(self->live); Py_VISIT(self->fallback); Py_VISIT(self->module_ref); Py_VISIT(self->call_impl);
    Py_VISIT(self->path); Py_VISIT(self->class_name); Py_VISIT(self->class_location); Py_VISIT(self->first_name);
    Py_VISIT(self->parameter_names);
    return 0;
}

static int wrapper_clear(Wrapper *self) {
    Py_CLEAR(self->live); Py_CLEAR(self->fallback); Py_CLEAR(self->module_ref); Py_CLEAR(self->call_impl);
    Py_CLEAR(self->path); Py_CLEAR(self->class_name); Py_CLEAR(self->class_location); Py_CLEAR(self->first_name);
    Py_CLEAR(self->parameter_names);
    return 0;
}

static void wrapper_dealloc(Wrapper *self) {
    PyObject_GC_UnTrack(self);
    wrapper_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}


/* ModuleCapture._summarize_all and iter_tensor_leaves, in C: the summaries of the tensors a call's arguments or
 * output hold, appended to `summaries` in the order and under the keys the Python walk gives them, at most
 * `max_leaves` of them, containers followed `max_nesting` deep. Each returns 0 to go on, 1 once the side is full
 * (the walk stops there, as the Python one returns), -1 on an error. */
static int walk_leaves(Session *session, PyObject *summaries, PyObject *value, PyObject *prefix,
                       Py_ssize_t depth);

static int add_leaf(Session *session, PyObject *summaries, PyObject *tensor, PyObject *key) {
    if (PyList_GET_SIZE(summaries) >= session->max_leaves)
        return 1;
    PyObject *summary = summary_of(session, tensor, key);
    if (summary == NULL)
        return -1;
    int status = PyList_Append(summaries, summary);
    Py_DECREF(summary);
    return status;
}

/* `f"{prefix}.{name}" if prefix else str(name)` (new reference) */
static PyObject *leaf_key(PyObject *prefix, PyObject *name) {
    if (PyUnicode_GET_LENGTH(prefix) == 0)
        return PyObject_Str(name);
    PyObject *formatted = PyObject_Format(name, core_str_empty);
    if (formatted == NULL)
        return NULL;
    PyObject *key = PyUnicode_FromFormat("%U.%U", prefix, formatted);
    Py_DECREF(formatted);
    return key;
}

/* one item of a container: a tensor is a leaf, anything else is walked one level deeper */
static int walk_item(Session *session, PyObject *summaries, PyObject *prefix, PyObject *name, PyObject *item,
                     Py_ssize_t depth) {
    PyObject *key = leaf_key(prefix, name);
    if (key == NULL)
        return -1;
    int status = PyObject_TypeCheck(item, (PyTypeObject *)session->tensor_type)
                     ? add_leaf(session, summaries, item, key)
                     : walk_leaves(session, summaries, item, key, depth + 1);
    Py_DECREF(key);
    return status;
}

static int walk_leaves(Session *session, PyObject *summaries, PyObject *value, PyObject *prefix,
                       Py_ssize_t depth) {
    if (depth >= session->max_nesting)
        return 0;
    int status = 0;
    if (PyDict_CheckExact(value)) {
        PyObject *name, *item;
        Py_ssize_t position = 0;
        while (status == 0 && PyDict_Next(value, &position, &name, &item)) {
            Py_INCREF(name);
            Py_INCREF(item);
            status = walk_item(session, summaries, prefix, name, item, depth);
            Py_DECREF(name);
            Py_DECREF(item);
        }
        return status;
    }
    if (PyTuple_CheckExact(value) || PyList_CheckExact(value)) {
        for (Py_ssize_t index = 0; status == 0 && index < PySequence_Fast_GET_SIZE(value); index++) {
            PyObject *item = PySequence_Fast_GET_ITEM(value, index);
            PyObject *name = PyLong_FromSsize_t(index);
            if (name == NULL)
                return -1;
            Py_INCREF(item);
            status = walk_item(session, summaries, prefix, name, item, depth);
            Py_DECREF(item);
            Py_DECREF(name);
        }
        return status;
    }
    /* a subclass (transformers' ModelOutput, a named tuple): walked through its own `items()` or iterator */
    int is_dict = PyDict_Check(value);
    if (!is_dict && !PyTuple_Check(value) && !PyList_Check(value))
        return 0;
    PyObject *items = is_dict ? PyObject_CallMethod(value, "items", NULL) : NULL;
    if (is_dict && items == NULL)
        return -1; /* its `items()` raised: raised from the call, as the Python walk does */
    PyObject *iterator = PyObject_GetIter(is_dict ? items : value);
    Py_XDECREF(items);
    if (iterator == NULL)
        return -1;
    PyObject *item;
    for (Py_ssize_t index = 0; status == 0 && (item = PyIter_Next(iterator)) != NULL; index++) {
        if (is_dict) {
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
                PyErr_SetString(PyExc_TypeError, "a mapping's items() gave something other than pairs");
                status = -1;
            } else {
                status = walk_item(session, summaries, prefix, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1),
                                   depth);
            }
        } else {
            PyObject *name = PyLong_FromSsize_t(index);
            status = name == NULL ? -1 : walk_item(session, summaries, prefix, name, item, depth);
            Py_XDECREF(name);
        }
        Py_DECREF(item);
    }
    Py_DECREF(iterator);
    return status < 0 || PyErr_Occurred() ? -1 : status;
}

/* one named argument (or the output, named ""): a tensor, nothing (None, a number, a string: no tensors in
 * them), or a container walked */
static int walk_named(Session *session, PyObject *summaries, PyObject *name, PyObject *value) {
    if (PyObject_TypeCheck(value, (PyTypeObject *)session->tensor_type))
        return add_leaf(session, summaries, value, name);
    if (value == Py_None)
        return 0;
    return walk_leaves(session, summaries, value, name, 0);
}

/* `ModuleCapture._summarize_arguments`: positional arguments under `forward`'s parameter names (`args.N` past
 * them), then the keyword arguments (new reference to a list) */
static PyObject *argument_summaries(Session *session, PyObject *args, PyObject *kwargs, PyObject *names) {
    PyObject *summaries = PyList_New(0);
    if (summaries == NULL)
        return NULL;
    Py_ssize_t named = PyList_CheckExact(names) ? PyList_GET_SIZE(names) : 0;
    int status = 0;
    for (Py_ssize_t position = 0; status == 0 && position < PyTuple_GET_SIZE(args); position++) {
        PyObject *name = position < named ? PyList_GET_ITEM(names, position) : NULL;
        if (name != NULL)
            Py_INCREF(name);
        else
            name = PyUnicode_FromFormat("args.%zd", position);
        status = name == NULL ? -1 : walk_named(session, summaries, name, PyTuple_GET_ITEM(args, position));
        Py_XDECREF(name);
    }
    if (kwargs != NULL) {
        PyObject *name, *value;
        Py_ssize_t position = 0;
        while (status == 0 && PyDict_Next(kwargs, &position, &name, &value)) {
            Py_INCREF(name);
            Py_INCREF(value);
            status = walk_named(session, summaries, name, value);
            Py_DECREF(name);
            Py_DECREF(value);
        }
    }
    if (status < 0)
        Py_CLEAR(summaries);
    return summaries;
}

/* The summaries of a call's output (new reference to a list) or NULL. */
static PyObject *output_summaries(Session *session, PyObject *output) {
    if (PyObject_TypeCheck(output, (PyTypeObject *)session->tensor_type)) {
        PyObject *summary = summary_of(session, output, core_str_empty);
        return summary ? Py_BuildValue("[N]", summary) : NULL;
    }
    PyObject *summaries = PyList_New(0);
    if (summaries != NULL && walk_named(session, summaries, core_str_empty, output) < 0)
        Py_CLEAR(summaries);
    return summaries;
}

static PyObject *wrapper_call(Wrapper *self, PyObject *args, PyObject *kwargs) {
    if (self->live == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "capture wrapper used after it was cleared");
        return NULL;
    }
    PyObject *session_tuple = PyList_GET_ITEM(self->live, 0);
    Session *session = NULL;
    if (PyTuple_CheckExact(session_tuple) && PyTuple_GET_SIZE(session_tuple) > 6 &&
        Py_TYPE(PyTuple_GET_ITEM(session_tuple, 6)) == &SessionType)
        session = (Session *)PyTuple_GET_ITEM(session_tuple, 6);
    if (session == NULL) /* no capture, or one this path does not serve: the closure does as it always did */
        return PyObject_Call(self->fallback, args, kwargs);
    PyObject *module = weak_target(self->module_ref); /* a new reference, released at the end as before */
    if (module == NULL)
        return PyObject_Call(self->fallback, args, kwargs);
    Py_INCREF(session);
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    int no_kwargs = kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0;
    PyObject *result = NULL, *location = NULL, *offset = NULL, *inputs = NULL, *record = NULL;
    PyObject *calls_object = NULL, *index_object = NULL, *parent = NULL;
    /* the call count of this module in this capture: its record's call_index */
    PyObject *calls = PyDict_GetItemWithError(session->counts, self->path);
    if (calls == NULL && PyErr_Occurred())
        goto done;
    long call_index = calls == NULL ? 0 : PyLong_AsLong(calls);
    if (call_index == -1 && PyErr_Occurred())
        goto done;
    calls_object = PyLong_FromLong(call_index);
    PyObject *next = PyLong_FromLong(call_index + 1);
    if (calls_object == NULL || next == NULL || PyDict_SetItem(session->counts, self->path, next) < 0) {
        Py_XDECREF(next);
        goto done;
    }
    Py_DECREF(next);
    if (call_site(session, &location, &offset) < 0)
        goto done;
    Py_ssize_t index = PyList_GET_SIZE(session->records);
    index_object = PyLong_FromSsize_t(index);
    Py_ssize_t depth = PyList_GET_SIZE(session->stack);
    if (depth > 0) {
        parent = PyList_GET_ITEM(session->stack, depth - 1);
        Py_INCREF(parent);
    } else {
        parent = PyLong_FromLong(-1);
    }
    if (index_object == NULL || parent == NULL)
        goto done;
    /* most modules take one tensor and return one: those skip the generic walks */
    if (no_kwargs && nargs == 1 && self->first_name != Py_None &&
        PyObject_TypeCheck(PyTuple_GET_ITEM(args, 0), (PyTypeObject *)session->tensor_type)) {
        PyObject *summary = summary_of(session, PyTuple_GET_ITEM(args, 0), self->first_name);
        inputs = summary ? Py_BuildValue("[N]", summary) : NULL;
    } else if (nargs == 0 && no_kwargs) {
        inputs = PyList_New(0);
    } else {
        inputs = argument_summaries(session, args, kwargs, self->parameter_names);
    }
    if (inputs == NULL)
        goto done;
    PyObject *unfinished = PyLong_FromLong(-1);
    PyObject *no_outputs = unfinished ? PyList_New(0) : NULL;
    if (no_outputs == NULL) {
        Py_XDECREF(unfinished);
        goto done;
    }
    /* ModuleCall(index, path, class_name, defined_at, called_at, call_index, parent, -1, call_site, inputs) */
    PyObject *record_values[RECORD_FIELDS] = {index_object, self->path,   self->class_name, self->class_location,
                                              location,     calls_object, parent,           unfinished,
                                              offset,       inputs,       no_outputs,       Py_None};
    record = new_slotted(session->module_call, session->record_offsets, record_values, RECORD_FIELDS);
    Py_DECREF(unfinished);
    Py_DECREF(no_outputs);
    if (record == NULL)
        goto done;
    if (PyDict_GET_SIZE(session->devices) > 0) {
        PyObject *device = PyDict_GetItemWithError(session->devices, self->path);
        if (device == NULL && PyErr_Occurred())
            goto done;
        Py_INCREF(device ? device : Py_None);
        set_slot(record, session->record_offsets[RECORD_DEVICE], device ? device : Py_None);
    }
    if (PyList_Append(session->records, record) < 0 || PyList_Append(session->stack, index_object) < 0)
        goto done;
    /* the call itself: torch's `_call_impl` with the module first */
    PyObject *small[8];
    PyObject **stack = nargs + 1 <= 8 ? small : PyMem_Malloc((size_t)(nargs + 1) * sizeof(PyObject *));
    if (stack == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    stack[0] = module;
    for (Py_ssize_t position = 0; position < nargs; position++)
        stack[position + 1] = PyTuple_GET_ITEM(args, position);
    PyObject *output = PyObject_VectorcallDict(self->call_impl, stack, (size_t)nargs + 1, kwargs);
    if (stack != small)
        PyMem_Free(stack);
    /* a call that raises keeps its record, with no outputs, in the order it ended */
    PyObject *error_type, *error_value, *error_traceback;
    PyErr_Fetch(&error_type, &error_value, &error_traceback);
    Py_ssize_t height = PyList_GET_SIZE(session->stack);
    int bookkeeping = height > 0 ? PyList_SetSlice(session->stack, height - 1, height, NULL) : 0;
    PyObject *finished = bookkeeping == 0 ? PyObject_GetAttr(session->capture, core_str_finished) : NULL;
    PyObject *after = finished ? PyNumber_Add(finished, core_one) : NULL;
    if (after == NULL || PyObject_SetAttr(session->capture, core_str_finished, after) < 0) {
        bookkeeping = -1;
        Py_XDECREF(finished);
    } else {
        set_slot(record, session->record_offsets[RECORD_FINISH_ORDER], finished);
    }
    Py_XDECREF(after);
    if (output == NULL || bookkeeping < 0) {
        if (error_type != NULL) {
            if (bookkeeping < 0)
                PyErr_Clear(); /* the call's own error is the one to raise */
            PyErr_Restore(error_type, error_value, error_traceback);
        }
        Py_XDECREF(output);
        goto done;
    }
    PyObject *outputs = output_summaries(session, output);
    if (outputs == NULL) {
        Py_DECREF(output);
        goto done;
    }
    set_slot(record, session->record_offsets[RECORD_OUTPUTS], outputs);
    result = output;
done:
    Py_XDECREF(location); Py_XDECREF(offset); Py_XDECREF(inputs); Py_XDECREF(record);
    Py_XDECREF(calls_object); Py_XDECREF(index_object); Py_XDECREF(parent);
    Py_DECREF(module);
    Py_DECREF(session);
    return result;
}

/* copy.copy and copy.deepcopy keep the wrapper itself, as they keep a function (a module dict copied while a
 * capture runs) */
static PyObject *wrapper_copy(PyObject *self, PyObject *unused) {
    Py_INCREF(self);
    return self;
}

static PyMethodDef wrapper_methods[] = {
    {"__copy__", (PyCFunction)wrapper_copy, METH_NOARGS, NULL},
    {"__deepcopy__", (PyCFunction)wrapper_copy, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef wrapper_members[] = {
    {"fallback", T_OBJECT, offsetof(Wrapper, fallback), READONLY, "the Python closure this wrapper stands in for"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "modeltrace_moments.Wrapper",
    .tp_doc = "A module's `_call_impl` while a capture runs (see capture_core.c).",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)wrapper_init,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_call = (ternaryfunc)wrapper_call,
    .tp_methods = wrapper_methods,
    .tp_members = wrapper_members,
};

/* --- the trace's tables (`trace/storage._table`), filled from the records in one pass ------------------------- */

static PyObject *table_str[22]; /* attribute names, interned at load */
enum {
    T_KEY, T_SHAPE, T_DTYPE, T_DEVICE, T_MEAN, T_STD, T_MIN, T_MAX, T_ABS_MAX, T_NAN, T_INF, T_POSITIVE, T_TENSOR,
    T_NOT_STORED, T_PLACEMENT, T_FILE, T_LINE, T_COLUMN, T_NAME, T_MODULE_CALL, T_INPUTS, T_OUTPUTS
};
static const char *table_names[22] = {
    "key", "shape", "dtype", "device", "mean", "std", "min", "max", "abs_max", "nan_count", "inf_count",
    "positive_fraction", "tensor", "not_stored", "placement", "file", "line", "column", "name", "module_call",
    "inputs", "outputs"};
/* the fields of a module record's row, in order, before its summaries' indices */
static PyObject *row_str[9];
static const char *row_names[9] = {"index", "path", "class_name", "defined_at", "called_at", "call_index",
                                   "parent", "finish_order", "call_site"};
static PyObject *str_cpu_row, *str_record_device, *str_line_call_index;

/* The classes the tables read most (TensorSummary, ModuleCall), known by the first of each met, and where their
 * fields live: read from the slots directly, a `getattr` for any other class (NULL offsets: not known yet). */
typedef struct {
    PyObject *type, *refused; /* the class whose slots are known; the last one found without them */
    Py_ssize_t offsets[SUMMARY_FIELDS > RECORD_FIELDS ? SUMMARY_FIELDS : RECORD_FIELDS];
} KnownSlots;
static KnownSlots known_summary, known_record;

static int known(KnownSlots *slots, PyObject *object, const char **names, int count) {
    PyObject *type = (PyObject *)Py_TYPE(object);
    if (slots->type != NULL || type == slots->refused)
        return type == slots->type;
    if (slot_offsets(type, names, count, slots->offsets) < 0) {
        PyErr_Clear(); /* not a slotted class of these fields: read by name */
        Py_INCREF(type);
        Py_XSETREF(slots->refused, type);
        return 0;
    }
    Py_INCREF(type);
    slots->type = type;
    return 1;
}

/* The field `index` of `object` (new reference): from its slot where its class is known, else by name. */
static PyObject *field_of(KnownSlots *slots, int is_known, PyObject *object, int index, PyObject *name) {
    if (is_known) {
        PyObject *value = slot(object, slots->offsets[index]);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
    }
    return PyObject_GetAttr(object, name);
}

typedef struct {
    PyObject *summary_index, *keys, *shapes, *dtypes, *extra, *location_index, *locations;
    double *numbers;
    Py_ssize_t used, allocated;
} Tables;

static int tables_number(Tables *tables, PyObject *value, double none) {
    double number = none;
    if (value != Py_None) {
        number = PyFloat_AsDouble(value);
        if (number == -1.0 && PyErr_Occurred())
            return -1;
    }
    if (tables->used == tables->allocated) {
        Py_ssize_t size = tables->allocated ? tables->allocated * 2 : 1024;
        double *grown = PyMem_Realloc(tables->numbers, (size_t)size * sizeof(double));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        tables->numbers = grown;
        tables->allocated = size;
    }
    tables->numbers[tables->used++] = number;
    return 0;
}

/* The index of `summary` in the summaries' tables, added the first time it is seen (new reference), as
 * `_table.add` does it. */
static PyObject *tables_summary(Tables *tables, PyObject *summary, double none) {
    PyObject *identity = PyLong_FromVoidPtr(summary);
    if (identity == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(tables->summary_index, identity);
    if (found != NULL || PyErr_Occurred()) {
        Py_DECREF(identity);
        Py_XINCREF(found);
        return found;
    }
    PyObject *fields[15] = {NULL};
    PyObject *index = PyLong_FromSsize_t(PyList_GET_SIZE(tables->keys));
    int status = index != NULL && PyDict_SetItem(tables->summary_index, identity, index) == 0 ? 0 : -1;
    Py_DECREF(identity);
    int is_known = known(&known_summary, summary, summary_field_names, SUMMARY_FIELDS);
    for (int field = 0; field < 15 && status == 0; field++) {
        fields[field] = field_of(&known_summary, is_known, summary, field, table_str[field]);
        if (fields[field] == NULL)
            status = -1;
    }
    if (status == 0 && (PyList_Append(tables->keys, fields[T_KEY]) < 0 ||
                        PyList_Append(tables->shapes, fields[T_SHAPE]) < 0 ||
                        PyList_Append(tables->dtypes, fields[T_DTYPE]) < 0))
        status = -1;
    const int statistics[6] = {T_MEAN, T_STD, T_MIN, T_MAX, T_ABS_MAX, T_POSITIVE};
    for (int position = 0; position < 6 && status == 0; position++)
        status = tables_number(tables, fields[statistics[position]], none);
    if (status == 0) {
        int other_device = PyObject_RichCompareBool(fields[T_DEVICE], str_cpu_row, Py_NE);
        int nan = other_device < 0 ? -1 : PyObject_IsTrue(fields[T_NAN]);
        int inf = nan < 0 ? -1 : PyObject_IsTrue(fields[T_INF]);
        if (inf < 0) {
            status = -1;
        } else {
            Py_ssize_t used = PyList_GET_SIZE(tables->extra);
            PyObject *last = used ? PyList_GET_ITEM(tables->extra, used - 1) : NULL;
            int rare = other_device || nan || inf || fields[T_TENSOR] != Py_None || fields[T_NOT_STORED] != Py_None;
            int placed = fields[T_PLACEMENT] != Py_None;
            PyObject *row = NULL;
            if (rare || placed) {
                /* a row of its own; a placement (tensor-parallel traces) goes after it, in a new row if needed */
                int same = 0;
                if (!rare && last != NULL) {
                    same = PyObject_RichCompareBool(PyList_GET_ITEM(last, 0), index, Py_EQ);
                    if (same < 0)
                        status = -1;
                }
                if (status == 0 && (rare || !same)) {
                    row = PyList_New(6);
                    if (row == NULL) {
                        status = -1;
                    } else {
                        PyObject *items[6] = {index, fields[T_DEVICE], fields[T_NAN], fields[T_INF], fields[T_TENSOR],
                                              fields[T_NOT_STORED]};
                        for (int item = 0; item < 6; item++) {
                            Py_INCREF(items[item]);
                            PyList_SET_ITEM(row, item, items[item]);
                        }
                        if (PyList_Append(tables->extra, row) < 0)
                            status = -1;
                        last = row;
                        Py_DECREF(row);
                    }
                }
                if (status == 0 && placed && PyList_Append(last, fields[T_PLACEMENT]) < 0)
                    status = -1;
            }
        }
    }
    for (int field = 0; field < 15; field++)
        Py_XDECREF(fields[field]);
    if (status < 0) {
        Py_XDECREF(index);
        return NULL;
    }
    return index;
}

/* The index of a location in the locations' table ([file, line, column]), added the first time it is seen; None
 * for None (new references). */
static PyObject *tables_location(Tables *tables, PyObject *location) {
    if (location == Py_None) {
        Py_RETURN_NONE;
    }
    PyObject *identity = PyLong_FromVoidPtr(location);
    if (identity == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(tables->location_index, identity);
    if (found != NULL || PyErr_Occurred()) {
        Py_DECREF(identity);
        Py_XINCREF(found);
        return found;
    }
    PyObject *index = PyLong_FromSsize_t(PyList_GET_SIZE(tables->locations));
    PyObject *file = PyObject_GetAttr(location, table_str[T_FILE]);
    PyObject *line = file ? PyObject_GetAttr(location, table_str[T_LINE]) : NULL;
    PyObject *column = line ? PyObject_GetAttr(location, table_str[T_COLUMN]) : NULL;
    PyObject *row = column ? PyList_New(3) : NULL;
    int status = -1;
    if (row != NULL && index != NULL) {
        PyList_SET_ITEM(row, 0, file);
        PyList_SET_ITEM(row, 1, line);
        PyList_SET_ITEM(row, 2, column);
        file = line = column = NULL;
        if (PyDict_SetItem(tables->location_index, identity, index) == 0 && PyList_Append(tables->locations, row) == 0)
            status = 0;
    }
    Py_XDECREF(file); Py_XDECREF(line); Py_XDECREF(column); Py_XDECREF(row);
    Py_DECREF(identity);
    if (status < 0) {
        Py_XDECREF(index);
        return NULL;
    }
    return index;
}

/* [the index of each summary in `summaries`] (new reference). */
static PyObject *tables_summaries(Tables *tables, PyObject *summaries, double none) {
    PyObject *sequence = PySequence_Fast(summaries, "a record's summaries must be a list");
    if (sequence == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    PyObject *indices = PyList_New(count);
    for (Py_ssize_t position = 0; indices != NULL && position < count; position++) {
        PyObject *index = tables_summary(tables, PySequence_Fast_GET_ITEM(sequence, position), none);
        if (index == NULL)
            Py_CLEAR(indices);
        else
            PyList_SET_ITEM(indices, position, index);
    }
    Py_DECREF(sequence);
    return indices;
}

/* table_rows(modules, lines, none): storage._table's pass over the records, the same tables in the same order:
 * (locations, keys, shapes, dtypes, extra, the statistics as little-endian float64 bytes, module rows, line rows),
 * `none` (a float) standing for a statistic that is None. */
static PyObject *py_table_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "table_rows(modules, lines, none)");
        return NULL;
    }
    double none = PyFloat_AsDouble(args[2]);
    if (none == -1.0 && PyErr_Occurred())
        return NULL;
    Tables tables = {PyDict_New(), PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0), PyDict_New(),
                     PyList_New(0), NULL, 0, 0};
    PyObject *modules = PySequence_Fast(args[0], "modules must be a list");
    PyObject *lines = modules ? PySequence_Fast(args[1], "lines must be a list") : NULL;
    PyObject *module_rows = lines ? PyList_New(0) : NULL, *line_rows = module_rows ? PyList_New(0) : NULL;
    PyObject *result = NULL;
    int status = line_rows != NULL && tables.summary_index && tables.keys && tables.shapes && tables.dtypes &&
                 tables.extra && tables.location_index && tables.locations ? 0 : -1;
    for (Py_ssize_t position = 0; status == 0 && position < PySequence_Fast_GET_SIZE(modules); position++) {
        PyObject *record = PySequence_Fast_GET_ITEM(modules, position);
        PyObject *row = PyList_New(11);
        if (row == NULL) {
            status = -1;
            break;
        }
        int is_known = known(&known_record, record, record_field_names, RECORD_FIELDS);
        for (int field = 0; field < 9 && status == 0; field++) {
            PyObject *value = field_of(&known_record, is_known, record, field, row_str[field]);
            if (value != NULL && (field == 3 || field == 4)) { /* defined_at, called_at: their locations' indices */
                PyObject *location = tables_location(&tables, value);
                Py_DECREF(value);
                value = location;
            }
            if (value == NULL)
                status = -1;
            else
                PyList_SET_ITEM(row, field, value);
        }
        for (int side = 0; side < 2 && status == 0; side++) {
            PyObject *summaries =
                field_of(&known_record, is_known, record, side ? RECORD_OUTPUTS : 9, table_str[side ? T_OUTPUTS : T_INPUTS]);
            PyObject *indices = summaries ? tables_summaries(&tables, summaries, none) : NULL;
            Py_XDECREF(summaries);
            if (indices == NULL)
                status = -1;
            else
                PyList_SET_ITEM(row, 9 + side, indices);
        }
        PyObject *device =
            status == 0 ? field_of(&known_record, is_known, record, RECORD_DEVICE, str_record_device) : NULL;
        if (device == NULL) {
            status = -1;
        } else if (device != Py_None && PyList_Append(row, device) < 0) { /* spread over devices: a twelfth field */
            status = -1;
        }
        Py_XDECREF(device);
        if (status == 0 && PyList_Append(module_rows, row) < 0)
            status = -1;
        Py_DECREF(row); /* NOTE: unfilled items of a row given up are NULL, which its deallocation skips */
    }
    for (Py_ssize_t position = 0; status == 0 && position < PySequence_Fast_GET_SIZE(lines); position++) {
        PyObject *record = PySequence_Fast_GET_ITEM(lines, position);
        PyObject *tensor = PyObject_GetAttr(record, table_str[T_TENSOR]);
        PyObject *index = tensor ? tables_summary(&tables, tensor, none) : NULL;
        Py_XDECREF(tensor);
        PyObject *row = index ? PyList_New(6) : NULL;
        PyObject *names[6] = {table_str[T_FILE], table_str[T_LINE], table_str[T_NAME], str_line_call_index, NULL,
                              table_str[T_MODULE_CALL]};
        for (int field = 0; row != NULL && field < 6; field++) {
            PyObject *value = field == 4 ? index : PyObject_GetAttr(record, names[field]);
            if (field == 4)
                index = NULL;
            if (value == NULL) {
                Py_CLEAR(row);
                break;
            }
            PyList_SET_ITEM(row, field, value);
        }
        Py_XDECREF(index);
        if (row == NULL || PyList_Append(line_rows, row) < 0)
            status = -1;
        Py_XDECREF(row);
    }
    if (status == 0) {
        /* little-endian float64, as `array.array("d", numbers)` after `_little_endian` */
        PyObject *statistics = PyBytes_FromStringAndSize(NULL, tables.used * 8);
        if (statistics != NULL) {
            unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(statistics);
            for (Py_ssize_t position = 0; position < tables.used; position++) {
                uint64_t bits;
                memcpy(&bits, &tables.numbers[position], 8);
                for (int byte = 0; byte < 8; byte++)
                    bytes[position * 8 + byte] = (unsigned char)(bits >> (8 * byte));
            }
            result = PyTuple_Pack(8, tables.locations, tables.keys, tables.shapes, tables.dtypes, tables.extra,
                                  statistics, module_rows, line_rows);
            Py_DECREF(statistics);
        }
    }
    Py_XDECREF(tables.summary_index); Py_XDECREF(tables.keys); Py_XDECREF(tables.shapes);
    Py_XDECREF(tables.dtypes); Py_XDECREF(tables.extra); Py_XDECREF(tables.location_index);
    Py_XDECREF(tables.locations); PyMem_Free(tables.numbers);
    Py_XDECREF(modules); Py_XDECREF(lines); Py_XDECREF(module_rows); Py_XDECREF(line_rows);
    return result;
}


/* ---- Entering and leaving a capture: the model's modules walked, their cached wrappers checked, put in place
 * and taken off (`_ModelWrappers`, `ModuleCapture.__enter__` and `_unwrap`), each one pass in C. ---- */

static PyObject *core_str_modules, *core_str_call_impl, *core_str_forward, *core_str_named_modules;

/* `module.__dict__` (new reference), NULL with an error for an object without one */
static PyObject *instance_dict(PyObject *module) { return PyObject_GenericGetDict(module, NULL); }

/* 1 where `module`'s class keeps torch's `named_modules` and holds its children in an exact dict under
 * `_modules` (stored in `*children`, new reference) keyed by strings: the walk below is then the one torch's
 * method makes; 0 where not (the caller walks in Python), -1 on an error */
static int torch_children(PyObject *module, PyObject *named_modules, PyObject **children) {
    /* looked up in the class's MRO as attribute access does, through the interpreter's method cache, without
     * the AttributeError a miss costs (about a µs each) */
    PyTypeObject *type = Py_TYPE(module);
    if (_PyType_Lookup(type, core_str_named_modules) != named_modules)
        return 0;
    if (_PyType_Lookup(type, core_str_modules) != NULL) /* a class-level `_modules`: not torch's layout */
        return 0;
    PyObject *attributes = instance_dict(module);
    if (attributes == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *found = PyDict_GetItemWithError(attributes, core_str_modules);
    Py_XINCREF(found);
    Py_DECREF(attributes);
    if (found == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyDict_CheckExact(found)) {
        Py_DECREF(found);
        return 0;
    }
    *children = found;
    return 1;
}

/* torch's `named_modules(memo, prefix)`: (prefix, module), then each child's walk; 1 where a module is not one
 * this walk knows (the caller walks in Python instead), 0 done, -1 on an error */
static int walk_modules(PyObject *module, PyObject *prefix, PyObject *memo, PyObject *out, PyObject *named_modules) {
    int seen = PySet_Contains(memo, module);
    if (seen != 0)
        return seen < 0 ? -1 : 0;
    PyObject *children = NULL;
    int known = torch_children(module, named_modules, &children);
    if (known <= 0)
        return known < 0 ? -1 : 1;
    PyObject *pair = PyTuple_Pack(2, prefix, module);
    int status = pair == NULL || PySet_Add(memo, module) < 0 || PyList_Append(out, pair) < 0 ? -1 : 0;
    Py_XDECREF(pair);
    if (status == 0 && Py_EnterRecursiveCall(" walking a model's modules") < 0)
        status = -1;
    else if (status == 0) {
        PyObject *name, *child;
        Py_ssize_t position = 0;
        while (status == 0 && PyDict_Next(children, &position, &name, &child)) {
            if (child == Py_None)
                continue;
            if (!PyUnicode_CheckExact(name)) {
                status = 1;
                break;
            }
            Py_INCREF(child);
            PyObject *path = PyUnicode_GET_LENGTH(prefix) == 0 ? (Py_INCREF(name), name)
                                                               : PyUnicode_FromFormat("%U.%U", prefix, name);
            status = path == NULL ? -1 : walk_modules(child, path, memo, out, named_modules);
            Py_XDECREF(path);
            Py_DECREF(child);
        }
        Py_LeaveRecursiveCall();
    }
    Py_DECREF(children);
    return status;
}

/* named_modules(model, nn.Module.named_modules): `list(model.named_modules())` where every module keeps torch's
 * walk, else None */
static PyObject *py_named_modules(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "named_modules(model, nn.Module.named_modules)");
        return NULL;
    }
    PyObject *memo = PySet_New(NULL), *out = PyList_New(0);
    int status = memo == NULL || out == NULL ? -1 : walk_modules(args[0], core_str_empty, memo, out, args[1]);
    Py_XDECREF(memo);
    if (status != 0) {
        Py_XDECREF(out);
        if (status < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    return out;
}

/* fitting_wrappers(cached, named): `_ModelWrappers.calls_for`'s check, for the (path, module) pairs of `named`:
 * (hits, misses), hits the (module, cached wrapper) pairs of modules whose entry in `cached` (id of a module ->
 * (weak reference, path, class, instance `forward`, class `_call_impl`, wrapper)) still fits, misses the (path,
 * module) pairs that need a new one. A module that holds a wrapper already (another capture's) is in neither. */
static PyObject *py_fitting_wrappers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "fitting_wrappers(cached: dict, named: list)");
        return NULL;
    }
    PyObject *cached = args[0], *named = args[1];
    PyObject *hits = PyList_New(0), *misses = PyList_New(0);
    if (hits == NULL || misses == NULL)
        goto failed;
    for (Py_ssize_t index = 0; index < PyList_GET_SIZE(named); index++) {
        PyObject *pair = PyList_GET_ITEM(named, index);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "fitting_wrappers: named holds (path, module) pairs");
            goto failed;
        }
        PyObject *path = PyTuple_GET_ITEM(pair, 0), *module = PyTuple_GET_ITEM(pair, 1);
        PyObject *attributes = instance_dict(module);
        if (attributes == NULL)
            goto failed;
        int wrapped = PyDict_Contains(attributes, core_str_call_impl);
        PyObject *forward = wrapped == 0 ? PyDict_GetItemWithError(attributes, core_str_forward) : NULL;
        Py_XINCREF(forward);
        Py_DECREF(attributes);
        if (wrapped < 0 || (forward == NULL && PyErr_Occurred()))
            goto failed;
        if (wrapped)
            continue;
        if (forward == NULL)
            forward = Py_NewRef(Py_None);
        PyObject *identity = PyLong_FromVoidPtr(module);
        PyObject *entry = identity ? PyDict_GetItemWithError(cached, identity) : NULL;
        Py_XDECREF(identity);
        if (entry == NULL && PyErr_Occurred()) {
            Py_DECREF(forward);
            goto failed;
        }
        PyObject *call_impl = PyObject_GetAttr((PyObject *)Py_TYPE(module), core_str_call_impl);
        if (call_impl == NULL) {
            Py_DECREF(forward);
            goto failed;
        }
        int fits = 0;
        if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 6 &&
            PyWeakref_CheckRef(PyTuple_GET_ITEM(entry, 0))) {
            fits = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 1), path, Py_EQ);
            if (fits > 0)
                fits = weak_target_is(PyTuple_GET_ITEM(entry, 0), module) &&
                       PyTuple_GET_ITEM(entry, 2) == (PyObject *)Py_TYPE(module) &&
                       PyTuple_GET_ITEM(entry, 3) == forward && PyTuple_GET_ITEM(entry, 4) == call_impl;
        }
        Py_DECREF(call_impl);
        Py_DECREF(forward);
        if (fits < 0)
            goto failed;
        PyObject *found = fits ? PyTuple_Pack(2, module, PyTuple_GET_ITEM(entry, 5)) : Py_NewRef(pair);
        if (found == NULL || PyList_Append(fits ? hits : misses, found) < 0) {
            Py_XDECREF(found);
            goto failed;
        }
        Py_DECREF(found);
    }
    return Py_BuildValue("(NN)", hits, misses);
failed:
    Py_XDECREF(hits);
    Py_XDECREF(misses);
    return NULL;
}

/* put_wrappers(wrapped, put): with `put` true, each (module, wrapper) pair's wrapper set as the module's
 * `_call_impl` in its instance dict (where `nn.Module.__call__` finds it first); else taken off again, where it
 * is still the one there */
static PyObject *py_put_wrappers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "put_wrappers(wrapped: list, put: bool)");
        return NULL;
    }
    int put = PyObject_IsTrue(args[1]);
    if (put < 0)
        return NULL;
    for (Py_ssize_t index = 0; index < PyList_GET_SIZE(args[0]); index++) {
        PyObject *pair = PyList_GET_ITEM(args[0], index);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "put_wrappers: wrapped holds (module, wrapper) pairs");
            return NULL;
        }
        PyObject *attributes = instance_dict(PyTuple_GET_ITEM(pair, 0));
        if (attributes == NULL)
            return NULL;
        int status = 0;
        if (put) {
            status = PyDict_SetItem(attributes, core_str_call_impl, PyTuple_GET_ITEM(pair, 1));
        } else {
            PyObject *there = PyDict_GetItemWithError(attributes, core_str_call_impl);
            if (there == PyTuple_GET_ITEM(pair, 1))
                status = PyDict_DelItem(attributes, core_str_call_impl);
            else if (there == NULL && PyErr_Occurred())
                status = -1;
        }
        Py_DECREF(attributes);
        if (status < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}


/* ---- The change check of a captured model's reused facts (`worker/reuse.py` `_change_check`), its walk over
 * the modules in one pass. ---- */

static PyObject *core_str_parameters, *core_str_buffers;

/* Appends to `tensors` (id, data_ptr(), _version, shape) of each tensor in the dict `held`; 1 where one has no
 * version counter or storage (a RuntimeError: an inference-mode tensor; the check is then never equal), 0, -1 */
static int add_tensor_states(PyObject *held, PyObject *tensors) {
    PyObject *name, *tensor;
    Py_ssize_t position = 0;
    while (PyDict_Next(held, &position, &name, &tensor)) {
        if (tensor == Py_None)
            continue;
        Py_INCREF(tensor);
        PyObject *identity = PyLong_FromVoidPtr(tensor);
        PyObject *address = identity ? PyObject_CallMethodNoArgs(tensor, core_str_data_ptr) : NULL;
        PyObject *version = address ? PyObject_GetAttr(tensor, core_str_version) : NULL;
        PyObject *shape = version ? PyObject_GetAttr(tensor, core_str_shape) : NULL;
        PyObject *state = shape ? PyTuple_Pack(4, identity, address, version, shape) : NULL;
        Py_XDECREF(identity); Py_XDECREF(address); Py_XDECREF(version); Py_XDECREF(shape);
        Py_DECREF(tensor);
        if (state == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_RuntimeError))
                return -1;
            PyErr_Clear();
            return 1;
        }
        int status = PyList_Append(tensors, state);
        Py_DECREF(state);
        if (status < 0)
            return -1;
    }
    return 0;
}

/* watched_state(modules, model, plain_types, canonical, limit): for `_change_check`, (alive, tensors): per module
 * (the model itself left out) the module, the canonical tuple of its watched attribute names (`canonical`, cleared
 * past `limit` entries) and their values, in the order of its `__dict__`; and each parameter's and buffer's
 * state, or None where one has none. None where a module is not laid out as torch's (the caller checks in
 * Python). */
static PyObject *py_watched_state(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_CheckExact(args[0]) || !PyAnySet_Check(args[2]) || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "watched_state(modules, model, plain_types, canonical, limit)");
        return NULL;
    }
    PyObject *modules = args[0], *model = args[1], *plain_types = args[2], *canonical = args[3];
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *alive = PyList_New(0), *tensors = PyList_New(0), *names = NULL, *values = NULL;
    PyObject *result = NULL;
    if (alive == NULL || tensors == NULL)
        goto done;
    for (Py_ssize_t index = 0; index < PyList_GET_SIZE(modules); index++) {
        PyObject *module = PyList_GET_ITEM(modules, index);
        if (module != model && PyList_Append(alive, module) < 0)
            goto done;
        PyObject *attributes = instance_dict(module);
        if (attributes == NULL)
            goto done;
        names = PyList_New(0);
        values = PyList_New(0);
        int status = names && values ? 0 : -1;
        PyObject *name, *value;
        Py_ssize_t position = 0;
        while (status == 0 && PyDict_Next(attributes, &position, &name, &value)) {
            if (!PyUnicode_CheckExact(name)) {
                status = 1;
                break;
            }
            int watched = PyUnicode_GET_LENGTH(name) == 0 || PyUnicode_READ_CHAR(name, 0) != '_';
            if (!watched)
                watched = PySet_Contains(plain_types, (PyObject *)Py_TYPE(value));
            if (watched < 0 || (watched && (PyList_Append(names, name) < 0 || PyList_Append(values, value) < 0)))
                status = -1;
        }
        PyObject *held[2] = {NULL, NULL};
        if (status == 0) {
            held[0] = PyDict_GetItemWithError(attributes, core_str_parameters);
            held[1] = held[0] ? PyDict_GetItemWithError(attributes, core_str_buffers) : NULL;
            if (held[1] == NULL || !PyDict_CheckExact(held[0]) || !PyDict_CheckExact(held[1]))
                status = PyErr_Occurred() ? -1 : 1;
            Py_XINCREF(held[0]);
            Py_XINCREF(held[1]);
        }
        Py_DECREF(attributes);
        if (status == 0) {
            PyObject *key = PyList_AsTuple(names);
            if (key != NULL && PyDict_GET_SIZE(canonical) >= limit)
                PyDict_Clear(canonical);
            PyObject *shared = key ? PyDict_SetDefault(canonical, key, key) : NULL;
            Py_XDECREF(key);
            if (shared == NULL || PyList_Append(alive, shared) < 0 ||
                PyList_SetSlice(alive, PyList_GET_SIZE(alive), PyList_GET_SIZE(alive), values) < 0)
                status = -1;
        }
        for (int which = 0; status == 0 && which < 2 && tensors != Py_None; which++) {
            int found = add_tensor_states(held[which], tensors);
            if (found < 0)
                status = -1;
            else if (found > 0)
                Py_SETREF(tensors, Py_NewRef(Py_None));
        }
        Py_XDECREF(held[0]);
        Py_XDECREF(held[1]);
        Py_CLEAR(names);
        Py_CLEAR(values);
        if (status < 0)
            goto done;
        if (status > 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = PyTuple_Pack(2, alive, tensors);
done:
    Py_XDECREF(alive); Py_XDECREF(tensors); Py_XDECREF(names); Py_XDECREF(values);
    return result;
}

static PyMethodDef core_functions[] = {
    {"table_rows", (PyCFunction)(void (*)(void))py_table_rows, METH_FASTCALL,
     "storage._table's pass over the records: the summaries', locations' and records' tables"},
    {"named_modules", (PyCFunction)(void (*)(void))py_named_modules, METH_FASTCALL,
     "list(model.named_modules()) where every module keeps torch's walk, else None"},
    {"fitting_wrappers", (PyCFunction)(void (*)(void))py_fitting_wrappers, METH_FASTCALL,
     "(hits, misses) of a model's cached wrappers for its (path, module) pairs"},
    {"put_wrappers", (PyCFunction)(void (*)(void))py_put_wrappers, METH_FASTCALL,
     "put (module, wrapper) pairs' wrappers in place as `_call_impl`, or take them off"},
    {"watched_state", (PyCFunction)(void (*)(void))py_watched_state, METH_FASTCALL,
     "the change check's walk over a model's modules: (alive, tensor states), or None"},
    {NULL, NULL, 0, NULL},
};

static int capture_core_add(PyObject *module) {
    struct { PyObject **slot; const char *text; } names[] = {
        {&core_str_version, "_version"},         {&core_str_dtype, "dtype"},
        {&core_str_shape, "shape"},              {&core_str_data_ptr, "data_ptr"},
        {&core_str_numel, "numel"},              {&core_str_is_contiguous, "is_contiguous"},
        {&core_str_is_cpu, "is_cpu"},            {&core_str_is_neg, "is_neg"},
        {&core_str_key, "key"},                  {&core_str_f_trace, "f_trace"},
        {&core_str_finished, "_finished"},       {&core_str_empty, ""},
        {&core_str_slots, "__slots__"},          {&core_str_modules, "_modules"},
        {&core_str_call_impl, "_call_impl"},     {&core_str_forward, "forward"},
        {&core_str_named_modules, "named_modules"}, {&core_str_parameters, "_parameters"},
        {&core_str_buffers, "_buffers"},
    };
    for (size_t index = 0; index < sizeof names / sizeof names[0]; index++) {
        *names[index].slot = PyUnicode_InternFromString(names[index].text);
        if (*names[index].slot == NULL)
            return -1;
    }
    core_one = PyLong_FromLong(1);
    core_zero = PyLong_FromLong(0);
    core_str_cpu = PyUnicode_InternFromString("cpu");
    if (core_one == NULL || core_zero == NULL || core_str_cpu == NULL)
        return -1;
    for (int index = 0; index < 22; index++)
        if ((table_str[index] = PyUnicode_InternFromString(table_names[index])) == NULL)
            return -1;
    for (int index = 0; index < 9; index++)
        if ((row_str[index] = PyUnicode_InternFromString(row_names[index])) == NULL)
            return -1;
    str_cpu_row = PyUnicode_InternFromString("cpu");
    str_record_device = PyUnicode_InternFromString("device");
    str_line_call_index = PyUnicode_InternFromString("call_index");
    if (str_cpu_row == NULL || str_record_device == NULL || str_line_call_index == NULL ||
        PyModule_AddFunctions(module, core_functions) < 0)
        return -1;
    if (PyType_Ready(&SessionType) < 0 || PyType_Ready(&WrapperType) < 0)
        return -1;
    Py_INCREF(&SessionType);
    if (PyModule_AddObject(module, "Session", (PyObject *)&SessionType) < 0) {
        Py_DECREF(&SessionType);
        return -1;
    }
    Py_INCREF(&WrapperType);
    if (PyModule_AddObject(module, "Wrapper", (PyObject *)&WrapperType) < 0) {
        Py_DECREF(&WrapperType);
        return -1;
    }
    return 0;
}
