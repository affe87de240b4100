/* step.c's portable build: the AVX-512 operations it uses, in plain C on 16-float vectors, so
 * that the kernel builds and its tests run on any CPU (musegen/model/native.py builds it with
 * -DMUSEGEN_PORTABLE; on a CPU without AVX512-BF16, step.c comes out this way and musegen runs
 * PyTorch's step instead, as this build is not fast). Each function is named after the
 * intrinsic it stands for, so step.c reads the same in both builds, and does what Intel's
 * documentation says that instruction does, including the bf16 dot product's order of
 * operations (VDPBF16PS: the odd pair's product added first, then the even pair's, each sum
 * rounded to fp32) and its rounding (VCVTNEPS2BF16: nearest even, denormals to zero).
 * Not included in a native build: there <immintrin.h> defines these names. */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { NATIVE_BF16 = 0 };

typedef struct { float f[16]; } __m512;
typedef struct { uint16_t h[32]; } __m512bh;
typedef uint16_t __mmask16;

enum { _CMP_GE_OQ = 0x1D, _CMP_GT_OQ = 0x1E, _MM_FROUND_TO_NEAREST_INT = 0, _MM_FROUND_NO_EXC = 8, _MM_HINT_T0 = 3 };
#define _mm_prefetch(address, hint) __builtin_prefetch(address)

#define LANES(expression)            \
    __m512 out;                      \
    for (int i = 0; i < 16; i++)     \
        out.f[i] = (expression);     \
    return out

static inline __m512 _mm512_setzero_ps(void) { LANES(0.0f); }
static inline __m512 _mm512_set1_ps(float x) { LANES(x); }
static inline __m512 _mm512_loadu_ps(const float *p) { LANES(p[i]); }
static inline __m512 _mm512_maskz_loadu_ps(__mmask16 k, const float *p) { LANES(k >> i & 1 ? p[i] : 0.0f); }
static inline void _mm512_storeu_ps(float *p, __m512 v) { memcpy(p, v.f, sizeof v.f); }
static inline void _mm512_mask_storeu_ps(float *p, __mmask16 k, __m512 v) {
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            p[i] = v.f[i];
}
static inline __m512 _mm512_add_ps(__m512 a, __m512 b) { LANES(a.f[i] + b.f[i]); }
static inline __m512 _mm512_sub_ps(__m512 a, __m512 b) { LANES(a.f[i] - b.f[i]); }
static inline __m512 _mm512_mul_ps(__m512 a, __m512 b) { LANES(a.f[i] * b.f[i]); }
static inline __m512 _mm512_div_ps(__m512 a, __m512 b) { LANES(a.f[i] / b.f[i]); }
static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) { LANES(fmaf(a.f[i], b.f[i], c.f[i])); }
static inline __m512 _mm512_fnmadd_ps(__m512 a, __m512 b, __m512 c) { LANES(fmaf(-a.f[i], b.f[i], c.f[i])); }
static inline __m512 _mm512_abs_ps(__m512 a) { LANES(fabsf(a.f[i])); }
/* max and min return their second operand when either is NaN, as the instructions do */
static inline __m512 _mm512_max_ps(__m512 a, __m512 b) { LANES(a.f[i] > b.f[i] ? a.f[i] : b.f[i]); }
static inline __m512 _mm512_min_ps(__m512 a, __m512 b) { LANES(a.f[i] < b.f[i] ? a.f[i] : b.f[i]); }
static inline __m512 _mm512_mask_max_ps(__m512 src, __mmask16 k, __m512 a, __m512 b) {
    LANES(k >> i & 1 ? (a.f[i] > b.f[i] ? a.f[i] : b.f[i]) : src.f[i]);
}
static inline __m512 _mm512_mask_sub_ps(__m512 src, __mmask16 k, __m512 a, __m512 b) {
    LANES(k >> i & 1 ? a.f[i] - b.f[i] : src.f[i]);
}
static inline __m512 _mm512_maskz_sub_ps(__mmask16 k, __m512 a, __m512 b) { LANES(k >> i & 1 ? a.f[i] - b.f[i] : 0.0f); }
static inline __m512 _mm512_maskz_mov_ps(__mmask16 k, __m512 a) { LANES(k >> i & 1 ? a.f[i] : 0.0f); }
static inline __m512 _mm512_mask_blend_ps(__mmask16 k, __m512 a, __m512 b) { LANES(k >> i & 1 ? b.f[i] : a.f[i]); }
/* rounding to the nearest integer, ties to even: the default rounding mode's rintf */
static inline __m512 _mm512_roundscale_ps(__m512 a, int mode) { LANES(((void)mode, rintf(a.f[i]))); }
static inline __m512 _mm512_scalef_ps(__m512 a, __m512 b) { LANES(ldexpf(a.f[i], (int)floorf(b.f[i]))); }

static inline __mmask16 _mm512_cmp_ps_mask(__m512 a, __m512 b, int predicate) {
    __mmask16 k = 0;
    for (int i = 0; i < 16; i++)
        k |= (predicate == _CMP_GT_OQ ? a.f[i] > b.f[i] : a.f[i] >= b.f[i]) << i;
    return k;
}

/* horizontal sums and maxima in halves, as the compilers' sequences for these intrinsics go */
static inline float _mm512_reduce_add_ps(__m512 a) {
    for (int width = 8; width >= 1; width /= 2)
        for (int i = 0; i < width; i++)
            a.f[i] += a.f[i + width];
    return a.f[0];
}
static inline float _mm512_reduce_max_ps(__m512 a) {
    for (int width = 8; width >= 1; width /= 2)
        for (int i = 0; i < width; i++)
            a.f[i] = a.f[i] > a.f[i + width] ? a.f[i] : a.f[i + width];
    return a.f[0];
}

/* bf16 bits as the float they stand for; denormals read as zero (as VDPBF16PS does) */
static inline float bf16_value(uint16_t h) {
    const uint32_t bits = (h & 0x7F80u) ? (uint32_t)h << 16 : (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* src[j] + a[2j + 1] b[2j + 1] + a[2j] b[2j], summed in that order in fp32 (a product of two
 * bf16 is exact in fp32, so only the two sums round). */
static inline __m512 _mm512_dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
    LANES((src.f[i] + bf16_value(a.h[2 * i + 1]) * bf16_value(b.h[2 * i + 1])) +
          bf16_value(a.h[2 * i]) * bf16_value(b.h[2 * i]));
}

/* 32 bf16 from p */
static inline __m512bh load_bf16(const uint16_t *p) {
    __m512bh v;
    memcpy(v.h, p, sizeof v.h);
    return v;
}

/* v rounded to bf16, to nearest even (NaN stays a quiet NaN, denormals become signed zeros),
 * stored as 16 bf16 at p */
static inline void store_bf16(uint16_t *p, __m512 v) {
    for (int i = 0; i < 16; i++) {
        uint32_t bits;
        memcpy(&bits, &v.f[i], sizeof bits);
        if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
            p[i] = (uint16_t)(bits >> 16 | 0x40);
        else if ((bits & 0x7F800000u) == 0)
            p[i] = (uint16_t)(bits >> 16 & 0x8000);
        else
            p[i] = (uint16_t)((bits + 0x7FFFu + (bits >> 16 & 1)) >> 16);
    }
}
