/* Dropout on CPU in one pass: each output is its input times 0 or the scale, the mask drawn
 * from SplitMix64 as musegen.model.transformer.random_words draws it (word w = the hash of
 * seed + w * golden ratio; element 4w + j keeps when 16-bit part j of word w, with the top
 * bit flipped, is at least `cut`). The same call on the gradient is the backward pass, so no mask
 * is stored. PyTorch's eager version of this makes a dozen passes over the data.
 * Loaded by musegen/model/native.py; tests/test_native.py checks it bit for bit against the
 * eager path. */
#include <stdint.h>
#include <string.h>

static inline uint64_t splitmix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t float_to_bf16(float f) { /* round to nearest even, as PyTorch does */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)(((bits & 0x7FFFFFFFu) > 0x7F800000u) ? ((bits >> 16) | 0x40u) : rounded); /* NaN stays NaN */
}

#define WORDS 64 /* a block: 64 words, 256 elements */

/* Element 4w + j reads uint16 number 4w + j of the words' memory, as the eager path's int16
 * view of its words does (part j of word w on a little-endian machine). */
static inline void draw(uint64_t w0, uint64_t seed, uint16_t parts[4 * WORDS]) {
    uint64_t words[WORDS];
    for (int i = 0; i < WORDS; i++)
        words[i] = splitmix64(seed + (w0 + (uint64_t)i) * 0x9E3779B97F4A7C15ULL);
    memcpy(parts, words, sizeof words);
}

/* dst[i] = src[i] * (0 or scale) for i < n; bf16 (as uint16) when `bf16`, else float32. One
 * thread: a second one would share its core with PyTorch's OpenMP workers, which spin-wait
 * after each parallel region, so it is no faster. */
void dropout(const void *src, void *dst, int64_t n, int bf16, uint64_t seed, uint32_t cut, float scale) {
    uint16_t parts[4 * WORDS];
    for (int64_t start = 0; start < n; start += 4 * WORDS) {
        draw((uint64_t)start / 4, seed, parts);
        int64_t count = n - start < 4 * WORDS ? n - start : 4 * WORDS;
        if (bf16) {
            const uint16_t *in = (const uint16_t *)src + start;
            uint16_t *out = (uint16_t *)dst + start;
            for (int64_t e = 0; e < count; e++)
                out[e] = float_to_bf16(bf16_to_float(in[e]) * ((uint32_t)(parts[e] ^ 0x8000u) >= cut ? scale : 0.0f));
        } else {
            const float *in = (const float *)src + start;
            float *out = (float *)dst + start;
            for (int64_t e = 0; e < count; e++)
                out[e] = in[e] * ((uint32_t)(parts[e] ^ 0x8000u) >= cut ? scale : 0.0f);
        }
    }
}
