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

/* A tile's accumulators: R <= RT or BR rows by C <= NT or BC columns, lanes each. */
typedef lanes tile_acc[8][4];
#define INLINE static inline __attribute__((always_inline))

/* acc[r][c] += x's row r times run `run` of block i of weight row c: its two multiply-adds */
INLINE void run_fmas(int R, int c, const float *x, int64_t ldx, int64_t at, lanes w0, lanes w1,
                     tile_acc acc) {
    for (int r = 0; r < R; r++) {
        const float *xr = x + r * ldx + at;
        acc[r][c] = lanes_fma(lanes_load(xr), w0, acc[r][c]);
        acc[r][c] = lanes_fma(lanes_load(xr + 16), w1, acc[r][c]);
    }
}

/* Block i of each of the C weight rows, run by run. Runs outer, columns inner: the C
 * accumulator chains interleave, so a run's multiply-adds do not wait on the previous
 * run's latency. On AVX2 the runs are unrolled (a run's shifts become constants: 1.15x at
 * one row; on AVX-512 it cost 0.75x at 8 rows, so there the loop stays) */
INLINE void block_by_runs(int type, int R, int C, const float *x, int64_t ldx, const uint8_t *w,
                          int64_t ldw, int64_t i, const block_factors *f, tile_acc acc) {
    const int bytes = block_bytes(type), runs = block_runs(type);
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
            run_fmas(R, c, x, ldx, (i * runs + run) * QK, w0, w1, acc);
        }
    }
}

#if PAIRED_Q4K
/* The same for Q4_K, two runs a decode (decode_q4k_pair); each lane's order as above */
INLINE void q4k_pairs(int R, int C, const float *x, int64_t ldx, const uint8_t *w,
                      int64_t ldw, int64_t i, const block_factors *f, tile_acc acc) {
    const int bytes = block_bytes(Q4_K);
    for (int run = 0; run < 8; run += 2)
        for (int c = 0; c < C; c++) {
            const uint8_t *blk = w + c * ldw + i * bytes;
            __builtin_prefetch(blk + PF_TILES * C * ldw + run * bytes / 8, 0, 2);
            lanes wq[4];
            decode_q4k_pair(blk, run, &f[c], wq);
            run_fmas(R, c, x, ldx, (i * 8 + run) * QK, wq[0], wq[1], acc);
            run_fmas(R, c, x, ldx, (i * 8 + run + 1) * QK, wq[2], wq[3], acc);
        }
}
#endif

#if HALVED_Q6K
/* The same for Q6_K, half a super-block at a time: the half's quants of every column
 * (q6_half), then its runs in order, columns inner, as above */
INLINE void q6k_halves(int R, int C, const float *x, int64_t ldx, const uint8_t *w,
                       int64_t ldw, int64_t i, const block_factors *f, tile_acc acc) {
    const int bytes = block_bytes(Q6_K);
    int8_t q6[4][128] __attribute__((aligned(64)));
    for (int half = 0; half < 2; half++) {
        for (int c = 0; c < C; c++) {
            const uint8_t *blk = w + c * ldw + i * bytes;
            /* bytes 0, 64, 128 | 192, 209: no line of the block's 210 missed */
            const uint8_t *ahead = blk + PF_TILES * C * ldw + (half ? 192 : 0);
            __builtin_prefetch(ahead, 0, 2);
            __builtin_prefetch(ahead + (half ? 17 : 64), 0, 2);
            if (!half) __builtin_prefetch(ahead + 128, 0, 2);
            q6_half(blk, half, q6[c]);
        }
        for (int t = 0; t < 4; t++) {
            const int run = 4 * half + t;
            for (int c = 0; c < C; c++) {
                lanes w0, w1;
                q6_weights(q6[c] + 32 * t, f[c].scale[2 * run], f[c].scale[2 * run + 1], &w0,
                           &w1);
                run_fmas(R, c, x, ldx, (i * 8 + run) * QK, w0, w1, acc);
            }
        }
    }
}
#endif

/* R rows of x (stride ldx) by C weight rows (stride ldw bytes) -> y (stride ldy). R and C
 * are constants where it is inlined, so the R x C accumulators stay in registers. */
INLINE void tile(int type, int R, int C, const float *x, int64_t ldx, const uint8_t *w,
                 int64_t ldw, int64_t blocks, const float *b, float *y, int64_t ldy) {
    const int bytes = block_bytes(type);
    tile_acc acc;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = lanes_zero();
    for (int64_t i = 0; i < blocks; i++) {
        block_factors f[4];                  /* each column's block scales, once a block */
        for (int c = 0; c < C; c++) block_factors_of(type, w + c * ldw + i * bytes, &f[c]);
#if PAIRED_Q4K
        if (type == Q4_K && R <= 2) {        /* at 4 rows and more pairs cost more than
                                              * they save (0.93-0.96x at 8) */
            q4k_pairs(R, C, x, ldx, w, ldw, i, f, acc);
            continue;
        }
#endif
#if HALVED_Q6K
        if (type == Q6_K) {
            q6k_halves(R, C, x, ldx, w, ldw, i, f, acc);
            continue;
        }
#endif
        block_by_runs(type, R, C, x, ldx, w, ldw, i, f, acc);
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

#include "quant_decoded.h"
#include "quant_bf16.h"
#include "quant_int8.h"

/* x [m][k], w [n][k] in `type`'s blocks, b [n] or NULL -> y [m][n]. 0, or -1 for a type
 * it does not know or k not a multiple of its block (32 or 256 weights). */
int tl_quant_matmul(const float *x, const uint8_t *w, int type, const float *b, float *y,
                    int64_t m, int64_t k, int64_t n, int threads) {
#if HAS_INT8
    if ((type & INT8_ACTIVATIONS) && int8_matmul(x, w, type & 0xff, b, y, m, k, n, threads) == 0)
        return 0;
    type &= ~INT8_ACTIVATIONS;   /* a type the int8 path lacks: the float32 path's answer */
#endif
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
