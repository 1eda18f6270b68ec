/* Fused tensor statistics: sum, sum of squares, positive count, min and max of a contiguous float array in one
 * pass over memory (torch needs ~6 passes and ~6 kernel launches for the same numbers; see worker/stats.py).
 *
 * Compiled on first use by worker/native/__init__.py and called through ctypes. float32 sums run in float32
 * within blocks of BLOCK elements (so that the compiler can vectorise them; a block that overflows is summed
 * again in double) and in double across blocks. Min and max compare the values' bit patterns as integers, which vectorises without fast-math and
 * orders every non-NaN float correctly: among non-negative floats the signed integer order is the float order;
 * among negative ones the unsigned order is the magnitude order. NaN and Inf make the sums non-finite, and the
 * caller then recomputes everything with NaN-aware torch reductions, so the min/max of such arrays is unused.
 *
 * Large float32 arrays are split across torch's OpenMP threads when the library is built with -fopenmp (it then
 * shares the libgomp that torch loaded, and with it torch's thread pool and thread count, see __init__.py): during
 * a module hook torch's second thread would only spin, and a fresh activation often sits half in each core's
 * cache, written there by the op that produced it. Each thread reduces a contiguous run of whole blocks and the
 * partial results are combined in thread order, so a given thread count always gives the same numbers.
 *
 * out[0..4] = sum, sum of squares, count of values > 0, min, max.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define BLOCK 1024
/* below this many elements a parallel region (a few µs to wake the other thread) costs more than it saves */
#define PARALLEL_MIN 32768
#define MAX_THREADS 64

struct f32_partial {
    double total, squares, positives;
    int32_t signed_min, signed_max, unsigned_max;
};

static void f32_range(const float *values, int64_t begin, int64_t count, struct f32_partial *partial) {
    double total = 0, squares = 0, positives = 0;
    int32_t signed_min = INT32_MAX, signed_max = INT32_MIN, unsigned_max = INT32_MIN; /* bits ^ sign bit */
    for (int64_t start = begin; start < count; start += BLOCK) {
        int64_t stop = start + BLOCK < count ? start + BLOCK : count;
        float block_total = 0, block_squares = 0;
        int32_t block_positives = 0;
        int32_t block_min = INT32_MAX, block_max = INT32_MIN, block_unsigned_max = INT32_MIN;
        for (int64_t i = start; i < stop; i++) {
            float value = values[i];
            int32_t bits;
            memcpy(&bits, &values[i], sizeof bits);
            block_total += value;
            block_squares += value * value;
            block_positives += value > 0.0f;
            block_min = bits < block_min ? bits : block_min;
            block_max = bits > block_max ? bits : block_max;
            int32_t flipped = bits ^ INT32_MIN;
            block_unsigned_max = flipped > block_unsigned_max ? flipped : block_unsigned_max;
        }
        if (isfinite(block_total) && isfinite(block_squares)) {
            total += block_total;
            squares += block_squares;
        } else {
            /* float32 overflowed: additive attention masks hold the dtype's minimum, whose square only a
             * double holds. Redo the block's sums in double; true NaN/Inf stay non-finite for the caller. */
            double wide_total = 0, wide_squares = 0;
            for (int64_t i = start; i < stop; i++) {
                double wide = values[i];
                wide_total += wide;
                wide_squares += wide * wide;
            }
            total += wide_total;
            squares += wide_squares;
        }
        positives += block_positives;
        signed_min = block_min < signed_min ? block_min : signed_min;
        signed_max = block_max > signed_max ? block_max : signed_max;
        unsigned_max = block_unsigned_max > unsigned_max ? block_unsigned_max : unsigned_max;
    }
    partial->total = total;
    partial->squares = squares;
    partial->positives = positives;
    partial->signed_min = signed_min;
    partial->signed_max = signed_max;
    partial->unsigned_max = unsigned_max;
}

void modeltrace_moments_f32(const float *values, int64_t count, double *out) {
    struct f32_partial partials[MAX_THREADS];
    int used = 1;
#ifdef _OPENMP
    int threads = omp_get_max_threads();
    threads = threads < MAX_THREADS ? threads : MAX_THREADS;
    if (count >= PARALLEL_MIN && threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int thread = omp_get_thread_num(), team = omp_get_num_threads();
            int64_t blocks = (count + BLOCK - 1) / BLOCK;
            int64_t first = blocks * thread / team * BLOCK, last = blocks * (thread + 1) / team * BLOCK;
            f32_range(values, first, last < count ? last : count, &partials[thread]);
            if (thread == 0)
                used = team;
        }
    } else
#endif
        f32_range(values, 0, count, &partials[0]);
    double total = 0, squares = 0, positives = 0;
    int32_t signed_min = INT32_MAX, signed_max = INT32_MIN, unsigned_max = INT32_MIN;
    for (int index = 0; index < used; index++) {
        const struct f32_partial *partial = &partials[index];
        total += partial->total;
        squares += partial->squares;
        positives += partial->positives;
        signed_min = partial->signed_min < signed_min ? partial->signed_min : signed_min;
        signed_max = partial->signed_max > signed_max ? partial->signed_max : signed_max;
        unsigned_max = partial->unsigned_max > unsigned_max ? partial->unsigned_max : unsigned_max;
    }
    /* max: the largest non-negative pattern, or if all are negative the one of smallest magnitude */
    int32_t max_bits = signed_max >= 0 ? signed_max : signed_min;
    /* min: the negative pattern of largest magnitude, or if none is negative the smallest non-negative one */
    int32_t largest_negative = unsigned_max ^ INT32_MIN;
    int32_t min_bits = largest_negative < 0 ? largest_negative : signed_min;
    float minimum, maximum;
    memcpy(&minimum, &min_bits, sizeof minimum);
    memcpy(&maximum, &max_bits, sizeof maximum);
    out[0] = total;
    out[1] = squares;
    out[2] = positives;
    out[3] = minimum;
    out[4] = maximum;
}

void modeltrace_moments_f64(const double *values, int64_t count, double *out) {
    double total = 0, squares = 0;
    int64_t positives = 0;
    int64_t signed_min = INT64_MAX, signed_max = INT64_MIN, unsigned_max = INT64_MIN;
    for (int64_t i = 0; i < count; i++) {
        double value = values[i];
        int64_t bits;
        memcpy(&bits, &values[i], sizeof bits);
        total += value;
        squares += value * value;
        positives += value > 0.0;
        signed_min = bits < signed_min ? bits : signed_min;
        signed_max = bits > signed_max ? bits : signed_max;
        int64_t flipped = bits ^ INT64_MIN;
        unsigned_max = flipped > unsigned_max ? flipped : unsigned_max;
    }
    int64_t max_bits = signed_max >= 0 ? signed_max : signed_min;
    int64_t largest_negative = unsigned_max ^ INT64_MIN;
    int64_t min_bits = largest_negative < 0 ? largest_negative : signed_min;
    double minimum, maximum;
    memcpy(&minimum, &min_bits, sizeof minimum);
    memcpy(&maximum, &max_bits, sizeof maximum);
    out[0] = total;
    out[1] = squares;
    out[2] = (double)positives;
    out[3] = minimum;
    out[4] = maximum;
}

/* Integers (token ids, positions): sums in double (exact below 2**53, as on the other paths), min and max as
 * integers; no NaN or Inf to meet. */
void modeltrace_moments_i64(const int64_t *values, int64_t count, double *out) {
    double total = 0, squares = 0;
    int64_t positives = 0, minimum = INT64_MAX, maximum = INT64_MIN;
    for (int64_t i = 0; i < count; i++) {
        int64_t value = values[i];
        double wide = (double)value;
        total += wide;
        squares += wide * wide;
        positives += value > 0;
        minimum = value < minimum ? value : minimum;
        maximum = value > maximum ? value : maximum;
    }
    out[0] = total;
    out[1] = squares;
    out[2] = (double)positives;
    out[3] = (double)minimum;
    out[4] = (double)maximum;
}

#ifdef MODELTRACE_PYTHON_MODULE
/* The same kernels as a Python extension module, `modeltrace_moments`: `f32(address, count)` (and `f64`,
 * `i64`) returns the tuple (sum, sum of squares, positives, min, max). A METH_FASTCALL call costs a tenth of a
 * ctypes call, which matters inside a module hook: the worker calls this for every new tensor of every call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef void (*moments_kernel)(const void *, int64_t, double *);

static PyObject *call_kernel(moments_kernel kernel, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "expected (address, count)");
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(args[0]);
    long long count = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (address == NULL || count < 0) {
        PyErr_SetString(PyExc_ValueError, "address must be non-zero and count non-negative");
        return NULL;
    }
    double out[5];
    if (count >= PARALLEL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        kernel(address, count, out);
        Py_END_ALLOW_THREADS
    } else {
        kernel(address, count, out);
    }
    PyObject *result = PyTuple_New(5);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t index = 0; index < 5; index++) {
        PyObject *number = PyFloat_FromDouble(out[index]);
        if (number == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyTuple_SET_ITEM(result, index, number);
    }
    return result;
}

static PyObject *py_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return call_kernel((moments_kernel)modeltrace_moments_f32, args, nargs);
}

static PyObject *py_f64(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return call_kernel((moments_kernel)modeltrace_moments_f64, args, nargs);
}

static PyObject *py_i64(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return call_kernel((moments_kernel)modeltrace_moments_i64, args, nargs);
}

static PyMethodDef methods[] = {
    {"f32", (PyCFunction)(void (*)(void))py_f32, METH_FASTCALL, "moments of float32 values at (address, count)"},
    {"f64", (PyCFunction)(void (*)(void))py_f64, METH_FASTCALL, "moments of float64 values at (address, count)"},
    {"i64", (PyCFunction)(void (*)(void))py_i64, METH_FASTCALL, "moments of int64 values at (address, count)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "modeltrace_moments", NULL, -1, methods};

PyMODINIT_FUNC PyInit_modeltrace_moments(void) { return PyModule_Create(&module); }
#endif
