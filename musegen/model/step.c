/* The single-token step's CPU kernel (musegen/model/c_step.py): one layer of a linear-attention
 * model for one token of every sequence, in one call.
 *
 * One token through the model reads every weight once and does little arithmetic with it, so a
 * step should take the time memory needs to deliver the weights. Here a layer is one call
 * (layer_step): its norms, its four products (weights in bf16, packed so they arrive as one
 * sequential stream; inputs rounded to bf16 as torch rounds them; sums in fp32 by the CPU's bf16
 * dot-product instruction), the feed-forward activation, and its attention (SPE codes, gated or
 * not; the feature map; the state update and read-out, in one pass over each head's state). The
 * residual stream, the norms, the attention and its state stay fp32. What it computes is
 * described once in Python: the layer's order in layer.py, the feature maps in features.py, the
 * SPE gate in spe.py.
 *
 * Built for AVX512-BF16. Elsewhere, or with -DMUSEGEN_PORTABLE, step_portable.h stands in for
 * the intrinsics in plain C (the same arithmetic, not fast: musegen then runs the PyTorch step,
 * and the tests run this build to check the kernel on any CPU). Built by musegen/model/native.py
 * with step_generated.h, which c_step.py writes from its declarations of the interface (the
 * constants, the structs and step_interface); tests/test_native.py checks the kernel against
 * PyTorch. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BF16__) && !defined(MUSEGEN_PORTABLE)
#include <immintrin.h>
enum { NATIVE_BF16 = 1 };

static inline __m512bh load_bf16(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); } /* 32 bf16 */

/* v rounded to bf16 (nearest even), stored as 16 bf16 at p */
static inline void store_bf16(uint16_t *p, __m512 v) {
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(v));
}
#else
#include "step_portable.h"
#endif
#include "step_generated.h" /* ROWS x COLUMNS (a tile of the packed weights), the FEATURE_, NORM_ and ACTIVATION_ numbers, the structs */

static int64_t padded(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

/* The mask of the first n of 16 lanes (none for n <= 0). */
static inline __mmask16 first(int64_t n) { return n <= 0 ? 0 : n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1); }

/* 16 floats from p, of which the first n exist (zeros after), and the store of such a vector:
 * masked only where the vector is partial, as masked stores are slow on some CPUs (AMD Zen 4). */
static inline __m512 load16(const float *p, int64_t n) {
    return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(first(n), p);
}

static inline void store16(float *p, __m512 v, int64_t n) {
    if (n >= 16)
        _mm512_storeu_ps(p, v);
    else
        _mm512_mask_storeu_ps(p, first(n), v);
}

enum { BLOCK = 64 }; /* rows a block: every sequence passes over a block while it is in cache */
/* One sequence's product streams the weights from memory: each line is also asked for 8 KB
 * ahead, as the hardware prefetcher alone leaves the step waiting for memory. */
enum { AHEAD = 4096 };

/* sum[r] = tile rows r . x for one input (x: `chunks` chunks of 32 bf16). */
static inline void tile_dot(const uint16_t *tiles, const uint16_t *x, int64_t chunks, __m512 sum[ROWS]) {
    for (int r = 0; r < ROWS; r++)
        sum[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < chunks; j++) {
        const __m512bh xj = load_bf16(x + j * COLUMNS);
        const uint16_t *tile = tiles + j * ROWS * COLUMNS;
        for (int r = 0; r < ROWS; r++) {
            _mm_prefetch((const char *)(tile + r * COLUMNS + AHEAD), _MM_HINT_T0);
            sum[r] = _mm512_dpbf16_ps(sum[r], load_bf16(tile + r * COLUMNS), xj);
        }
    }
}

/* tile_dot for two inputs at once: each weight vector loaded once for both. */
static inline void tile_dot2(const uint16_t *tiles, const uint16_t *x0, const uint16_t *x1, int64_t chunks,
                             __m512 sum0[ROWS], __m512 sum1[ROWS]) {
    for (int r = 0; r < ROWS; r++)
        sum0[r] = sum1[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < chunks; j++) {
        const __m512bh a = load_bf16(x0 + j * COLUMNS), b = load_bf16(x1 + j * COLUMNS);
        const uint16_t *tile = tiles + j * ROWS * COLUMNS;
        for (int r = 0; r < ROWS; r++) {
            const __m512bh w = load_bf16(tile + r * COLUMNS);
            sum0[r] = _mm512_dpbf16_ps(sum0[r], w, a);
            sum1[r] = _mm512_dpbf16_ps(sum1[r], w, b);
        }
    }
}

/* y[row .. row + 8) of one sequence = residual + (sum + bias), the rows that exist. */
static inline void store_rows(const __m512 sum[ROWS], const float *bias, const float *residual, float *y, int64_t row,
                              int64_t n_out) {
    float total[ROWS]; /* a constant-bound loop: sum[] stays in registers */
    for (int r = 0; r < ROWS; r++)
        total[r] = _mm512_reduce_add_ps(sum[r]);
    for (int64_t r = 0; r < ROWS && row + r < n_out; r++)
        y[row + r] = (residual ? residual[row + r] : 0.0f) + (total[r] + bias[row + r]);
}

/* y [batch, n_out] = x [batch, n_in] W^T + bias (+ residual, which may be y itself). `packed`
 * holds W [n_out, n_in] zero-padded to [padded(n_out, ROWS), padded(n_in, COLUMNS)], tile
 * (i, j) = rows 8i.. and columns 32j.. at offset (i * padded_in / 32 + j) * 256. The weights
 * come from memory once: a block of rows is read by the first pair of sequences and found in
 * cache by the rest. Returns -1 when its scratch memory cannot be had, else 0. */
int linear_bf16(const uint16_t *packed, const float *bias, const float *x, const float *residual, float *y,
                int64_t batch, int64_t n_out, int64_t n_in) {
    const int64_t padded_in = padded(n_in, COLUMNS), chunks = padded_in / COLUMNS, padded_out = padded(n_out, ROWS);
    uint16_t *xs = aligned_alloc(64, (size_t)(batch * padded_in) * sizeof(uint16_t));
    if (xs == NULL)
        return -1;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t k = 0; k < padded_in; k += 16)
            store_bf16(xs + b * padded_in + k, load16(x + b * n_in + k, n_in - k)); /* zeros past n_in */
    for (int64_t block = 0; block < padded_out; block += BLOCK) {
        const int64_t end = block + BLOCK < padded_out ? block + BLOCK : padded_out;
        int64_t b = 0;
        for (; b + 1 < batch; b += 2) /* in pairs: half the loads of the weights from cache */
            for (int64_t row = block; row < end; row += ROWS) {
                __m512 sum0[ROWS], sum1[ROWS];
                tile_dot2(packed + row * padded_in, xs + b * padded_in, xs + (b + 1) * padded_in, chunks, sum0, sum1);
                store_rows(sum0, bias, residual ? residual + b * n_out : NULL, y + b * n_out, row, n_out);
                store_rows(sum1, bias, residual ? residual + (b + 1) * n_out : NULL, y + (b + 1) * n_out, row, n_out);
            }
        for (; b < batch; b++)
            for (int64_t row = block; row < end; row += ROWS) {
                __m512 sum[ROWS];
                tile_dot(packed + row * padded_in, xs + b * padded_in, chunks, sum);
                store_rows(sum, bias, residual ? residual + b * n_out : NULL, y + b * n_out, row, n_out);
            }
    }
    free(xs);
    return 0;
}

/* e^x for 16 floats: 2^n e^r with n = round(x / ln 2), |r| <= ln(2) / 2, e^r by its Taylor
 * series to r^7 (relative error under 1e-7); scalef applies 2^n with IEEE underflow and
 * overflow. NaN stays NaN (max and min return their second operand when one is NaN). */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x); /* ln 2 in two parts */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
    static const float inverse_factorials[] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 1.f / 2, 1.f, 1.f};
    __m512 p = _mm512_set1_ps(inverse_factorials[0]);
    for (int i = 1; i < 8; i++)
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(inverse_factorials[i]));
    return _mm512_scalef_ps(p, n);
}

enum { SPAN = 8 }; /* vectors of a row's product at once: 8 independent sums keep the FMA units busy */

/* out [n] = x [k] @ m [k, n] (m dense). */
static void row_times(const float *restrict x, int64_t k, const float *restrict m, int64_t n, float *restrict out) {
    for (int64_t j = 0; j < n; j += 16 * SPAN) {
        __m512 sum[SPAN];
        for (int s = 0; s < SPAN; s++)
            sum[s] = _mm512_setzero_ps();
        for (int64_t i = 0; i < k; i++) {
            const __m512 xi = _mm512_set1_ps(x[i]);
            for (int s = 0; s < SPAN; s++)
                sum[s] = _mm512_fmadd_ps(xi, load16(m + i * n + j + 16 * s, n - j - 16 * s), sum[s]);
        }
        for (int s = 0; s < SPAN && j + 16 * s < n; s++)
            store16(out + j + 16 * s, sum[s], n - j - 16 * s);
    }
}

/* row_times for four rows (row r at x + r * stride; out dense), sharing each load of m. */
static void four_rows_times(const float *restrict x, int64_t stride, int64_t k, const float *restrict m, int64_t n,
                            float *restrict out) {
    for (int64_t j = 0; j < n; j += 64) {
        __m512 sum[4][4];
        for (int r = 0; r < 4; r++)
            for (int s = 0; s < 4; s++)
                sum[r][s] = _mm512_setzero_ps();
        for (int64_t i = 0; i < k; i++) {
            __m512 mi[4];
            for (int s = 0; s < 4; s++)
                mi[s] = load16(m + i * n + j + 16 * s, n - j - 16 * s);
            for (int r = 0; r < 4; r++) {
                const __m512 xri = _mm512_set1_ps(x[r * stride + i]);
                for (int s = 0; s < 4; s++)
                    sum[r][s] = _mm512_fmadd_ps(xri, mi[s], sum[r][s]);
            }
        }
        for (int r = 0; r < 4; r++)
            for (int s = 0; s < 4 && j + 16 * s < n; s++)
                store16(out + r * n + j + 16 * s, sum[r][s], n - j - 16 * s);
    }
}

/* out [rows, n] (dense) = x [rows, k] (row r at x + r * stride) @ m [k, n]. */
static void matmul(const float *x, int64_t stride, int64_t rows, int64_t k, const float *m, int64_t n, float *out) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        four_rows_times(x + r * stride, stride, k, m, n, out + r * n);
    for (; r < rows; r++)
        row_times(x + r * stride, k, m, n, out + r * n);
}

/* A head's codes gated as SPEFilter gates them: mixed [D, width] = wet [D] * codes + dry_eps. */
static void gate_codes(const float *codes, const float *wet, const float *dry_eps, int64_t head_dim, int64_t width,
                       float *mixed) {
    for (int64_t d = 0; d < head_dim; d++)
        for (int64_t r = 0; r < width; r += 16) {
            const int64_t i = d * width + r;
            store16(mixed + i, _mm512_fmadd_ps(_mm512_set1_ps(wet[d]), load16(codes + i, width - r), load16(dry_eps + i, width - r)),
                    width - r);
        }
}

/* phi [rows, features] of queries or keys x [rows, width] (row r at x + r * stride), as
 * features.py. FAVOR+ (`projection` [width, features] = [w, -w] scaled, Favor.constants):
 * exp(u - shift) with u = x P + log_scale and shift = max(u) for a query, key_scale * |x|^2 for
 * a key, each row's shift kept in shifts [rows] where not NULL. relu(x), or elu(x) + 1 = x + 1
 * above 0 and e^x below. */
static void feature_maps(const float *x, int64_t stride, int64_t rows, int64_t width, const float *projection,
                         int64_t features, int feature_map, int queries, float log_scale, float key_scale, float *phi,
                         float *shifts) {
    if (feature_map != FEATURE_PERFORMER) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < width; i += 16) {
                const __m512 v = load16(x + r * stride + i, width - i);
                const __mmask16 positive = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
                const __m512 y = feature_map == FEATURE_RELU ? _mm512_maskz_mov_ps(positive, v)
                                              : _mm512_mask_blend_ps(positive, exp16(v), _mm512_add_ps(v, _mm512_set1_ps(1.0f)));
                store16(phi + r * width + i, y, width - i);
            }
        return;
    }
    matmul(x, stride, rows, width, projection, features, phi);
    for (int64_t r = 0; r < rows; r++) {
        float *u = phi + r * features;
        const float *xr = x + r * stride;
        __m512 largest = _mm512_set1_ps(-INFINITY), squares = _mm512_setzero_ps();
        for (int64_t m = 0; m < features; m += 16) {
            const __m512 um = _mm512_add_ps(load16(u + m, features - m), _mm512_set1_ps(log_scale));
            store16(u + m, um, features - m);
            largest = _mm512_mask_max_ps(largest, first(features - m), largest, um);
        }
        for (int64_t w = 0; w < width; w += 16) {
            const __m512 v = load16(xr + w, width - w);
            squares = _mm512_fmadd_ps(v, v, squares);
        }
        const float shift = queries ? _mm512_reduce_max_ps(largest) : key_scale * _mm512_reduce_add_ps(squares);
        if (shifts)
            shifts[r] = shift;
        for (int64_t m = 0; m < features; m += 16)
            store16(u + m, exp16(_mm512_sub_ps(load16(u + m, features - m), _mm512_set1_ps(shift))), features - m);
    }
}

enum { BAND = 16 }; /* rows of the state at a time: 16 x (head_dim + 1) floats, in L1 while all its columns pass */

/* state [features, n] += phi_k [features] (outer) v [n]; read [n] = phi_q @ state (updated), in
 * one pass over the state in memory order: by bands of rows, each band by columns of 16 with
 * four independent sums. */
static void update_and_read(float *restrict state, const float *restrict v, const float *restrict phi_k,
                            const float *restrict phi_q, int64_t features, int64_t n, float *restrict read) {
    for (int64_t j = 0; j < n; j++)
        read[j] = 0.0f;
    for (int64_t band = 0; band < features; band += BAND) {
        const int64_t end = band + BAND < features ? band + BAND : features;
        /* the next band from memory while this one computes: the state is too large for any cache */
        for (const char *line = (const char *)(state + end * n); line < (const char *)(state + (end + BAND) * n); line += 64)
            _mm_prefetch(line, _MM_HINT_T0);
        for (int64_t j = 0; j < n; j += 16) {
            const __m512 vj = load16(v + j, n - j);
            __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int64_t m = band; m < end; m++) {
                float *s = state + m * n + j;
                const __m512 updated = _mm512_fmadd_ps(_mm512_set1_ps(phi_k[m]), vj, load16(s, n - j));
                store16(s, updated, n - j);
                sum[m & 3] = _mm512_fmadd_ps(_mm512_set1_ps(phi_q[m]), updated, sum[m & 3]);
            }
            const __m512 total = _mm512_add_ps(_mm512_add_ps(sum[0], sum[1]), _mm512_add_ps(sum[2], sum[3]));
            store16(read + j, _mm512_add_ps(load16(read + j, n - j), total), n - j);
        }
    }
}

/* The exact part of a windowed attention for one query q [width] (attention.windowed_attention):
 * logits[j] = temperature q . keys[j] + offset over the `filled` slots of the ring buffers keys
 * [., width] and values [., n]; with extra = max(0, max logits), read [n] (the linear part's
 * phi(q) sums) becomes read e^-extra + sum_j e^(logits[j] - extra) values[j]. */
static void window_read(const float *q, const float *keys, const float *values, int64_t filled, int64_t width,
                        int64_t n, float temperature, float offset, float *logits, float *read) {
    float extra = 0.0f;
    for (int64_t j = 0; j < filled; j++) {
        float dot = 0.0f;
        for (int64_t i = 0; i < width; i++)
            dot += q[i] * keys[j * width + i];
        logits[j] = temperature * dot + offset;
        extra = logits[j] > extra ? logits[j] : extra;
    }
    const float scale = expf(-extra);
    for (int64_t i = 0; i < n; i++)
        read[i] *= scale;
    for (int64_t j = 0; j < filled; j++) {
        const float weight = expf(logits[j] - extra);
        for (int64_t i = 0; i < n; i++)
            read[i] += weight * values[j * n + i];
    }
}

/* One token's linear attention for every head and sequence, the token after `tokens` others.
 * projected [batch, 2 H D + H (D + 1)] is the qkv projection: queries, keys, then each head's
 * values followed by a constant 1 (so one pass gives numerator and denominator). With SPE, codes
 * [2, H, D, width] are the position's query and key codes (each sequence's own at
 * codes + b * codes_stride when shape->codes_stride is not 0) and the layer's wet [H, D],
 * dry_eps [H, D, width] its gate (NULL: ungated); without SPE (codes NULL) width is D.
 * Without a window, the layer's sums [H, batch, features, D + 1] += phi(k) [v, 1], then
 * out [batch, H D] = (phi(q) sums)[:D] / ((phi(q) sums)[D] + eps), in one pass over the sums.
 * With one (torch_step's _windowed), the key and [v, 1] in slot tokens % window of the ring
 * buffers keys [H, batch, window, width] and values [H, batch, window, D + 1] enter the sums
 * as they leave, the token takes their slot, and the exact weights over the filled slots join
 * the read-out (window_read). Returns -1 when its scratch memory cannot be had, else 0. */
int linear_attention_step(const struct layer *layer, const struct shape *shape, const float *projected,
                          const float *codes, int64_t tokens, float *out) {
    const int64_t B = shape->batch, H = shape->heads, D = shape->head_dim, width = shape->width,
                  M = shape->features, W = shape->window, stride = 2 * H * D + H * (D + 1);
    const int64_t group = shape->codes_stride ? 1 : B; /* the sequences that share one set of codes */
    float *scratch = malloc((size_t)(2 * D * width + 2 * B * (width + M) + B + D + 1 + W) * sizeof(float));
    if (scratch == NULL)
        return -1;
    float *mixed_q = scratch, *mixed_k = mixed_q + D * width, *qs = mixed_k + D * width, *ks = qs + B * width,
          *phi_q = ks + B * width, *phi_k = phi_q + B * M, *shifts = phi_k + B * M, *read = shifts + B,
          *logits = read + D + 1;
    for (int64_t h = 0; h < H; h++) { /* each step below for every sequence at once */
        const float *q = projected + h * D, *k = q + H * D;
        int64_t q_stride = stride; /* from one sequence's query (key) to the next */
        if (codes) {
            for (int64_t b = 0; b < B; b += group) {
                const float *codes_q = codes + b * shape->codes_stride + h * D * width, *codes_k = codes_q + H * D * width;
                if (layer->wet) {
                    gate_codes(codes_q, layer->wet + h * D, layer->dry_eps + h * D * width, D, width, mixed_q);
                    gate_codes(codes_k, layer->wet + h * D, layer->dry_eps + h * D * width, D, width, mixed_k);
                    codes_q = mixed_q, codes_k = mixed_k;
                }
                matmul(q + b * stride, stride, group, D, codes_q, width, qs + b * width);
                matmul(k + b * stride, stride, group, D, codes_k, width, ks + b * width);
            }
            q = qs, k = ks, q_stride = width;
        }
        feature_maps(q, q_stride, B, width, layer->projection, M, shape->feature_map, 1, shape->log_scale,
                     shape->key_scale, phi_q, shifts);
        float *keys = NULL, *values = NULL;
        const int64_t slot = W ? tokens % W : 0, filled = tokens + 1 < W ? tokens + 1 : W;
        if (!W) /* the token's own key enters the sums */
            feature_maps(k, q_stride, B, width, layer->projection, M, shape->feature_map, 0, shape->log_scale,
                         shape->key_scale, phi_k, NULL);
        else {
            keys = layer->keys + h * B * W * width, values = layer->values + h * B * W * (D + 1);
            if (tokens >= W) /* the key leaving the window enters the sums */
                feature_maps(keys + slot * width, W * width, B, width, layer->projection, M, shape->feature_map, 0,
                             shape->log_scale, shape->key_scale, phi_k, NULL);
            else
                memset(phi_k, 0, (size_t)(B * M) * sizeof(float));
        }
        for (int64_t b = 0; b < B; b++) {
            const float *v = projected + b * stride + 2 * H * D + h * (D + 1);
            float *sums = layer->sums + (h * B + b) * M * (D + 1);
            if (!W) {
                update_and_read(sums, v, phi_k + b * M, phi_q + b * M, M, D + 1, read);
            } else {
                float *ring_k = keys + b * W * width, *ring_v = values + b * W * (D + 1);
                const float *qb = q + b * q_stride;
                update_and_read(sums, ring_v + slot * (D + 1), phi_k + b * M, phi_q + b * M, M, D + 1, read);
                memcpy(ring_k + slot * width, k + b * q_stride, (size_t)width * sizeof(float));
                memcpy(ring_v + slot * (D + 1), v, (size_t)(D + 1) * sizeof(float));
                float squares = 0.0f;
                for (int64_t i = 0; i < width; i++)
                    squares += qb[i] * qb[i];
                /* on the scale of phi(q): Favor.query_offset = key_scale |q|^2 - log_scale - max(q P) */
                window_read(qb, ring_k, ring_v, filled, width, D + 1, 2 * shape->key_scale,
                            shape->key_scale * squares - shifts[b], logits, read);
            }
            for (int64_t d = 0; d < D; d++)
                out[b * H * D + h * D + d] = read[d] / (read[D] + shape->eps);
        }
    }
    free(scratch);
    return 0;
}

/* erfc(|z|) for 16 floats (Abramowitz & Stegun 7.1.26: absolute error under 1.5e-7), without the
 * cancellation that 1 - erf(|z|) would have in the tails. */
static inline __m512 erfc_abs16(__m512 z) {
    static const float a[] = {1.061405429f, -1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f};
    const __m512 abs = _mm512_abs_ps(z);
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), abs, _mm512_set1_ps(1.0f)));
    __m512 p = _mm512_set1_ps(a[0]);
    for (int i = 1; i < 5; i++)
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(a[i]));
    return _mm512_mul_ps(_mm512_mul_ps(p, t), exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), abs), abs)));
}

/* x = gelu(x) = x (1 + erf(x / sqrt 2)) / 2 (the exact form, torch's default), or relu(x). */
static void activate(float *x, int64_t n, int gelu) {
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = load16(x + i, n - i);
        __m512 y;
        if (gelu) {
            const __m512 tail = erfc_abs16(_mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)));
            const __mmask16 positive = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);
            const __m512 one_plus_erf = _mm512_mask_sub_ps(tail, positive, _mm512_set1_ps(2.0f), tail);
            y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), one_plus_erf);
        } else {
            y = _mm512_max_ps(v, _mm512_setzero_ps());
        }
        store16(x + i, y, n - i);
    }
}

/* out [rows, n] = (x - mean) / sqrt(variance + eps) * weight + bias, row by row (out may be x). */
static void layer_norm(const struct norm *norm, const float *x, float *out, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++, x += n, out += n) {
        __m512 sum = _mm512_setzero_ps(), squares = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16)
            sum = _mm512_add_ps(sum, load16(x + i, n - i));
        const float mean = _mm512_reduce_add_ps(sum) / (float)n;
        for (int64_t i = 0; i < n; i += 16) {
            const __m512 centred = _mm512_maskz_sub_ps(first(n - i), load16(x + i, n - i), _mm512_set1_ps(mean));
            squares = _mm512_fmadd_ps(centred, centred, squares);
        }
        const __m512 scale = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(squares) / (float)n + norm->eps));
        for (int64_t i = 0; i < n; i += 16) {
            const __m512 centred = _mm512_sub_ps(load16(x + i, n - i), _mm512_set1_ps(mean));
            store16(out + i, _mm512_fmadd_ps(_mm512_mul_ps(centred, scale), load16(norm->weight + i, n - i),
                                             load16(norm->bias + i, n - i)), n - i);
        }
    }
}

static int apply(const struct linear *linear, const float *x, const float *residual, float *y, int64_t batch) {
    return linear_bf16(linear->tiles, linear->bias, x, residual, y, batch, linear->n_out, linear->n_in);
}

/* One layer for one token of every sequence (the token after `tokens` others), in layer.py's
 * order: x [batch, d_model], the residual stream, is updated in place; `codes` are the
 * position's SPE codes (NULL without SPE).
 * `layer` holds its weights (`projection`: the feature map's constants, NULL for maps without;
 * `wet`, `dry_eps`: the SPE gate, NULL when ungated; `sums`: the attention state [H, batch,
 * features, D + 1]; `keys`, `values`: the window's ring buffers, NULL without one). Returns -1
 * when its scratch memory cannot be had, else 0. */
int layer_step(const struct layer *layer, const struct shape *shape, const float *codes, int64_t tokens, float *x) {
    const int64_t B = shape->batch, d_model = layer->out.n_out, HD = shape->heads * shape->head_dim;
    float *scratch = malloc((size_t)(B * (d_model + layer->qkv.n_out + HD + layer->ff_in.n_out)) * sizeof(float));
    if (scratch == NULL)
        return -1;
    float *h = scratch, *projected = h + B * d_model, *attended = projected + B * layer->qkv.n_out,
          *hidden = attended + B * HD;
    const int pre_norm = shape->norm == NORM_PRE;
    int status = 0;
    if (pre_norm)
        layer_norm(&layer->norm1, x, h, B, d_model);
    status |= apply(&layer->qkv, pre_norm ? h : x, NULL, projected, B);
    status |= linear_attention_step(layer, shape, projected, codes, tokens, attended);
    status |= apply(&layer->out, attended, x, x, B);
    if (pre_norm)
        layer_norm(&layer->norm2, x, h, B, d_model);
    else
        layer_norm(&layer->norm1, x, x, B, d_model);
    status |= apply(&layer->ff_in, pre_norm ? h : x, NULL, hidden, B);
    activate(hidden, B * layer->ff_in.n_out, shape->activation == ACTIVATION_GELU);
    status |= apply(&layer->ff_out, hidden, x, x, B);
    if (!pre_norm)
        layer_norm(&layer->norm2, x, x, B, d_model);
    free(scratch);
    return status ? -1 : 0;
}
