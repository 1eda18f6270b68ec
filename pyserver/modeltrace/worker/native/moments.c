/* Fused tensor statistics: sum, sum of squares, positive count, min and max of a float array in one pass over
 * memory (torch needs ~6 passes and ~6 kernel launches for the same numbers; see worker/stats.py).
 *
 * Compiled on first use by worker/native/__init__.py and called as an extension module (or through ctypes).
 * float32 sums run in float32 within blocks of BLOCK elements (so that the compiler can vectorise them; a block
 * that overflows is summed again in double) and in double across blocks. Min and max compare the values' bit
 * patterns as integers (see f32_block_sums). NaN and Inf make the sums non-finite, and the caller then recomputes
 * everything with NaN-aware torch reductions, so the min/max of such arrays is unused.
 *
 * A float32 view that is not contiguous (a slice, a transpose, an `expand`) is read in place as runs of its
 * innermost dimension (modeltrace_moments_f32_strided): copying a medium model's activation first costs more
 * than its statistics.
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
    float minimum, maximum;
};

/* The float32 sums of one block of up to BLOCK contiguous values, before they reach the doubles. */
struct f32_block {
    float total, squares, minimum, maximum;
    int32_t positives;
};

/* The sums of `count` (> 0) contiguous values. Min and max compare the values' bit patterns as integers, which
 * vectorises without fast-math (float min/max reductions do not: NaN) and orders every non-NaN float correctly:
 * among non-negative floats the signed integer order is the float order; among negative ones the unsigned order
 * is the magnitude order. (AVX2 intrinsics with float min/max and four accumulator sets measured no faster: the
 * loop is bound by the vector ports, not by the latency of the adds.) */
static void f32_block_sums(const float *values, int64_t count, struct f32_block *block) {
    float total = 0, squares = 0;
    int32_t positives = 0;
    int32_t signed_min = INT32_MAX, signed_max = INT32_MIN, unsigned_max = INT32_MIN; /* bits ^ sign bit */
    for (int64_t i = 0; i < count; i++) {
        float value = values[i];
        int32_t bits;
        memcpy(&bits, &values[i], sizeof bits);
        total += value;
        squares += value * value;
        positives += value > 0.0f;
        signed_min = bits < signed_min ? bits : signed_min;
        signed_max = bits > signed_max ? bits : signed_max;
        int32_t flipped = bits ^ INT32_MIN;
        unsigned_max = flipped > unsigned_max ? flipped : unsigned_max;
    }
    /* max: the largest non-negative pattern, or if all are negative the one of smallest magnitude */
    int32_t max_bits = signed_max >= 0 ? signed_max : signed_min;
    /* min: the negative pattern of largest magnitude, or if none is negative the smallest non-negative one */
    int32_t largest_negative = unsigned_max ^ INT32_MIN;
    int32_t min_bits = largest_negative < 0 ? largest_negative : signed_min;
    float minimum, maximum;
    memcpy(&minimum, &min_bits, sizeof minimum);
    memcpy(&maximum, &max_bits, sizeof maximum);
    block->total = total;
    block->squares = squares;
    block->positives = positives;
    block->minimum = minimum;
    block->maximum = maximum;
}

static void f32_add_run_wide(const float *values, int64_t count, double *total, double *squares) {
    for (int64_t i = 0; i < count; i++) {
        double wide = values[i];
        *total += wide;
        *squares += wide * wide;
    }
}

/* One block of up to BLOCK contiguous values into `partial`. */
static void f32_add_block(const float *values, int64_t length, struct f32_partial *partial) {
    struct f32_block block;
    f32_block_sums(values, length, &block);
    if (isfinite(block.total) && isfinite(block.squares)) {
        partial->total += block.total;
        partial->squares += block.squares;
    } else {
        /* float32 overflowed: additive attention masks hold the dtype's minimum, whose square only a double
         * holds. Redo the block's sums in double; true NaN/Inf stay non-finite for the caller. */
        f32_add_run_wide(values, length, &partial->total, &partial->squares);
    }
    partial->positives += block.positives;
    partial->minimum = block.minimum < partial->minimum ? block.minimum : partial->minimum;
    partial->maximum = block.maximum > partial->maximum ? block.maximum : partial->maximum;
}

static void f32_range(const float *values, int64_t begin, int64_t count, struct f32_partial *partial) {
    for (int64_t start = begin; start < count; start += BLOCK)
        f32_add_block(values + start, start + BLOCK < count ? BLOCK : count - start, partial);
}

static const struct f32_partial EMPTY_PARTIAL = {0.0, 0.0, 0.0, INFINITY, -INFINITY};

static void f32_combine(const struct f32_partial *partials, int used, double *out) {
    struct f32_partial sum = EMPTY_PARTIAL;
    for (int index = 0; index < used; index++) {
        const struct f32_partial *partial = &partials[index];
        sum.total += partial->total;
        sum.squares += partial->squares;
        sum.positives += partial->positives;
        sum.minimum = partial->minimum < sum.minimum ? partial->minimum : sum.minimum;
        sum.maximum = partial->maximum > sum.maximum ? partial->maximum : sum.maximum;
    }
    out[0] = sum.total;
    out[1] = sum.squares;
    out[2] = sum.positives;
    out[3] = sum.minimum;
    out[4] = sum.maximum;
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
            partials[thread] = EMPTY_PARTIAL;
            f32_range(values, first, last < count ? last : count, &partials[thread]);
            if (thread == 0)
                used = team;
        }
    } else
#endif
    {
        partials[0] = EMPTY_PARTIAL;
        f32_range(values, 0, count, &partials[0]);
    }
    f32_combine(partials, used, out);
}

/* A strided float32 view (a slice, a transpose, an expanded tensor) without copying it: `sizes` and `strides`
 * (in elements) are normalised to runs of the innermost dimension, read in place. Every logical element is
 * visited once in some order, and no statistic depends on the order; a dimension of stride 0 (`expand`)
 * repeats the same values, so it is read once and its size weights the sums and the count. */
#define MAX_DIMS 16

struct f32_runs {
    const float *values;
    int outer;                   /* outer dimensions, outermost first */
    int64_t sizes[MAX_DIMS], strides[MAX_DIMS];
    int64_t run, step;           /* innermost dimension: elements per run and their stride */
    int64_t runs;                /* number of runs: the product of the outer sizes */
};

/* Offset of run `index` (row-major over the outer dimensions). */
static int64_t f32_run_offset(const struct f32_runs *view, int64_t index) {
    int64_t offset = 0;
    for (int dim = view->outer - 1; dim >= 0; dim--) {
        offset += index % view->sizes[dim] * view->strides[dim];
        index /= view->sizes[dim];
    }
    return offset;
}

/* Runs [first, last) into `partial`. Long contiguous runs are read in place a block at a time; short runs
 * (rotate_half's halves: 32 values) and strided ones are gathered into a block-sized buffer first, so that the
 * vector loop and its final reduction run once per block rather than once per run. */
static void f32_runs_range(const struct f32_runs *view, int64_t first, int64_t last, struct f32_partial *partial) {
    float buffer[BLOCK];
    int64_t filled = 0;
    for (int64_t index = first; index < last; index++) {
        const float *run = view->values + f32_run_offset(view, index);
        if (view->step == 1 && view->run >= BLOCK / 4) {
            f32_range(run, 0, view->run, partial);
            continue;
        }
        for (int64_t done = 0; done < view->run;) {
            int64_t length = view->run - done < BLOCK - filled ? view->run - done : BLOCK - filled;
            const float *source = run + done * view->step;
            if (view->step == 1) {
                memcpy(buffer + filled, source, (size_t)length * sizeof(float));
            } else {
                for (int64_t i = 0; i < length; i++)
                    buffer[filled + i] = source[i * view->step];
            }
            filled += length;
            done += length;
            if (filled == BLOCK) {
                f32_add_block(buffer, filled, partial);
                filled = 0;
            }
        }
    }
    if (filled > 0)
        f32_add_block(buffer, filled, partial);
}

/* The moments of a view of at least one outer dimension, its runs split across threads where it is large. */
static void f32_runs_moments(const struct f32_runs *view, double *out) {
    struct f32_partial partials[MAX_THREADS];
    int used = 1;
#ifdef _OPENMP
    int threads = omp_get_max_threads();
    threads = threads < MAX_THREADS ? threads : MAX_THREADS;
    if (view->runs * view->run >= PARALLEL_MIN && view->runs >= threads && threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int thread = omp_get_thread_num(), team = omp_get_num_threads();
            partials[thread] = EMPTY_PARTIAL;
            f32_runs_range(view, view->runs * thread / team, view->runs * (thread + 1) / team, &partials[thread]);
            if (thread == 0)
                used = team;
        }
    } else
#endif
    {
        partials[0] = EMPTY_PARTIAL;
        f32_runs_range(view, 0, view->runs, &partials[0]);
    }
    f32_combine(partials, used, out);
}

/* Returns 0, or -1 when the view has more than MAX_DIMS dimensions or a negative stride (the caller copies).
 * `parallel` 0: on the calling thread only (a background thread's work must not take torch's pool). */
static int f32_strided_moments(const float *values, int64_t ndim, const int64_t *sizes, const int64_t *strides,
                               double *out, int parallel) {
    struct f32_runs view;
    int64_t kept_sizes[MAX_DIMS], kept_strides[MAX_DIMS];
    int kept = 0;
    double weight = 1;
    if (ndim > MAX_DIMS)
        return -1;
    for (int64_t dim = 0; dim < ndim; dim++) {
        if (strides[dim] < 0)
            return -1;
        if (sizes[dim] == 0) {
            out[0] = out[1] = out[2] = 0;
            out[3] = INFINITY;
            out[4] = -INFINITY;
            return 0;
        }
        if (sizes[dim] == 1)
            continue;
        if (strides[dim] == 0) {
            weight *= (double)sizes[dim];
            continue;
        }
        /* insertion by decreasing stride: the innermost (smallest) stride ends up last */
        int position = kept++;
        while (position > 0 && kept_strides[position - 1] < strides[dim]) {
            kept_sizes[position] = kept_sizes[position - 1];
            kept_strides[position] = kept_strides[position - 1];
            position--;
        }
        kept_sizes[position] = sizes[dim];
        kept_strides[position] = strides[dim];
    }
    /* merge a dimension into the next one where they step through memory as one (a contiguous prefix) */
    int merged = 0;
    for (int dim = 0; dim < kept; dim++) {
        if (merged > 0 && kept_strides[merged - 1] == kept_strides[dim] * kept_sizes[dim]) {
            kept_sizes[merged - 1] *= kept_sizes[dim];
            kept_strides[merged - 1] = kept_strides[dim];
        } else {
            kept_sizes[merged] = kept_sizes[dim];
            kept_strides[merged] = kept_strides[dim];
            merged++;
        }
    }
    view.values = values;
    if (merged == 0) {
        view.outer = 0;
        view.run = 1;
        view.step = 1;
    } else {
        view.outer = merged - 1;
        view.run = kept_sizes[merged - 1];
        view.step = kept_strides[merged - 1];
    }
    view.runs = 1;
    for (int dim = 0; dim < view.outer; dim++) {
        view.sizes[dim] = kept_sizes[dim];
        view.strides[dim] = kept_strides[dim];
        view.runs *= kept_sizes[dim];
    }
    if (!parallel) {
        struct f32_partial partial = EMPTY_PARTIAL;
        if (view.outer == 0 && view.step == 1)
            f32_range(values, 0, view.run, &partial);
        else
            f32_runs_range(&view, 0, view.runs, &partial);
        f32_combine(&partial, 1, out);
    } else if (view.outer == 0 && view.step == 1)
        /* dense once the repeats are dropped: the contiguous kernel, parallel where it is large */
        modeltrace_moments_f32(values, view.run, out);
    else
        f32_runs_moments(&view, out);
    out[0] *= weight;
    out[1] *= weight;
    out[2] *= weight;
    return 0;
}

int modeltrace_moments_f32_strided(const float *values, int64_t ndim, const int64_t *sizes, const int64_t *strides,
                                   double *out) {
    return f32_strided_moments(values, ndim, sizes, strides, out, 1);
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

static PyObject *moments_tuple(const double *out) {
    return Py_BuildValue("(ddddd)", out[0], out[1], out[2], out[3], out[4]);
}

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
    return moments_tuple(out);
}

/* f32_strided(address, sizes, strides): the tuple as f32 gives, or None where the view cannot be read in place. */
static PyObject *py_f32_strided(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "expected (address, sizes tuple, strides tuple)");
        return NULL;
    }
    Py_ssize_t ndim = PyTuple_GET_SIZE(args[1]);
    if (PyTuple_GET_SIZE(args[2]) != ndim) {
        PyErr_SetString(PyExc_ValueError, "sizes and strides differ in length");
        return NULL;
    }
    if (ndim > MAX_DIMS)
        Py_RETURN_NONE;
    int64_t sizes[MAX_DIMS], strides[MAX_DIMS], count = 1, span = 1;
    for (Py_ssize_t dim = 0; dim < ndim; dim++) {
        sizes[dim] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[1], dim));
        strides[dim] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[2], dim));
        count *= sizes[dim];
        span += sizes[dim] > 0 ? (sizes[dim] - 1) * (strides[dim] < 0 ? -strides[dim] : strides[dim]) : 0;
    }
    void *address = PyLong_AsVoidPtr(args[0]);
    if (PyErr_Occurred())
        return NULL;
    if (address == NULL) {
        PyErr_SetString(PyExc_ValueError, "address must be non-zero");
        return NULL;
    }
    double out[5];
    int status;
    /* A few elements far apart (a weight's fingerprint sample: 16,384 of its values, evenly strided) read as many
     * cache lines as a large tensor: the GIL is released for them too, so that the worker's second thread,
     * fingerprinting the weights while the forward runs, does not hold the forward's thread back meanwhile. */
    if (count >= PARALLEL_MIN || span >= PARALLEL_MIN * 16) {
        Py_BEGIN_ALLOW_THREADS
        status = modeltrace_moments_f32_strided(address, ndim, sizes, strides, out);
        Py_END_ALLOW_THREADS
    } else {
        status = modeltrace_moments_f32_strided(address, ndim, sizes, strides, out);
    }
    if (status != 0)
        Py_RETURN_NONE;
    return moments_tuple(out);
}

/* One weight of f32_fingerprints: its view, the flat positions of its sample, and what was read. */
struct fingerprint_item {
    const float *values;
    int64_t ndim, sizes[MAX_DIMS], strides[MAX_DIMS];
    const int64_t *positions;
    int64_t sampled;
    double out[5];
    int status;
};

/* f32_fingerprints(items), each item (address, sizes, strides, positions address, positions count) of a float32
 * tensor: [(sum, sum of squares, positives, min, max, (value at each position, ...)) or None, ...], None for an
 * item whose view cannot be read in place. The moments are the view's, as f32_strided gives them but on this
 * thread alone; the positions (int64 offsets from the address) are the weight's fixed sample. One call for a
 * whole model's weights, with the GIL released throughout: the worker's second thread runs it beside the
 * forward, whose thread then never waits for the GIL on its account (a Python loop there, handing the GIL back
 * and forth around each weight, cost a medium Llama's forward ~3%). */
static PyObject *py_f32_fingerprints(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "expected a list of (address, sizes, strides, positions, count) tuples");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(args[0]);
    struct fingerprint_item *items = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof *items);
    double *samples = NULL;
    PyObject *result = NULL;
    if (items == NULL)
        return PyErr_NoMemory();
    int64_t total_sampled = 0;
    for (Py_ssize_t index = 0; index < count; index++) {
        PyObject *item = PyList_GET_ITEM(args[0], index);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 5 || !PyTuple_Check(PyTuple_GET_ITEM(item, 1)) ||
            !PyTuple_Check(PyTuple_GET_ITEM(item, 2))) {
            PyErr_SetString(PyExc_TypeError, "expected (address, sizes tuple, strides tuple, positions, count)");
            goto done;
        }
        struct fingerprint_item *entry = &items[index];
        PyObject *sizes = PyTuple_GET_ITEM(item, 1), *strides = PyTuple_GET_ITEM(item, 2);
        entry->ndim = PyTuple_GET_SIZE(sizes);
        if (PyTuple_GET_SIZE(strides) != entry->ndim) {
            PyErr_SetString(PyExc_ValueError, "sizes and strides differ in length");
            goto done;
        }
        entry->status = entry->ndim > MAX_DIMS ? -1 : 0;
        for (int64_t dim = 0; dim < entry->ndim && dim < MAX_DIMS; dim++) {
            entry->sizes[dim] = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, dim));
            entry->strides[dim] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, dim));
        }
        entry->values = PyLong_AsVoidPtr(PyTuple_GET_ITEM(item, 0));
        entry->positions = PyLong_AsVoidPtr(PyTuple_GET_ITEM(item, 3));
        entry->sampled = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 4));
        if (PyErr_Occurred())
            goto done;
        if (entry->values == NULL || entry->sampled < 0 || (entry->sampled > 0 && entry->positions == NULL)) {
            PyErr_SetString(PyExc_ValueError, "addresses must be non-zero and counts non-negative");
            goto done;
        }
        total_sampled += entry->sampled;
    }
    samples = PyMem_Malloc(total_sampled > 0 ? (size_t)total_sampled * sizeof(double) : 1);
    if (samples == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    int64_t offset = 0;
    for (Py_ssize_t index = 0; index < count; index++) {
        struct fingerprint_item *entry = &items[index];
        if (entry->status == 0)
            entry->status = f32_strided_moments(entry->values, entry->ndim, entry->sizes, entry->strides,
                                                 entry->out, 0);
        for (int64_t position = 0; position < entry->sampled; position++)
            samples[offset + position] = entry->values[entry->positions[position]];
        offset += entry->sampled;
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(count);
    if (result == NULL)
        goto done;
    int64_t offset_out = 0;
    for (Py_ssize_t index = 0; index < count; index++) {
        struct fingerprint_item *entry = &items[index];
        PyObject *value;
        if (entry->status != 0) {
            Py_INCREF(Py_None);
            value = Py_None;
        } else {
            PyObject *sample = PyTuple_New((Py_ssize_t)entry->sampled);
            if (sample == NULL) {
                Py_CLEAR(result);
                goto done;
            }
            for (int64_t position = 0; position < entry->sampled; position++)
                PyTuple_SET_ITEM(sample, (Py_ssize_t)position, PyFloat_FromDouble(samples[offset_out + position]));
            value = Py_BuildValue("(dddddN)", entry->out[0], entry->out[1], entry->out[2], entry->out[3],
                                  entry->out[4], sample);
            if (value == NULL) {
                Py_CLEAR(result);
                goto done;
            }
        }
        offset_out += entry->sampled;
        PyList_SET_ITEM(result, index, value);
    }
done:
    PyMem_Free(samples);
    PyMem_Free(items);
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

/* the capture's per-call path (`worker/capture.py`): its `Wrapper` and `Session` types, from Python 3.11 (which
 * has PyFrame_GetLasti); on an older Python the capture keeps its Python closures */
#if PY_VERSION_HEX >= 0x030B0000
#include "capture_core.c"
#endif

static PyMethodDef methods[] = {
    {"f32", (PyCFunction)(void (*)(void))py_f32, METH_FASTCALL, "moments of float32 values at (address, count)"},
    {"f32_strided", (PyCFunction)(void (*)(void))py_f32_strided, METH_FASTCALL,
     "moments of a float32 view at (address, sizes, strides), in place; None where it cannot be read so"},
    {"f32_fingerprints", (PyCFunction)(void (*)(void))py_f32_fingerprints, METH_FASTCALL,
     "moments and fixed samples of float32 weights, one call for many, without the GIL"},
    {"f64", (PyCFunction)(void (*)(void))py_f64, METH_FASTCALL, "moments of float64 values at (address, count)"},
    {"i64", (PyCFunction)(void (*)(void))py_i64, METH_FASTCALL, "moments of int64 values at (address, count)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "modeltrace_moments", NULL, -1, methods};

PyMODINIT_FUNC PyInit_modeltrace_moments(void) {
    PyObject *created = PyModule_Create(&module);
#if PY_VERSION_HEX >= 0x030B0000
    if (created != NULL && capture_core_add(created) < 0)
        Py_CLEAR(created);
#endif
    return created;
}
#endif
