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
 *       w = (d * sc[r]) * q - dmin * mn[r], sc and mn 6 bits (k_scale_min)
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

/* Q4_K/Q5_K run r's scale and min (6 bits each) from the 12 bytes s: bytes 0-3 hold scales
 * 0-3 and the top 2 bits of scales 4-7, bytes 4-7 the mins alike, bytes 8-11 the low nibbles
 * of scales 4-7 and, high, of mins 4-7. */
static inline void k_scale_min(const uint8_t *s, int r, int *sc, int *mn) {
    if (r < 4) {
        *sc = s[r] & 63;
        *mn = s[r + 4] & 63;
    } else {
        *sc = (s[r + 4] & 15) | (s[r - 4] >> 6) << 4;
        *mn = (s[r + 4] >> 4) | (s[r] >> 6) << 4;
    }
}

/* A run's float factors: the weight is q * scale + offset (Q4_K, Q5_K: fma(q, d sc, -dmin mn),
 * its one rounding) or q * scale. For Q6_K, scale of weights 0-15 and scale2 of 16-31. */
typedef struct { float scale, scale2, offset; } run_factors;

static inline run_factors k_factors(int type, const uint8_t *blk, int r) {
    run_factors f;
    if (type == Q6_K) {
        float d = half_to_float(blk + 208);
        const int8_t *sc = (const int8_t *)(blk + 192 + 8 * (r / 4) + 2 * (r % 4));
        f.scale = d * (float)sc[0];
        f.scale2 = d * (float)sc[1];
        f.offset = 0.0f;
        return f;
    }
    int sc, mn;
    k_scale_min(blk + 4, r, &sc, &mn);
    f.scale = f.scale2 = half_to_float(blk) * (float)sc;
    f.offset = -(half_to_float(blk + 2) * (float)mn);
    return f;
}
#endif
