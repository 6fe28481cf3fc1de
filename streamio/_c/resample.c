/* Image resampling bit-identical to Pillow's Image.resize(size, filter, box=...) for 8-bit L and
 * RGB images (Pillow: src/libImaging/Resample.c; our own implementation of its arithmetic).
 *
 * Pillow's convolution resampling, the parts the output depends on:
 *   - the box is C float (Pillow parses it with "(ffff)"); in1 - in0 is a float subtraction;
 *   - per output pixel xx: center = in0 + (xx + 0.5) * scale, scale = (in1 - in0) / out_size,
 *     the filter widened by filterscale = max(scale, 1); taps [xmin, xmin + n) with
 *     xmin = (int)(center - support + 0.5) clamped to 0, xmax likewise clamped to in_size;
 *     weights filter((x + xmin - center + 0.5) / filterscale) in double, divided by their sum
 *     (unless 0), then fixed point with PRECISION_BITS = 22, rounded half away from zero;
 *   - each output byte: (2^21 + sum pixel * weight) >> 22 clipped to 0..255, in 32-bit
 *     integer arithmetic (sums wrap like Pillow's int with -fwrapv; unsigned here);
 *   - a horizontal pass over only the source rows the vertical pass reads, into 8-bit rows,
 *     then the vertical pass; a pass is skipped when its axis is unchanged; an integral box of
 *     the output's size is a plain crop.
 * SIMD (chosen at import, overridable per call for the tests): the multiply-accumulate on 32-bit
 * lanes with the same integer products (SSE4.1 pmulld; AVX2 for two taps / eight bytes at a
 * time), so every level gives the same bytes. Loads of a 3-byte pixel read 4 (or 8) bytes: the
 * horizontal pass checks that those stay inside the source buffer, else does that pixel in C.
 */
#include "resample.h"

#include <math.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

enum { ISA_SCALAR = 0, ISA_SSE41 = 1, ISA_AVX2 = 2 };
static int resample_best_isa = ISA_SCALAR;

/* --- filters (Pillow's Resampling codes: LANCZOS 1, BILINEAR 2, BICUBIC 3, BOX 4, HAMMING 5) */

static double filter_box(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

static double filter_bilinear(double x)
{
    x = x < 0.0 ? -x : x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double filter_hamming(double x)
{
    x = x < 0.0 ? -x : x;
    if (x == 0.0)
        return 1.0;
    if (x >= 1.0)
        return 0.0;
    x = x * M_PI;
    /* the window's constants are float literals in Pillow: their float values, widened */
    return sin(x) / x * ((double)0.54f + (double)0.46f * cos(x));
}

static double filter_bicubic(double x) /* Keys' cubic convolution with a = -0.5 */
{
    const double a = -0.5;
    x = x < 0.0 ? -x : x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc(double x)
{
    if (x == 0.0)
        return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double filter_lanczos(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3) : 0.0; }

typedef struct {
    double (*fn)(double);
    double support;
} filter_def;

static const filter_def *filter_by_code(int code)
{
    static const filter_def lanczos = {filter_lanczos, 3.0}, bilinear = {filter_bilinear, 1.0},
                            bicubic = {filter_bicubic, 2.0}, box = {filter_box, 0.5},
                            hamming = {filter_hamming, 1.0};
    switch (code) {
    case 1: return &lanczos;
    case 2: return &bilinear;
    case 3: return &bicubic;
    case 4: return &box;
    case 5: return &hamming;
    default: return NULL;
    }
}

/* --- coefficients ---------------------------------------------------------------------------- */

/* double -> int32 as x86's cvttsd2si does it (what Pillow's (int) cast compiles to), without
 * C's undefined behaviour for values out of range: those give INT32_MIN. */
static int32_t to_int32(double v)
{
    if (!(v > -2147483649.0 && v < 2147483648.0))
        return INT32_MIN;
    return (int32_t)v;
}

/* Fills *c for one axis; 0, or -1 with MemoryError set. */
static int make_coeffs(int in_size, float in0, float in1, int out_size, const filter_def *f,
                       coeffs *c)
{
    double scale, filterscale, support;
    filterscale = scale = (double)(float)(in1 - in0) / out_size;
    if (filterscale < 1.0)
        filterscale = 1.0;
    support = f->support * filterscale;
    double ksize_d = ceil(support) * 2 + 1;
    /* Pillow's own limit (it raises MemoryError past it) */
    if (ksize_d > INT_MAX / 8 || out_size > INT_MAX / ((int)ksize_d * (int)sizeof(double))) {
        PyErr_NoMemory();
        return -1;
    }
    int ksize = (int)ksize_d;
    Py_ssize_t nk;
    if (checked_mul(out_size, ksize, &nk) < 0)
        return -1;
    c->ksize = ksize;
    c->max_taps = 0;
    c->k = alloc_items(nk, sizeof(int32_t));
    c->bounds = alloc_items(2 * (Py_ssize_t)out_size, sizeof(int));
    double *w = alloc_items(ksize, sizeof(double));
    if (c->k == NULL || c->bounds == NULL || w == NULL) {
        PyMem_Free(w);
        return -1;
    }
    double ss = 1.0 / filterscale;
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale, ww = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0)
            xmin = 0;
        if (xmax > in_size)
            xmax = in_size;
        int n = xmax - xmin;
        if (n > ksize) /* cannot happen (n <= 2 * ceil(support) + 1); keeps k's rows apart */
            n = ksize;
        if (n < 0)
            n = 0;
        for (int x = 0; x < n; x++) {
            w[x] = f->fn((x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        int32_t *k = c->k + (Py_ssize_t)xx * ksize;
        for (int x = 0; x < ksize; x++) {
            double v = x < n ? (ww != 0.0 ? w[x] / ww : w[x]) : 0.0;
            k[x] = to_int32(v < 0 ? -0.5 + v * (1 << PRECISION_BITS)
                                  : 0.5 + v * (1 << PRECISION_BITS));
        }
        c->bounds[2 * xx] = xmin;
        c->bounds[2 * xx + 1] = n;
        if (n > c->max_taps)
            c->max_taps = n;
    }
    PyMem_Free(w);
    return 0;
}

/* --- the passes: scalar ----------------------------------------------------------------------- */
/* (their per-pixel helpers, which the SIMD passes also finish with, are in resample.h) */

static void horizontal_scalar(const pass *p)
{
    for (int r = 0; r < p->rows; r++) {
        const uint8_t *in = p->src + (Py_ssize_t)(p->first_row + r) * p->src_stride;
        uint8_t *o = p->dst + (Py_ssize_t)r * p->dst_stride;
        for (int xx = 0; xx < p->out_w; xx++)
            h_pixel_scalar(in, o + (Py_ssize_t)xx * p->channels, p->channels,
                           p->c->bounds[2 * xx], p->c->bounds[2 * xx + 1],
                           p->c->k + (Py_ssize_t)xx * p->c->ksize);
    }
}

static void vertical_scalar(const pass *p)
{
    Py_ssize_t row_bytes = (Py_ssize_t)p->out_w * p->channels;
    for (int r = 0; r < p->rows; r++) {
        int ymin = p->c->bounds[2 * r], n = p->c->bounds[2 * r + 1];
        vertical_tail(p->src + (Py_ssize_t)ymin * p->src_stride, p->src_stride,
                      p->dst + (Py_ssize_t)r * p->dst_stride, 0, row_bytes,
                      p->c->k + (Py_ssize_t)r * p->c->ksize, n);
    }
}

/* --- the passes: SSE4.1 and AVX2 are in resample_x86.c --------------------------------------- */

static void horizontal_pass(const pass *p, int isa)
{
#ifdef STREAMIO_X86_RESAMPLE
    if (p->channels == 1 && p->c->kw != NULL && isa >= ISA_SSE41) {
        if (isa >= ISA_AVX2)
            horizontal1_avx2(p);
        else
            horizontal1_sse41(p);
        return;
    }
    if (p->channels == 3 && p->c->kw != NULL && isa >= ISA_AVX2) {
        horizontal3_avx2(p);
        return;
    }
    if (p->channels == 3 && p->c->kw != NULL && isa >= ISA_SSE41) {
        horizontal3_sse41(p);
        return;
    }
#endif
    horizontal_scalar(p);
}

static void vertical_pass(const pass *p, int isa)
{
#ifdef STREAMIO_X86_RESAMPLE
    if (isa >= ISA_AVX2) {
        vertical_avx2(p);
        return;
    }
    if (isa >= ISA_SSE41) {
        vertical_sse41(p);
        return;
    }
#endif
    vertical_scalar(p);
}

/* --- the Python function --------------------------------------------------------------------- */

/* An 8-bit C-contiguous (H, W) or (H, W, 1|3) array; its sizes and channel count. */
static int image_view(PyObject *obj, Py_buffer *v, int writable, const char *name, int *h,
                      int *w, int *channels)
{
    if (PyObject_GetBuffer(obj, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS |
                                       (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (v->itemsize != 1 || v->format == NULL || strcmp(v->format, "B") != 0 ||
        (v->ndim != 2 && v->ndim != 3) || (v->ndim == 3 && v->shape[2] != 1 &&
                                           v->shape[2] != 3)) {
        PyErr_Format(PyExc_TypeError, "%s must be a uint8 array of shape (H, W), (H, W, 1) or"
                     " (H, W, 3)", name);
        return -1;
    }
    if (v->shape[0] > INT_MAX || v->shape[1] > INT_MAX / 3) {
        PyErr_Format(PyExc_ValueError, "%s is too large", name);
        return -1;
    }
    *h = (int)v->shape[0];
    *w = (int)v->shape[1];
    *channels = v->ndim == 3 ? (int)v->shape[2] : 1;
    return 0;
}

/* Pillow's checks of the box (in float, as it parsed it), with its messages; and NaN, which
 * passes Pillow's checks and then casts NaN to int. */
static int check_box(const double d[4], float box[4], int in_w, int in_h)
{
    for (int i = 0; i < 4; i++) {
        if (isnan(d[i])) {
            PyErr_SetString(PyExc_ValueError, "box coordinates must be numbers, not NaN");
            return -1;
        }
        box[i] = (float)d[i]; /* inf when out of float's range, as in Pillow */
    }
    if (box[0] < 0 || box[1] < 0) {
        PyErr_SetString(PyExc_ValueError, "box offset can't be negative");
        return -1;
    }
    if (box[2] > in_w || box[3] > in_h) {
        PyErr_SetString(PyExc_ValueError, "box can't exceed original image size");
        return -1;
    }
    if ((float)(box[2] - box[0]) < 0 || (float)(box[3] - box[1]) < 0) {
        PyErr_SetString(PyExc_ValueError, "box can't be empty");
        return -1;
    }
    return 0;
}

typedef struct {
    const uint8_t *src;
    Py_ssize_t src_len;
    uint8_t *dst;
    int in_w, in_h, out_w, out_h, channels, isa;
} job;

/* Pillow 13 (python-pillow/Pillow#9549) runs the vertical pass first when the height shrinks
 * by more than twice as many pixels as the width: (in_h - out_h) > 2 (in_w - out_w). */
static int vertical_first(const job *jb)
{
    return jb->out_h < jb->in_h &&
           (long long)jb->in_h - jb->out_h > 2 * ((long long)jb->in_w - jb->out_w);
}

/* A temporary image of rows x row_bytes (at least one byte); NULL with MemoryError set. */
static uint8_t *temp_image(Py_ssize_t rows, Py_ssize_t row_bytes, Py_ssize_t *size)
{
    if (checked_mul(rows > 0 ? rows : 1, row_bytes > 0 ? row_bytes : 1, size) < 0)
        return NULL;
    return alloc_items(*size, 1);
}

/* c->kw, the weights of the SIMD horizontal passes as 16-bit halves w = hi * 2^15 + lo, per
 * pair of taps (t, t + 1), in blocks of 16 words: eight lo words, then eight hi words.
 *   RGB: per output pixel, a block per pair: (lo_t lo_t+1) x 4 lanes, (hi_t hi_t+1) x 4;
 *   L: per group of 4 output pixels, a block per pair: (lo_t lo_t+1) of each pixel, then hi.
 * Taps past a pixel's own (and past ksize) weigh 0. Left NULL (the C loop then) when a weight's
 * hi does not fit in 16 bits, which normalized weights never reach. 0, or -1 (MemoryError). */
static int make_pairs(coeffs *c, int out_size, int channels)
{
    Py_ssize_t pairs = (c->max_taps + 1) / 2, n;
    if (checked_mul(out_size, 16 * pairs, &n) < 0 || (c->kw = alloc_items(n, sizeof(int16_t))) == NULL)
        return -1;
    for (Py_ssize_t xx = 0; xx < out_size; xx++) {
        const int32_t *k = c->k + xx * c->ksize;
        if (channels == 1 && xx >= out_size / 4 * 4)
            break; /* the last < 4 pixels of a row are done in C */
        for (Py_ssize_t t = 0; t < 2 * pairs; t++) {
            int32_t w = t < c->ksize ? k[t] : 0, hi = w >> 15; /* arithmetic shift */
            if (hi < INT16_MIN || hi > INT16_MAX) {
                PyMem_Free(c->kw);
                c->kw = NULL;
                return 0;
            }
            Py_ssize_t block = channels == 3 ? xx * pairs + t / 2 : (xx / 4) * pairs + t / 2;
            for (int lane = 0; lane < 4; lane++) {
                if (channels == 1 && lane != xx % 4)
                    continue;
                c->kw[block * 16 + lane * 2 + t % 2] = (int16_t)(w & 0x7FFF);
                c->kw[block * 16 + 8 + lane * 2 + t % 2] = (int16_t)hi;
            }
        }
    }
    return 0;
}

/* Both passes (or one) in Pillow's order; 0, or -1 with an exception set. The first pass covers
 * only the source rows (or columns) the second one reads. */
static int resample_image(const job *jb, const filter_def *f, const float box[4])
{
    int need_h = jb->out_w != jb->in_w || box[0] != 0 || box[2] != jb->out_w;
    int need_v = jb->out_h != jb->in_h || box[1] != 0 || box[3] != jb->out_h;
    int v_first = need_h && need_v && vertical_first(jb);
    coeffs cv = {0, 0, NULL, NULL, NULL}, ch = {0, 0, NULL, NULL, NULL};
    uint8_t *temp = NULL;
    Py_ssize_t size, c = jb->channels, out_row = jb->out_w * c, in_row = jb->in_w * c;
    int rc = -1;
    if (make_coeffs(jb->in_h, box[1], box[3], jb->out_h, f, &cv) < 0 ||
        (need_h && make_coeffs(jb->in_w, box[0], box[2], jb->out_w, f, &ch) < 0) ||
        (need_h && jb->isa >= ISA_SSE41 && make_pairs(&ch, jb->out_w, jb->channels) < 0))
        goto done;
    /* defaults: one pass from the source straight into the output */
    pass hp = {jb->src, jb->src + jb->src_len, in_row, jb->dst, out_row, jb->channels,
               jb->out_w, jb->out_h, 0, &ch};
    pass vp = {jb->src, jb->src + jb->src_len, in_row, jb->dst, out_row, jb->channels,
               jb->out_w, jb->out_h, 0, &cv};
    if (v_first) { /* vertical over columns [first, last), then horizontal from there */
        int first = ch.bounds[0];
        int last = ch.bounds[2 * jb->out_w - 2] + ch.bounds[2 * jb->out_w - 1];
        for (int i = 0; i < jb->out_w; i++)
            ch.bounds[2 * i] -= first;
        if ((temp = temp_image(jb->out_h, (last - first) * c, &size)) == NULL)
            goto done;
        vp.src = jb->src + first * c;
        vp.out_w = last - first;
        vp.dst = temp;
        vp.dst_stride = (last - first) * c;
        hp.src = temp;
        hp.src_end = temp + size;
        hp.src_stride = vp.dst_stride;
    } else if (need_h) { /* horizontal over rows [first, last), then vertical from there */
        int first = cv.bounds[0];
        int last = cv.bounds[2 * jb->out_h - 2] + cv.bounds[2 * jb->out_h - 1];
        for (int i = 0; i < jb->out_h; i++)
            cv.bounds[2 * i] -= first;
        hp.first_row = first;
        hp.rows = last - first;
        if (need_v) {
            if ((temp = temp_image(last - first, out_row, &size)) == NULL)
                goto done;
            hp.dst = temp;
            vp.src = temp;
            vp.src_end = temp + size;
            vp.src_stride = out_row;
        } else if (last - first != jb->out_h) { /* cannot happen: the rows are 0 .. in_h */
            PyErr_SetString(PyExc_SystemError, "resample: unexpected row bounds");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    if (v_first) {
        vertical_pass(&vp, jb->isa);
        horizontal_pass(&hp, jb->isa);
    } else {
        if (need_h)
            horizontal_pass(&hp, jb->isa);
        if (need_v)
            vertical_pass(&vp, jb->isa);
    }
    if (!need_h && !need_v) /* the crop shortcut takes these; kept for completeness */
        memcpy(jb->dst, jb->src, (size_t)jb->src_len);
    Py_END_ALLOW_THREADS
    rc = 0;
done:
    PyMem_Free(cv.k);
    PyMem_Free(cv.bounds);
    PyMem_Free(ch.k);
    PyMem_Free(ch.bounds);
    PyMem_Free(ch.kw);
    PyMem_Free(temp);
    return rc;
}

/* Pillow's shortcut: an integral box of exactly the output's size is a crop (no resampling). */
static int is_crop(const float box[4], int out_w, int out_h)
{
    return box[0] - (int)box[0] == 0 && (float)(box[2] - box[0]) == (float)out_w &&
           box[1] - (int)box[1] == 0 && (float)(box[3] - box[1]) == (float)out_h;
}

static void crop(const job *jb, const float box[4])
{
    Py_ssize_t in_row = (Py_ssize_t)jb->in_w * jb->channels;
    Py_ssize_t out_row = (Py_ssize_t)jb->out_w * jb->channels;
    const uint8_t *in = jb->src + (Py_ssize_t)(int)box[1] * in_row + (Py_ssize_t)(int)box[0] * jb->channels;
    for (int r = 0; r < jb->out_h; r++)
        memcpy(jb->dst + r * out_row, in + r * in_row, (size_t)out_row);
}

PyDoc_STRVAR(resample_doc,
"resample(src, out, filter, x0, y0, x1, y1, isa=-1) -> None\n\n"
"Pillow's Image.fromarray(src).resize((W, H), filter, box=(x0, y0, x1, y1)), bit for bit, into\n"
"out (H, W[, C]). src, out: C-contiguous uint8 (H, W), (H, W, 1) or (H, W, 3) arrays with the\n"
"same channels; filter: Pillow's code (1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming).\n"
"isa: 0 plain C, 1 SSE4.1, 2 AVX2 (capped to the CPU's; -1: the best). Bad arguments raise\n"
"ValueError or TypeError with Pillow's messages for the box.");

static PyObject *py_resample(PyObject *self, PyObject *args)
{
    PyObject *src_obj, *out_obj, *result = NULL;
    int code, isa = -1, oc;
    double d[4];
    float box[4];
    Py_buffer sv = {0}, ov = {0};
    job jb;
    if (!PyArg_ParseTuple(args, "OOidddd|i:resample", &src_obj, &out_obj, &code, &d[0], &d[1],
                          &d[2], &d[3], &isa))
        return NULL;
    const filter_def *f = filter_by_code(code);
    if (f == NULL) {
        PyErr_Format(PyExc_ValueError, "unsupported resampling filter %d", code);
        return NULL;
    }
    if (image_view(src_obj, &sv, 0, "src", &jb.in_h, &jb.in_w, &jb.channels) < 0 ||
        image_view(out_obj, &ov, 1, "out", &jb.out_h, &jb.out_w, &oc) < 0)
        goto done;
    if (sv.ndim != ov.ndim || oc != jb.channels) {
        PyErr_SetString(PyExc_TypeError, "out must have the channels (and dimensions) of src");
        goto done;
    }
    if (jb.out_w < 1 || jb.out_h < 1) {
        PyErr_SetString(PyExc_ValueError, "height and width must be > 0");
        goto done;
    }
    if ((const char *)ov.buf < (const char *)sv.buf + sv.len &&
        (const char *)sv.buf < (const char *)ov.buf + ov.len) {
        PyErr_SetString(PyExc_ValueError, "out must not overlap src");
        goto done;
    }
    if (check_box(d, box, jb.in_w, jb.in_h) < 0)
        goto done;
    jb.src = sv.buf;
    jb.src_len = sv.len;
    jb.dst = ov.buf;
    jb.isa = isa < 0 || isa > resample_best_isa ? resample_best_isa : isa;
    if (is_crop(box, jb.out_w, jb.out_h))
        crop(&jb, box);
    else if (resample_image(&jb, f, box) < 0)
        goto done;
    result = Py_None;
    Py_INCREF(result);
done:
    if (sv.obj != NULL)
        PyBuffer_Release(&sv);
    if (ov.obj != NULL)
        PyBuffer_Release(&ov);
    return result;
}

const char *resample_isa_name(void)
{
    static const char *const names[] = {"c", "sse4.1", "avx2"};
    return names[resample_best_isa];
}

void resample_init(void)
{
#ifdef STREAMIO_X86_RESAMPLE
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.1"))
        resample_best_isa = ISA_SSE41;
    if (__builtin_cpu_supports("avx2")) /* libgcc checks that the OS saves the YMM registers */
        resample_best_isa = ISA_AVX2;
#endif
}

PyMethodDef resample_methods[] = {
    {"resample", py_resample, METH_VARARGS, resample_doc},
    {NULL, NULL, 0, NULL},
};
