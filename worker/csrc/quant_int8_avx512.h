/* quant_int8.h's group functions with 512-bit registers, where the CPU has AVX-512 (BW): two
 * runs of 32 weights (Q4_K, Q5_K, Q6_K) or two blocks (Q4_0, Q8_0) a register, so each
 * multiply, load and unpacking step takes 64 weights where the AVX2 code's takes 32; with
 * AVX512_VNNI a multiply's pairs join the sum in one instruction (vpdpwssd, vpdpbusd: exact,
 * as vpmaddwd then vpaddd is).
 *
 * The same bits as the AVX2 code: a register's low half holds an even run's (block's) terms
 * and its high half the next odd one's, each 32-bit lane the lane the AVX2 code would add them
 * to. The integer sums are exact (the head of quant_int8.h), so the two halves added give the
 * AVX2 code's eight lanes exactly, whatever the order; the float work after them is the AVX2
 * code's, in its order (Q4_0's two chains of blocks are the two halves of one register).
 * tests/worker/test_quant_int8.py checks the AVX2 build's bits against this one's. */

/* a + the products of p's and sc's 16-bit words, summed by pairs into a's 32-bit lanes */
INLINE8 __m512i madd_add512(__m512i a, __m512i p, __m512i sc) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(a, p, sc);
#else
    return _mm512_add_epi32(a, _mm512_madd_epi16(p, sc));
#endif
}

/* the sums of u's unsigned bytes times x's signed ones, four a 32-bit lane */
INLINE8 __m512i dot4_512(__m512i u, __m512i x) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1));
#endif
}

/* the two halves' eight 32-bit lanes added */
INLINE8 __m256i halves_sum(__m512i a) {
    return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
}

/* a[r] += runs 2i, 2i + 1's 64 quants w (unsigned bytes) times row r's 64 values there,
 * times the words sc (run_dot's, two runs at once) */
INLINE8 void runs_dot512(int R, __m512i w, __m512i sc, const int8_group *g, int i,
                         __m512i a[4]) {
    for (int r = 0; r < R; r++) {
        __m512i x = _mm512_loadu_si512((const void *)(g->q[r] + 64 * i));
        a[r] = madd_add512(a[r], _mm512_maddubs_epi16(w, x), sc);
        __asm__("" : "+v"(a[r]));            /* run_dot's reason */
    }
}

/* words whose first 16 are word i of s and the last 16 word j */
INLINE8 __m512i words_two(__m512i s, int i, int j) {
    const __m512i at = _mm512_inserti64x4(_mm512_set1_epi16((short)i),
                                          _mm256_set1_epi16((short)j), 1);
    return _mm512_permutexvar_epi16(at, s);
}

/* v's 32 bytes in both halves, the low half's shifted right by lo bits a 64-bit lane and the
 * high half's by hi (left where `left`) */
INLINE8 __m512i both_shifted(__m256i v, int lo, int hi, int left) {
    const __m512i n = _mm512_inserti64x4(_mm512_set1_epi64(lo), _mm256_set1_epi64x(hi), 1);
    const __m512i vv = _mm512_broadcast_i64x4(v);
    return left ? _mm512_sllv_epi64(vv, n) : _mm512_srlv_epi64(vv, n);
}

/* qk_group with two runs a register: runs 2p and 2p + 1 are a byte's low and high nibbles,
 * and x's values for them are its bytes 64p .. 64p + 63 */
INLINE8 void qk_group512(int R, int q5, const uint8_t *blk, const int8_group *g,
                         __m256 acc[4]) {
    uint8_t sc[8], mn[8];
    k_scales_mins(blk + 4, sc, mn);
    const __m512i s = _mm512_castsi128_si512(
        _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16))
                          : _mm256_setzero_si256();
    const __m512i m15 = _mm512_set1_epi8(15), m16 = _mm512_set1_epi8(16);
    __m512i a[4];
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        __m512i w = _mm512_and_si512(both_shifted(v, 0, 4, 0), m15);
        if (q5)                              /* bit j of qh's bytes to bit 4 (fifth_bit) */
            w = _mm512_or_si512(w, _mm512_and_si512(
                p < 2 ? both_shifted(qh, 4 - 2 * p, 3 - 2 * p, 1)
                      : both_shifted(qh, 2 * p - 4, 2 * p - 3, 0), m16));
        runs_dot512(R, w, words_two(s, 2 * p, 2 * p + 1), g, p, a);
    }
    __m256i a8[4];
    for (int r = 0; r < R; r++) a8[r] = halves_sum(a[r]);
    qk_close(R, blk, mn, g, a8, acc);
}

/* q6k_group with two runs a register: half h's runs 4h, 4h + 1 are the low nibbles of its
 * 64 bytes, 4h + 2, 4h + 3 the high ones; a run's first 16 weights take scale 2j, the rest
 * 2j + 1 (j its index in the super-block) */
INLINE8 void q6k_group512(int R, const uint8_t *blk, const int8_group *g, __m256 acc[4]) {
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    const __m512i s = _mm512_castsi256_si512(s16);
    const __m512i m15 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m256i eighths = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                               0x0303030303030303);   /* i / 8, bytes */
    __m512i a[4];
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512((const void *)(blk + 64 * h));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        const __m512i w01 = _mm512_or_si512(_mm512_and_si512(l, m15),
                                            _mm512_and_si512(both_shifted(qh, 4, 2, 1), m30));
        const __m512i w23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m15),
                                            _mm512_and_si512(both_shifted(qh, 0, 2, 0), m30));
        for (int t = 0; t < 2; t++) {        /* runs 4h + 2t, 4h + 2t + 1: scales 8h + 4t .. */
            /* word i of the register takes scale 8h + 4t + i / 8 */
            const __m512i at = _mm512_add_epi16(_mm512_set1_epi16((short)(8 * h + 4 * t)),
                                                _mm512_cvtepu8_epi16(eighths));
            runs_dot512(R, t ? w23 : w01, _mm512_permutexvar_epi16(at, s), g, 2 * h + t, a);
        }
    }
    __m256i a8[4];
    for (int r = 0; r < R; r++) a8[r] = halves_sum(a[r]);
    q6k_close(R, blk, s16, g, a8, acc);
}

/* q8x_group with two blocks a register: blocks b, b + 1 (b even) in its halves, so its low
 * half's float chain is the AVX2 code's even chain and the high half's the odd one */
INLINE8 void q8x_group512(int R, int q8, const uint8_t *blk, const int8_group *g,
                          __m256 acc[4]) {
    const __m256 d8 = eight_d(q8, blk);
    const __m512 d16 = _mm512_castps256_ps512(d8);
    __m512 t[4];
    for (int r = 0; r < R; r++) t[r] = _mm512_setzero_ps();
    for (int b = 0; b < 8; b += 2) {
        __m512i w;
        if (q8) {
            w = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 34 * b + 2))),
                _mm256_loadu_si256((const __m256i *)(blk + 34 * (b + 1) + 2)), 1);
        } else {                             /* [b's 16 bytes, b's, b + 1's, b + 1's] */
            const __m256i two = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 18 * b + 2))),
                _mm_loadu_si128((const __m128i *)(blk + 18 * (b + 1) + 2)), 1);
            const __m512i four = _mm512_permutexvar_epi64(
                _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(two));
            w = _mm512_and_si512(
                _mm512_srlv_epi64(four, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                _mm512_set1_epi8(15));
        }
        const __m512i wu = q8 ? _mm512_abs_epi8(w) : w;
        const __mmask64 neg = q8 ? _mm512_movepi8_mask(w) : 0;
        const __m512 db = _mm512_permutexvar_ps(
            _mm512_inserti64x4(_mm512_set1_epi32(b), _mm256_set1_epi32(b + 1), 1), d16);
        for (int r = 0; r < R; r++) {
            __m512i x = _mm512_loadu_si512((const void *)(g->q[r] + 32 * b));
            /* x's sign flipped where w < 0 (vpsignb's work; where w = 0, |w| is) */
            if (q8) x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
            t[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4_512(wu, x)), db, t[r]);
        }
    }
    __m256 u[4];                             /* the even chain plus the odd, as AVX2's */
    for (int r = 0; r < R; r++)
        u[r] = _mm256_add_ps(_mm512_castps512_ps256(t[r]), _mm256_castpd_ps(
                                 _mm512_extractf64x4_pd(_mm512_castps_pd(t[r]), 1)));
    q8x_close(R, q8, d8, g, u, acc);
}
