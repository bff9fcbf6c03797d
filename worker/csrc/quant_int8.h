/* quant_gemm.c's int8 path (`--int8-activations`, docs/design/cpu-paths.md "Activations in
 * int8"): the integer dot products llama.cpp takes, for the block types it serves here (Q4_K,
 * Q5_K, Q6_K, Q4_0, Q8_0); a call on another type takes the float32 path. Built where the CPU
 * has AVX2; with AVX-512 the group functions are quant_int8_avx512.h's, two runs a register,
 * the same bits. HAS_INT8 says whether it was built.
 *
 * Each row of x is rounded to int8 per 256 values (k / 256 groups, GGUF's Q8_K): dx = amax /
 * 127, q = nearest-even(x * (127 / amax)) (dx = 0 and q = 0 where amax is 0), and the sums of
 * its sixteen 16-value groups kept beside it. A weight's quants (unsigned: Q4_K and Q4_0's
 * nibbles, Q5_K's five bits, Q6_K's six; Q8_0's signed bytes as |w|, x's signs flipped where w
 * is negative) multiply the int8 row with vpmaddubsw (32 products an instruction into 16-bit
 * pairs, which cannot overflow: at most 2 x 128 x 127 < 32767), and the sub-block scales
 * with vpmaddwd, into 32-bit sums that are exact. Per super-block (256 weights) s of an
 * output, in integers:
 *     Q4_K  A = sum_j sc_j sum_l q_jl x_jl   M = sum_j mn_j bsum_j      v = d A - dmin M
 *     Q5_K  as Q4_K, q_jl its five bits
 *     Q6_K  A = sum_g sc_g (sum_l q_gl x_gl - 32 bsum_g)                 v = d A
 *     Q4_0  A_b = sum_l q_bl x_bl (per 32-weight block b)   v = sum_b d_b A_b - 8 sum_b d_b bsum_b
 *     Q8_0  as Q4_0, q_bl signed, no 8 sum_b d_b bsum_b
 * held as eight 32-bit lanes, converted exactly (|lane| < 2^24) and added to eight float32
 * lanes: acc = fma(float(A), d dx_s, acc), then acc = fnma(float(M), dmin dx_s, acc) (Q4_0:
 * t_e = fma(float(A_b), d_b, t_e) for the even blocks in order from 0, t_o alike for the odd,
 * t = t_e + t_o, lane b of t less 8 d_b bsum_b, then acc = fma(t, dx_s, acc)), super-blocks
 * in order. The output is the eight lanes halved (h4 = a[l] + a[l + 4], h2, h1, as lanes_sum),
 * plus the bias. So a row's bits depend on nothing but its own x and the weights: not on the
 * call's rows, its tiles or threads (batch invariance holds within the mode). The values are
 * not the float32 path's: x is rounded to 8 bits. */
#if defined(__AVX2__)
#define INT8_ACTIVATIONS 0x100               /* tl_quant_matmul's type | this: the int8 path */
/* Weight rows a tile takes (1B shapes, Zen 3 with AVX2 only, against 2: 1.02-1.11x at one
 * row, where more rows are read from memory at once; even at 8 rows; 1.08-1.11x at 64,
 * although a 4 x 4 tile's sums no longer fit AVX2's 16 registers) */
#define IC 4
/* How far ahead, in tiles, a tile prefetches its weight rows (into L2, as quant_gemm.c; 1, 2
 * and 4 measured alike at one row) */
#define PF_TILES_I8 2
#define QS 256                               /* values per group of x's int8 rounding */
/* A prompt's rounded rows are taken a block of this many bytes at a time, every weight tile
 * over one block before the next: the block stays in L2 while the tiles pass, where all of
 * x (4 MB at 512 rows of 8192) came from L3 for every tile (1.07-1.08x at 256 and 512 rows,
 * 1B shapes, Zen 3; 256 KB measured alike) */
#define X_BLOCK_BYTES (128 << 10)

typedef struct {                             /* x's rows rounded to int8 */
    int8_t *q;                               /* [m][k] */
    float *d;                                /* [m][k / 256] */
    int16_t *sums;                           /* [m][k / 256][16]: 16-value groups' sums */
} int8_rows;

static inline __attribute__((always_inline)) float hmax8(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}

/* x's row r, group g (256 floats) -> q, d, sums (see the head) */
static void round_group(const float *x, int8_t *q, float *d, int16_t *sums) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < QS; j += 8)
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    const float top = hmax8(amax);
    *d = top / 127.0f;
    const __m256 inv = _mm256_set1_ps(top != 0.0f ? 127.0f / top : 0.0f);
    for (int j = 0; j < QS; j += 32) {
        __m256i v[4];
        for (int t = 0; t < 4; t++)          /* nearest, ties to even (MXCSR's default) */
            v[t] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * t), inv));
        __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]),
                                       _mm256_packs_epi32(v[2], v[3]));
        /* the packs interleave 128-bit lanes: dwords 0 4 1 5 2 6 3 7 back in order */
        w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + j), w);
        /* the two 16-value sums: bytes times 1 in 16-bit pairs, pairs of those, then the
         * four dwords of each 128-bit lane (one group each) */
        __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), w),
                                        _mm256_set1_epi16(1));
        __m128i h = _mm_hadd_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        h = _mm_hadd_epi32(h, h);
        sums[j / 16] = (int16_t)_mm_extract_epi32(h, 0);
        sums[j / 16 + 1] = (int16_t)_mm_extract_epi32(h, 1);
    }
}

#define INLINE8 static inline __attribute__((always_inline))

INLINE8 __m256i nibbles_lo(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
INLINE8 __m256i nibbles_hi(__m256i v) {
    return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15));
}
/* [a x 8 | b x 8] words where `v` holds 8 words in each 128-bit lane: word a' of the low
 * lane and b' of the high one, a' = a % 8, b' = b % 8 (pshufb's bytes 2a', 2a' + 1, ...) */
INLINE8 __m256i words_of(__m256i v, int a, int b) {
    a %= 8, b %= 8;
    const __m256i pick = _mm256_setr_epi8(
        2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1,
        2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1,
        2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1,
        2 * b, 2 * b + 1);
    return _mm256_shuffle_epi8(v, pick);
}

/* The R rows' group s of x as the block functions read it: rows' quants, d and sums */
typedef struct { const int8_t *q[4]; float d[4]; const int16_t *sums[4]; } int8_group;

/* a[r] += run j's 32 quants w (unsigned bytes) times row r's 32 values, times the words sc */
INLINE8 void run_dot(int R, __m256i w, __m256i sc, const int8_group *g, int j, __m256i a[4]) {
    for (int r = 0; r < R; r++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(g->q[r] + 32 * j));
        a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), sc));
        /* Each product joins its row's sum at once: left alone, GCC computes a tile's 32
         * products first and adds them as a tree, spilling them to the stack (AVX2 has 16
         * registers): 1.2-1.3x slower at 8-64 rows (Zen 3) */
        __asm__("" : "+x"(a[r]));
    }
}

/* Q5_K's fifth bit of run j's 32 quants (bit j of qh's byte l), as 16: one shift of qh's
 * 16-bit words brings bit j of each byte to its bit 4 (the shift never crosses a byte there) */
INLINE8 __m256i fifth_bit(__m256i qh, int j) {
    const __m256i at4 = j <= 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
    return _mm256_and_si256(at4, _mm256_set1_epi8(16));
}

/* acc[r] += a Q4_K or Q5_K super-block's v = d A - dmin M for row r, from its sums A (a[r],
 * eight lanes) and its mins mn (group h of x, 16 values, meets run h / 2's min) */
INLINE8 void qk_close(int R, const uint8_t *blk, const uint8_t mn[8], const int8_group *g,
                      const __m256i a[4], __m256 acc[4]) {
    const __m128i twice = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m256i mins = _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)mn), twice));
    const float d = half_to_float(blk), dmin = half_to_float(blk + 2);
    for (int r = 0; r < R; r++) {
        __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)g->sums[r]), mins);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_set1_ps(d * g->d[r]), acc[r]);
        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin * g->d[r]), acc[r]);
    }
}

/* acc[r] += one Q4_K (q5 = 0) or Q5_K (q5 = 1: each quant plus 16 where its bit of qh is
 * set, so 0..31) super-block times row r's group: v = d A - dmin M (the head) */
INLINE8 void qk_group(int R, int q5, const uint8_t *blk, const int8_group *g, __m256 acc[4]) {
    uint8_t sc[8], mn[8];
    k_scales_mins(blk + 4, sc, mn);
    const __m256i s = _mm256_broadcastsi128_si256(
        _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16))
                          : _mm256_setzero_si256();
    __m256i a[4];
    for (int r = 0; r < R; r++) a[r] = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {            /* runs 2p, 2p + 1: a byte's low, high nibble */
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        __m256i lo = nibbles_lo(v), hi = nibbles_hi(v);
        if (q5) {
            lo = _mm256_or_si256(lo, fifth_bit(qh, 2 * p));
            hi = _mm256_or_si256(hi, fifth_bit(qh, 2 * p + 1));
        }
        run_dot(R, lo, words_of(s, 2 * p, 2 * p), g, 2 * p, a);
        run_dot(R, hi, words_of(s, 2 * p + 1, 2 * p + 1), g, 2 * p + 1, a);
    }
    qk_close(R, blk, mn, g, a, acc);
}

/* acc[r] += a Q6_K super-block's v = d (A - 32 M) for row r, from its sums A (a[r], eight
 * lanes) and its 16 scales s */
INLINE8 void q6k_close(int R, const uint8_t *blk, __m256i s, const int8_group *g,
                       const __m256i a[4], __m256 acc[4]) {
    const float d = half_to_float(blk + 208);
    for (int r = 0; r < R; r++) {
        __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)g->sums[r]), s);
        __m256i v = _mm256_sub_epi32(a[r], _mm256_slli_epi32(m, 5));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(d * g->d[r]), acc[r]);
    }
}

/* acc[r] += one Q6_K super-block times row r's group: v = d (A - 32 M), in integers */
INLINE8 void q6k_group(int R, const uint8_t *blk, const int8_group *g, __m256 acc[4]) {
    /* run j's first 16 weights (the low lane's 8 products) have scale 2j, the rest 2j + 1 */
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    const __m256i m30 = _mm256_set1_epi8(0x30);
    __m256i a[4];
    for (int r = 0; r < R; r++) a[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {            /* quant_blocks.h's layout, unsigned 0..63 */
        const __m256i sh = h ? _mm256_permute2x128_si256(s, s, 0x11)
                             : _mm256_permute2x128_si256(s, s, 0x00);
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        __m256i w[4] = {
            _mm256_or_si256(nibbles_lo(l0), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
            _mm256_or_si256(nibbles_lo(l1), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
            _mm256_or_si256(nibbles_hi(l0), _mm256_and_si256(qh, m30)),
            _mm256_or_si256(nibbles_hi(l1), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
        for (int t = 0; t < 4; t++)
            run_dot(R, w[t], words_of(sh, 2 * t, 2 * t + 1), g, 4 * h + t, a);
    }
    q6k_close(R, blk, s, g, a, acc);
}

/* the eight Q4_0 or Q8_0 blocks' fp16 d as floats */
INLINE8 __m256 eight_d(int q8, const uint8_t *blk) {
    uint16_t h[8];
    for (int b = 0; b < 8; b++) memcpy(h + b, blk + (q8 ? 34 : 18) * b, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* acc[r] += t[r] (sum_b d_b A_b, lane b of it), for Q4_0 less 8 d_b bsum_b, times dx */
INLINE8 void q8x_close(int R, int q8, __m256 d8, const int8_group *g, const __m256 t[4],
                       __m256 acc[4]) {
    const __m256 d8x8 = _mm256_mul_ps(d8, _mm256_set1_ps(8.0f));
    for (int r = 0; r < R; r++) {
        __m256 u = t[r];
        if (!q8) {
            __m256i g16 = _mm256_loadu_si256((const __m256i *)g->sums[r]);
            const __m256 bsum = _mm256_cvtepi32_ps(_mm256_madd_epi16(g16, _mm256_set1_epi16(1)));
            u = _mm256_fnmadd_ps(d8x8, bsum, u);
        }
        acc[r] = _mm256_fmadd_ps(u, _mm256_set1_ps(g->d[r]), acc[r]);
    }
}

/* acc[r] += eight Q4_0 (q8 = 0) or Q8_0 (q8 = 1) blocks, one group of x, times row r's
 * group: t = sum_b d_b A_b (a float product a block, in two chains), for Q4_0 less 8 d_b
 * bsum_b in lane b, then acc += t dx. Q8_0's quants are signed: |w| times x with w's sign
 * (vpsignb), as vpmaddubsw wants one side unsigned (2 x 128 x 127 < 32767: no saturation). */
INLINE8 void q8x_group(int R, int q8, const uint8_t *blk, const int8_group *g, __m256 acc[4]) {
    const __m256 d8 = eight_d(q8, blk);
    /* block by block, each row's chain in turn: a block's quants and d unpacked once and the
     * 2R chains kept in registers (all eight blocks unpacked first spilled to the stack) */
    __m256 t2[4][2];
    for (int r = 0; r < R; r++) t2[r][0] = t2[r][1] = _mm256_setzero_ps();
    #pragma GCC unroll 8                     /* so each chain is a register, not t2[r][b & 1] */
    for (int b = 0; b < 8; b++) {
        __m256i w;
        if (q8) {
            w = _mm256_loadu_si256((const __m256i *)(blk + 34 * b + 2));
        } else {
            /* the block's 16 bytes in both lanes, the high lane's shifted to its high nibbles:
             * one shift where a shift and an insert were (1.12-1.15x at 1 and 8 rows, Zen 3) */
            const __m256i v = _mm256_broadcastsi128_si256(
                _mm_loadu_si128((const __m128i *)(blk + 18 * b + 2)));
            w = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                 _mm256_set1_epi8(15));
        }
        const __m256i wu = q8 ? _mm256_abs_epi8(w) : w;
        const __m256 db = _mm256_permutevar8x32_ps(d8, _mm256_set1_epi32(b));
        for (int r = 0; r < R; r++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(g->q[r] + 32 * b));
            if (q8) x = _mm256_sign_epi8(x, w);
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, x), _mm256_set1_epi16(1));
            t2[r][b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), db, t2[r][b & 1]);
        }
    }
    __m256 t[4];
    for (int r = 0; r < R; r++) t[r] = _mm256_add_ps(t2[r][0], t2[r][1]);
    q8x_close(R, q8, d8, g, t, acc);
}

#if defined(__AVX512BW__)
#include "quant_int8_avx512.h"           /* the same functions, two runs a register */
#define QK_GROUP qk_group512
/* Q6_K's one-row tiles keep the 256-bit group: streamed from memory it read Q6_K's 1B
 * shapes 1.01-1.18x faster than the 512-bit one (Zen 5, 2 threads), though slower from cache
 * (its unpacking is the 512-bit one's twice over): a one-row step reads at memory's pace, so
 * the loads' pattern counts, not the instructions (1B Q4_K_M step 0.3 ms faster, 3 of 3
 * alternating runs). Same bits: the two agree (the head of quant_int8_avx512.h). */
#define Q6K_GROUP(R, ...) ((R) == 1 ? q6k_group(R, __VA_ARGS__) : q6k_group512(R, __VA_ARGS__))
#define Q8X_GROUP q8x_group512
#else
#define QK_GROUP qk_group
#define Q6K_GROUP q6k_group
#define Q8X_GROUP q8x_group
#endif

INLINE8 float int8_sum(__m256 a) {
    __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

/* Bytes of w a group of x meets: a super-block, or eight Q4_0 or Q8_0 blocks */
static inline int group_bytes(int type) {
    return type == Q4_0 || type == Q8_0 ? 8 * block_bytes(type) : block_bytes(type);
}

/* The R rows' group s of x (rows of k values, `groups` groups), as the block functions read it */
INLINE8 int8_group group_at(const int8_rows *x, int R, int64_t r0, int64_t k, int64_t groups,
                            int64_t s) {
    int8_group g;
    for (int r = 0; r < R; r++) {
        g.q[r] = x->q + (r0 + r) * k + s * QS;
        g.d[r] = x->d[(r0 + r) * groups + s];
        g.sums[r] = x->sums + ((r0 + r) * groups + s) * 16;
    }
    return g;
}

/* acc += the R rows' group g times the weights' group at blk (a super-block, or eight Q4_0 or
 * Q8_0 blocks), prefetching the bytes `ahead` of it into L2 */
INLINE8 void group_dot(int type, int R, const uint8_t *blk, int64_t ahead, const int8_group *g,
                       __m256 acc[4]) {
    for (int line = 0; line < group_bytes(type); line += 64)
        __builtin_prefetch(blk + ahead + line, 0, 2);
    if (type == Q4_K || type == Q5_K) QK_GROUP(R, type == Q5_K, blk, g, acc);
    else if (type == Q6_K) Q6K_GROUP(R, blk, g, acc);
    else Q8X_GROUP(R, type == Q8_0, blk, g, acc);
}

/* Rows r0 .. r0 + R - 1 (R <= 4) of x by C weight rows at w -> y. R, C and the type are
 * constants where it is inlined: the R x C sums stay in registers. Each sum takes the groups
 * in order whichever loop runs, so the bits are the same. */
INLINE8 void int8_tile(int type, int R, int C, const int8_rows *x, int64_t r0, int64_t k,
                       const uint8_t *w, int64_t ldw, const float *b, float *y, int64_t ldy) {
    const int64_t groups = k / QS, gb = group_bytes(type), ahead = PF_TILES_I8 * C * ldw;
    __m256 acc[IC][4];
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) acc[c][r] = _mm256_setzero_ps();
    if (R == 1) {
        /* One row of x (a step's decode): the tile's weight rows one after the other, so a
         * thread reads one stream from memory where the loop below reads C side by side.
         * 1B shapes, Zen 5, 2 threads, runs alternating with the old build: Q4_K 1.08-1.35x,
         * 0.94-1.00x, 1.15-1.27x; Q6_K 1.00-1.07x, 1.14-1.54x; Q4_0 1.01-1.05x, 1.03-1.28x;
         * Q5_K 0.99-1.00x; Q8_0 0.94-1.01x, 0.95-0.99x (kept on the one code path); 1B
         * Q4_K_M step faster in 6 of 8 alternating runs, its fastest steps in 8 of 8. x's
         * row stays in L1 either way. */
        for (int c = 0; c < C; c++)
            for (int64_t s = 0; s < groups; s++) {
                const int8_group g = group_at(x, 1, r0, k, groups, s);
                group_dot(type, 1, w + c * ldw + s * gb, ahead, &g, acc[c]);
            }
    } else {
        for (int64_t s = 0; s < groups; s++) {
            const int8_group g = group_at(x, R, r0, k, groups, s);
            for (int c = 0; c < C; c++)
                group_dot(type, R, w + c * ldw + s * gb, ahead, &g, acc[c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            y[r * ldy + c] = int8_sum(acc[c][r]) + (b ? b[c] : 0.0f);
}

typedef void (*int8_tile_fn)(const int8_rows *, int64_t, int64_t, const uint8_t *, int64_t,
                             const float *, float *, int64_t);
#define I8TILE(T, R, C)                                                                    \
    static void i8tile_##T##_##R##_##C(const int8_rows *x, int64_t r0, int64_t k,          \
                                       const uint8_t *w, int64_t ldw, const float *b,      \
                                       float *y, int64_t ldy) {                            \
        int8_tile(T, R, C, x, r0, k, w, ldw, b, y, ldy);                                   \
    }
#define I8ROWS(T, C) I8TILE(T, 1, C) I8TILE(T, 2, C) I8TILE(T, 3, C) I8TILE(T, 4, C)
#define I8FNS(T, C) {i8tile_##T##_1_##C, i8tile_##T##_2_##C, i8tile_##T##_3_##C, i8tile_##T##_4_##C}
#define I8TILES(T) I8ROWS(T, 1) I8ROWS(T, 2) I8ROWS(T, 3) I8ROWS(T, 4)                      \
    static const int8_tile_fn I8TILES_##T[4][4] = {I8FNS(T, 1), I8FNS(T, 2), I8FNS(T, 3),  \
                                                   I8FNS(T, 4)};
I8TILES(Q4_K) I8TILES(Q5_K) I8TILES(Q6_K) I8TILES(Q4_0) I8TILES(Q8_0)

/* A type's tiles, or 0 where this path has none: the one list of the types it takes */
static const int8_tile_fn (*int8_tiles(int type))[4] {
    switch (type) {
    case Q4_K: return I8TILES_Q4_K;
    case Q5_K: return I8TILES_Q5_K;
    case Q6_K: return I8TILES_Q6_K;
    case Q4_0: return I8TILES_Q4_0;
    case Q8_0: return I8TILES_Q8_0;
    default: return 0;
    }
}

/* y = x W^T + b with x rounded to int8 (the head): 0, or -1 where this path cannot take the
 * call (another type, k not whole groups of 256, no memory) and the caller's float32 path
 * must. */
static int int8_matmul(const float *x, const uint8_t *w, int type, const float *b, float *y,
                       int64_t m, int64_t k, int64_t n, int threads) {
    const int8_tile_fn (*table)[4] = int8_tiles(type);
    if (!table || k % QS) return -1;
    const int64_t groups = k / QS, ldw = groups * group_bytes(type);
    int8_rows xr = {malloc((size_t)(m * k)), malloc(sizeof(float) * (size_t)(m * groups)),
                    malloc(sizeof(int16_t) * 16 * (size_t)(m * groups))};
    int rc = -1;
    if (xr.q && xr.d && xr.sums) {
        #pragma omp parallel num_threads(threads)
        {
            #pragma omp for schedule(static)     /* x rounded once (the loop's end waits) */
            for (int64_t g = 0; g < m * groups; g++)
                round_group(x + g * QS, xr.q + g * QS, xr.d + g, xr.sums + g * 16);
            const int64_t rb = X_BLOCK_BYTES / k < 4 ? 4 : X_BLOCK_BYTES / k / 4 * 4;
            for (int64_t m0 = 0; m0 < m; m0 += rb) {
                const int64_t m1 = m - m0 < rb ? m : m0 + rb;
                /* no wait between blocks: their outputs are apart, and a static schedule
                 * gives each thread the same weight tiles in every block */
                #pragma omp for schedule(static) nowait
                for (int64_t n0 = 0; n0 < n; n0 += IC) {
                    const int cols = n - n0 < IC ? (int)(n - n0) : IC;
                    for (int64_t r0 = m0; r0 < m1; r0 += 4) {
                        const int R = m1 - r0 < 4 ? (int)(m1 - r0) : 4;
                        table[cols - 1][R - 1](&xr, r0, k, w + n0 * ldw, ldw, b ? b + n0 : 0,
                                               y + r0 * n + n0, n);
                    }
                }
            }
        }
        rc = 0;
    }
    free(xr.q), free(xr.d), free(xr.sums);
    return rc;
}
#define HAS_INT8 1
#else
#define HAS_INT8 0
#endif

int tl_quant_has_int8(void) { return HAS_INT8; }

/* The values x is rounded in groups of where a layer of `type` with rows of k weights takes
 * the int8 path, else 0 (another type, rows not whole groups, no int8 path built): what the
 * worker asks to know which layers the flag changes, and what the step log records */
int tl_quant_int8_group(int type, int64_t k) {
#if HAS_INT8
    return int8_tiles(type) && k % QS == 0 ? QS : 0;   /* k = 0: of the type alone */
#else
    (void)type, (void)k;
    return 0;
#endif
}
