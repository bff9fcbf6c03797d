/* Linear layers y = x @ W^T + b (fp32 x and y) on weights kept in GGUF's quantized blocks.
 *
 * W [n][k] is stored row by row, each row k / 32 blocks of 32 weights (Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1) or k / 256 super-blocks of 256 (Q4_K, Q5_K, Q6_K), as ggml lays them
 * (quant_blocks.h). Each weight is decoded to the float32 nearest its exact value (a scale
 * times a quant is exact in fp32, so one rounding at most, an added or subtracted min), the
 * very bits of gguf-py's dequantize and worker/linear/quant.py's. A row is read as runs of
 * 32 weights (a super-block's 8 runs in order): run i is weights 32i .. 32i + 31.
 *
 * Summation order, the same for every output whatever the call's rows, the tile a row or
 * column falls in, the thread count and the instruction set (AVX-512, AVX2 or scalar):
 * sixteen lanes, lane l summing with fused multiply-adds, from 0,
 *     for each run i:    a[l] = fma(x[32i + l], w[32i + l], a[l]);
 *                        a[l] = fma(x[32i + 16 + l], w[32i + 16 + l], a[l]);
 * then halving: h8[l] = a[l] + a[l+8], h4[l] = h8[l] + h8[l+4], h2[l] = h4[l] + h4[l+2],
 * y = h2[0] + h2[1], then y + b[n]. So a row's result does not depend on the other rows
 * (the batch-invariant mode's guarantee, docs/design/cpu-paths.md "Quantized weights").
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "quant_blocks.h"

#if defined(__AVX512F__)
#include "quant_lanes_avx512.h"
#elif defined(__AVX2__)
#include "quant_lanes_avx2.h"
#else
#include "quant_lanes_scalar.h"
#endif

/* How far ahead, in tiles, a tile prefetches its weight blocks. */
#define PF_TILES 2

const char *tl_quant_isa(void) { return ISA; }

/* R rows of x (stride ldx) by C weight rows (stride ldw bytes) -> y (stride ldy). R and C
 * are constants where it is inlined, so the R x C accumulators stay in registers. */
static inline __attribute__((always_inline)) void
tile(int type, int R, int C, const float *x, int64_t ldx, const uint8_t *w, int64_t ldw,
     int64_t blocks, const float *b, float *y, int64_t ldy) {
    const int bytes = block_bytes(type), runs = block_runs(type);
    lanes acc[8][4];                         /* R <= RT or BR, C <= NT or BC */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = lanes_zero();
    for (int64_t i = 0; i < blocks; i++) {
        block_factors f[4];                  /* each column's block scales, once a block */
        for (int c = 0; c < C; c++) block_factors_of(type, w + c * ldw + i * bytes, &f[c]);
        /* runs outer, columns inner: the C accumulator chains interleave, so a run's
         * multiply-adds do not wait on the previous run's latency. On AVX2 the runs are
         * unrolled (a run's shifts become constants: 1.15x at one row; on AVX-512 it cost
         * 0.75x at 8 rows, so there the loop stays) */
#if UNROLL_RUNS
        #pragma GCC unroll 8
#endif
        for (int run = 0; run < runs; run++) {
            for (int c = 0; c < C; c++) {
                lanes w0, w1;
                const uint8_t *blk = w + c * ldw + i * bytes;
                /* a tile's rows are only k / 32 blocks long, too short for the hardware's
                 * stream prefetcher to start: fetch the same bytes two tiles ahead, into L2
                 * (prefetcht1): into L1 the requests queue behind the loads' misses, and a
                 * one-row Q8_0 call read memory at 17 GB/s on 2 threads where it now reads
                 * 27. A super-block's runs each fetch their share of its lines. */
                __builtin_prefetch(blk + PF_TILES * C * ldw + run * bytes / runs, 0, 2);
                lanes_decode(type, blk, run, &f[c], &w0, &w1);
                for (int r = 0; r < R; r++) {
                    const float *xr = x + r * ldx + (i * runs + run) * QK;
                    acc[r][c] = lanes_fma(lanes_load(xr), w0, acc[r][c]);
                    acc[r][c] = lanes_fma(lanes_load(xr + 16), w1, acc[r][c]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = lanes_sum(acc[r][c]);
            if (b) s += b[c];
            y[r * ldy + c] = s;
        }
}

typedef void (*tile_fn)(const float *, int64_t, const uint8_t *, int64_t, int64_t,
                        const float *, float *, int64_t);
#define TILE(T, R, C)                                                                      \
    static void tile_##T##_##R##_##C(const float *x, int64_t ldx, const uint8_t *w,       \
                                     int64_t ldw, int64_t blocks, const float *b,         \
                                     float *y, int64_t ldy) {                             \
        tile(T, R, C, x, ldx, w, ldw, blocks, b, y, ldy);                                  \
    }
#define TILES_C(T, R) TILE(T, R, 1) TILE(T, R, 2) TILE(T, R, 3) TILE(T, R, 4)
#if BR
#define BIG(T) TILE(T, BR, BC)
#define BIG_FN(T) tile_##T##_BR_BC
#else
#define BIG(T)
#define BIG_FN(T) 0
#endif
#define ROW(T, R) {tile_##T##_##R##_1, tile_##T##_##R##_2, tile_##T##_##R##_3, tile_##T##_##R##_4}
/* A type's tiles: RT x NT and smaller, and its BR x BC one (a call of at least BR rows takes
 * it, where the ISA has it), or 0. Every tile sums an output in the same order, so a row's
 * result does not depend on which tile it fell in.
 * The super-block types have no big tile: beside its 24 accumulators, a K-quant's decode
 * (sub-block scales and mins, masks) no longer fits the registers. scripts/benchmarks/
 * kernel_rows.py, AVX-512, 8 and 12 rows (the path below PRE_ROWS), 4 x 4 tiles against
 * 8 x 3: Q4_K 1.13-1.21x, Q5_K 1.01-1.06x, Q6_K 1.00-1.08x; the 32-weight types keep theirs
 * (Q8_0 0.90x, Q5_0 0.84x without it). */
typedef struct { tile_fn small[4][4], big; } tiles;
#define TABLE(T, BIG_TILE) TILES_C(T, 1) TILES_C(T, 2) TILES_C(T, 3) TILES_C(T, 4)           \
    static const tiles TILES_##T = {{ROW(T, 1), ROW(T, 2), ROW(T, 3), ROW(T, 4)}, BIG_TILE};
#define TILES(T) BIG(T) TABLE(T, BIG_FN(T))
#define TILES_NO_BIG(T) TABLE(T, 0)
TILES(Q4_0) TILES(Q4_1) TILES(Q5_0) TILES(Q5_1) TILES(Q8_0)
TILES_NO_BIG(Q4_K) TILES_NO_BIG(Q5_K) TILES_NO_BIG(Q6_K)

static const tiles *tiles_of(int type) {
    switch (type) {
    case Q4_0: return &TILES_Q4_0;
    case Q4_1: return &TILES_Q4_1;
    case Q5_0: return &TILES_Q5_0;
    case Q5_1: return &TILES_Q5_1;
    case Q8_0: return &TILES_Q8_0;
    case Q4_K: return &TILES_Q4_K;
    case Q5_K: return &TILES_Q5_K;
    case Q6_K: return &TILES_Q6_K;
    default: return 0;
    }
}

#if defined(__AVX512F__) || defined(__AVX2__)
/* A call of PRE_ROWS rows or more decodes each weight once, NC columns at a time (NC / 2
 * for long rows: strip_cols), into floats that stay in L2 (NC x k x 4 bytes), and
 * multiplies them in PR x PC tiles. The tiles above decode a block once per tile of rows
 * they run (on AVX2, 2 rows: a 64-row call decodes every block 32 times), and read one
 * operand of every multiply-add from L1 (x, or the decoded weights), as many loads as
 * multiply-adds: on AVX-512 bound by L1's bandwidth at ~65% of the FMA peak. Here a half
 * block's PC weight vectors and each row's x vector are loaded once into registers (the
 * empty asm keeps the compiler from folding them back into memory operands). Every output
 * is still summed in the order at the head of this file: the bits are the same. */
#define NC 48                                /* a multiple of 2 x PC */
/* A long row (the MLP's down projection, k 8192 on a 1B model) takes strips of NC / 2
 * columns: a 48-column strip of it is 1.5 MB of floats, and beside x's rows L2 no longer
 * keeps it. scripts/benchmarks/kernel_rows.py, k 8192 -> 2048 at 64 and 256 rows, against
 * 48 columns: Q4_K and Q6_K 1.13-1.17x on AVX-512, 1.07-1.11x on AVX2; at k 2048 NC / 2 was
 * no faster. A strip's width does not touch the order an output is summed in. */
#define LONG_ROW 4096
/* A decoded weight row takes k + ROW_PAD floats: at a stride of k floats (a multiple of
 * 1 KB for every k the types allow past 256), a tile's 6 weight rows map to the same few
 * sets of L1. Measured with the kernel built at -DROW_PAD=0 and 16 side by side in one run
 * (AVX-512 Xeon, 256 rows, Q4_K, Q6_K, Q4_0 and Q8_0 at the 1B and 1.5B models' shapes):
 * 1.00-1.10x, the same bits (only the buffer's layout moves); padding x too was slower. */
#ifndef ROW_PAD
#define ROW_PAD 16
#endif
static inline int64_t strip_cols(int64_t k) { return k > LONG_ROW ? NC / 2 : NC; }
#if defined(__AVX512F__)
/* The 32-weight types' big tiles (8 x 3) stay ahead of the decoded path up to 24 rows:
 * kernel_rows.py at 16 rows, Q4_0 1.10-1.19x and Q8_0 1.19-1.26x the decoded path's speed,
 * at 24 rows even, at 32 behind. The super-blocks' 4 x 4 tiles are even at 16 rows. */
#define PRE_ROWS 16
#define PRE_ROWS_BIG 24
#define PR 4
#define PC 6                                 /* 24 accumulators, 6 weights, 1 x: 31 */

static inline __attribute__((always_inline)) lanes in_register(lanes v) {
    __asm__("" : "+v"(v));
    return v;
}

/* One half block (16 lanes) of x's R rows by C decoded weight rows, into acc: 10 loads for
 * 24 multiply-adds, ~30% more work a second than the tiles at 64-512 rows. */
static inline __attribute__((always_inline)) void
half_block(int R, int C, const float *x, int64_t k, const float *w, int64_t ldw,
           lanes acc[PR][PC]) {
    lanes wv[PC];
    for (int c = 0; c < C; c++) wv[c] = in_register(lanes_load(w + c * ldw));
    for (int r = 0; r < R; r++) {
        lanes xv = in_register(lanes_load(x + r * k));
        for (int c = 0; c < C; c++) acc[r][c] = lanes_fma(xv, wv[c], acc[r][c]);
    }
}
#define DTILES(R) DTILE(R, 1) DTILE(R, 2) DTILE(R, 3) DTILE(R, 4) DTILE(R, 5) DTILE(R, 6)
#define DROW(R) {decoded_##R##_1, decoded_##R##_2, decoded_##R##_3, decoded_##R##_4,       \
                 decoded_##R##_5, decoded_##R##_6}
#define DROWS {DROW(1), DROW(2), DROW(3), DROW(4)}
#else
#define PRE_ROWS 6                           /* measured: 0.74x the tiles' time at 6 rows */
#define PRE_ROWS_BIG PRE_ROWS                /* no big tiles on AVX2 */
#define PR 3
#define PC 2                                 /* 12 accumulators, 2 weights, 1 x: 15 of 16 */

static inline __attribute__((always_inline)) __m256 in_register(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

/* One eighth of a block (8 lanes) of x's R rows by C decoded weight rows, into the lanes
 * 0-7 (.a) or 8-15 (.b) of acc. */
static inline __attribute__((always_inline)) void
eighth(int R, int C, const float *x, int64_t k, const float *w, int64_t ldw, int hi,
       lanes acc[PR][PC]) {
    __m256 wv[PC];
    for (int c = 0; c < C; c++) wv[c] = in_register(_mm256_loadu_ps(w + c * ldw));
    for (int r = 0; r < R; r++) {
        __m256 xv = in_register(_mm256_loadu_ps(x + r * k));
        for (int c = 0; c < C; c++) {
            __m256 *a = hi ? &acc[r][c].b : &acc[r][c].a;
            *a = _mm256_fmadd_ps(xv, wv[c], *a);
        }
    }
}

/* A half block as two eighths, so that a tile's accumulators fit the 16 registers: 5 loads
 * for 6 multiply-adds. */
static inline __attribute__((always_inline)) void
half_block(int R, int C, const float *x, int64_t k, const float *w, int64_t ldw,
           lanes acc[PR][PC]) {
    eighth(R, C, x, k, w, ldw, 0, acc);
    eighth(R, C, x + 8, k, w + 8, ldw, 1, acc);
}
#define DTILES(R) DTILE(R, 1) DTILE(R, 2)
#define DROW(R) {decoded_##R##_1, decoded_##R##_2}
#define DROWS {DROW(1), DROW(2), DROW(3)}
#endif

/* Each lane's sum runs over the half blocks in order, as at the head of this file. */
static inline __attribute__((always_inline)) void
decoded_tile(int R, int C, const float *x, int64_t k, const float *w, int64_t ldw,
             const float *b, float *y, int64_t ldy) {
    lanes acc[PR][PC];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = lanes_zero();
    for (int64_t j = 0; j < k; j += 16) half_block(R, C, x + j, k, w + j, ldw, acc);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = lanes_sum(acc[r][c]);
            if (b) s += b[c];
            y[r * ldy + c] = s;
        }
}

typedef void (*decoded_fn)(const float *, int64_t, const float *, int64_t, const float *,
                           float *, int64_t);
#define DTILE(R, C)                                                                        \
    static void decoded_##R##_##C(const float *x, int64_t k, const float *w, int64_t ldw, \
                                  const float *b, float *y, int64_t ldy) {                \
        decoded_tile(R, C, x, k, w, ldw, b, y, ldy);                                       \
    }
DTILES(1) DTILES(2) DTILES(3)
#if PR == 4
DTILES(4)
#endif
static const decoded_fn DECODED[PR][PC] = DROWS;

#if defined(__AVX512F__)
/* Half blocks j0 .. j1 - 1 of x's R rows by C decoded weight rows, added to the sums in
 * acc, each lane's sum in order as above whatever the chunks a call is cut into. The sums
 * are copied into a local array for the loop, so that they stay in registers (acc itself
 * may alias x and w). */
static inline __attribute__((always_inline)) void
decoded_part(int R, int C, const float *x, int64_t k, const float *w, int64_t ldw,
             int64_t j0, int64_t j1, lanes acc[PR][PC]) {
    lanes a[PR][PC];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) a[r][c] = acc[r][c];
    for (int64_t j = j0; j < j1; j += 16) half_block(R, C, x + j, k, w + j, ldw, a);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = a[r][c];
}

typedef void (*part_fn)(const float *, int64_t, const float *, int64_t, int64_t, int64_t,
                        lanes (*)[PC]);
#define PTILE(R, C)                                                                        \
    static void part_##R##_##C(const float *x, int64_t k, const float *w, int64_t ldw,    \
                               int64_t j0, int64_t j1, lanes acc[PR][PC]) {                \
        decoded_part(R, C, x, k, w, ldw, j0, j1, acc);                                     \
    }
#define PTILES(R) PTILE(R, 1) PTILE(R, 2) PTILE(R, 3) PTILE(R, 4) PTILE(R, 5) PTILE(R, 6)
#define PROW(R) {part_##R##_1, part_##R##_2, part_##R##_3, part_##R##_4, part_##R##_5,     \
                 part_##R##_6}
PTILES(1) PTILES(2) PTILES(3) PTILES(4)
static const part_fn PARTS[PR][PC] = {PROW(1), PROW(2), PROW(3), PROW(4)};

/* A strip whose rows are at most LONG_ROW long is multiplied KC floats of k at a time: PR
 * rows of x over KC (4 KB) stay in L1 while the strip's column tiles pass them, where over
 * the whole of k (4 rows of k 2048: 32 KB, beside 6 weight rows' 48 KB) every x load came
 * from L2. Between chunks a tile's sums wait in memory (a row group's: NC x PR lanes,
 * 12 KB): each output is summed in the same order, so its bits are the same.
 * scripts/benchmarks/kernel_rows.py against one pass, alternating (Zen 5, 64 and 256 rows,
 * k 2048): Q4_K 1.01-1.11x, Q6_K 1.04-1.12x, Q4_0 1.03-1.09x. Long rows (k 8192, 24-column
 * strips: 0.89-1.0x) and AVX2's 3 x 2 tiles (0.65x) keep one pass. */
#define KC 256

static void chunked_strip(const float *x, int64_t m, int64_t k, const float *wf, int64_t ldo,
                          int64_t cols, const float *b, float *y, int64_t n) {
    lanes acc[NC / PC][PR][PC];
    for (int64_t r0 = 0; r0 < m; r0 += PR) {
        int nr = m - r0 < PR ? (int)(m - r0) : PR;
        for (int64_t t = 0; t < (cols + PC - 1) / PC; t++)
            for (int r = 0; r < PR; r++)
                for (int c = 0; c < PC; c++) acc[t][r][c] = lanes_zero();
        for (int64_t j0 = 0; j0 < k; j0 += KC) {
            int64_t j1 = k - j0 < KC ? k : j0 + KC;
            for (int64_t c0 = 0; c0 < cols; c0 += PC) {
                int nc = cols - c0 < PC ? (int)(cols - c0) : PC;
                PARTS[nr - 1][nc - 1](x + r0 * k, k, wf + c0 * ldo, ldo, j0, j1, acc[c0 / PC]);
            }
        }
        for (int64_t c0 = 0; c0 < cols; c0 += PC)
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < PC && c0 + c < cols; c++) {
                    float s = lanes_sum(acc[c0 / PC][r][c]);
                    if (b) s += b[c0 + c];
                    y[(r0 + r) * n + c0 + c] = s;
                }
    }
}
#endif

/* The `cols` weight rows of `type` at w (stride ldw bytes) decoded into out [cols][k], a
 * row every ldo floats. */
static void decode_rows(int type, const uint8_t *w, int64_t ldw, int64_t blocks,
                        int64_t cols, float *out, int64_t ldo) {
    const int bytes = block_bytes(type), runs = block_runs(type);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t i = 0; i < blocks; i++) {
            const uint8_t *blk = w + c * ldw + i * bytes;
            block_factors f;
            block_factors_of(type, blk, &f);
            for (int run = 0; run < runs; run++) {
                lanes w0, w1;
                float *at = out + c * ldo + (i * runs + run) * QK;
                lanes_decode(type, blk, run, &f, &w0, &w1);
                lanes_store(at, w0);
                lanes_store(at + 16, w1);
            }
        }
}

/* y[:, 0:cols] (row stride n) from x [m][k] and `cols` decoded weight rows wf [cols][k]
 * (a row every ldo floats): rows outer, so a tile's rows of x are read from L1 across the
 * columns. */
static void decoded_strip(const float *x, int64_t m, int64_t k, const float *wf, int64_t ldo,
                          int64_t cols, const float *b, float *y, int64_t n) {
    for (int64_t r0 = 0; r0 < m; r0 += PR) {
        int nr = m - r0 < PR ? (int)(m - r0) : PR;
        for (int64_t c0 = 0; c0 < cols; c0 += PC) {
            int nc = cols - c0 < PC ? (int)(cols - c0) : PC;
            DECODED[nr - 1][nc - 1](x + r0 * k, k, wf + c0 * ldo, ldo, b ? b + c0 : 0,
                                    y + r0 * n + c0, n);
        }
    }
}

/* tl_quant_matmul's path for m >= PRE_ROWS (PRE_ROWS_BIG for a type with a big tile): 0,
 * or -1 where a thread's scratch memory was short (the caller then computes every output
 * again with the tiles that decode). */
static int decoded_matmul(const float *x, const uint8_t *w, int type, const float *b,
                          float *y, int64_t m, int64_t k, int64_t n, int threads) {
    const int64_t blocks = k / (QK * block_runs(type)), ldw = blocks * block_bytes(type);
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        const int64_t nc = strip_cols(k), ldo = k + ROW_PAD;
        float *buf = aligned_alloc(64, nc * ldo * sizeof(float));
        failed = buf == NULL;
        #pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < n; n0 += nc) {
            if (buf == NULL) continue;
            int64_t cols = n - n0 < nc ? n - n0 : nc;
            decode_rows(type, w + n0 * ldw, ldw, blocks, cols, buf, ldo);
#if defined(__AVX512F__)
            if (k <= LONG_ROW) {
                chunked_strip(x, m, k, buf, ldo, cols, b ? b + n0 : 0, y + n0, n);
                continue;
            }
#endif
            decoded_strip(x, m, k, buf, ldo, cols, b ? b + n0 : 0, y + n0, n);
        }
        free(buf);
    }
    return failed ? -1 : 0;
}
#define HAS_DECODED 1
#else
#define HAS_DECODED 0
#endif

/* x [m][k], w [n][k] in `type`'s blocks, b [n] or NULL -> y [m][n]. 0, or -1 for a type
 * it does not know or k not a multiple of its block (32 or 256 weights). */
int tl_quant_matmul(const float *x, const uint8_t *w, int type, const float *b, float *y,
                    int64_t m, int64_t k, int64_t n, int threads) {
    const tiles *t = tiles_of(type);
    if (!t || k % (QK * block_runs(type))) return -1;
    const tile_fn (*table)[4] = t->small;
#if HAS_DECODED
    const int64_t pre_rows = t->big ? PRE_ROWS_BIG : PRE_ROWS;
    if (m >= pre_rows && decoded_matmul(x, w, type, b, y, m, k, n, threads) == 0) return 0;
#endif
    const int64_t blocks = k / (QK * block_runs(type)), ldw = blocks * block_bytes(type);
    const tile_fn big = m >= BR ? t->big : 0;
    const int64_t step = big ? BC : NT, big_rows = big ? m - m % (BR ? BR : 1) : 0;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n0 = 0; n0 < n; n0 += step) {
        int cols = n - n0 < step ? (int)(n - n0) : (int)step;
        int64_t r0 = 0;
        if (cols == BC)
            for (; r0 < big_rows; r0 += BR)
                big(x + r0 * k, k, w + n0 * ldw, ldw, blocks, b ? b + n0 : 0, y + r0 * n + n0, n);
        for (; r0 < m; r0 += RT) {
            int rows = m - r0 < RT ? (int)(m - r0) : RT;
            table[rows - 1][cols - 1](x + r0 * k, k, w + n0 * ldw, ldw, blocks,
                                      b ? b + n0 : 0, y + r0 * n + n0, n);
        }
    }
    return 0;
}
