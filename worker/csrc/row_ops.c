/* The Llama family's small per-token ops, one call each instead of a dozen of torch's:
 * RMSNorm (optionally after the residual add) and the rotary embedding of q and k. fp32,
 * rows with unit stride, a row stride between them.
 *
 * Each row is computed by one thread and every sum taken in one fixed order (16 lane
 * partials over the row, then a fixed tree), so a row's result does not depend on the
 * call's other rows (docs/design/cpu-paths.md, "Batch-invariant mode"). Built with
 * -ffp-contract=off: the products and sums round as torch's separate ops do (the rotary
 * embedding then gives torch's very bits).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define LANES 16
#define PAR_MIN 16384   /* floats a call must touch before it spreads over the threads */

/* sum of x[i]^2 in a fixed order: lane l sums i = l mod 16 (the tail included), then a
 * pairwise tree over the lanes. */
static float sum_squares(const float *x, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l] * x[i + l];
    for (int l = 0; i + l < n; l++) acc[l] += x[i + l] * x[i + l];
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

static void norm_row(const float *x, const float *w, float eps, int64_t n, float *out) {
    const float r = 1.0f / sqrtf(sum_squares(x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* out = w * (x * rsqrt(mean(x^2) + eps)) row by row (transformers' LlamaRMSNorm); with
 * `res` non-NULL, x = res + x first and that sum is written to `sum` (the residual). */
void tl_rms_norm(const float *x, int64_t x_stride, const float *res, int64_t res_stride,
                 const float *w, float eps, int64_t rows, int64_t n, float *sum, float *out,
                 int threads) {
    #pragma omp parallel for num_threads(threads) if(rows * n >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        if (res != NULL) {
            const float *rr = res + r * res_stride;
            float *s = sum + r * n;
            for (int64_t i = 0; i < n; i++) s[i] = rr[i] + xr[i];
            xr = s;
        }
        norm_row(xr, w, eps, n, out + r * n);
    }
}

/* One head of `dim` (even) values: out = x * cos + rotate_half(x) * sin, rotate_half(x) =
 * (-x[half:], x[:half]). */
static void rope_head(const float *x, const float *c, const float *s, int64_t dim,
                      float *out) {
    const int64_t h = dim / 2;
    for (int64_t d = 0; d < h; d++) out[d] = x[d] * c[d] + (-x[d + h]) * s[d];
    for (int64_t d = h; d < dim; d++) out[d] = x[d] * c[d] + x[d - h] * s[d];
}

/* q [tokens, q_heads, dim] and k [tokens, k_heads, dim] (token strides qs, ks floats, heads
 * contiguous), cos and sin [tokens, dim] contiguous -> qo, ko contiguous. */
void tl_rope(const float *q, int64_t qs, int64_t q_heads, const float *k, int64_t ks,
             int64_t k_heads, const float *cos, const float *sin, int64_t tokens, int64_t dim,
             float *qo, float *ko, int threads) {
    #pragma omp parallel for num_threads(threads) if(tokens * (q_heads + k_heads) * dim >= PAR_MIN)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * dim, *s = sin + t * dim;
        for (int64_t g = 0; g < q_heads; g++)
            rope_head(q + t * qs + g * dim, c, s, dim, qo + (t * q_heads + g) * dim);
        for (int64_t g = 0; g < k_heads; g++)
            rope_head(k + t * ks + g * dim, c, s, dim, ko + (t * k_heads + g) * dim);
    }
}
