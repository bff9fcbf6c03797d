/* Linear layers y = x @ W^T + b (fp32 x and y) on weights kept in GGUF's quantized blocks.
 *
 * W [n][k] is stored row by row, each row k / 32 blocks of 32 weights, as ggml lays them:
 *   Q8_0 (34 bytes): fp16 d, int8 q[32];                 w[j] = d * q[j]
 *   Q4_0 (18 bytes): fp16 d, uint8 qs[16];               w[j] = d * (nibble(j) - 8)
 *   Q4_1 (20 bytes): fp16 d, fp16 m, uint8 qs[16];       w[j] = d * nibble(j) + m
 * where nibble(j) is qs[j] & 15 for j < 16 and qs[j - 16] >> 4 for j >= 16.
 * Each weight is decoded to the float32 nearest its exact value (d * q is exact in fp32, so
 * one rounding at most, Q4_1's + m), the very bits of worker/linear/quant.py's dequantize.
 *
 * Summation order, the same for every output whatever the call's rows, the tile a row or
 * column falls in, the thread count and the instruction set (AVX-512, AVX2 or scalar):
 * sixteen lanes, lane l summing with fused multiply-adds, from 0,
 *     for each block i:  a[l] = fma(x[32i + l], w[32i + l], a[l]);
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

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };     /* ggml's type ids */
#define QK 32                                /* weights per block */

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) {                        /* subnormal: normalize */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 1024));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 1023) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* lanes: the sixteen accumulator lanes; lanes_decode puts a block's weights 0..15 in w0
 * and 16..31 in w1, lane for lane. */
#if defined(__AVX512F__)
#define ISA "avx512"
#define RT 4                                 /* rows per tile */
#define NT 4                                 /* columns per tile */
#define BR 8                                 /* a call of BR rows or more: BR x BC tiles, */
#define BC 3                                 /* 24 accumulators of the 32 registers */
typedef __m512 lanes;
static inline lanes lanes_zero(void) { return _mm512_setzero_ps(); }
static inline lanes lanes_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void lanes_store(float *p, lanes a) { _mm512_storeu_ps(p, a); }
static inline lanes lanes_fma(lanes x, lanes w, lanes a) { return _mm512_fmadd_ps(x, w, a); }
static inline float lanes_sum(lanes a) {
    __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}
static inline void lanes_decode(int type, const uint8_t *blk, lanes *w0, lanes *w1) {
    __m512 d = _mm512_set1_ps(half_to_float(blk));
    if (type == Q8_0) {
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                  _mm_loadu_si128((const __m128i *)(blk + 2)))), d);
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                  _mm_loadu_si128((const __m128i *)(blk + 18)))), d);
        return;
    }
    /* A 4-bit weight has sixteen values: decode them once into a table and look each
     * weight up by its nibble (vpermps reads an index's low 4 bits, so the low nibble needs
     * no mask). The table holds the very floats the arithmetic gave: d * (v - 8) exact,
     * fma(v, d, m) one rounding. */
    const uint8_t *qs = blk + (type == Q4_1 ? 4 : 2);
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table = type == Q4_0
        ? _mm512_mul_ps(_mm512_sub_ps(values, _mm512_set1_ps(8.0f)), d)
        : _mm512_fmadd_ps(values, d, _mm512_set1_ps(half_to_float(blk + 2)));
    *w0 = _mm512_permutexvar_ps(q, table);
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
}
#elif defined(__AVX2__)
#define ISA "avx2"
#define RT 2
#define NT 2
#define BR 0                                 /* no larger tiles: 16 registers */
#define BC 1
typedef struct { __m256 a, b; } lanes;       /* lanes 0..7, 8..15 */
static inline lanes lanes_zero(void) { return (lanes){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline lanes lanes_load(const float *p) {
    return (lanes){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
static inline void lanes_store(float *p, lanes a) {
    _mm256_storeu_ps(p, a.a);
    _mm256_storeu_ps(p + 8, a.b);
}
static inline lanes lanes_fma(lanes x, lanes w, lanes a) {
    return (lanes){_mm256_fmadd_ps(x.a, w.a, a.a), _mm256_fmadd_ps(x.b, w.b, a.b)};
}
static inline float lanes_sum(lanes a) {
    __m256 h8 = _mm256_add_ps(a.a, a.b);
    __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}
static inline __m256 q8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline void lanes_decode(int type, const uint8_t *blk, lanes *w0, lanes *w1) {
    __m256 d = _mm256_set1_ps(half_to_float(blk));
    if (type == Q8_0) {
        *w0 = (lanes){_mm256_mul_ps(q8x8(blk + 2), d), _mm256_mul_ps(q8x8(blk + 10), d)};
        *w1 = (lanes){_mm256_mul_ps(q8x8(blk + 18), d), _mm256_mul_ps(q8x8(blk + 26), d)};
        return;
    }
    __m128i bytes = _mm_loadu_si128((const __m128i *)(blk + (type == Q4_1 ? 4 : 2)));
    __m256i q0 = _mm256_cvtepu8_epi32(bytes), q1 = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
    __m256i f = _mm256_set1_epi32(15);
    __m256i n[4] = {_mm256_and_si256(q0, f), _mm256_and_si256(q1, f),
                    _mm256_srli_epi32(q0, 4), _mm256_srli_epi32(q1, 4)};
    __m256 w[4];
    if (type == Q4_0) {
        __m256i eight = _mm256_set1_epi32(8);
        for (int i = 0; i < 4; i++)
            w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(n[i], eight)), d);
    } else {
        __m256 m = _mm256_set1_ps(half_to_float(blk + 2));
        for (int i = 0; i < 4; i++)
            w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n[i]), d, m);
    }
    *w0 = (lanes){w[0], w[1]};
    *w1 = (lanes){w[2], w[3]};
}
#else
#define ISA "scalar"
#define RT 1
#define NT 1
#define BR 0
#define BC 1
typedef struct { float v[16]; } lanes;
static inline lanes lanes_zero(void) { return (lanes){{0}}; }
static inline lanes lanes_load(const float *p) { lanes l; memcpy(l.v, p, sizeof l.v); return l; }
static inline lanes lanes_fma(lanes x, lanes w, lanes a) {
    for (int l = 0; l < 16; l++) a.v[l] = fmaf(x.v[l], w.v[l], a.v[l]);
    return a;
}
static inline float lanes_sum(lanes a) {
    for (int half = 8; half; half /= 2)
        for (int l = 0; l < half; l++) a.v[l] = a.v[l] + a.v[l + half];
    return a.v[0];
}
static inline void lanes_decode(int type, const uint8_t *blk, lanes *w0, lanes *w1) {
    float d = half_to_float(blk), m = type == Q4_1 ? half_to_float(blk + 2) : 0.0f;
    const uint8_t *qs = blk + (type == Q4_1 ? 4 : 2);
    for (int j = 0; j < 16; j++) {
        if (type == Q8_0) {
            w0->v[j] = d * (float)(int8_t)qs[j];
            w1->v[j] = d * (float)(int8_t)qs[j + 16];
        } else if (type == Q4_0) {
            w0->v[j] = d * (float)((qs[j] & 15) - 8);
            w1->v[j] = d * (float)((qs[j] >> 4) - 8);
        } else {
            w0->v[j] = fmaf((float)(qs[j] & 15), d, m);
            w1->v[j] = fmaf((float)(qs[j] >> 4), d, m);
        }
    }
}
#endif

/* How far ahead, in tiles, a tile prefetches its weight blocks. */
#define PF_TILES 2

static int block_bytes(int type) {
    return type == Q8_0 ? 34 : type == Q4_0 ? 18 : type == Q4_1 ? 20 : 0;
}

const char *tl_quant_isa(void) { return ISA; }

/* R rows of x (stride ldx) by C weight rows (stride ldw bytes) -> y (stride ldy). R and C
 * are constants where it is inlined, so the R x C accumulators stay in registers. */
static inline __attribute__((always_inline)) void
tile(int type, int R, int C, const float *x, int64_t ldx, const uint8_t *w, int64_t ldw,
     int64_t blocks, const float *b, float *y, int64_t ldy) {
    const int bytes = block_bytes(type);
    lanes acc[8][4];                         /* R <= RT or BR, C <= NT or BC */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = lanes_zero();
    for (int64_t i = 0; i < blocks; i++) {
        for (int c = 0; c < C; c++) {
            lanes w0, w1;
            const uint8_t *blk = w + c * ldw + i * bytes;
            /* a tile's rows are only k / 32 blocks long, too short for the hardware's
             * stream prefetcher to start: fetch the same block two tiles ahead, into L2
             * (prefetcht1): into L1 the requests queue behind the loads' misses, and a
             * one-row Q8_0 call read memory at 17 GB/s on 2 threads where it now reads 27 */
            __builtin_prefetch(blk + PF_TILES * C * ldw, 0, 2);
            lanes_decode(type, blk, &w0, &w1);
            for (int r = 0; r < R; r++) {
                const float *xr = x + r * ldx + i * QK;
                acc[r][c] = lanes_fma(lanes_load(xr), w0, acc[r][c]);
                acc[r][c] = lanes_fma(lanes_load(xr + 16), w1, acc[r][c]);
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
#define TILES(T) TILES_C(T, 1) TILES_C(T, 2) TILES_C(T, 3) TILES_C(T, 4)
TILES(Q4_0) TILES(Q4_1) TILES(Q8_0)
#if BR
TILE(Q4_0, BR, BC) TILE(Q4_1, BR, BC) TILE(Q8_0, BR, BC)
#endif
#define ROW(T, R) {tile_##T##_##R##_1, tile_##T##_##R##_2, tile_##T##_##R##_3, tile_##T##_##R##_4}
#define TABLE(T) {ROW(T, 1), ROW(T, 2), ROW(T, 3), ROW(T, 4)}
static const tile_fn TILES_Q4_0[4][4] = TABLE(Q4_0), TILES_Q4_1[4][4] = TABLE(Q4_1),
                     TILES_Q8_0[4][4] = TABLE(Q8_0);

/* The BR x BC tile of `type` (a call of at least BR rows takes them, where the ISA has
 * them), or 0. Every tile sums an output in the same order, so a row's result does not
 * depend on which tile it fell in. */
static tile_fn big_tile(int type) {
#if BR
    return type == Q4_0 ? tile_Q4_0_BR_BC : type == Q4_1 ? tile_Q4_1_BR_BC : tile_Q8_0_BR_BC;
#else
    (void)type;
    return 0;
#endif
}

#if defined(__AVX512F__) || defined(__AVX2__)
/* A call of PRE_ROWS rows or more decodes each weight once, NC columns at a time, into
 * floats that stay in L2 (NC x k x 4 bytes), and multiplies them in PR x PC tiles. The
 * tiles above decode a block once per tile of rows they run (on AVX2, 2 rows: a 64-row call
 * decodes every block 32 times), and read one operand of every multiply-add from L1 (x, or
 * the decoded weights), as many loads as multiply-adds: on AVX-512 bound by L1's bandwidth
 * at ~65% of the FMA peak. Here a half block's PC weight vectors and each row's x vector are
 * loaded once into registers (the empty asm keeps the compiler from folding them back into
 * memory operands). Every output is still summed in the order at the head of this file: the
 * bits are the same. */
#define NC 48                                /* a multiple of PC */
#if defined(__AVX512F__)
#define PRE_ROWS 16
#define PR 4
#define PC 6                                 /* 24 accumulators, 6 weights, 1 x: 31 */

static inline __attribute__((always_inline)) lanes in_register(lanes v) {
    __asm__("" : "+v"(v));
    return v;
}

/* One half block (16 lanes) of x's R rows by C decoded weight rows, into acc: 10 loads for
 * 24 multiply-adds, ~30% more work a second than the tiles at 64-512 rows. */
static inline __attribute__((always_inline)) void
half_block(int R, int C, const float *x, int64_t k, const float *w, lanes acc[PR][PC]) {
    lanes wv[PC];
    for (int c = 0; c < C; c++) wv[c] = in_register(lanes_load(w + c * k));
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
#define PR 3
#define PC 2                                 /* 12 accumulators, 2 weights, 1 x: 15 of 16 */

static inline __attribute__((always_inline)) __m256 in_register(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

/* One eighth of a block (8 lanes) of x's R rows by C decoded weight rows, into the lanes
 * 0-7 (.a) or 8-15 (.b) of acc. */
static inline __attribute__((always_inline)) void
eighth(int R, int C, const float *x, int64_t k, const float *w, int hi, lanes acc[PR][PC]) {
    __m256 wv[PC];
    for (int c = 0; c < C; c++) wv[c] = in_register(_mm256_loadu_ps(w + c * k));
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
half_block(int R, int C, const float *x, int64_t k, const float *w, lanes acc[PR][PC]) {
    eighth(R, C, x, k, w, 0, acc);
    eighth(R, C, x + 8, k, w + 8, 1, acc);
}
#define DTILES(R) DTILE(R, 1) DTILE(R, 2)
#define DROW(R) {decoded_##R##_1, decoded_##R##_2}
#define DROWS {DROW(1), DROW(2), DROW(3)}
#endif

/* Each lane's sum runs over the half blocks in order, as at the head of this file. */
static inline __attribute__((always_inline)) void
decoded_tile(int R, int C, const float *x, int64_t k, const float *w, const float *b,
             float *y, int64_t ldy) {
    lanes acc[PR][PC];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = lanes_zero();
    for (int64_t j = 0; j < k; j += 16) half_block(R, C, x + j, k, w + j, acc);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = lanes_sum(acc[r][c]);
            if (b) s += b[c];
            y[r * ldy + c] = s;
        }
}

typedef void (*decoded_fn)(const float *, int64_t, const float *, const float *, float *,
                           int64_t);
#define DTILE(R, C)                                                                        \
    static void decoded_##R##_##C(const float *x, int64_t k, const float *w,              \
                                  const float *b, float *y, int64_t ldy) {                \
        decoded_tile(R, C, x, k, w, b, y, ldy);                                            \
    }
DTILES(1) DTILES(2) DTILES(3)
#if PR == 4
DTILES(4)
#endif
static const decoded_fn DECODED[PR][PC] = DROWS;

/* The `cols` weight rows of `type` at w (stride ldw bytes) decoded into out [cols][k]. */
static void decode_rows(int type, const uint8_t *w, int64_t ldw, int64_t blocks,
                        int64_t cols, float *out) {
    const int bytes = block_bytes(type);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t i = 0; i < blocks; i++) {
            lanes w0, w1;
            lanes_decode(type, w + c * ldw + i * bytes, &w0, &w1);
            lanes_store(out + (c * blocks + i) * QK, w0);
            lanes_store(out + (c * blocks + i) * QK + 16, w1);
        }
}

/* y[:, 0:cols] (row stride n) from x [m][k] and `cols` decoded weight rows wf [cols][k]:
 * rows outer, so a tile's rows of x are read from L1 across the columns. */
static void decoded_strip(const float *x, int64_t m, int64_t k, const float *wf,
                          int64_t cols, const float *b, float *y, int64_t n) {
    for (int64_t r0 = 0; r0 < m; r0 += PR) {
        int nr = m - r0 < PR ? (int)(m - r0) : PR;
        for (int64_t c0 = 0; c0 < cols; c0 += PC) {
            int nc = cols - c0 < PC ? (int)(cols - c0) : PC;
            DECODED[nr - 1][nc - 1](x + r0 * k, k, wf + c0 * k, b ? b + c0 : 0,
                                    y + r0 * n + c0, n);
        }
    }
}

/* tl_quant_matmul's path for m >= PRE_ROWS: 0, or -1 where a thread's scratch memory was
 * short (the caller then computes every output again with the tiles that decode). */
static int decoded_matmul(const float *x, const uint8_t *w, int type, const float *b,
                          float *y, int64_t m, int64_t k, int64_t n, int threads) {
    const int64_t blocks = k / QK, ldw = blocks * block_bytes(type);
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        float *buf = aligned_alloc(64, NC * k * sizeof(float));
        failed = buf == NULL;
        #pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < n; n0 += NC) {
            if (buf == NULL) continue;
            int64_t cols = n - n0 < NC ? n - n0 : NC;
            decode_rows(type, w + n0 * ldw, ldw, blocks, cols, buf);
            decoded_strip(x, m, k, buf, cols, b ? b + n0 : 0, y + n0, n);
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
 * it does not know or k not a multiple of 32. */
int tl_quant_matmul(const float *x, const uint8_t *w, int type, const float *b, float *y,
                    int64_t m, int64_t k, int64_t n, int threads) {
    const tile_fn (*table)[4] = type == Q4_0 ? TILES_Q4_0 : type == Q4_1 ? TILES_Q4_1
                              : type == Q8_0 ? TILES_Q8_0 : 0;
    if (!table || k % QK) return -1;
#if HAS_DECODED
    if (m >= PRE_ROWS && decoded_matmul(x, w, type, b, y, m, k, n, threads) == 0) return 0;
#endif
    const int64_t blocks = k / QK, ldw = blocks * block_bytes(type);
    const tile_fn big = m >= BR ? big_tile(type) : 0;
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
