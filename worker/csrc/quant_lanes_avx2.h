/* quant_gemm.c's sixteen accumulator lanes on AVX2: two registers (lanes 0..7, 8..15), and
 * the decoders that put run r's weights 0..15 of a block in w0 and 16..31 in w1, lane for
 * lane (quant_blocks.h has the layouts): each weight's integer converted and scaled with
 * the same float operations, so the same bits, as the AVX-512 tables hold. */
#define ISA "avx2"
#define RT 2
#define NT 2
#define BR 0                                 /* no larger tiles: 16 registers */
#define UNROLL_RUNS 1                        /* quant_gemm.c's tile() */
#define PAIRED_Q4K 0
#define HALVED_Q6K 0
#define BC 1
typedef struct { __m256 a, b; } lanes;
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

static inline __m256i u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline __m256 q8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
/* q[i] (eighths 0..3 of the run) as floats times scale, plus offset where there is one:
 * eighths 0, 1 are w0's lanes, 2, 3 w1's; scale2 serves w1 (Q6_K's second sub-block). */
static inline void scaled(const __m256i q[4], float scale, float scale2, const float *offset,
                          lanes *w0, lanes *w1) {
    __m256 w[4];
    for (int i = 0; i < 4; i++) {
        __m256 s = _mm256_set1_ps(i < 2 ? scale : scale2), v = _mm256_cvtepi32_ps(q[i]);
        w[i] = offset ? _mm256_fmadd_ps(v, s, _mm256_set1_ps(*offset)) : _mm256_mul_ps(v, s);
    }
    *w0 = (lanes){w[0], w[1]};
    *w1 = (lanes){w[2], w[3]};
}
/* the nibbles of the 16 bytes qs as the 32 weights of a Q4_0/Q4_1/Q5 block, in eighths */
static inline void nibbles(const uint8_t *qs, __m256i q[4]) {
    __m256i f = _mm256_set1_epi32(15), q0 = u8x8(qs), q1 = u8x8(qs + 8);
    q[0] = _mm256_and_si256(q0, f);
    q[1] = _mm256_and_si256(q1, f);
    q[2] = _mm256_srli_epi32(q0, 4);
    q[3] = _mm256_srli_epi32(q1, 4);
}

static inline void decode_k(int type, const uint8_t *blk, int r, const block_factors *f,
                            lanes *w0, lanes *w1) {
    __m256i q[4];
    if (type == Q6_K) {
        __m256i q32 = q6_run(blk, r);
        __m128i lo = _mm256_castsi256_si128(q32), hi = _mm256_extracti128_si256(q32, 1);
        q[0] = _mm256_cvtepi8_epi32(lo);
        q[1] = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo));
        q[2] = _mm256_cvtepi8_epi32(hi);
        q[3] = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi));
        scaled(q, f->scale[2 * r], f->scale[2 * r + 1], 0, w0, w1);
        return;
    }
    const __m256i f15 = _mm256_set1_epi32(15);
    const uint8_t *qs = blk + (type == Q5_K ? 48 : 16) + 32 * (r / 2);
    const __m128i shift = _mm_cvtsi32_si128(r & 1 ? 4 : 0);
    for (int i = 0; i < 4; i++) {
        q[i] = _mm256_and_si256(_mm256_srl_epi32(u8x8(qs + 8 * i), shift), f15);
        if (type == Q5_K) {
            __m256i hb = _mm256_and_si256(_mm256_srli_epi32(u8x8(blk + 16 + 8 * i), r),
                                          _mm256_set1_epi32(1));
            q[i] = _mm256_or_si256(q[i], _mm256_slli_epi32(hb, 4));
        }
    }
    scaled(q, f->scale[r], f->scale[r], f->offset + r, w0, w1);
}

static inline void lanes_decode(int type, const uint8_t *blk, int r, const block_factors *f,
                                lanes *w0, lanes *w1) {
    if (type == Q4_K || type == Q5_K || type == Q6_K) {
        decode_k(type, blk, r, f, w0, w1);
        return;
    }
    float d = f->scale[0];
    if (type == Q8_0) {
        __m256 dv = _mm256_set1_ps(d);
        *w0 = (lanes){_mm256_mul_ps(q8x8(blk + 2), dv), _mm256_mul_ps(q8x8(blk + 10), dv)};
        *w1 = (lanes){_mm256_mul_ps(q8x8(blk + 18), dv), _mm256_mul_ps(q8x8(blk + 26), dv)};
        return;
    }
    int has_min = type == Q4_1 || type == Q5_1, five = type == Q5_0 || type == Q5_1;
    const uint8_t *qs = blk + 2 + 2 * has_min + 4 * five;
    __m256i q[4];
    nibbles(qs, q);
    if (five) {                              /* bit j of qh: 16 more for weight j */
        __m256i bits = _mm256_set1_epi32((int)load_u32(qs - 4));
        for (int i = 0; i < 4; i++) {
            __m256i at = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(8 * i));
            __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(bits, at), _mm256_set1_epi32(1));
            q[i] = _mm256_or_si256(q[i], _mm256_slli_epi32(hb, 4));
        }
    }
    if (!has_min) {                          /* Q4_0: v - 8, Q5_0: v - 16 */
        __m256i bias = _mm256_set1_epi32(five ? 16 : 8);
        for (int i = 0; i < 4; i++) q[i] = _mm256_sub_epi32(q[i], bias);
    }
    scaled(q, d, d, has_min ? f->offset : 0, w0, w1);
}
