/* Dropout on CPU in one pass: each output is its input times 0 or the scale, the mask drawn
 * from SplitMix64 as musegen.model.transformer.random_words draws it (word w = the hash of
 * seed + w * golden ratio; element 4w + j keeps when its 16-bit part j, with the top bit
 * flipped, is at least `cut`). The same call on the gradient is the backward pass, so no mask
 * is stored. PyTorch's eager version of this makes a dozen passes over the data.
 * Loaded by musegen/model/native.py; tests/test_native.py checks it bit for bit against it. */
#include <pthread.h>
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

typedef struct {
    const void *src;
    void *dst;
    int64_t begin, end; /* elements; begin a multiple of 4 * WORDS */
    uint64_t seed;
    uint32_t cut;
    float scale;
    int bf16;
} Job;

#define WORDS 16 /* a block: 16 words, 64 elements */

/* Element 4w + j's 16 bits are part j of word w; on a little-endian machine that is uint16
 * number 4w + j of the words' memory, so a block's words are read back as 64 uint16. */
static inline void draw(uint64_t w0, uint64_t seed, uint16_t parts[4 * WORDS]) {
    uint64_t words[WORDS];
    for (int i = 0; i < WORDS; i++)
        words[i] = splitmix64(seed + (w0 + (uint64_t)i) * 0x9E3779B97F4A7C15ULL);
    memcpy(parts, words, sizeof words);
}

static void *run(void *arg) {
    const Job *job = arg;
    const uint32_t cut = job->cut;
    const float scale = job->scale;
    uint16_t parts[4 * WORDS];
    for (int64_t start = job->begin; start < job->end; start += 4 * WORDS) {
        draw((uint64_t)start / 4, job->seed, parts);
        int64_t count = job->end - start < 4 * WORDS ? job->end - start : 4 * WORDS;
        if (job->bf16) {
            const uint16_t *src = (const uint16_t *)job->src + start;
            uint16_t *dst = (uint16_t *)job->dst + start;
            for (int64_t e = 0; e < count; e++)
                dst[e] = float_to_bf16(bf16_to_float(src[e]) * ((uint32_t)(parts[e] ^ 0x8000u) >= cut ? scale : 0.0f));
        } else {
            const float *src = (const float *)job->src + start;
            float *dst = (float *)job->dst + start;
            for (int64_t e = 0; e < count; e++)
                dst[e] = src[e] * ((uint32_t)(parts[e] ^ 0x8000u) >= cut ? scale : 0.0f);
        }
    }
    return NULL;
}

#define MAX_THREADS 64
#define MIN_PER_THREAD (1 << 16) /* elements: below this a thread's start costs more than it saves */

/* dst[i] = src[i] * (0 or scale) for i < n; bf16 (as uint16) when `bf16`, else float32. */
void dropout(const void *src, void *dst, int64_t n, int bf16, uint64_t seed, uint32_t cut, float scale, int threads) {
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > n / MIN_PER_THREAD) threads = (int)(n / MIN_PER_THREAD);
    if (threads < 1) threads = 1;
    Job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int64_t share = (n / threads + 4 * WORDS - 1) / (4 * WORDS) * (4 * WORDS);
    for (int t = 0; t < threads; t++) {
        int64_t begin = t * share, end = t == threads - 1 ? n : (t + 1) * share;
        jobs[t] = (Job){src, dst, begin < n ? begin : n, end < n ? end : n, seed, cut, scale, bf16};
    }
    int started = 1; /* jobs[1..started) run on threads of their own, the rest here */
    while (started < threads && pthread_create(&ids[started], NULL, run, &jobs[started]) == 0)
        started++;
    for (int t = started; t < threads; t++)
        run(&jobs[t]);
    run(&jobs[0]);
    for (int t = 1; t < started; t++)
        pthread_join(ids[t], NULL);
}
