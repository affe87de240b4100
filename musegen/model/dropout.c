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
    int64_t begin, end; /* elements */
    uint64_t seed;
    uint32_t cut;
    float scale;
    int bf16;
} Job;

static inline float factor(uint64_t word, int part, uint32_t cut, float scale) {
    uint32_t u = ((uint32_t)(word >> (16 * part)) & 0xFFFFu) ^ 0x8000u;
    return u >= cut ? scale : 0.0f;
}

static void *run(void *arg) {
    const Job *job = arg;
    const uint64_t golden = 0x9E3779B97F4A7C15ULL;
    int64_t w0 = job->begin / 4, w_end = job->end / 4; /* begin is a multiple of 4 */
    if (job->bf16) {
        const uint16_t *restrict src = job->src;
        uint16_t *restrict dst = job->dst;
        for (int64_t w = w0; w < w_end; w++) {
            uint64_t word = splitmix64(job->seed + (uint64_t)w * golden);
            for (int j = 0; j < 4; j++)
                dst[4 * w + j] = float_to_bf16(bf16_to_float(src[4 * w + j]) * factor(word, j, job->cut, job->scale));
        }
        uint64_t word = splitmix64(job->seed + (uint64_t)w_end * golden);
        for (int64_t i = 4 * w_end; i < job->end; i++)
            dst[i] = float_to_bf16(bf16_to_float(src[i]) * factor(word, (int)(i & 3), job->cut, job->scale));
    } else {
        const float *restrict src = job->src;
        float *restrict dst = job->dst;
        for (int64_t w = w0; w < w_end; w++) {
            uint64_t word = splitmix64(job->seed + (uint64_t)w * golden);
            for (int j = 0; j < 4; j++)
                dst[4 * w + j] = src[4 * w + j] * factor(word, j, job->cut, job->scale);
        }
        uint64_t word = splitmix64(job->seed + (uint64_t)w_end * golden);
        for (int64_t i = 4 * w_end; i < job->end; i++)
            dst[i] = src[i] * factor(word, (int)(i & 3), job->cut, job->scale);
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
    int64_t share = (n / threads + 3) / 4 * 4;
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
