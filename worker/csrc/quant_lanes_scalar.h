/* quant_gemm.c's sixteen accumulator lanes without vector instructions: each weight of run r
 * of a block decoded with the same float operations as the vector paths (quant_blocks.h). */
#define ISA "scalar"
#define RT 1
#define NT 1
#define BR 0
#define UNROLL_RUNS 0
#define PAIRED_Q4K 0
#define HALVED_Q6K 0
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

/* weight j (< 32) of run r's integer q, before its scale */
static inline int run_quant(int type, const uint8_t *blk, int r, int j) {
    int nib, l = j & 15, hi = j >> 4;
    switch (type) {
    case Q8_0: return (int8_t)blk[2 + j];
    case Q4_0: return (hi ? blk[2 + l] >> 4 : blk[2 + l] & 15) - 8;
    case Q4_1: return hi ? blk[4 + l] >> 4 : blk[4 + l] & 15;
    case Q5_0:
    case Q5_1: {
        const uint8_t *qh = blk + (type == Q5_1 ? 4 : 2);
        nib = hi ? qh[4 + l] >> 4 : qh[4 + l] & 15;
        nib |= (int)(load_u32(qh) >> j & 1) << 4;
        return type == Q5_0 ? nib - 16 : nib;
    }
    case Q6_K: {
        int h = r / 4, t = r % 4, b = blk[64 * h + 32 * (t & 1) + j];
        nib = t >= 2 ? b >> 4 : b & 15;
        return (nib | (blk[128 + 32 * h + j] >> 2 * t & 3) << 4) - 32;
    }
    default: {                               /* Q4_K, Q5_K */
        int b = blk[(type == Q5_K ? 48 : 16) + 32 * (r / 2) + j];
        nib = r & 1 ? b >> 4 : b & 15;
        return type == Q5_K ? nib | (blk[16 + j] >> r & 1) << 4 : nib;
    }
    }
}

static inline void lanes_decode(int type, const uint8_t *blk, int r, const block_factors *f,
                                lanes *w0, lanes *w1) {
    int has_min = type == Q4_1 || type == Q5_1 || type == Q4_K || type == Q5_K;
    int k = type == Q4_K || type == Q5_K || type == Q6_K;
    float scale = f->scale[type == Q6_K ? 2 * r : k ? r : 0];
    float scale2 = type == Q6_K ? f->scale[2 * r + 1] : scale;
    float offset = has_min ? f->offset[k ? r : 0] : 0.0f;
    for (int j = 0; j < 32; j++) {
        float q = (float)run_quant(type, blk, r, j), s = j < 16 ? scale : scale2;
        (j < 16 ? w0 : w1)->v[j & 15] = has_min ? fmaf(q, s, offset) : s * q;
    }
}
