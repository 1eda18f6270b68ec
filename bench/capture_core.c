/* A per-call capture core in C: a PROTOTYPE for the benchmarks (bench/capture_core.py), not product code.
 *
 * It measures what ModelTrace's statistics capture would cost with its per-call path out of the interpreter
 * (issue #33): one `Wrapper` per module in place of `ModuleCapture`'s Python closure, and a `Recorder` that keeps
 * each call as a row of plain values (index, path, call index, parent, finish order, the caller's code object and
 * bytecode offset, inputs and outputs as (key, summary index) pairs) and each tensor's summary as a tuple. A
 * contiguous float32 CPU tensor is summarised here with the product's kernel (`moments.c`, included below);
 * anything else, and every argument list other than one bare tensor, goes through the Python callbacks the
 * Recorder was given. Left out, against the engine: ModuleCall and TensorSummary objects, summaries shared by
 * memory span (a view is summarised again), deferred statistics, line capture, full tensors and retained calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include "moments.c" /* the product kernel: -I pyserver/modeltrace/worker/native */

typedef struct {
    PyObject_HEAD
    PyObject *rows;         /* list of lists [index, path, calls, parent, finish, code, lasti, inputs, outputs] */
    PyObject *summaries;    /* list of tuples */
    PyObject *counts;       /* dict path -> int */
    PyObject *stack;        /* list of ints */
    PyObject *cache;        /* dict id -> (weakref, version, index) */
    PyObject *plumbing;     /* dict id(code) -> (code, bool) */
    PyObject *plumbing_fn;  /* code -> bool */
    PyObject *fallback_args;/* (recorder, args, kwargs, names) -> list of (key, index) */
    PyObject *fallback_out; /* (recorder, output) -> list of (key, index) */
    PyObject *fallback_summary; /* tensor -> summary object */
    PyObject *tensor_type;
    PyObject *parameter_type;
    PyObject *float32;
    long finished;
} Recorder;

static PyObject *s_version, *s_dtype, *s_shape, *s_data_ptr, *s_numel, *s_is_contiguous, *s_is_cpu, *s_is_neg, *s_empty;

static int recorder_init(Recorder *self, PyObject *args, PyObject *kwds) {
    PyObject *plumbing_fn, *fallback_args, *fallback_out, *fallback_summary, *tensor_type, *parameter_type, *float32;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &plumbing_fn, &fallback_args, &fallback_out, &fallback_summary,
                          &tensor_type, &parameter_type, &float32))
        return -1;
    self->rows = PyList_New(0);
    self->summaries = PyList_New(0);
    self->counts = PyDict_New();
    self->stack = PyList_New(0);
    self->cache = PyDict_New();
    self->plumbing = PyDict_New();
    Py_INCREF(plumbing_fn); self->plumbing_fn = plumbing_fn;
    Py_INCREF(fallback_args); self->fallback_args = fallback_args;
    Py_INCREF(fallback_out); self->fallback_out = fallback_out;
    Py_INCREF(fallback_summary); self->fallback_summary = fallback_summary;
    Py_INCREF(tensor_type); self->tensor_type = tensor_type;
    Py_INCREF(parameter_type); self->parameter_type = parameter_type;
    Py_INCREF(float32); self->float32 = float32;
    self->finished = 0;
    return 0;
}

static void recorder_dealloc(Recorder *self) {
    Py_XDECREF(self->rows); Py_XDECREF(self->summaries); Py_XDECREF(self->counts); Py_XDECREF(self->stack);
    Py_XDECREF(self->cache); Py_XDECREF(self->plumbing); Py_XDECREF(self->plumbing_fn);
    Py_XDECREF(self->fallback_args); Py_XDECREF(self->fallback_out); Py_XDECREF(self->fallback_summary);
    Py_XDECREF(self->tensor_type); Py_XDECREF(self->parameter_type); Py_XDECREF(self->float32);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* index of the summary of `tensor` (new reference to a PyLong), or NULL with an error */
static PyObject *summarize(Recorder *rec, PyObject *tensor) {
    long version = -1;
    PyObject *v = PyObject_GetAttr(tensor, s_version);
    if (v == NULL) PyErr_Clear();
    else { version = PyLong_AsLong(v); Py_DECREF(v); }
    PyObject *key = PyLong_FromVoidPtr(tensor);
    if (key == NULL) return NULL;
    if (version >= 0) {
        PyObject *entry = PyDict_GetItemWithError(rec->cache, key);
        if (entry != NULL && PyLong_AsLong(PyTuple_GET_ITEM(entry, 1)) == version &&
            PyWeakref_GET_OBJECT(PyTuple_GET_ITEM(entry, 0)) == tensor) {
            Py_DECREF(key);
            PyObject *index = PyTuple_GET_ITEM(entry, 2);
            Py_INCREF(index);
            return index;
        }
    }
    PyObject *summary = NULL;
    PyTypeObject *type = Py_TYPE(tensor);
    if ((PyObject *)type == rec->tensor_type || (PyObject *)type == rec->parameter_type) {
        PyObject *dtype = PyObject_GetAttr(tensor, s_dtype);
        PyObject *is_cpu = dtype ? PyObject_GetAttr(tensor, s_is_cpu) : NULL;
        if (dtype == rec->float32 && is_cpu == Py_True) {
            PyObject *contiguous = PyObject_CallMethodNoArgs(tensor, s_is_contiguous);
            PyObject *neg = PyObject_CallMethodNoArgs(tensor, s_is_neg);
            if (contiguous == Py_True && neg == Py_False) {
                PyObject *ptr = PyObject_CallMethodNoArgs(tensor, s_data_ptr);
                PyObject *numel = PyObject_CallMethodNoArgs(tensor, s_numel);
                PyObject *shape = PyObject_GetAttr(tensor, s_shape);
                if (ptr && numel && shape) {
                    long long count = PyLong_AsLongLong(numel);
                    if (count > 1) {
                        double m[5];
                        modeltrace_moments_f32((const float *)PyLong_AsVoidPtr(ptr), count, m);
                        double mean = m[0] / count;
                        double variance = (m[1] - m[0] * mean) / (count - 1);
                        if (isfinite(m[0]) && isfinite(m[1]) && variance > 0) {
                            double absmax = -m[3] > m[4] ? -m[3] : m[4];
                            summary = Py_BuildValue("(Osddddddd)", shape, "float32", mean, sqrt(variance), m[3],
                                                    m[4], absmax, m[2] / count, 0.0);
                        }
                    }
                }
                Py_XDECREF(ptr); Py_XDECREF(numel); Py_XDECREF(shape);
            }
            Py_XDECREF(contiguous); Py_XDECREF(neg);
        }
        Py_XDECREF(dtype); Py_XDECREF(is_cpu);
        if (PyErr_Occurred()) { Py_DECREF(key); Py_XDECREF(summary); return NULL; }
    }
    if (summary == NULL) {
        summary = PyObject_CallOneArg(rec->fallback_summary, tensor);
        if (summary == NULL) { Py_DECREF(key); return NULL; }
    }
    PyObject *index = PyLong_FromSsize_t(PyList_GET_SIZE(rec->summaries));
    PyList_Append(rec->summaries, summary);
    Py_DECREF(summary);
    if (version >= 0) {
        PyObject *ref = PyWeakref_NewRef(tensor, NULL);
        if (ref == NULL) PyErr_Clear();
        else {
            PyObject *entry = Py_BuildValue("(NlO)", ref, version, index);
            PyDict_SetItem(rec->cache, key, entry);
            Py_DECREF(entry);
        }
    }
    Py_DECREF(key);
    return index;
}

static PyObject *recorder_summarize(Recorder *self, PyObject *tensor) { return summarize(self, tensor); }

static int is_plumbing(Recorder *rec, PyCodeObject *code) {
    PyObject *key = PyLong_FromVoidPtr(code);
    PyObject *entry = PyDict_GetItemWithError(rec->plumbing, key);
    if (entry != NULL && PyTuple_GET_ITEM(entry, 0) == (PyObject *)code) {
        Py_DECREF(key);
        return PyTuple_GET_ITEM(entry, 1) == Py_True;
    }
    PyObject *answer = PyObject_CallOneArg(rec->plumbing_fn, (PyObject *)code);
    if (answer == NULL) { Py_DECREF(key); return -1; }
    int result = PyObject_IsTrue(answer);
    entry = PyTuple_Pack(2, (PyObject *)code, result ? Py_True : Py_False);
    PyDict_SetItem(rec->plumbing, key, entry);
    Py_DECREF(entry); Py_DECREF(answer); Py_DECREF(key);
    return result;
}

static PyMethodDef recorder_methods[] = {
    {"summarize", (PyCFunction)recorder_summarize, METH_O, "index of a tensor's summary"},
    {NULL},
};

static PyMemberDef recorder_members[] = {
    {"rows", T_OBJECT, offsetof(Recorder, rows), READONLY, NULL},
    {"summaries", T_OBJECT, offsetof(Recorder, summaries), READONLY, NULL},
    {"cache", T_OBJECT, offsetof(Recorder, cache), READONLY, NULL},
    {NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "capture_core.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)recorder_init,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
    .tp_members = recorder_members,
};

typedef struct {
    PyObject_HEAD
    PyObject *live;
    PyObject *path;
    PyObject *call_impl;
    PyObject *module_ref; /* weak: the benchmark's cache of wrappers must not keep the model alive */
    PyObject *first_name;
    PyObject *names;
} Wrapper;

static int wrapper_init(Wrapper *self, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, "OOOOOO", &self->live, &self->path, &self->call_impl, &self->module_ref,
                          &self->first_name, &self->names))
        return -1;
    Py_INCREF(self->live); Py_INCREF(self->path); Py_INCREF(self->call_impl); Py_INCREF(self->module_ref);
    Py_INCREF(self->first_name); Py_INCREF(self->names);
    return 0;
}

static void wrapper_dealloc(Wrapper *self) {
    Py_XDECREF(self->live); Py_XDECREF(self->path); Py_XDECREF(self->call_impl); Py_XDECREF(self->module_ref);
    Py_XDECREF(self->first_name); Py_XDECREF(self->names);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *wrapper_call(Wrapper *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    PyObject *small[9];
    PyObject **stack = nargs + 1 <= 9 ? small : PyMem_Malloc((nargs + 1) * sizeof(PyObject *));
    stack[0] = PyWeakref_GET_OBJECT(self->module_ref);
    if (stack[0] == Py_None) {
        PyErr_SetString(PyExc_ReferenceError, "capture_core: the wrapped module is gone");
        if (stack != small) PyMem_Free(stack);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) stack[i + 1] = PyTuple_GET_ITEM(args, i);
    PyObject *live = PyList_GET_ITEM(self->live, 0);
    PyObject *result = NULL;
    if (live == Py_None) {
        result = PyObject_VectorcallDict(self->call_impl, stack, nargs + 1, kwargs);
        goto done;
    }
    Recorder *rec = (Recorder *)live;
    /* call count */
    long calls = 0;
    PyObject *count = PyDict_GetItemWithError(rec->counts, self->path);
    if (count != NULL) calls = PyLong_AsLong(count);
    PyObject *next = PyLong_FromLong(calls + 1);
    PyDict_SetItem(rec->counts, self->path, next);
    Py_DECREF(next);
    /* the call site: the first frame that is not plumbing */
    PyFrameObject *frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    PyObject *site_code = Py_None;
    Py_INCREF(Py_None);
    int lasti = -1;
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int plumbing = is_plumbing(rec, code);
        if (plumbing < 0) { Py_DECREF(code); Py_DECREF(frame); goto done; }
        if (!plumbing) {
            Py_DECREF(site_code);
            site_code = (PyObject *)code;
            lasti = PyFrame_GetLasti(frame);
            Py_DECREF(frame);
            break;
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_ssize_t index = PyList_GET_SIZE(rec->rows);
    Py_ssize_t depth = PyList_GET_SIZE(rec->stack);
    PyObject *parent = depth ? PyList_GET_ITEM(rec->stack, depth - 1) : NULL;
    /* inputs */
    PyObject *inputs;
    int no_kwargs = kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0;
    if (no_kwargs && nargs == 1 && self->first_name != Py_None &&
        PyObject_TypeCheck(stack[1], (PyTypeObject *)rec->tensor_type)) {
        PyObject *summary = summarize(rec, stack[1]);
        if (summary == NULL) { Py_DECREF(site_code); goto done; }
        inputs = Py_BuildValue("[(ON)]", self->first_name, summary);
    } else if (nargs == 0 && no_kwargs) {
        inputs = PyList_New(0);
    } else {
        inputs = PyObject_CallFunctionObjArgs(rec->fallback_args, (PyObject *)rec, args, kwargs ? kwargs : Py_None,
                                              self->names, NULL);
        if (inputs == NULL) { Py_DECREF(site_code); goto done; }
    }
    PyObject *row = Py_BuildValue("[nOlOiNiNO]", index, self->path, calls, parent ? parent : Py_None, -1,
                                  site_code, lasti, inputs, Py_None);
    PyList_Append(rec->rows, row);
    PyObject *position = PyLong_FromSsize_t(index);
    PyList_Append(rec->stack, position);
    Py_DECREF(position);
    result = PyObject_VectorcallDict(self->call_impl, stack, nargs + 1, kwargs);
    PyList_SetSlice(rec->stack, PyList_GET_SIZE(rec->stack) - 1, PyList_GET_SIZE(rec->stack), NULL);
    PyList_SetItem(row, 4, PyLong_FromLong(rec->finished++));
    if (result != NULL) {
        PyObject *outputs;
        if (PyObject_TypeCheck(result, (PyTypeObject *)rec->tensor_type)) {
            PyObject *summary = summarize(rec, result);
            outputs = summary ? Py_BuildValue("[(ON)]", s_empty, summary) : NULL;
        } else {
            outputs = PyObject_CallFunctionObjArgs(rec->fallback_out, (PyObject *)rec, result, NULL);
        }
        if (outputs == NULL) { Py_CLEAR(result); }
        else PyList_SetItem(row, 8, outputs);
    }
    Py_DECREF(row);
done:
    if (stack != small) PyMem_Free(stack);
    return result;
}

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "capture_core.Wrapper",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)wrapper_init,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_call = (ternaryfunc)wrapper_call,
};

static struct PyModuleDef coremodule = {PyModuleDef_HEAD_INIT, "capture_core", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_capture_core(void) {
    if (PyType_Ready(&RecorderType) < 0 || PyType_Ready(&WrapperType) < 0) return NULL;
    s_version = PyUnicode_InternFromString("_version");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_numel = PyUnicode_InternFromString("numel");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_is_neg = PyUnicode_InternFromString("is_neg");
    s_empty = PyUnicode_InternFromString("");
    PyObject *module = PyModule_Create(&coremodule);
    Py_INCREF(&RecorderType);
    PyModule_AddObject(module, "Recorder", (PyObject *)&RecorderType);
    Py_INCREF(&WrapperType);
    PyModule_AddObject(module, "Wrapper", (PyObject *)&WrapperType);
    return module;
}
