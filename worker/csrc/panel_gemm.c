/* Linear layers y = x @ w^T + b (fp32) on weights laid out once in column panels.
 *
 * A panel is NR consecutive output columns, stored k-major: panels[p][k][j] is
 * w[p * NR + j][k]. A call walks the panels (split among the threads) and, within one, the
 * rows of x in blocks of up to MR; each block keeps its MR x NR outputs in registers while
 * k runs from 0 to K, then adds the bias. So every output is
 *     fma(x[m][K-1], w[n][K-1], ... fma(x[m][0], w[n][0], 0)) + b[n]
 * in that order, whatever the row count, the block a row lands in or the thread count: a
 * row's result does not depend on the other rows of the call (docs/design/cpu-paths.md, "Panel
 * linear layers"). One row reads each panel once, front to back: the weights stream from
 * memory at the machine's bandwidth, where oneDNN's and MKL's small-M paths do not.
 *
 * Written with GCC vector extensions, so -march picks the instruction set; GCC contracts
 * `acc += x * w` to one fused multiply-add wherever the target has one.
 */
#include <stdint.h>
#include <string.h>

#define NR 32                          /* output columns per panel: two 16-float vectors */
#define MR 12                          /* rows of x per register block */
typedef float v16 __attribute__((vector_size(64)));

static inline v16 load(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, v16 v) { memcpy(p, &v, sizeof v); }

int tl_panel_width(void) { return NR; }

/* w [n][k] -> panels [n / NR][k][NR]; n is a multiple of NR. */
void tl_panels_pack(const float *w, float *panels, int64_t n, int64_t k, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < n / NR; p++)
        for (int64_t i = 0; i < k; i++)
            for (int j = 0; j < NR; j++)
                panels[(p * k + i) * NR + j] = w[(p * NR + j) * k + i];
}

/* Rows x[0..R) against one panel into y (row stride ldy); R is a compile-time constant in
 * each instance, so the accumulators live in registers. */
#define BLOCK(R)                                                                           \
    static void block##R(const float *x, int64_t k, const float *panel, const float *b,   \
                         float *y, int64_t ldy) {                                         \
        v16 lo[R], hi[R];                                                                  \
        for (int r = 0; r < R; r++) lo[r] = hi[r] = (v16){0};                              \
        for (int64_t i = 0; i < k; i++) {                                                  \
            v16 w0 = load(panel + i * NR), w1 = load(panel + i * NR + 16);                 \
            for (int r = 0; r < R; r++) {                                                  \
                v16 xv = (v16){0} + x[r * k + i];                                          \
                lo[r] += xv * w0;                                                          \
                hi[r] += xv * w1;                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < R; r++) {                                                      \
            if (b) { lo[r] += load(b); hi[r] += load(b + 16); }                            \
            store(y + r * ldy, lo[r]);                                                     \
            store(y + r * ldy + 16, hi[r]);                                                \
        }                                                                                  \
    }
BLOCK(1) BLOCK(2) BLOCK(3) BLOCK(4) BLOCK(5) BLOCK(6)
BLOCK(7) BLOCK(8) BLOCK(9) BLOCK(10) BLOCK(11) BLOCK(12)

typedef void (*block_fn)(const float *, int64_t, const float *, const float *, float *, int64_t);
static const block_fn BLOCKS[MR + 1] = {0, block1, block2, block3, block4, block5, block6,
                                        block7, block8, block9, block10, block11, block12};

/* x [m][k], panels of a [n][k] weight, b [n] or NULL -> y [m][n]. */
void tl_panels_linear(const float *x, const float *panels, const float *b, float *y,
                      int64_t m, int64_t k, int64_t n, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < n / NR; p++) {
        const float *panel = panels + p * k * NR;
        const float *bp = b ? b + p * NR : 0;
        for (int64_t r = 0; r < m; r += MR) {
            int rows = m - r < MR ? (int)(m - r) : MR;
            BLOCKS[rows](x + r * k, k, panel, bp, y + r * n + p * NR, n);
        }
    }
}
