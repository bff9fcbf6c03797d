/* quant_gemm.c's bfloat16 path (tl_quant_matmul_bf16), where the CPU has AVX512_BF16: the
 * opt-in `--prefill-bf16` of docs/design/cpu-paths.md, "Prompts in bfloat16". Included by
 * quant_gemm.c after quant_decoded.h; HAS_BF16 says whether it was built.
 *
 * x's rows and the weights (each decoded to its float32 value first, as the other paths do)
 * are rounded to the nearest bfloat16, and multiplied with vdpbf16ps: 32 products an
 * instruction against float32's 16, and half the bytes for a decoded strip. Each output is
 * summed in one fixed order whatever the call's rows and threads: sixteen float32 lanes,
 * lane l adding, for each run i of 32 weights in order, the products of weights 32i + 2l
 * and 32i + 2l + 1 (vdpbf16ps), then halved as at the head of quant_gemm.c, then the bias.
 * The result is not the float32 path's (the inputs are rounded to 8 significant bits): the
 * caller uses it only where asked to. */
int tl_quant_matmul(const float *x, const uint8_t *w, int type, const float *b, float *y,
                    int64_t m, int64_t k, int64_t n, int threads);

#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* Tiles of PR x PC (4 x 6) as quant_decoded.h's: 24 sums, 6 weights, 1 x in registers */

/* 32 floats to 32 bfloat16, each rounded to nearest (even) */
static inline __m512bh to_bf16(__m512 lo, __m512 hi) { return _mm512_cvtne2ps_pbh(hi, lo); }

static inline __attribute__((always_inline)) __m512bh bf16_in_register(__m512bh v) {
    __asm__("" : "+v"(v));
    return v;
}

/* x [m][k] float32 -> xb [m][k] bfloat16 (k a multiple of 32) */
static void rows_to_bf16(const float *x, int64_t m, int64_t k, uint16_t *xb, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < k; j += 32) {
            __m512bh v = to_bf16(_mm512_loadu_ps(x + r * k + j),
                                 _mm512_loadu_ps(x + r * k + j + 16));
            _mm512_storeu_si512((void *)(xb + r * k + j), (__m512i)v);
        }
}

/* R rows of xb by C decoded weight rows wb (a row every ldo values) -> y, over all of k */
static inline __attribute__((always_inline)) void
bf16_tile(int R, int C, const uint16_t *xb, int64_t k, const uint16_t *wb, int64_t ldo,
          const float *b, float *y, int64_t ldy) {
    lanes acc[PR][PC];
    zero_sums(R, C, acc);
    for (int64_t j = 0; j < k; j += 32) {
        __m512bh wv[PC];
        for (int c = 0; c < C; c++)
            wv[c] = bf16_in_register((__m512bh)_mm512_loadu_si512((const void *)(wb + c * ldo + j)));
        for (int r = 0; r < R; r++) {
            __m512bh xv = bf16_in_register((__m512bh)_mm512_loadu_si512((const void *)(xb + r * k + j)));
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
        }
    }
    store_sums(R, C, acc, b, y, ldy);
}

typedef void (*bf16_fn)(const uint16_t *, int64_t, const uint16_t *, int64_t, const float *,
                        float *, int64_t);
#define BTILE(R, C)                                                                        \
    static void bf16_##R##_##C(const uint16_t *xb, int64_t k, const uint16_t *wb, int64_t ldo, \
                               const float *b, float *y, int64_t ldy) {                    \
        bf16_tile(R, C, xb, k, wb, ldo, b, y, ldy);                                        \
    }
#define BTILES(R) BTILE(R, 1) BTILE(R, 2) BTILE(R, 3) BTILE(R, 4) BTILE(R, 5) BTILE(R, 6)
#define BROW(R) {bf16_##R##_1, bf16_##R##_2, bf16_##R##_3, bf16_##R##_4, bf16_##R##_5,     \
                 bf16_##R##_6}
BTILES(1) BTILES(2) BTILES(3) BTILES(4)
static const bf16_fn BF16_TILES[PR][PC] = {BROW(1), BROW(2), BROW(3), BROW(4)};

/* y[:, 0:cols] (row stride n) from xb [m][k] and `cols` rounded weight rows */
static void bf16_strip(const uint16_t *xb, int64_t m, int64_t k, const uint16_t *wb, int64_t ldo,
                       int64_t cols, const float *b, float *y, int64_t n) {
    for (int64_t r0 = 0; r0 < m; r0 += PR) {
        int nr = m - r0 < PR ? (int)(m - r0) : PR;
        for (int64_t c0 = 0; c0 < cols; c0 += PC) {
            int nc = cols - c0 < PC ? (int)(cols - c0) : PC;
            BF16_TILES[nr - 1][nc - 1](xb + r0 * k, k, wb + c0 * ldo, ldo, b ? b + c0 : 0,
                                       y + r0 * n + c0, n);
        }
    }
}

/* x [m][k], w [n][k] in `type`'s blocks, b [n] or NULL -> y [m][n], in bfloat16 as above.
 * 0, or -1 for a type it does not know or k not whole blocks. Where memory is short for its
 * buffers, tl_quant_matmul's float32 answer (a row's bits then differ, never its value's
 * precision). */
int tl_quant_matmul_bf16(const float *x, const uint8_t *w, int type, const float *b, float *y,
                         int64_t m, int64_t k, int64_t n, int threads) {
    if (!tiles_of(type) || k % (QK * block_runs(type))) return -1;
    const int64_t blocks = k / (QK * block_runs(type)), ldw = blocks * block_bytes(type);
    uint16_t *xb = aligned_alloc(64, ((m * k * sizeof(uint16_t)) + 63) / 64 * 64);
    if (xb == NULL) return tl_quant_matmul(x, w, type, b, y, m, k, n, threads);
    rows_to_bf16(x, m, k, xb, threads);
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        /* k + 32: a row stride off a multiple of 1 KB (quant_decoded.h's ROW_PAD) */
        const int64_t nc = NC, ldo = k + 32;
        uint16_t *buf = aligned_alloc(64, nc * ldo * sizeof(uint16_t));
        failed = buf == NULL;
        #pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < n; n0 += nc) {
            if (buf == NULL) continue;
            int64_t cols = n - n0 < nc ? n - n0 : nc;
            decode_rows_into(type, w + n0 * ldw, ldw, blocks, cols, NULL, buf, ldo);
            bf16_strip(xb, m, k, buf, ldo, cols, b ? b + n0 : 0, y + n0, n);
        }
        free(buf);
    }
    free(xb);
    return failed ? tl_quant_matmul(x, w, type, b, y, m, k, n, threads) : 0;
}
#define HAS_BF16 1
#else
int tl_quant_matmul_bf16(const float *x, const uint8_t *w, int type, const float *b, float *y,
                         int64_t m, int64_t k, int64_t n, int threads) {
    (void)x, (void)w, (void)type, (void)b, (void)y, (void)m, (void)k, (void)n, (void)threads;
    return -2;                               /* not built: no AVX512_BF16 */
}
#define HAS_BF16 0
#endif

int tl_quant_has_bf16(void) { return HAS_BF16; }
