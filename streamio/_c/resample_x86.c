/* The SSE4.1 and AVX2 passes of resample.c (see its comment for the arithmetic they share with
 * the scalar passes): each function is compiled for its instruction set with a target attribute,
 * and called only on a CPU that has it (resample_init picks the level). */
#include "resample.h"

#ifdef STREAMIO_X86_RESAMPLE

/* The clipped sums (r g b .) of one RGB output pixel, two taps per step with pmaddwd: the two
 * pixels' bytes as words (r0 r1 g0 g1 b0 b1 0 0) times the taps' weights split as
 * w = hi * 2^15 + lo (lo in 0 .. 2^15 - 1, hi fitting in 16 bits: make_pairs checks), so
 * sum p * w = sum p * lo + 2^15 * sum p * hi, the same 32-bit value as Pillow's products.
 * Reads 8 bytes per pair (6 used); the caller checked they are inside the buffer. */
__attribute__((target("sse4.1"), always_inline)) static inline __m128i
h_sums3(const uint8_t *px, const int16_t *kw, int pairs)
{
    const __m128i spread = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128();
    for (int j = 0; j < pairs; j++, px += 6, kw += 16) {
        __m128i v = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)px), spread);
        lo = _mm_add_epi32(lo, _mm_madd_epi16(v, _mm_loadu_si128((const __m128i *)kw)));
        hi = _mm_add_epi32(hi, _mm_madd_epi16(v, _mm_loadu_si128((const __m128i *)(kw + 8))));
    }
    __m128i sum = _mm_add_epi32(lo, _mm_slli_epi32(hi, 15));
    return _mm_srai_epi32(_mm_add_epi32(sum, _mm_set1_epi32((int)HALF)), PRECISION_BITS);
}

/* RGB rows, four output pixels per step: their sums packed (with saturation, which is the
 * clipping) to 16 bytes r g b . x 4, compacted to 12 and stored. Every pixel runs max_taps taps
 * (rounded up to pairs): the weights past its own taps are 0 (their products add nothing), and a loop count that
 * never changes is one the branch predictor gets right (3 or 4 taps in turn cost a mispredicted
 * branch per pixel). Pixels whose loads would pass the end of the buffer, and the last < 4,
 * are done in C. Compiled for SSE4.1 and for AVX2. */
__attribute__((target("sse4.1"), always_inline)) static inline void horizontal3_simd(const pass *p)
{
    const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const int *bounds = p->c->bounds, pairs = (p->c->max_taps + 1) / 2;
    const Py_ssize_t kw_stride = 16 * (Py_ssize_t)pairs;
    for (int r = 0; r < p->rows; r++) {
        const uint8_t *in = p->src + (Py_ssize_t)(p->first_row + r) * p->src_stride;
        uint8_t *o = p->dst + (Py_ssize_t)r * p->dst_stride;
        int xx = 0;
        for (; xx + 4 <= p->out_w; xx += 4) {
            int reach = 0; /* one past the last source pixel the four use */
            for (int i = 0; i < 4; i++)
                if (bounds[2 * (xx + i)] + 2 * pairs > reach)
                    reach = bounds[2 * (xx + i)] + 2 * pairs;
            if (p->src_end - in < 3 * (Py_ssize_t)reach + 2)
                break;
            __m128i s[4];
            for (int i = 0; i < 4; i++)
                s[i] = h_sums3(in + 3 * (Py_ssize_t)bounds[2 * (xx + i)],
                               p->c->kw + (xx + i) * kw_stride, pairs);
            __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(s[0], s[1]),
                                             _mm_packs_epi32(s[2], s[3]));
            bytes = _mm_shuffle_epi8(bytes, compact);
            _mm_storel_epi64((__m128i *)(o + 3 * (Py_ssize_t)xx), bytes);
            uint32_t tail = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(bytes, 8));
            memcpy(o + 3 * (Py_ssize_t)xx + 8, &tail, 4);
        }
        for (; xx < p->out_w; xx++)
            h_pixel_scalar(in, o + 3 * (Py_ssize_t)xx, 3, bounds[2 * xx], bounds[2 * xx + 1],
                           p->c->k + (Py_ssize_t)xx * p->c->ksize);
    }
}

/* L rows, four output pixels per step, one per 32-bit lane: per pair of taps, each pixel's two
 * source bytes as words times its pair of weight halves (pmaddwd, as h_sums3). */
__attribute__((target("sse4.1"), always_inline)) static inline void horizontal1_simd(const pass *p)
{
    const int *bounds = p->c->bounds, pairs = (p->c->max_taps + 1) / 2;
    const __m128i half = _mm_set1_epi32((int)HALF);
    for (int r = 0; r < p->rows; r++) {
        const uint8_t *in = p->src + (Py_ssize_t)(p->first_row + r) * p->src_stride;
        uint8_t *o = p->dst + (Py_ssize_t)r * p->dst_stride;
        const int16_t *kw = p->c->kw;
        int xx = 0;
        for (; xx + 4 <= p->out_w; xx += 4, kw += 16 * (Py_ssize_t)pairs) {
            int reach = 0; /* one past the last source byte the four read */
            for (int i = 0; i < 4; i++)
                if (bounds[2 * (xx + i)] + 2 * pairs > reach)
                    reach = bounds[2 * (xx + i)] + 2 * pairs;
            if (p->src_end - in < (Py_ssize_t)reach)
                break;
            const uint8_t *q0 = in + bounds[2 * xx], *q1 = in + bounds[2 * xx + 2];
            const uint8_t *q2 = in + bounds[2 * xx + 4], *q3 = in + bounds[2 * xx + 6];
            __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128();
            for (int j = 0; j < 2 * pairs; j += 2) {
                uint16_t b0, b1, b2, b3; /* little-endian: the first byte is the low one */
                memcpy(&b0, q0 + j, 2);
                memcpy(&b1, q1 + j, 2);
                memcpy(&b2, q2 + j, 2);
                memcpy(&b3, q3 + j, 2);
                uint64_t bytes = b0 | (uint64_t)b1 << 16 | (uint64_t)b2 << 32 | (uint64_t)b3 << 48;
                __m128i v = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)bytes));
                lo = _mm_add_epi32(lo, _mm_madd_epi16(v, _mm_loadu_si128((const __m128i *)(kw + 8 * j))));
                hi = _mm_add_epi32(hi, _mm_madd_epi16(v, _mm_loadu_si128((const __m128i *)(kw + 8 * j + 8))));
            }
            __m128i sum = _mm_add_epi32(_mm_add_epi32(lo, _mm_slli_epi32(hi, 15)), half);
            sum = _mm_srai_epi32(sum, PRECISION_BITS);
            sum = _mm_packus_epi16(_mm_packs_epi32(sum, sum), sum);
            uint32_t four = (uint32_t)_mm_cvtsi128_si32(sum);
            memcpy(o + xx, &four, 4);
        }
        for (; xx < p->out_w; xx++)
            h_pixel_scalar(in, o + xx, 1, bounds[2 * xx], bounds[2 * xx + 1],
                           p->c->k + (Py_ssize_t)xx * p->c->ksize);
    }
}

__attribute__((target("sse4.1"))) void horizontal1_sse41(const pass *p)
{
    horizontal1_simd(p);
}

__attribute__((target("avx2"))) void horizontal1_avx2(const pass *p)
{
    horizontal1_simd(p);
}

__attribute__((target("sse4.1"))) void horizontal3_sse41(const pass *p)
{
    horizontal3_simd(p);
}

/* h_sums3 for two output pixels at once, one in each 128-bit half. */
__attribute__((target("avx2"), always_inline)) static inline __m256i
h_sums3_x2(const uint8_t *pa, const uint8_t *pb, const int16_t *ka, const int16_t *kb,
           int pairs)
{
    const __m256i spread = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1,
                                            -1, 0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1,
                                            -1, -1);
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int j = 0; j < pairs; j++, pa += 6, pb += 6, ka += 16, kb += 16) {
        __m256i v = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)pa)),
            _mm_loadl_epi64((const __m128i *)pb), 1);
        v = _mm256_shuffle_epi8(v, spread);
        __m256i wl = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)ka)),
            _mm_loadu_si128((const __m128i *)kb), 1);
        __m256i wh = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(ka + 8))),
            _mm_loadu_si128((const __m128i *)(kb + 8)), 1);
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(v, wl));
        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(v, wh));
    }
    __m256i sum = _mm256_add_epi32(lo, _mm256_slli_epi32(hi, 15));
    return _mm256_srai_epi32(_mm256_add_epi32(sum, _mm256_set1_epi32((int)HALF)),
                             PRECISION_BITS);
}

/* horizontal3_simd with two pixels per 256-bit step (same checks, same bytes). */
__attribute__((target("avx2"))) void horizontal3_avx2(const pass *p)
{
    /* packs/packus leave the pixels as 0 2 1 3: this puts them in order and drops the 4th byte */
    const __m128i compact = _mm_setr_epi8(0, 1, 2, 8, 9, 10, 4, 5, 6, 12, 13, 14, -1, -1, -1, -1);
    const int *bounds = p->c->bounds, pairs = (p->c->max_taps + 1) / 2;
    const Py_ssize_t kw_stride = 16 * (Py_ssize_t)pairs;
    for (int r = 0; r < p->rows; r++) {
        const uint8_t *in = p->src + (Py_ssize_t)(p->first_row + r) * p->src_stride;
        uint8_t *o = p->dst + (Py_ssize_t)r * p->dst_stride;
        const int16_t *kw = p->c->kw;
        int xx = 0;
        for (; xx + 4 <= p->out_w; xx += 4, kw += 4 * kw_stride) {
            int reach = 0; /* one past the last source pixel the four use */
            for (int i = 0; i < 4; i++)
                if (bounds[2 * (xx + i)] + 2 * pairs > reach)
                    reach = bounds[2 * (xx + i)] + 2 * pairs;
            if (p->src_end - in < 3 * (Py_ssize_t)reach + 2)
                break;
            const uint8_t *px = in + 3 * (Py_ssize_t)bounds[2 * xx];
            __m256i s01 = h_sums3_x2(px, in + 3 * (Py_ssize_t)bounds[2 * xx + 2], kw,
                                     kw + kw_stride, pairs);
            __m256i s23 = h_sums3_x2(in + 3 * (Py_ssize_t)bounds[2 * xx + 4],
                                     in + 3 * (Py_ssize_t)bounds[2 * xx + 6], kw + 2 * kw_stride,
                                     kw + 3 * kw_stride, pairs);
            __m256i words = _mm256_packs_epi32(s01, s23); /* halves: (s0 s2) (s1 s3) */
            __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(words),
                                             _mm256_extracti128_si256(words, 1));
            bytes = _mm_shuffle_epi8(bytes, compact);
            _mm_storel_epi64((__m128i *)(o + 3 * (Py_ssize_t)xx), bytes);
            uint32_t tail = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(bytes, 8));
            memcpy(o + 3 * (Py_ssize_t)xx + 8, &tail, 4);
        }
        for (; xx < p->out_w; xx++)
            h_pixel_scalar(in, o + 3 * (Py_ssize_t)xx, 3, bounds[2 * xx], bounds[2 * xx + 1],
                           p->c->k + (Py_ssize_t)xx * p->c->ksize);
    }
}

/* 16 bytes of a row per step, 4 accumulators of 4 lanes; the tail in C. */
__attribute__((target("sse4.1"))) void vertical_sse41(const pass *p)
{
    Py_ssize_t row_bytes = (Py_ssize_t)p->out_w * p->channels, s = p->src_stride;
    const __m128i half = _mm_set1_epi32((int)HALF);
    for (int r = 0; r < p->rows; r++) {
        int ymin = p->c->bounds[2 * r], n = p->c->bounds[2 * r + 1];
        const int32_t *k = p->c->k + (Py_ssize_t)r * p->c->ksize;
        const uint8_t *in = p->src + (Py_ssize_t)ymin * s;
        uint8_t *o = p->dst + (Py_ssize_t)r * p->dst_stride;
        Py_ssize_t j = 0;
        for (; j + 16 <= row_bytes; j += 16) {
            __m128i a0 = half, a1 = half, a2 = half, a3 = half;
            for (int y = 0; y < n; y++) {
                __m128i v = _mm_loadu_si128((const __m128i *)(in + (Py_ssize_t)y * s + j));
                __m128i w = _mm_set1_epi32(k[y]);
                a0 = _mm_add_epi32(a0, _mm_mullo_epi32(_mm_cvtepu8_epi32(v), w));
                a1 = _mm_add_epi32(a1, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 4)), w));
                a2 = _mm_add_epi32(a2, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 8)), w));
                a3 = _mm_add_epi32(a3, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 12)), w));
            }
            a0 = _mm_srai_epi32(a0, PRECISION_BITS);
            a1 = _mm_srai_epi32(a1, PRECISION_BITS);
            a2 = _mm_srai_epi32(a2, PRECISION_BITS);
            a3 = _mm_srai_epi32(a3, PRECISION_BITS);
            __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
            _mm_storeu_si128((__m128i *)(o + j), bytes);
        }
        vertical_tail(in, s, o, j, row_bytes, k, n);
    }
}

/* 32 bytes of a row per step, 4 accumulators of 8 lanes; the tail in C. */
__attribute__((target("avx2"))) void vertical_avx2(const pass *p)
{
    Py_ssize_t row_bytes = (Py_ssize_t)p->out_w * p->channels, s = p->src_stride;
    const __m256i half = _mm256_set1_epi32((int)HALF);
    /* packs/packus work within 128-bit halves: this puts the 4-byte groups back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int r = 0; r < p->rows; r++) {
        int ymin = p->c->bounds[2 * r], n = p->c->bounds[2 * r + 1];
        const int32_t *k = p->c->k + (Py_ssize_t)r * p->c->ksize;
        const uint8_t *in = p->src + (Py_ssize_t)ymin * s;
        uint8_t *o = p->dst + (Py_ssize_t)r * p->dst_stride;
        Py_ssize_t j = 0;
        for (; j + 32 <= row_bytes; j += 32) {
            __m256i a0 = half, a1 = half, a2 = half, a3 = half;
            for (int y = 0; y < n; y++) {
                const uint8_t *q = in + (Py_ssize_t)y * s + j;
                __m256i w = _mm256_set1_epi32(k[y]);
#define TAP8(a, off) a = _mm256_add_epi32(a, _mm256_mullo_epi32(_mm256_cvtepu8_epi32( \
                         _mm_loadl_epi64((const __m128i *)(q + (off)))), w))
                TAP8(a0, 0);
                TAP8(a1, 8);
                TAP8(a2, 16);
                TAP8(a3, 24);
#undef TAP8
            }
            a0 = _mm256_srai_epi32(a0, PRECISION_BITS);
            a1 = _mm256_srai_epi32(a1, PRECISION_BITS);
            a2 = _mm256_srai_epi32(a2, PRECISION_BITS);
            a3 = _mm256_srai_epi32(a3, PRECISION_BITS);
            __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1),
                                                _mm256_packs_epi32(a2, a3));
            _mm256_storeu_si256((__m256i *)(o + j),
                                _mm256_permutevar8x32_epi32(bytes, order));
        }
        vertical_tail(in, s, o, j, row_bytes, k, n);
    }
}

#else
typedef int resample_x86_unused; /* ISO C: a translation unit is not empty */
#endif /* STREAMIO_X86_RESAMPLE */
