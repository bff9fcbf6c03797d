/* Paged attention for one-token queries (decodes), read straight from the block pool.
 *
 * The torch path gathers each decode's blocks into a contiguous copy, then runs SDPA on
 * it: the KV bytes cross memory three times (read, write, read). Here each (sequence,
 * KV head) pair reads its keys once for the scores and its values once for the output.
 *
 * Layouts (fp32, contiguous):
 *   q, out   [n, kv_heads * rep, dim]  query head h = g * rep + r uses KV head g
 *   k, v     [num_blocks, block_size, kv_heads, dim]  one layer's half of the pool
 *   tables   [n, table_stride] block ids;  ctx [n] context lengths (>= 1)
 * tl_paged_decode_supports says which shapes it takes. Written with GCC vector
 * extensions, so -march picks the instruction set; AVX2 (16 registers) has its own 8-wide
 * scores that sum in the 16-lane order. Every build with fused multiply-adds gives the same
 * bits (docs/design/cpu-paths.md, "The attention kernel on AVX2").
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef int32_t v8i __attribute__((vector_size(32)));
#define MAX_DV 8                       /* dim / 16 */
#define MAX_REP 16                     /* query heads per KV head */
#define INLINE static inline __attribute__((always_inline))

INLINE v16 load(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
INLINE void store(float *p, v16 v) { memcpy(p, &v, sizeof v); }
INLINE v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
INLINE void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

/* The machine's own vector, for sums whose lanes are each their own output (any width
 * gives the same bits): GCC handles v16 without AVX-512 through the stack where it cannot
 * keep it in pairs of registers. */
#ifdef __AVX512F__
typedef v16 vn;
typedef v16i vni;
#define loadn load
#define storen store
#else
typedef v8 vn;
typedef v8i vni;
#define loadn load8
#define storen store8
#endif
#define VN ((int)(sizeof(vn) / sizeof(float)))

/* Where block b of a table sits in one layer's half of the pool: the sequence's position
 * b * bs + p is pool row table[b] * bs + p (its slot: docs/design/worker.md, "Paged KV layout"),
 * `row` floats apart. */
INLINE const float *block_rows(const float *pool, const int64_t *table, int64_t b, int bs,
                               int64_t row) {
    return pool + table[b] * bs * row;
}

/* Blocks sit anywhere in the pool, so the hardware prefetcher cannot see the next one
 * coming: ask for a block's rows (this head's part of each) one block ahead, into L2
 * (prefetcht1). Into L1, the block's 64 requests queued behind the loads' own misses: 64
 * decodes at context 400 read the pool at 18 GB/s on 2 threads, and at 27 this way. */
INLINE void prefetch_next(const float *pool, const int64_t *table, int64_t b, int64_t t0,
                          int64_t ctx, int bs, int64_t row, int dv) {
    if (t0 + bs >= ctx) return;
    const float *blk = block_rows(pool, table, b + 1, bs, row);
    const int64_t len = ctx - t0 - bs < bs ? ctx - t0 - bs : bs;
    for (int64_t p = 0; p < len; p++)
        for (int j = 0; j < dv; j++) __builtin_prefetch(blk + p * row + 16 * j, 0, 2);
}

/* One step of a walk along a table: the rows of block b (positions t0 = b * bs onwards),
 * *len of them among the first ctx positions; the next block is prefetched. */
INLINE const float *walk_block(const float *pool, const int64_t *table, int64_t b,
                               int64_t t0, int64_t ctx, int bs, int64_t row, int dv,
                               int64_t *len) {
    const float *rows = block_rows(pool, table, b, bs, row);
    *len = ctx - t0 < bs ? ctx - t0 : bs;
    prefetch_next(pool, table, b, t0, ctx, bs, row, dv);
    return rows;
}

INLINE vn vmax(vn a, vn b) {
    vni more = a > b;
    return (vn)(((vni)a & more) | ((vni)b & ~more));
}

/* A 16-lane sum's tree from its halves' sum h8[l] = a[l] + a[l + 8]: h4[l] = h8[l] +
 * h8[l + 4], then (h4[0] + h4[2]) + (h4[1] + h4[3]). */
INLINE float tree8(v8 a) {
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

INLINE float hsum(v16 v) {
    return tree8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
                 + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* The same sum given as 16 / VN vectors: lanes 0-15 of the 16-lane accumulator in order. */
INLINE float sum_parts(const vn *parts) {
#ifdef __AVX512F__
    return hsum(parts[0]);
#else
    return tree8(parts[0] + parts[1]);
#endif
}

/* exp(x) for x <= 0, 16 lanes: 2^-k * e^f with f in [-ln2/2, ln2/2] and a degree-7
 * Taylor polynomial, relative error < 1e-8 (below fp32 rounding). */
INLINE vn exp_nonpos(vn x) {
    const vn lo = (vn){0} - 87.0f;
    x = vmax(x, lo);
    vn t = x * -1.44269504088896341f;
    vni k = __builtin_convertvector(t + 0.5f, vni);     /* t >= 0: truncation rounds */
    vn f = (t - __builtin_convertvector(k, vn)) * -0.69314718055994531f;
    vn p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (
            1.0f / 120 + f * (1.0f / 720 + f * (1.0f / 5040)))))));
    return p * (vn)((127 - k) << 23);
}

/* [q.k_0, ..., q.k_15] for 16 positions at `stride` floats apart: each position's 16 lane
 * partials are summed in a transposing tree (15 shuffle-adds for 16 dots, where one
 * horizontal sum per dot costs 4). */
#define SHUF(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
INLINE v16 dots16(const v16 *qv, const float *k, int64_t stride, int dv) {
    v16 a[16], b[8], c[4], d[2];
    for (int p = 0; p < 16; p++) {
        const float *kt = k + p * stride;
        a[p] = qv[0] * load(kt);
        for (int j = 1; j < dv; j++) a[p] += qv[j] * load(kt + 16 * j);
    }
    for (int p = 0; p < 8; p++)   /* lanes 0-7: position p; 8-15: position p + 8 */
        b[p] = SHUF(a[p], a[p + 8], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
             + SHUF(a[p], a[p + 8], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int p = 0; p < 4; p++)   /* lane quads: p, p + 4, p + 8, p + 12 */
        c[p] = SHUF(b[p], b[p + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
             + SHUF(b[p], b[p + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int p = 0; p < 2; p++)   /* lane pairs: p, p + 2, ..., p + 14 */
        d[p] = SHUF(c[p], c[p + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
             + SHUF(c[p], c[p + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    return SHUF(d[0], d[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
         + SHUF(d[0], d[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* With AVX2, dots16's v16 lives on the stack: the same sums in 8-wide halves. A position's
 * lanes 0-7 (lo) and 8-15 (hi) of the 16-lane accumulator, then h8 = lo + hi. */
INLINE v8 halves(const v8 *q, const float *k, int dv) {
    v8 lo = q[0] * load8(k), hi = q[1] * load8(k + 8);
    for (int j = 1; j < dv; j++) {
        lo += q[2 * j] * load8(k + 16 * j);
        hi += q[2 * j + 1] * load8(k + 16 * j + 8);
    }
    return lo + hi;
}

/* dots16's tree for 8 positions, transposed in 8-wide vectors. */
INLINE v8 dots8(const v8 *q, const float *k, int64_t stride, int dv) {
    v8 h[8], c[4], d[2];
    for (int p = 0; p < 8; p++) h[p] = halves(q, k + p * stride, dv);
    for (int p = 0; p < 4; p++)   /* lanes 0-3: h4 of position p; 4-7: of p + 4 */
        c[p] = SHUF(h[p], h[p + 4], 0, 1, 2, 3, 8, 9, 10, 11)
             + SHUF(h[p], h[p + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int p = 0; p < 2; p++)   /* lane pairs: h2 of positions p, p + 2, p + 4, p + 6 */
        d[p] = SHUF(c[p], c[p + 2], 0, 1, 8, 9, 4, 5, 12, 13)
             + SHUF(c[p], c[p + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUF(d[0], d[1], 0, 8, 2, 10, 4, 12, 6, 14)
         + SHUF(d[0], d[1], 1, 9, 3, 11, 5, 13, 7, 15);
}

/* scale * q_r . k_t for the `len` positions of one block, into sr. */
INLINE void block_scores(const float *q, const float *kb, int64_t len, int64_t row, int dv,
                         float scale, float *sr) {
    v8 qv[2 * MAX_DV];
    for (int j = 0; j < 2 * dv; j++) qv[j] = load8(q + 8 * j);
    int64_t p = 0;
    for (; p + 8 <= len; p += 8) store8(sr + p, dots8(qv, kb + p * row, row, dv) * scale);
    for (; p < len; p++) sr[p] = tree8(halves(qv, kb + p * row, dv)) * scale;
}
#else
INLINE void block_scores(const float *q, const float *kb, int64_t len, int64_t row, int dv,
                         float scale, float *sr) {
    v16 qv[MAX_DV];
    for (int j = 0; j < dv; j++) qv[j] = load(q + 16 * j);
    int64_t p = 0;
    for (; p + 16 <= len; p += 16) store(sr + p, dots16(qv, kb + p * row, row, dv) * scale);
    for (; p < len; p++) {
        const float *kt = kb + p * row;
        v16 acc = qv[0] * load(kt);
        for (int j = 1; j < dv; j++) acc += qv[j] * load(kt + 16 * j);
        sr[p] = hsum(acc) * scale;
    }
}
#endif

/* s[r * ld + t] = scale * q_r . k_t for each of the rep query heads, positions along the
 * block table; each block's rows are read from memory once for all rep heads. */
INLINE void scores(const float *q, const float *k, const int64_t *table, int64_t ctx,
                   int64_t ld, int64_t row, int bs, int rep, int dv, float scale,
                   float *restrict s) {
    for (int64_t t0 = 0, b = 0; t0 < ctx; t0 += bs, b++) {
        int64_t len;
        const float *kb = walk_block(k, table, b, t0, ctx, bs, row, dv, &len);
        for (int r = 0; r < rep; r++)
            block_scores(q + r * dv * 16, kb, len, row, dv, scale, s + r * ld + t0);
    }
}

/* s <- softmax numerators in place (s has room for ctx rounded up to 16); returns their
 * sum, lane l of a 16-lane accumulator summing positions t = l mod 16. */
INLINE float softmax(float *restrict s, int64_t ctx) {
    const int64_t padded = (ctx + 15) & ~(int64_t)15;
    for (int64_t t = ctx; t < padded; t++) s[t] = -1e30f;   /* weight ~1e-38: none */
    vn m = loadn(s);
    for (int64_t t = VN; t < padded; t += VN) m = vmax(m, loadn(s + t));
    float top = m[0];
    for (int i = 1; i < VN; i++) top = m[i] > top ? m[i] : top;
    vn sum[16 / VN] = {0};
    for (int64_t t = 0; t < padded; t += 16)
        for (int i = 0; i < 16 / VN; i++) {
            vn e = exp_nonpos(loadn(s + t + VN * i) - top);
            storen(s + t + VN * i, e);
            sum[i] += e;
        }
    return sum_parts(sum);
}

/* Accumulators a block's value rows meet at once: the heads are taken as many at a time as
 * fit, so each row is loaded once per group and the group's chains of fused multiply-adds
 * run side by side, where a head alone left each chain waiting on its own latency. With
 * AVX-512's 32 registers, 16 (4 heads of dim 64: one sequence's call at context 300-700
 * 1.05-1.12x faster, Zen 5); AVX2's 16 registers hold one head's 8. */
#ifdef __AVX512F__
#define ACC_BUDGET 16
#else
#define ACC_BUDGET 8
#endif

/* acc[(r0 + r) * dn + j] += sum_p w[(r0 + r) * ld + p] * v_p for the block's len rows vb and
 * heads r0 .. r0 + R - 1 (R constant where inlined: the accumulators stay in registers) */
INLINE void block_values(int R, int dn, const float *vb, int64_t len, int64_t row,
                         const float *restrict w, int64_t ld, vn *acc) {
    vn a[MAX_DV * 16 / VN > ACC_BUDGET ? MAX_DV * 16 / VN : ACC_BUDGET];   /* R * dn */
    for (int i = 0; i < R * dn; i++) a[i] = acc[i];
    for (int64_t p = 0; p < len; p++)
        for (int j = 0; j < dn; j++) {
            const vn x = loadn(vb + p * row + VN * j);
            for (int r = 0; r < R; r++) a[r * dn + j] += w[r * ld + p] * x;
        }
    for (int i = 0; i < R * dn; i++) acc[i] = a[i];
}

/* out_r = (sum_t w[r * ld + t] * v_t) / total[r]. A block's value rows are read from
 * memory once and then from L1 by each group of heads in turn (rep * dv accumulators in
 * registers at once spilled with AVX2's 16: 4.7 of a 5.7 ms call at 64 decodes of context
 * 300). Each accumulator sums its positions in order, whatever the grouping: the same bits. */
INLINE void weighted_values(const float *v, const int64_t *table, int64_t ctx, int64_t ld,
                            int64_t row, int bs, int rep, int dv, const float *restrict w,
                            const float *total, float *restrict out) {
    const int dn = dv * 16 / VN;             /* vectors in a head's row */
    const int group = dn > ACC_BUDGET ? 1 : ACC_BUDGET / dn;
    vn acc[MAX_REP * MAX_DV * 16 / VN];
    for (int i = 0; i < rep * dn; i++) acc[i] = (vn){0};
    for (int64_t t0 = 0, b = 0; t0 < ctx; t0 += bs, b++) {
        int64_t len;
        const float *vb = walk_block(v, table, b, t0, ctx, bs, row, dv, &len);
        const float *wb = w + t0;
        int r = 0;                           /* groups of a constant size, then one by one */
        if (group == 4)
            for (; r + 4 <= rep; r += 4)
                block_values(4, dn, vb, len, row, wb + r * ld, ld, acc + r * dn);
        else if (group == 2)
            for (; r + 2 <= rep; r += 2)
                block_values(2, dn, vb, len, row, wb + r * ld, ld, acc + r * dn);
        for (; r < rep; r++) block_values(1, dn, vb, len, row, wb + r * ld, ld, acc + r * dn);
    }
    for (int r = 0; r < rep; r++)
        for (int j = 0; j < dn; j++)
            storen(out + (r * dn + j) * VN, acc[r * dn + j] / total[r]);
}

INLINE void attend(const float *q, const float *k, const float *v, const int64_t *table,
                   int64_t ctx, int kv_heads, int rep, int bs, int dv, float scale,
                   float *out, float *s) {
    const int64_t row = (int64_t)kv_heads * dv * 16;   /* floats between two positions */
    const int64_t ld = (ctx + 15) & ~(int64_t)15;      /* s holds one padded row per head */
    float total[MAX_REP];
    scores(q, k, table, ctx, ld, row, bs, rep, dv, scale, s);
    for (int r = 0; r < rep; r++) total[r] = softmax(s + r * ld, ctx);
    weighted_values(v, table, ctx, ld, row, bs, rep, dv, s, total, out);
}

/* What the kernel takes: a head dim that is a multiple of 16 up to 16 * MAX_DV (64 and 128
 * unrolled, the others looped), at most MAX_REP query heads per KV head. */
int tl_paged_decode_supports(int dim, int rep) {
    return dim % 16 == 0 && dim >= 16 && dim <= 16 * MAX_DV && rep >= 1 && rep <= MAX_REP;
}

/* Returns 0; -1 if scratch memory could not be allocated, -2 for an unsupported shape. */
int tl_paged_decode(const float *q, const float *k, const float *v, const int64_t *tables,
                    int64_t table_stride, const int64_t *ctx, int n, int kv_heads, int rep,
                    int dim, int block_size, float scale, float *out, int threads) {
    if (!tl_paged_decode_supports(dim, rep)) return -2;
    int64_t longest = 1;
    for (int i = 0; i < n; i++) longest = ctx[i] > longest ? ctx[i] : longest;
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        const int64_t room = (longest + 15) & ~(int64_t)15;
        float *s = malloc(sizeof(float) * (size_t)rep * (size_t)room);
        if (s == NULL) failed = 1;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < (int64_t)n * kv_heads; item++) {
            if (s == NULL) continue;
            const int64_t i = item / kv_heads, g = item % kv_heads;
            const int64_t head = (i * kv_heads + g) * rep * dim;
            const int64_t *table = tables + i * table_stride;
            if (dim == 64)
                attend(q + head, k + g * dim, v + g * dim, table, ctx[i], kv_heads, rep,
                       block_size, 4, scale, out + head, s);
            else if (dim == 128)
                attend(q + head, k + g * dim, v + g * dim, table, ctx[i], kv_heads, rep,
                       block_size, 8, scale, out + head, s);
            else
                attend(q + head, k + g * dim, v + g * dim, table, ctx[i], kv_heads, rep,
                       block_size, dim / 16, scale, out + head, s);
        }
        free(s);
    }
    return failed ? -1 : 0;
}

/* The step's new keys and values into one layer's pool: token t's heads go to row slots[t]
 * of each half ([rows, kv_heads, dim], v `half` floats after k). k and v are [kv_heads,
 * tokens, dim] with any head and token strides (ks, vs: a transposed view), dim contiguous.
 * Returns 0, or -1 (nothing written) where a slot is outside the pool. */
int tl_kv_write(float *pool, int64_t half, int64_t rows, const int64_t *slots, int64_t n,
                const float *k, const int64_t *ks, const float *v, const int64_t *vs,
                int kv_heads, int dim) {
    for (int64_t t = 0; t < n; t++)
        if (slots[t] < 0 || slots[t] >= rows) return -1;
    const size_t bytes = sizeof(float) * (size_t)dim;
    for (int64_t t = 0; t < n; t++)
        for (int g = 0; g < kv_heads; g++) {
            float *dst = pool + (slots[t] * kv_heads + g) * dim;
            memcpy(dst, k + g * ks[0] + t * ks[1], bytes);
            memcpy(dst + half, v + g * vs[0] + t * vs[1], bytes);
        }
    return 0;
}
