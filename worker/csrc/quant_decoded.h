/* quant_gemm.c's decoded path, for calls of PRE_ROWS rows or more (AVX-512 and AVX2): each
 * weight decoded once into floats, then multiplied in register tiles; every output summed in
 * the order at the head of quant_gemm.c, so a row's bits are those of the tiles that decode
 * a block per tile. Included by quant_gemm.c after its tiles; HAS_DECODED says whether the
 * instruction set has it. */
#if defined(__AVX512F__) || defined(__AVX2__)
/* A call of PRE_ROWS rows or more decodes each weight once, NC columns at a time (NC / 2
 * for long rows: strip_cols), into floats that stay in L2 (NC x k x 4 bytes), and
 * multiplies them in PR x PC tiles. quant_gemm.c's tiles decode a block once per tile of rows
 * they run (on AVX2, 2 rows: a 64-row call decodes every block 32 times), and read one
 * operand of every multiply-add from L1 (x, or the decoded weights), as many loads as
 * multiply-adds: on AVX-512 bound by L1's bandwidth at ~65% of the FMA peak. Here a half
 * block's PC weight vectors and each row's x vector are loaded once into registers (the
 * empty asm keeps the compiler from folding them back into memory operands). Every output
 * is still summed in the order at the head of quant_gemm.c: the bits are the same. */
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

/* Each lane's sum runs over the half blocks in order, as at the head of quant_gemm.c. */
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
