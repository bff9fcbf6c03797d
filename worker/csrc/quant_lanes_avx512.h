/* quant_gemm.c's sixteen accumulator lanes on AVX-512: one register, and the decoders that
 * put run r's weights 0..15 of a block in w0 and 16..31 in w1, lane for lane
 * (quant_blocks.h has the layouts). A weight of 4 or 5 bits has 16 or 32 values in its
 * (sub-)block: they are computed once into a table (the very floats the scalar arithmetic
 * gives) and each weight is looked up by its bits (vpermps reads an index's low 4 bits, so
 * a low nibble needs no mask; the fifth bit picks the second table through a mask). */
#define ISA "avx512"
#define RT 4                                 /* rows per tile */
#define NT 4                                 /* columns per tile */
#define BR 8                                 /* a call of BR rows or more: BR x BC tiles, */
#define UNROLL_RUNS 0
#define PAIRED_Q4K 1                         /* quant_gemm.c's tile(): decode_q4k_pair */
#define HALVED_Q6K 1                         /* and q6_half */
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

static inline __m512i bytes16(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline __m512 values16(float first) {
    return _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_ps(first));
}
/* the 16 values q * scale + offset (offset NULL: q * scale) for q = first .. first + 15 */
static inline __m512 table16(float first, float scale, const float *offset) {
    __m512 v = values16(first), s = _mm512_set1_ps(scale);
    return offset ? _mm512_fmadd_ps(v, s, _mm512_set1_ps(*offset)) : _mm512_mul_ps(v, s);
}
/* weights by their low 4 bits in q, from hi where `high` has the lane's bit, else lo */
static inline __m512 lookup(__m512i q, __mmask16 high, __m512 lo, __m512 hi) {
    return _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(q, lo), high, q, hi);
}

static inline void decode_q5(int type, const uint8_t *blk, const block_factors *f,
                             lanes *w0, lanes *w1) {
    const uint8_t *qh = blk + (type == Q5_1 ? 4 : 2);
    uint32_t bits = load_u32(qh);
    __m512i q = bytes16(qh + 4), q1 = _mm512_srli_epi32(q, 4);
    const float *off = type == Q5_1 ? f->offset : 0;
    float base = type == Q5_1 ? 0.0f : -16.0f;
    __m512 lo = table16(base, f->scale[0], off), hi = table16(base + 16, f->scale[0], off);
    *w0 = lookup(q, (__mmask16)bits, lo, hi);
    *w1 = lookup(q1, (__mmask16)(bits >> 16), lo, hi);
}

static inline void decode_k(int type, const uint8_t *blk, int r, const block_factors *f,
                            lanes *w0, lanes *w1) {
    if (type == Q6_K) {
        __m256i q = q6_run(blk, r);
        __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
        __m512 v1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
        *w0 = _mm512_mul_ps(v0, _mm512_set1_ps(f->scale[2 * r]));
        *w1 = _mm512_mul_ps(v1, _mm512_set1_ps(f->scale[2 * r + 1]));
        return;
    }
    const uint8_t *qs = blk + (type == Q5_K ? 48 : 16) + 32 * (r / 2);
    __m512i q0 = bytes16(qs), q1 = bytes16(qs + 16);
    if (r & 1) {
        q0 = _mm512_srli_epi32(q0, 4);
        q1 = _mm512_srli_epi32(q1, 4);
    }
    __m512 lo = table16(0.0f, f->scale[r], f->offset + r);
    if (type == Q4_K) {
        *w0 = _mm512_permutexvar_ps(q0, lo);
        *w1 = _mm512_permutexvar_ps(q1, lo);
        return;
    }
    __m512 hi = table16(16.0f, f->scale[r], f->offset + r);
    const __m512i bit = _mm512_set1_epi32(1 << r);
    *w0 = lookup(q0, _mm512_test_epi32_mask(bytes16(blk + 16), bit), lo, hi);
    *w1 = lookup(q1, _mm512_test_epi32_mask(bytes16(blk + 32), bit), lo, hi);
}

/* Q4_K's runs r and r + 1 (r even) share their 32 bytes: run r is their low nibbles, r + 1
 * their high ones. Read once for both: w[0], w[1] run r's weights 0..15 and 16..31, w[2],
 * w[3] run r + 1's (the same floats decode_k gives, with 2 of its 4 loads) */
static inline void decode_q4k_pair(const uint8_t *blk, int r, const block_factors *f,
                                   lanes w[4]) {
    const uint8_t *qs = blk + 16 + 16 * r;
    __m512i q0 = bytes16(qs), q1 = bytes16(qs + 16);
    __m512 lo = table16(0.0f, f->scale[r], f->offset + r);
    __m512 hi = table16(0.0f, f->scale[r + 1], f->offset + r + 1);
    w[0] = _mm512_permutexvar_ps(q0, lo);
    w[1] = _mm512_permutexvar_ps(q1, lo);
    w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(q0, 4), hi);
    w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(q1, 4), hi);
}

/* Q6_K's half h (runs 4h .. 4h + 3) as its signed quants q - 32, 128 bytes at out, run
 * 4h + t's 32 at out + 32t, with 64-byte operations: runs t = 0, 1 are the low nibbles of
 * ql's 64 bytes, t = 2, 3 their high ones; t's two high bits are qh's bits 2t, 2t + 1
 * (quant_blocks.h). What q6_run gives a run at a time, in half the instructions. */
static inline void q6_half(const uint8_t *blk, int h, int8_t *out) {
    const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3), b32 = _mm512_set1_epi8(32);
    __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * h));
    __m256i qh32 = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    __m512i qh = _mm512_inserti64x4(_mm512_castsi256_si512(qh32), qh32, 1);
    /* 16-bit shifts: bytes 0-31 (t = 0 or 2) by 0 or 4, bytes 32-63 (t = 1 or 3) by 2 or 6 */
    const __m512i by01 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    const __m512i by23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    __m512i hi01 = _mm512_and_si512(_mm512_srlv_epi16(qh, by01), m2);
    __m512i hi23 = _mm512_and_si512(_mm512_srlv_epi16(qh, by23), m2);
    __m512i lo01 = _mm512_and_si512(ql, m4);
    __m512i lo23 = _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
    _mm512_storeu_si512((void *)out,
                        _mm512_sub_epi8(_mm512_or_si512(lo01, _mm512_slli_epi16(hi01, 4)), b32));
    _mm512_storeu_si512((void *)(out + 64),
                        _mm512_sub_epi8(_mm512_or_si512(lo23, _mm512_slli_epi16(hi23, 4)), b32));
}

/* a run's 32 signed quants at q times its two sub-block scales (decode_k's floats) */
static inline void q6_weights(const int8_t *q, float s0, float s1, lanes *w0, lanes *w1) {
    __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    __m512 v1 = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
    *w0 = _mm512_mul_ps(v0, _mm512_set1_ps(s0));
    *w1 = _mm512_mul_ps(v1, _mm512_set1_ps(s1));
}

static inline void lanes_decode(int type, const uint8_t *blk, int r, const block_factors *f,
                                lanes *w0, lanes *w1) {
    if (type == Q4_K || type == Q5_K || type == Q6_K) {
        decode_k(type, blk, r, f, w0, w1);
        return;
    }
    if (type == Q5_0 || type == Q5_1) {
        decode_q5(type, blk, f, w0, w1);
        return;
    }
    __m512 d = _mm512_set1_ps(f->scale[0]);
    if (type == Q8_0) {
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                  _mm_loadu_si128((const __m128i *)(blk + 2)))), d);
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                  _mm_loadu_si128((const __m128i *)(blk + 18)))), d);
        return;
    }
    /* Q4_0: d * (v - 8) exact; Q4_1: fma(v, d, m), one rounding */
    __m512i q = bytes16(blk + (type == Q4_1 ? 4 : 2));
    __m512 table = table16(type == Q4_0 ? -8.0f : 0.0f, f->scale[0],
                           type == Q4_1 ? f->offset : 0);
    *w0 = _mm512_permutexvar_ps(q, table);
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
}
