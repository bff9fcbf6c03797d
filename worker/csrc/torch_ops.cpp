// The decode graph's hottest ops with C++ kernels (worker/torch_ops.py): an op whose kernel is
// a Python function costs the graph ~10 us a call to enter Python, and a one-row step on
// smollm2 makes ~270 such calls (121 quantized matmuls, 91 row ops, 60 for the attention). A
// kernel here does what its Python one does (worker/linear/quant.py blocks_matmul,
// worker/row_ops.py, worker/native.py) and calls the same C function, which
// worker/torch_ops.py hands over by address once its library loads.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cstdint>

namespace {

typedef int (*quant_fn)(const float *, const uint8_t *, int, const float *, float *, int64_t,
                        int64_t, int64_t, int);
quant_fn quant_matmul = nullptr;

at::Tensor quant_linear(const at::Tensor &x_, const at::Tensor &blocks,
                        const std::optional<at::Tensor> &bias_, int64_t qtype) {
    TORCH_CHECK(x_.scalar_type() == at::kFloat,
                "a quantized linear layer takes float32 input, not ", x_.scalar_type());
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.dim() == 2,
                "a quantized weight's blocks are one contiguous uint8 [out, bytes] tensor");
    TORCH_CHECK(quant_matmul, "no quantized-weight kernel");
    at::Tensor x = x_.contiguous();
    const int64_t k = x.size(-1), out = blocks.size(0);
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = out;
    at::Tensor y = at::empty(sizes, x.options());
    const int64_t rows = k ? x.numel() / k : 0;
    at::Tensor bias;
    if (bias_.has_value())
        bias = bias_->to(at::kFloat).contiguous();
    if (rows && out) {
        int rc = quant_matmul(x.data_ptr<float>(), blocks.data_ptr<uint8_t>(), (int)qtype,
                    bias.defined() ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                    rows, k, out, at::get_num_threads());
        TORCH_CHECK(rc == 0, "quantized kernel refused type ", qtype, " [", out, ", ", k,
                    "] (", rc, ")");
    }
    return y;
}

typedef void (*norm_fn)(const float *, int64_t, const float *, int64_t, const float *, float,
                        int64_t, int64_t, float *, float *, int);
typedef void (*rope_fn)(const float *, int64_t, int64_t, const float *, int64_t, int64_t,
                        const float *, const float *, int64_t, int64_t, float *, float *, int);
norm_fn rms_norm_rows = nullptr;
rope_fn rope_rows = nullptr;

// x read as rows of its last dim with unit stride: (x or a copy, rows, row stride), as
// worker/row_ops.py _rows
struct Rows {
    at::Tensor t;
    int64_t rows, stride;
};
Rows rows_of(const at::Tensor &x) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(),
                "the native row ops take CPU float32, not ", x.device(), " ", x.scalar_type());
    const int64_t n = x.size(-1);
    if (x.is_contiguous())
        return {x, n ? x.numel() / n : 0, n};
    at::Tensor flat = x.reshape({-1, n});
    if (flat.stride(-1) != 1)
        flat = flat.contiguous();
    return {flat, flat.size(0), flat.stride(0)};
}

at::Tensor out_like(const at::Tensor &x) { return at::empty(x.sizes(), x.options()); }

std::tuple<at::Tensor, at::Tensor> norm(const at::Tensor &x, const at::Tensor *residual,
                                        const at::Tensor &weight, double eps) {
    TORCH_CHECK(rms_norm_rows, "no row-op kernel");
    const int64_t n = x.size(-1);
    Rows xr = rows_of(x), w = rows_of(weight);
    TORCH_CHECK(w.t.dim() == 1 && w.t.size(0) == n, "an RMSNorm weight of ", weight.sizes(),
                " for rows of ", n);
    at::Tensor out = out_like(x), total;
    Rows res{at::Tensor(), 0, 0};
    if (residual) {
        TORCH_CHECK(residual->sizes() == x.sizes(), "a residual of ", residual->sizes(),
                    " for ", x.sizes());
        res = rows_of(*residual);
        total = out_like(x);
    }
    rms_norm_rows(xr.t.data_ptr<float>(), xr.stride,
                  residual ? res.t.data_ptr<float>() : nullptr, res.stride,
                  w.t.data_ptr<float>(), (float)eps, xr.rows, n,
                  residual ? total.data_ptr<float>() : nullptr, out.data_ptr<float>(),
                  at::get_num_threads());
    return {total, out};
}

at::Tensor rms_norm(const at::Tensor &x, const at::Tensor &weight, double eps) {
    return std::get<1>(norm(x, nullptr, weight, eps));
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor &x, const at::Tensor &residual,
                                                const at::Tensor &weight, double eps) {
    return norm(x, &residual, weight, eps);
}

// cos or sin as [tokens, dim] contiguous, as worker/row_ops.py _table
at::Tensor table(const at::Tensor &t, at::IntArrayRef lead, int64_t dim) {
    at::Tensor e = t;
    if (t.sizes().slice(0, t.dim() - 1) != lead) {
        std::vector<int64_t> shape(lead.begin(), lead.end());
        shape.push_back(dim);
        e = t.expand(shape);
    }
    return rows_of(e.contiguous()).t;
}

std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor &q, const at::Tensor &k,
                                        const at::Tensor &cos, const at::Tensor &sin,
                                        int64_t dim) {
    TORCH_CHECK(rope_rows, "no row-op kernel");
    at::IntArrayRef lead = q.sizes().slice(0, q.dim() - 1);
    TORCH_CHECK(k.sizes().slice(0, k.dim() - 1) == lead && dim > 0 && dim % 2 == 0 &&
                    q.size(-1) % dim == 0 && k.size(-1) % dim == 0 && cos.size(-1) == dim &&
                    sin.size(-1) == dim,
                "rotary embedding of q ", q.sizes(), " and k ", k.sizes(), " in heads of ", dim);
    Rows qr = rows_of(q), kr = rows_of(k);
    at::Tensor c = table(cos, lead, dim), s = table(sin, lead, dim);
    at::Tensor qo = out_like(q), ko = out_like(k);
    rope_rows(qr.t.data_ptr<float>(), qr.stride, q.size(-1) / dim, kr.t.data_ptr<float>(),
              kr.stride, k.size(-1) / dim, c.data_ptr<float>(), s.data_ptr<float>(), qr.rows,
              dim, qo.data_ptr<float>(), ko.data_ptr<float>(), at::get_num_threads());
    return {qo, ko};
}

typedef int (*decode_fn)(const float *, const float *, const float *, const void *, int64_t,
                         const void *, int, int, int, int, int, float, float *, int);
typedef int (*kv_write_fn)(float *, int64_t, int64_t, const void *, int64_t, const float *,
                           const int64_t *, const float *, const int64_t *, int, int);
decode_fn decode_rows = nullptr;
kv_write_fn kv_write_rows = nullptr;

// as worker/native.py kernel_decode
at::Tensor paged_decode(const at::Tensor &q_, const at::Tensor &k, const at::Tensor &v,
                        const at::Tensor &tables, const at::Tensor &ctx, double scale) {
    TORCH_CHECK(decode_rows, "no decode kernel");
    at::Tensor q = q_.contiguous();
    const int64_t n = q.size(0), heads = q.size(1), dim = q.size(2);
    const int64_t kv_heads = k.size(2), block = k.size(1);
    at::Tensor out = at::empty_like(q);
    int rc = decode_rows(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                         tables.data_ptr(), tables.stride(0), ctx.data_ptr(), (int)n, (int)kv_heads,
                         (int)(heads / kv_heads), (int)dim, (int)block, (float)scale,
                         out.data_ptr<float>(), at::get_num_threads());
    TORCH_CHECK(rc != -2, "native decode attention takes no head dim ", dim, " with ",
                heads / kv_heads, " query heads per KV head");
    TORCH_CHECK(rc == 0, "native decode attention could not allocate its scratch");
    return out;
}

at::Tensor unit_last(const at::Tensor &x) { return x.stride(-1) == 1 ? x : x.contiguous(); }

// as worker/native.py kernel_kv_write
void kv_write(const at::Tensor &cache, const at::Tensor &slots, const at::Tensor &k_,
              const at::Tensor &v_) {
    TORCH_CHECK(kv_write_rows, "no KV write kernel");
    const int64_t heads = k_.size(0), tokens = k_.size(1), dim = k_.size(2);
    const bool fits = v_.sizes() == k_.sizes() && cache.is_contiguous() &&
                      cache.size(-2) == heads && cache.size(-1) == dim &&
                      k_.scalar_type() == at::kFloat && v_.scalar_type() == at::kFloat &&
                      cache.scalar_type() == at::kFloat && slots.scalar_type() == at::kLong &&
                      slots.dim() == 1 && slots.size(0) == tokens;
    TORCH_CHECK(fits, "keys ", k_.sizes(), " and values ", v_.sizes(), " for a pool of ",
                cache.sizes(), " at ", slots.sizes(), " slots");
    at::Tensor k = unit_last(k_), v = unit_last(v_), s = slots.contiguous();
    const int64_t ks[2] = {k.stride(0), k.stride(1)}, vs[2] = {v.stride(0), v.stride(1)};
    const int64_t half = cache.numel() / cache.size(0);
    int rc = kv_write_rows(cache.data_ptr<float>(), half, half / (heads * dim), s.data_ptr(),
                           tokens, k.data_ptr<float>(), ks, v.data_ptr<float>(), vs,
                           (int)heads, (int)dim);
    TORCH_CHECK(rc == 0, "slot_mapping points outside the KV pool");
}

}  // namespace

extern "C" void tl_torch_ops_set(void *quant, void *norm, void *rope, void *decode,
                                 void *kv_write) {
    quant_matmul = (quant_fn)quant;
    rms_norm_rows = (norm_fn)norm;
    rope_rows = (rope_fn)rope;
    decode_rows = (decode_fn)decode;
    kv_write_rows = (kv_write_fn)kv_write;
}

// The ops whose kernel it has (worker/torch_ops.py registers them only once every C
// function a kernel here calls has been handed over)
TORCH_LIBRARY_IMPL(tl, CompositeExplicitAutograd, m) {
    m.impl("quant_linear", TORCH_FN(quant_linear));
    m.impl("rms_norm", TORCH_FN(rms_norm));
    m.impl("add_rms_norm", TORCH_FN(add_rms_norm));
    m.impl("rope", TORCH_FN(rope));
    m.impl("paged_decode", TORCH_FN(paged_decode));
    m.impl("kv_write", TORCH_FN(kv_write));
}
