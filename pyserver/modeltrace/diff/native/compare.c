/* The diff's fused array comparison: one pass over a reference and a candidate array of one dtype, giving what
 * `diff/compare.py`'s `measure_arrays` needs (the largest |x - y|, the largest |x - y| / |x| over x != 0, the
 * largest |x - y| - rtol·|x|, max |x|, and the sums Σ(x-y)², Σx², Σy², Σxy in double precision).
 *
 * The differences and ratios are computed in the arrays' own precision, as numpy computes them, so the
 * maxima are the same numbers; the sums are accumulated in double (numpy's float32 dot accumulates in
 * float32). A NaN or Inf anywhere makes the squares non-finite (the hardware still computes them); the caller
 * checks the sums and measures such an array with numpy, which reports where the non-finite values differ.
 * That is why it may be built with -ffinite-math-only (which lets the compiler vectorise the maxima): nothing
 * here tests for NaN. Plain C, no intrinsics: the compiler vectorises the loop for whatever flags it is given
 * (baseline or the CPU's own); -ffp-contract=off keeps x - r·|x| rounded as numpy rounds it. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#define MODELTRACE_COMPARE(NAME, TYPE, FABS, LOWEST)                                                                  \
    void NAME(const TYPE *x, const TYPE *y, int64_t count, double relative, double *out) {                            \
        const TYPE rel = (TYPE)relative;                                                                              \
        TYPE max_abs = 0, max_rel = 0, excess = LOWEST, abs_max = 0;                                                  \
        double sq_diff = 0, sq_ref = 0, sq_cand = 0, dot = 0;                                                         \
        for (int64_t i = 0; i < count; i++) {                                                                         \
            const TYPE xi = x[i], yi = y[i];                                                                          \
            const TYPE d = FABS(xi - yi);                                                                             \
            const TYPE magnitude = FABS(xi);                                                                          \
            const TYPE over = d - rel * magnitude;                                                                    \
            const TYPE ratio = magnitude != 0 ? d / magnitude : 0;                                                    \
            max_abs = d > max_abs ? d : max_abs;                                                                      \
            excess = over > excess ? over : excess;                                                                   \
            max_rel = ratio > max_rel ? ratio : max_rel;                                                              \
            abs_max = magnitude > abs_max ? magnitude : abs_max;                                                      \
            const double xd = (double)xi, yd = (double)yi;                                                            \
            sq_diff += (xd - yd) * (xd - yd);                                                                         \
            sq_ref += xd * xd;                                                                                        \
            sq_cand += yd * yd;                                                                                       \
            dot += xd * yd;                                                                                           \
        }                                                                                                             \
        out[0] = max_abs;                                                                                             \
        out[1] = max_rel;                                                                                             \
        out[2] = excess;                                                                                              \
        out[3] = abs_max;                                                                                             \
        out[4] = sq_diff;                                                                                             \
        out[5] = sq_ref;                                                                                              \
        out[6] = sq_cand;                                                                                             \
        out[7] = dot;                                                                                                 \
    }

MODELTRACE_COMPARE(modeltrace_compare_f32, float, fabsf, -FLT_MAX)
MODELTRACE_COMPARE(modeltrace_compare_f64, double, fabs, -DBL_MAX)
