#include "speedups.h"

#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * mix_take: one step of streamio.mix, in one pass
 *
 * Each draw (a little-endian uint32) picks the part k with bounds[k - 1] <= draw < bounds[k]
 * (bounds: the parts' cumulative weights scaled to 2**32); the part's next item is appended to
 * the output, and its record origin too when origins are given. The pass stops after `limit`
 * items, at the end of the draws, or at the first draw whose part holds no item left (`short`:
 * the caller pulls that part's next block, or ends it). Same results, same errors as
 * streamio.pipeline.mix.mix_take_reference.
 *
 * Moving, not copying: a part that nothing but the `parts` list refers to (its reference count
 * is 1: the mix's input blocks, handed over by the generators that made them) gives its items
 * up. Their references move to the output and None takes their slots, so an item is not
 * touched at all here: counting it up, and down again when the part is freed, cost two reads of
 * memory the item left long ago (a block's items were made a whole read earlier), most of what
 * mixing cost per record. A part someone else holds (a cache's block, a caller's list) is only
 * read, each item counted up, as before.
 *
 * Making, not placing: a part may also be a tuple (buffer, spans), records still in an input's
 * read buffer at the (offset, length) int64 pairs of spans (a reader's RecordSpans). Each item
 * taken from it is made here, a bytes object copied out of the buffer, so a mixed epoch makes
 * its records in the order it hands them out (and frees them in that order), as an input read
 * alone does, instead of placing records made a read earlier in each input's order. A pair
 * outside its buffer is a ValueError. A part (buffer, spans, True) holds records each followed
 * in the buffer by its masked CRC-32C (TFRecord's footer, left unchecked by the reader's scan):
 * the CRC is computed as the record is copied (one pass over its bytes, as a reader's list
 * scan makes a record), and a record whose CRC does not match stops the pass before its draw,
 * as a part that ran out does (`short` is the part; its start stays at that record, so the
 * caller tells the two apart). Two span parts without origins (the commonest mix) take a loop
 * of their own, take_two_spans.
 * ------------------------------------------------------------------------------------------- */

#define MAX_PARTS 256
#define DRAW_BYTES 4
#define BOUND_END ((uint64_t)1 << 32) /* past every uint32 draw */
#define LINEAR_PARTS 8                /* up to this many parts a linear scan beats a bisection */
/* An item's count is written when it is placed, often long after the item was made: the
 * count of the part's item this many ahead is asked for first (GCC and Clang). */
#define PREFETCH_AHEAD 8
/* A new output list is made with room for `limit` items (the caller's block) up to this many;
 * beyond it, room for the items of this pass only. */
#define MAX_ROOM ((Py_ssize_t)1 << 20)

PyDoc_STRVAR(mix_take_doc,
"mix_take(draws, begin, limit, bounds, parts, starts, origins, origins_out, out=None)\n"
"    -> (out, end, short)\n\n"
"From draw `begin` on (draws: a contiguous buffer of little-endian uint32), each draw u picks\n"
"the first part k with u < bounds[k] (bounds: a contiguous buffer of uint64, one per part,\n"
"non-decreasing, the last 2**32) and takes the next item of parts[k] (a list, or a tuple\n"
"(buffer, spans) whose items are bytes made from buffer at spans' (offset, length) int64\n"
"pairs, or (buffer, spans, True): the same, each record's masked CRC-32C following it in\n"
"buffer, checked) from\n"
"starts[k] (a list of ints, updated in place), appending it to `out` (a list, not one of the\n"
"parts; None: a new list), which is returned. Stops after `limit` items, at the end of the\n"
"draws, or before the first draw whose part has no item left or whose record's CRC does not\n"
"match (its start left at it): `short` is that part, else -1;\n"
"`end` is the first draw not used. origins (None, or a list of int64 buffers as long as the\n"
"parts) gives each item's origin, written to origins_out[0:n] for the n items of this pass\n"
"(a writable int64 buffer of at least min(limit, draws left) entries). A part that only the\n"
"parts list refers to gives its taken items up: None takes their slots.");

/* The part a draw picks: the first k with u < bounds[k] (bounds[nparts - 1] is past any u). */
static inline Py_ssize_t pick(const uint64_t *bounds, Py_ssize_t nparts, uint64_t u)
{
    if (nparts <= LINEAR_PARTS) {
        /* Bounds are non-decreasing and the last is past u: the part is the number of the
         * others that u reaches. Counted without a branch per bound: the draws are random, so
         * a loop that stops at the part mispredicts about as often as it picks a part that
         * is not the most likely one. */
        Py_ssize_t k = 0;
        for (Py_ssize_t i = 0; i < nparts - 1; i++)
            k += u >= bounds[i];
        return k;
    }
    Py_ssize_t lo = 0, hi = nparts - 1;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (u < bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* A span part: (buffer, spans) or (buffer, spans, crcs). */
static inline int is_span_part(PyObject *part)
{
    return PyTuple_CheckExact(part) && (PyTuple_GET_SIZE(part) == 2 || PyTuple_GET_SIZE(part) == 3);
}

#if defined(__GNUC__) || defined(__clang__)
#define COLD __attribute__((cold, noinline))
#else
#define COLD
#endif

static COLD PyObject *span_outside(Py_ssize_t k, Py_ssize_t index)
{
    PyErr_Format(PyExc_ValueError, "parts[%zd] item %zd lies outside its buffer", k, index);
    return NULL;
}

/* Item j of span part k (pair: its (offset, length)) made as a bytes object out of the part's
 * buffer of `size` bytes at `base`; NULL with a ValueError for a pair outside the buffer (item
 * `index` of the part; reported out of line, so that the loops stay tight), or with the
 * allocator's error. `crc`: the record's masked CRC-32C follows it in the buffer (inside it,
 * or the pair is outside), computed as the record is copied; a mismatch gives NULL with no
 * error set (the record is not made). */
static inline __attribute__((always_inline)) PyObject *
span_item(const char *base, Py_ssize_t size, const int64_t *pair, Py_ssize_t k,
          Py_ssize_t index, int crc)
{
    int64_t offset = pair[0], length = pair[1];
    if (offset < 0 || length < 0 || offset > size || length > size - offset ||
        (crc && size - offset - length < 4))
        return span_outside(k, index);
    if (!crc)
        return PyBytes_FromStringAndSize(base + offset, (Py_ssize_t)length);
    PyObject *item = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (item == NULL)
        return NULL;
    const unsigned char *from = (const unsigned char *)base + offset;
    uint32_t sum = crc32c_copy(0, (unsigned char *)PyBytes_AS_STRING(item), from, (size_t)length);
    if (mask_crc(sum) != load_le32(from + length)) {
        Py_DECREF(item);
        return NULL;
    }
    return item;
}

/* The main loop of py_mix_take for its most common call: two parts, both records in a buffer
 * (a mix of two TFRecord inputs read as they are), both with their CRCs or neither, no
 * origins. The same steps and results,
 * with both parts' counts of items taken in registers (the general loop keeps them in an array
 * in memory, and a draw of the part the draw before it took reads the count that draw stored)
 * and the part picked by one comparison; with a bad pair reported out of line (span_item), a
 * quarter fewer instructions in the kernel (cachegrind: 24.5 to 17.7 million an epoch of the
 * benchmark's 400,000 records), the mixed epoch 0.99x the time [quartiles 0.97-1.00] (20 and
 * 24 rounds, old and new code by turns, 2026-11-27). Takes from
 * draw `d` on, at most `most`; returns the number n of items placed in slot[0:n], their
 * parts' counts in taken[0:2] and the part that ran out, or whose record failed its CRC, in
 * *short_part (else -1, left as it was). A pair outside its buffer, or a failed allocation
 * (span_item), sets the error and *failed, and returns the items placed before it. Compiled
 * once with CRCs and once without (take_two_spans_crc, take_two_spans_plain). */
static inline __attribute__((always_inline)) Py_ssize_t
take_two_spans(const unsigned char *d, Py_ssize_t most, uint64_t bound, const Py_ssize_t *avail,
               const Py_ssize_t *first, const char *const *base, const Py_ssize_t *size,
               const int64_t *const *pairs, Py_ssize_t *taken, PyObject **slot,
               Py_ssize_t *short_part, int *failed, int crc)
{
    Py_ssize_t n = 0, t0 = taken[0], t1 = taken[1];
    for (; n < most; n++, d += DRAW_BYTES) {
        uint64_t u = (uint64_t)d[0] | (uint64_t)d[1] << 8 | (uint64_t)d[2] << 16 |
                     (uint64_t)d[3] << 24;
        int k = u >= bound; /* pick() for two parts */
        Py_ssize_t j = k ? t1 : t0;
        if (j == avail[k]) {
            *short_part = k;
            break;
        }
        PyObject *item = span_item(base[k], size[k], pairs[k] + 2 * j, k, first[k] + j, crc);
        if (item == NULL) {
            if (crc && !PyErr_Occurred())
                *short_part = k; /* its CRC did not match */
            else
                *failed = 1;
            break;
        }
        slot[n] = item;
        if (k)
            t1 = j + 1;
        else
            t0 = j + 1;
    }
    taken[0] = t0;
    taken[1] = t1;
    return n;
}

#define TAKE_TWO_SPANS_ARGS                                                                    \
    const unsigned char *d, Py_ssize_t most, uint64_t bound, const Py_ssize_t *avail,          \
        const Py_ssize_t *first, const char *const *base, const Py_ssize_t *size,              \
        const int64_t *const *pairs, Py_ssize_t *taken, PyObject **slot, Py_ssize_t *short_part, \
        int *failed
static Py_ssize_t take_two_spans_crc(TAKE_TWO_SPANS_ARGS)
{
    return take_two_spans(d, most, bound, avail, first, base, size, pairs, taken, slot,
                          short_part, failed, 1);
}
static Py_ssize_t take_two_spans_plain(TAKE_TWO_SPANS_ARGS)
{
    return take_two_spans(d, most, bound, avail, first, base, size, pairs, taken, slot,
                          short_part, failed, 0);
}

static PyObject *py_mix_take(PyObject *self, PyObject *args)
{
    PyObject *draws_obj, *bounds_obj, *parts, *starts, *origins, *origins_out_obj;
    PyObject *out_obj = Py_None, *out = NULL, *result = NULL;
    Py_ssize_t begin, limit, nparts = 0, norigins = 0, had = 0;
    Py_buffer draws = {0}, bounds_view = {0}, oout = {0};
    Py_buffer *oviews = NULL;
    int have_oout = 0, placed = 0;
    uint64_t bounds[MAX_PARTS];
    /* Only the parts' entries are set (zeroed once their number is known: an epoch of 16 KiB
     * records calls this a few hundred times, and zeroing all MAX_PARTS cost more than the
     * items it placed). */
    Py_ssize_t first[MAX_PARTS], avail[MAX_PARTS], taken[MAX_PARTS], nready = 0;
    PyObject **items[MAX_PARTS];
    unsigned char owned[MAX_PARTS];
    const unsigned char *origin_in[MAX_PARTS];
    PyObject *new_starts[MAX_PARTS];
    /* Span parts: their buffers (two a part: the bytes, the pairs), where their bytes are,
     * how many, and their pairs from the part's start. */
    Py_buffer *sviews = NULL;
    const char *span_base[MAX_PARTS];
    Py_ssize_t span_len[MAX_PARTS];
    const int64_t *span_pairs[MAX_PARTS];
    unsigned char span_crc[MAX_PARTS]; /* each record's CRC follows it: checked */
    int any_span = 0;
    Py_ssize_t n = 0;
    const unsigned char *d_first = NULL;
    PyObject **slot = NULL;

    if (!PyArg_ParseTuple(args, "OnnOOOOO|O:mix_take", &draws_obj, &begin, &limit, &bounds_obj,
                          &parts, &starts, &origins, &origins_out_obj, &out_obj))
        return NULL;
    if (!PyList_Check(parts) || !PyList_Check(starts)) {
        PyErr_SetString(PyExc_TypeError, "parts and starts must be lists");
        return NULL;
    }
    if (out_obj != Py_None && !PyList_CheckExact(out_obj)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list or None");
        return NULL;
    }
    if (PyObject_GetBuffer(draws_obj, &draws, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (draws.len % DRAW_BYTES) {
        PyErr_Format(PyExc_ValueError, "draws must be whole 4-byte draws, not %zd bytes",
                     draws.len);
        goto fail;
    }
    Py_ssize_t ndraws = draws.len / DRAW_BYTES;
    if (begin < 0 || begin > ndraws) {
        PyErr_Format(PyExc_ValueError, "begin %zd is outside the %zd draws", begin, ndraws);
        goto fail;
    }
    if (limit < 0) {
        PyErr_Format(PyExc_ValueError, "limit must be >= 0, not %zd", limit);
        goto fail;
    }
    Py_ssize_t most = ndraws - begin < limit ? ndraws - begin : limit;

    if (PyObject_GetBuffer(bounds_obj, &bounds_view, PyBUF_C_CONTIGUOUS) < 0)
        goto fail;
    nparts = PyList_GET_SIZE(parts);
    if (nparts < 1 || nparts > MAX_PARTS) {
        PyErr_Format(PyExc_ValueError, "between 1 and 256 parts, not %zd", nparts);
        goto fail;
    }
    memset(taken, 0, (size_t)nparts * sizeof taken[0]);
    memset(new_starts, 0, (size_t)nparts * sizeof new_starts[0]);
    memset(span_crc, 0, (size_t)nparts);
    nready = nparts;
    if (bounds_view.itemsize != 8 || bounds_view.len != nparts * 8) {
        PyErr_Format(PyExc_ValueError, "bounds must be %zd uint64, one per part", nparts);
        goto fail;
    }
    memcpy(bounds, bounds_view.buf, (size_t)nparts * 8);
    for (Py_ssize_t k = 0; k < nparts; k++) {
        if ((k && bounds[k] < bounds[k - 1]) || bounds[k] > BOUND_END) {
            PyErr_SetString(PyExc_ValueError, "bounds must be non-decreasing, at most 2**32");
            goto fail;
        }
    }
    if (bounds[nparts - 1] != BOUND_END) {
        PyErr_SetString(PyExc_ValueError, "the last bound must be 2**32");
        goto fail;
    }
    if (PyList_GET_SIZE(starts) != nparts) {
        PyErr_Format(PyExc_ValueError, "starts has %zd entries for %zd parts",
                     PyList_GET_SIZE(starts), nparts);
        goto fail;
    }
    if ((origins == Py_None) != (origins_out_obj == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "origins and origins_out are both None or neither");
        goto fail;
    }
    if (origins != Py_None) {
        if (!PyList_Check(origins) || PyList_GET_SIZE(origins) != nparts) {
            PyErr_Format(PyExc_ValueError, "origins must be a list of %zd buffers", nparts);
            goto fail;
        }
        if (PyObject_GetBuffer(origins_out_obj, &oout, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            goto fail;
        have_oout = 1;
        if (oout.itemsize != 8 || oout.len / 8 < most) {
            PyErr_Format(PyExc_ValueError, "origins_out must hold %zd int64", most);
            goto fail;
        }
        oviews = PyMem_Calloc((size_t)nparts, sizeof(Py_buffer));
        if (oviews == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (; norigins < nparts; norigins++) {
            if (PyObject_GetBuffer(PyList_GET_ITEM(origins, norigins), &oviews[norigins],
                                   PyBUF_C_CONTIGUOUS) < 0)
                goto fail;
            if (oviews[norigins].itemsize != 8) {
                PyErr_Format(PyExc_ValueError, "origins[%zd] must be a buffer of int64",
                             norigins);
                norigins++; /* released below with the others */
                goto fail;
            }
        }
    }
    /* The span parts' buffers, taken before anything of parts is read for the pass: an
     * exporter may run Python code (and so may the collection below); the loop over the parts
     * checks that each span part still holds the objects whose buffers were taken. */
    for (Py_ssize_t k = 0; k < nparts && k < PyList_GET_SIZE(parts); k++) {
        PyObject *part = PyList_GET_ITEM(parts, k);
        if (!is_span_part(part))
            continue;
        if (sviews == NULL) {
            sviews = PyMem_Calloc((size_t)nparts * 2, sizeof(Py_buffer));
            if (sviews == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
        }
        Py_INCREF(part); /* its items stay alive while their buffers are taken */
        Py_buffer *data = &sviews[2 * k], *pairs = &sviews[2 * k + 1];
        int crc = PyTuple_GET_SIZE(part) == 3 ? PyObject_IsTrue(PyTuple_GET_ITEM(part, 2)) : 0;
        int got = crc >= 0 &&
                  PyObject_GetBuffer(PyTuple_GET_ITEM(part, 0), data, PyBUF_SIMPLE) == 0 &&
                  PyObject_GetBuffer(PyTuple_GET_ITEM(part, 1), pairs, PyBUF_C_CONTIGUOUS) == 0;
        Py_DECREF(part);
        if (!got)
            goto fail;
        span_crc[k] = (unsigned char)crc;
        if (pairs->itemsize != 8 || pairs->len % 16) {
            PyErr_Format(PyExc_ValueError,
                         "parts[%zd]'s spans must be int64 (offset, length) pairs", k);
            goto fail;
        }
    }
    /* The output: the caller's list with room for this pass's items, else a new one. Made
     * before anything of parts is looked at: allocating (here or in growing the caller's list)
     * can run a garbage collection, whose finalizers could change the lists. Nothing below,
     * until the items are placed, calls back into Python. */
    if (out_obj == Py_None) {
        Py_ssize_t room = limit <= MAX_ROOM && limit > most ? limit : most;
        out = PyList_New(room);
        if (out == NULL)
            goto fail;
        Py_SET_SIZE(out, 0); /* an empty list with room for `room` items */
    } else {
        Py_INCREF(out_obj);
        out = out_obj;
        had = PyList_GET_SIZE(out);
        if (((PyListObject *)out)->allocated - had < most) {
            /* Grown the list's own way (over-allocating): `most` Nones appended, then its
             * length put back. The length is read again after the filler is made (making it
             * can run a collection); appending runs no Python code. */
            PyObject *filler = PyList_New(most);
            if (filler == NULL)
                goto fail;
            for (Py_ssize_t i = 0; i < most; i++) {
                Py_INCREF(Py_None);
                PyList_SET_ITEM(filler, i, Py_None);
            }
            had = PyList_GET_SIZE(out);
            int grown = PyList_SetSlice(out, had, had, filler);
            Py_DECREF(filler);
            if (grown < 0)
                goto fail;
            for (Py_ssize_t i = 0; i < most; i++)
                Py_DECREF(Py_None); /* the appended slots, given up again */
            Py_SET_SIZE(out, had);
        }
    }
    if (PyList_GET_SIZE(parts) != nparts || PyList_GET_SIZE(starts) != nparts) {
        PyErr_SetString(PyExc_ValueError, "parts or starts changed while mix_take read them");
        goto fail;
    }
    for (Py_ssize_t k = 0; k < nparts; k++) {
        PyObject *part = PyList_GET_ITEM(parts, k), *start_obj = PyList_GET_ITEM(starts, k);
        span_base[k] = NULL;
        int is_span = is_span_part(part);
        if (!PyList_Check(part) && !is_span) {
            PyErr_Format(PyExc_TypeError,
                         "parts[%zd] must be a list or a (buffer, spans[, crcs]) tuple", k);
            goto fail;
        }
        if (part == out) {
            PyErr_Format(PyExc_ValueError, "out is parts[%zd]", k);
            goto fail;
        }
        if (!PyLong_CheckExact(start_obj)) {
            PyErr_Format(PyExc_TypeError, "starts[%zd] must be an int", k);
            goto fail;
        }
        Py_ssize_t size;
        if (is_span) {
            if (sviews == NULL || sviews[2 * k].obj != PyTuple_GET_ITEM(part, 0) ||
                sviews[2 * k + 1].obj != PyTuple_GET_ITEM(part, 1)) {
                PyErr_Format(PyExc_ValueError, "parts[%zd] changed while mix_take read it", k);
                goto fail;
            }
            size = sviews[2 * k + 1].len / 16;
        } else {
            size = PyList_GET_SIZE(part);
        }
        Py_ssize_t start = PyLong_AsSsize_t(start_obj);
        if (start == -1 && PyErr_Occurred())
            goto fail;
        if (start < 0 || start > size) {
            PyErr_Format(PyExc_ValueError, "starts[%zd] is %zd, outside parts[%zd] of %zd items",
                         k, start, k, size);
            goto fail;
        }
        if (have_oout && oviews[k].len / 8 != size) {
            PyErr_Format(PyExc_ValueError, "origins[%zd] has %zd entries for %zd items", k,
                         oviews[k].len / 8, size);
            goto fail;
        }
        first[k] = start;
        avail[k] = size - start;
        /* Only the parts list refers to it (an exact list: a subclass may keep its items in
         * sync with something else): its items move out. */
        owned[k] = !is_span && PyList_CheckExact(part) && Py_REFCNT(part) == 1;
        /* An empty list's (or buffer's) storage may be NULL: no offset from it (UB even + 0). */
        items[k] = avail[k] && !is_span ? PySequence_Fast_ITEMS(part) + start : NULL;
        if (is_span) {
            any_span = 1;
            span_base[k] = sviews[2 * k].buf ? (const char *)sviews[2 * k].buf : "";
            span_len[k] = sviews[2 * k].len;
            span_pairs[k] = avail[k] ? (const int64_t *)sviews[2 * k + 1].buf + 2 * start : NULL;
        }
        origin_in[k] = have_oout && avail[k] ? (const unsigned char *)oviews[k].buf + 8 * start
                                             : NULL;
    }

    const unsigned char *d = most ? (const unsigned char *)draws.buf + (size_t)begin * DRAW_BYTES
                                  : NULL;
    d_first = d;
    unsigned char *origin_out = have_oout ? (unsigned char *)oout.buf : NULL;
    /* Room for `most` items after the `had` there (none: the storage may be NULL). */
    slot = most ? PySequence_Fast_ITEMS(out) + had : NULL;
    Py_ssize_t short_part = -1;
    placed = 1; /* from here a failure gives back what was placed */
    int two_spans = nparts == 2 && span_base[0] != NULL && span_base[1] != NULL &&
                    span_crc[0] == span_crc[1] && origin_out == NULL;
    if (two_spans) {
        int failed = 0;
        n = (span_crc[0] ? take_two_spans_crc : take_two_spans_plain)(
            d, most, bounds[0], avail, first, span_base, span_len, span_pairs, taken, slot,
            &short_part, &failed);
        if (failed)
            goto fail;
    }
    for (; !two_spans && n < most; n++, d += DRAW_BYTES) {
        uint64_t u = (uint64_t)d[0] | (uint64_t)d[1] << 8 | (uint64_t)d[2] << 16 |
                     (uint64_t)d[3] << 24;
        Py_ssize_t k = pick(bounds, nparts, u);
        Py_ssize_t j = taken[k];
        if (j == avail[k]) {
            short_part = k;
            break;
        }
        PyObject *item;
        if (span_base[k] != NULL) {
            item = span_item(span_base[k], span_len[k], span_pairs[k] + 2 * j, k, first[k] + j,
                             span_crc[k]);
            if (item == NULL) {
                if (!span_crc[k] || PyErr_Occurred())
                    goto fail;
                short_part = k; /* its CRC did not match: the pass stops before it */
                break;
            }
        } else {
            item = items[k][j];
            if (!owned[k]) {
#if defined(__GNUC__) || defined(__clang__)
                if (j + PREFETCH_AHEAD < avail[k])
                    __builtin_prefetch(items[k][j + PREFETCH_AHEAD], 1);
#endif
                Py_INCREF(item);
            }
        }
        slot[n] = item;
        if (origin_out != NULL)
            memcpy(origin_out + 8 * n, origin_in[k] + 8 * j, 8);
        taken[k] = j + 1;
    }

    /* The new starts and the result, all made before any is set: a failure leaves starts as
     * they were. */
    for (Py_ssize_t k = 0; k < nparts; k++) {
        if (taken[k]) {
            new_starts[k] = PyLong_FromSsize_t(first[k] + taken[k]);
            if (new_starts[k] == NULL)
                goto fail;
        }
    }
    PyObject *end_obj = PyLong_FromSsize_t(begin + n);
    PyObject *short_obj = end_obj != NULL ? PyLong_FromSsize_t(short_part) : NULL;
    if (short_obj != NULL)
        result = PyTuple_Pack(3, out, end_obj, short_obj); /* out's length is set below */
    Py_XDECREF(end_obj);
    Py_XDECREF(short_obj);
    if (result == NULL)
        goto fail;
    /* Nothing fails from here. The owned parts give their taken items up. */
    placed = 0;
    for (Py_ssize_t k = 0; k < nparts; k++) {
        if (owned[k]) {
            for (Py_ssize_t j = 0; j < taken[k]; j++) {
                Py_INCREF(Py_None);
                items[k][j] = Py_None;
            }
        }
        if (new_starts[k] != NULL) {
            PyList_SetItem(starts, k, new_starts[k]); /* steals the reference */
            new_starts[k] = NULL;
        }
    }
    Py_SET_SIZE(out, had + n);
fail:
    if (placed) {
        /* Failed after placing: the items counted up are counted down, the moved ones left to
         * their parts, and out is as it was. */
        for (Py_ssize_t k = 0; k < nparts; k++) {
            if (!owned[k] && span_base[k] == NULL) {
                for (Py_ssize_t j = 0; j < taken[k]; j++)
                    Py_DECREF(items[k][j]);
            }
        }
        /* The items made from span parts: the first n slots' draws say which. */
        for (Py_ssize_t i = 0; any_span && i < n; i++) {
            const unsigned char *e = d_first + (size_t)i * DRAW_BYTES;
            uint64_t u = (uint64_t)e[0] | (uint64_t)e[1] << 8 | (uint64_t)e[2] << 16 |
                         (uint64_t)e[3] << 24;
            if (span_base[pick(bounds, nparts, u)] != NULL)
                Py_DECREF(slot[i]);
        }
    }
    Py_XDECREF(out); /* a new list's unused room is never looked at */
    for (Py_ssize_t k = 0; k < nready; k++)
        Py_XDECREF(new_starts[k]);
    for (Py_ssize_t k = 0; sviews != NULL && k < 2 * nparts; k++) {
        if (sviews[k].obj != NULL)
            PyBuffer_Release(&sviews[k]);
    }
    PyMem_Free(sviews);
    for (Py_ssize_t k = 0; k < norigins; k++)
        PyBuffer_Release(&oviews[k]);
    PyMem_Free(oviews);
    if (have_oout)
        PyBuffer_Release(&oout);
    if (bounds_view.obj != NULL)
        PyBuffer_Release(&bounds_view);
    PyBuffer_Release(&draws);
    return result;
}

PyMethodDef mix_methods[] = {
    {"mix_take", py_mix_take, METH_VARARGS, mix_take_doc},
    {NULL, NULL, 0, NULL},
};
