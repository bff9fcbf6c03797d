/* GGUF's block layouts the quantized kernel reads (quant_gemm.c), as ggml lays them, and the
 * scalar helpers every instruction set's decoder shares.
 *
 * Blocks of 32 weights; nibble(j) is qs[j] & 15 for j < 16 and qs[j - 16] >> 4 for j >= 16,
 * hbit(j) bit j of the little-endian uint32 qh:
 *   Q8_0 (34 bytes): fp16 d, int8 q[32];                       w[j] = d * q[j]
 *   Q4_0 (18 bytes): fp16 d, qs[16];                           w[j] = d * (nibble(j) - 8)
 *   Q4_1 (20 bytes): fp16 d, fp16 m, qs[16];                   w[j] = d * nibble(j) + m
 *   Q5_0 (22 bytes): fp16 d, qh[4], qs[16];          w[j] = d * (nibble(j) + 16 hbit(j) - 16)
 *   Q5_1 (24 bytes): fp16 d, fp16 m, qh[4], qs[16];  w[j] = d * (nibble(j) + 16 hbit(j)) + m
 * Super-blocks of 256 weights, read as 8 runs r of 32 weights (weight 32r + l, l < 32):
 *   Q4_K (144): fp16 d, fp16 dmin, scales[12], qs[128]
 *       q = qs[32 (r / 2) + l], its low nibble for even r, high for odd;
 *       w = (d * sc[r]) * q - dmin * mn[r], sc and mn 6 bits (k_scales_mins)
 *   Q5_K (176): fp16 d, fp16 dmin, scales[12], qh[32], qs[128]
 *       as Q4_K, q plus 16 where bit r of qh[l] is set
 *   Q6_K (210): ql[128], qh[64], int8 sc[16], fp16 d at byte 208
 *       run r in half h = r / 4 at quarter t = r % 4: q = nibble of ql[64h + 32 (t & 1) + l]
 *       (low for t < 2) plus 16 * ((qh[32h + l] >> 2t) & 3); w = (d * sc[8h + 2t + l / 16]) * (q - 32)
 * Every product of a scale and a quant is exact in float32 (at most 11 + 7 + 5 significant
 * bits), so each weight is its exact value rounded once at most (the added or subtracted
 * min): the bits of gguf-py's dequantize and of worker/linear/quant.py's.
 */
#ifndef QUANT_BLOCKS_H
#define QUANT_BLOCKS_H
#include <stdint.h>
#include <string.h>

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
#define QK 32                                /* weights per run, the summation's unit */

/* bytes of a block; 0 for a type the kernel does not know */
static inline int block_bytes(int type) {
    switch (type) {
    case Q8_0: return 34;
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

/* runs of 32 weights in a block */
static inline int block_runs(int type) { return type >= Q4_K ? 8 : 1; }

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

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Q4_K/Q5_K's eight 6-bit scales and mins from the 12 bytes s: bytes 0-3 hold scales 0-3
 * and the top 2 bits of scales 4-7, bytes 4-7 the mins alike, bytes 8-11 the low nibbles of
 * scales 4-7 and, high, of mins 4-7. Unpacked as four 32-bit words at once. */
static inline void k_scales_mins(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, top2 = 0x03030303u;
    uint32_t a = load_u32(s), b = load_u32(s + 4), c = load_u32(s + 8);
    uint32_t words[4] = {a & low6, (c & low4) | ((a >> 6) & top2) << 4,
                         b & low6, ((c >> 4) & low4) | ((b >> 6) & top2) << 4};
    memcpy(sc, words, 8);
    memcpy(mn, words + 2, 8);
}

/* A block's float factors, computed once a block (not once a run): run r's weight is
 * q * scale[r] + offset[r] (Q4_K, Q5_K: fma(q, d sc, -(dmin mn)), its one rounding); for
 * Q6_K, weights 0-15 of run r have scale[2r], weights 16-31 scale[2r + 1]; for the 32-weight
 * types, scale[0] = d and offset[0] = m (Q4_1, Q5_1) or 0. */
typedef struct { float scale[16], offset[8]; } block_factors;

#if defined(__AVX2__)
/* 8 bytes at p (signed or not) as floats times d: vectors, where a compiler's loop of
 * scalar conversions was a third of a Q4_K call's time (the same bits: the conversion is
 * exact and the product one rounding). */
static inline void scaled8(const void *p, int is_signed, float d, float *out) {
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m256i v = is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(d)));
}
#else
static inline void scaled8(const void *p, int is_signed, float d, float *out) {
    for (int j = 0; j < 8; j++)
        out[j] = d * (float)(is_signed ? ((const int8_t *)p)[j] : ((const uint8_t *)p)[j]);
}
#endif

static inline void block_factors_of(int type, const uint8_t *blk, block_factors *f) {
    if (type == Q6_K) {
        float d = half_to_float(blk + 208);
        scaled8(blk + 192, 1, d, f->scale);
        scaled8(blk + 200, 1, d, f->scale + 8);
        return;
    }
    if (type == Q4_K || type == Q5_K) {
        uint8_t sc[8], mn[8];
        k_scales_mins(blk + 4, sc, mn);
        scaled8(sc, 0, half_to_float(blk), f->scale);
        scaled8(mn, 0, -half_to_float(blk + 2), f->offset);   /* -(dmin mn), exactly */
        return;
    }
    f->scale[0] = half_to_float(blk);
    f->offset[0] = type == Q4_1 || type == Q5_1 ? half_to_float(blk + 2) : 0.0f;
}

#if defined(__AVX2__)
/* Q6_K's run r as bytes, 32 at once: the low nibble (ql, shifted for t >= 2) or'ed with the
 * two high bits (qh >> 2t) times 16, less 32: the signed quant in -32 .. 31. */
static inline __m256i q6_run(const uint8_t *blk, int r) {
    int h = r / 4, t = r % 4;
    const __m256i f15 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
    __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (t & 1)));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(t >= 2 ? 4 : 0)), f15);
    __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), three);
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}
#endif
#endif
