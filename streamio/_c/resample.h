/* What resample.c and its x86 passes (resample_x86.c) share: the fixed-point arithmetic, the
 * coefficients and a pass's description, and the scalar helpers the SIMD passes finish with. */
#ifndef STREAMIO_RESAMPLE_H
#define STREAMIO_RESAMPLE_H

#include "speedups.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STREAMIO_X86_RESAMPLE 1
#include <immintrin.h>
#endif

#define PRECISION_BITS (32 - 8 - 2)
#define HALF (1u << (PRECISION_BITS - 1))

typedef struct {
    int ksize;      /* coefficients per output pixel (the row stride of k) */
    int max_taps;   /* the largest number of taps of an output pixel (<= ksize) */
    int *bounds;    /* per output pixel: first tap, number of taps */
    int32_t *k;     /* fixed-point weights, out_size x ksize */
    int16_t *kw;    /* RGB SIMD: the weights as 16-bit halves in pairs of taps (see make_pairs) */
} coeffs;

static inline uint8_t clip8(uint32_t acc)
{
    int32_t v = (int32_t)acc >> PRECISION_BITS; /* arithmetic shift (gcc, clang) */
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One output pixel of the horizontal pass: ``in`` is the source row, ``channels`` 1 or 3. */
static inline void h_pixel_scalar(const uint8_t *in, uint8_t *o, int channels, int xmin, int n,
                                  const int32_t *k)
{
    uint32_t a0 = HALF, a1 = HALF, a2 = HALF;
    if (channels == 1) {
        for (int x = 0; x < n; x++)
            a0 += in[x + xmin] * (uint32_t)k[x];
        o[0] = clip8(a0);
        return;
    }
    const uint8_t *p = in + 3 * (Py_ssize_t)xmin;
    for (int x = 0; x < n; x++, p += 3) {
        a0 += p[0] * (uint32_t)k[x];
        a1 += p[1] * (uint32_t)k[x];
        a2 += p[2] * (uint32_t)k[x];
    }
    o[0] = clip8(a0);
    o[1] = clip8(a1);
    o[2] = clip8(a2);
}

/* Everything a pass needs: source rows (from ``first_row``), destination rows, coefficients. */
typedef struct {
    const uint8_t *src, *src_end; /* src_end: one past the source buffer's last byte */
    Py_ssize_t src_stride;
    uint8_t *dst;
    Py_ssize_t dst_stride;
    int channels, out_w, rows, first_row;
    const coeffs *c;
} pass;

/* Vertical: row ``r`` of the output from source rows bounds[2r] .. + bounds[2r + 1]; the bytes
 * of a row (all channels) are independent columns. */
/* Bytes j .. row_bytes - 1 of one output row ``o`` from the n source rows from ``in``. */
static inline void vertical_tail(const uint8_t *in, Py_ssize_t stride, uint8_t *o, Py_ssize_t j,
                                 Py_ssize_t row_bytes, const int32_t *k, int n)
{
    for (; j < row_bytes; j++) {
        uint32_t acc = HALF;
        for (int y = 0; y < n; y++)
            acc += in[(Py_ssize_t)y * stride + j] * (uint32_t)k[y];
        o[j] = clip8(acc);
    }
}

#ifdef STREAMIO_X86_RESAMPLE
/* resample_x86.c: each pass compiled for SSE4.1 or AVX2 (callers check the CPU has it). */
#pragma GCC visibility push(hidden)
void horizontal1_sse41(const pass *p);
void horizontal1_avx2(const pass *p);
void horizontal3_sse41(const pass *p);
void horizontal3_avx2(const pass *p);
void vertical_sse41(const pass *p);
void vertical_avx2(const pass *p);
#pragma GCC visibility pop
#endif

#endif
