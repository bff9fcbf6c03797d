/* quant_gemm.c's bfloat16 path (tl_quant_matmul_bf16), where the CPU has AVX512_BF16: the
 * opt-in `--prefill-bf16` of docs/design/cpu-paths.md, "Prompts in bfloat16". Included by
 * quant_gemm.c after quant_decoded.h; HAS_BF16 says whether it was built.
 *
 * x's rows and the weights (each decoded to its float32 value first, as the other paths do)
 * are rounded to the nearest bfloat16 and multiplied with vdpbf16ps, which adds to each
 * float32 lane the products of two bfloat16 pairs: 32 products an instruction against
 * float32's 16. A strip of 48 weight rows is decoded once into pairs (weights 2p and 2p + 1
 * of a row side by side, the strip's 48 rows next to each other: decode_pairs), so that one
 * instruction takes x's pair p of one row, broadcast, against pair p of 16 weight rows: 16
 * outputs a register, no sum across lanes, and a tile of 8 rows of x by 48 columns keeps 24
 * sums, 3 weight vectors and a broadcast in registers (each weight byte loaded once per 8
 * rows, where the float32 path's dot products load it once per 4).
 *
 * Each output is summed in one fixed order whatever the call's rows, its tiles and threads:
 * from 0, for p = 0 .. k/2 - 1 in order, s = vdpbf16ps(s, x[2p..2p+1], w[2p..2p+1]), then the
 * bias. The result is not the float32 path's (the inputs are rounded to 8 significant bits):
 * the caller uses it only where asked to. */
int tl_quant_matmul(const float *x, const uint8_t *w, int type, const float *b, float *y,
                    int64_t m, int64_t k, int64_t n, int threads);

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define OR 8                                 /* rows of x per tile */
#define OV 3                                 /* 16-column vectors per tile */
#define OCOLS (16 * OV)                      /* a strip's columns */

/* 32 floats to 32 bfloat16, each rounded to nearest (even) */
static inline __m512bh to_bf16(__m512 lo, __m512 hi) { return _mm512_cvtne2ps_pbh(hi, lo); }

/* row r of x [m][k] float32 -> xb [m][k] bfloat16 (k a multiple of 32) */
static void row_to_bf16(const float *x, int64_t k, int64_t r, uint16_t *xb) {
    for (int64_t j = 0; j < k; j += 32) {
        __m512bh v = to_bf16(_mm512_loadu_ps(x + r * k + j),
                             _mm512_loadu_ps(x + r * k + j + 16));
        _mm512_storeu_si512((void *)(xb + r * k + j), (__m512i)v);
    }
}

/* v[c] (16 dwords each) transposed in place: v[j] becomes (old v[0][j], ..., v[15][j]) */
static inline __attribute__((always_inline)) void transpose16(__m512i v[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {        /* dwords of row pairs interleaved */
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {        /* then qwords of pairs of those */
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {            /* then 128-bit lanes, in two steps */
        t[i] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        v[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
        v[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        v[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

/* The `cols` (<= OCOLS) weight rows of `type` at w (stride ldw bytes), decoded, rounded to
 * bfloat16 and laid out by pairs: wp[p * OCOLS + c] holds row c's weights 2p (low half) and
 * 2p + 1; rows past `cols` are zeros. Sixteen rows at a time: a run of each (16 pairs) in
 * 16 registers, transposed so that each holds one pair of the 16 rows. */
static void decode_pairs(int type, const uint8_t *w, int64_t ldw, int64_t blocks,
                         int64_t cols, uint32_t *wp) {
    const int bytes = block_bytes(type), runs = block_runs(type);
    for (int64_t c0 = 0; c0 < OCOLS; c0 += 16) {
        const int live = cols - c0 >= 16 ? 16 : cols - c0 > 0 ? (int)(cols - c0) : 0;
        for (int64_t i = 0; i < blocks; i++) {
            block_factors f[16];
            for (int c = 0; c < live; c++)
                block_factors_of(type, w + (c0 + c) * ldw + i * bytes, &f[c]);
            for (int run = 0; run < runs; run++) {
                __m512i v[16];
                for (int c = 0; c < 16; c++) {
                    if (c >= live) {
                        v[c] = _mm512_setzero_si512();
                        continue;
                    }
                    lanes w0, w1;
                    lanes_decode(type, w + (c0 + c) * ldw + i * bytes, run, &f[c], &w0, &w1);
                    v[c] = (__m512i)to_bf16(w0, w1);   /* dword j: the run's pair j */
                }
                transpose16(v);
                uint32_t *to = wp + (i * runs + run) * 16 * OCOLS + c0;
                for (int j = 0; j < 16; j++) _mm512_store_si512((void *)(to + j * OCOLS), v[j]);
            }
        }
    }
}

static inline __attribute__((always_inline)) __m512 in_reg_ps(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

/* R rows of xb by the strip's `cols` columns (pairs wp) -> y (row stride ldy), plus b */
static inline __attribute__((always_inline)) void
outer_tile(int R, const uint16_t *xb, int64_t k, const uint32_t *wp, int64_t cols,
           const float *b, float *y, int64_t ldy) {
    __m512 acc[OR][OV];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < OV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k / 2; p++) {
        __m512bh wv[OV];
        for (int v = 0; v < OV; v++)
            wv[v] = (__m512bh)in_reg_ps(_mm512_load_ps((const float *)(wp + p * OCOLS + 16 * v)));
        for (int r = 0; r < R; r++) {
            int32_t pair;
            memcpy(&pair, xb + r * k + 2 * p, sizeof pair);
            __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            for (int v = 0; v < OV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xv, wv[v]);
        }
    }
    for (int v = 0; v < OV; v++) {
        const int64_t left = cols - 16 * v;
        if (left <= 0) break;
        const __mmask16 mask = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512 bias = b ? _mm512_maskz_loadu_ps(mask, b + 16 * v) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + r * ldy + 16 * v, mask, _mm512_add_ps(acc[r][v], bias));
    }
}

typedef void (*outer_fn)(const uint16_t *, int64_t, const uint32_t *, int64_t, const float *,
                         float *, int64_t);
#define OTILE(R)                                                                           \
    static void outer_##R(const uint16_t *xb, int64_t k, const uint32_t *wp, int64_t cols,  \
                          const float *b, float *y, int64_t ldy) {                          \
        outer_tile(R, xb, k, wp, cols, b, y, ldy);                                          \
    }
OTILE(1) OTILE(2) OTILE(3) OTILE(4) OTILE(5) OTILE(6) OTILE(7) OTILE(8)
static const outer_fn OUTER[OR] = {outer_1, outer_2, outer_3, outer_4,
                                   outer_5, outer_6, outer_7, outer_8};

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
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        #pragma omp for schedule(static)     /* x rounded once (the loop's end waits) */
        for (int64_t r = 0; r < m; r++) row_to_bf16(x, k, r, xb);
        uint32_t *wp = aligned_alloc(64, k / 2 * OCOLS * sizeof(uint32_t));
        failed = wp == NULL;
        #pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < n; n0 += OCOLS) {
            if (wp == NULL) continue;
            const int64_t cols = n - n0 < OCOLS ? n - n0 : OCOLS;
            decode_pairs(type, w + n0 * ldw, ldw, blocks, cols, wp);
            for (int64_t r0 = 0; r0 < m; r0 += OR) {
                const int rows = m - r0 < OR ? (int)(m - r0) : OR;
                OUTER[rows - 1](xb + r0 * k, k, wp, cols, b ? b + n0 : 0, y + r0 * n + n0, n);
            }
        }
        free(wp);
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
