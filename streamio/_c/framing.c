/* Framing scans: scan_tfrecords and scan_recordio (see streamio/formats/_framing.py). */
#include "speedups.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SYNC_X86 1 /* the resync search: SSE2 compares, and crc32 where the CPU has SSE4.2 */
#include <immintrin.h>
#endif

/* Frames located per batch before their payload CRCs are checked and their bytes copied. */
#define SCAN_BATCH 256

/* ---------------------------------------------------------------------------------------------
 * Argument helpers
 * ------------------------------------------------------------------------------------------- */

/* The framers pass a Python int max_record_size; keep its exact meaning for any value. */
typedef struct {
    int all_too_large; /* a negative limit: every length exceeds it */
    uint64_t limit;
} size_limit;

static int parse_limit(PyObject *obj, size_limit *out)
{
    int overflow = 0;
    long long value;
    if (!PyLong_Check(obj)) {
        PyObject *index = PyNumber_Index(obj);
        if (index == NULL)
            return -1;
        value = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
    } else {
        value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    }
    if (value == -1 && PyErr_Occurred())
        return -1;
    out->all_too_large = overflow < 0 || (overflow == 0 && value < 0);
    out->limit = overflow > 0 ? UINT64_MAX : (value < 0 ? 0 : (uint64_t)value);
    return 0;
}

static inline int too_large(const size_limit *lim, uint64_t length)
{
    return lim->all_too_large || length > lim->limit;
}

/* Check pos/end against the buffer: the kernels read buf[pos:end] and nothing else. */
static int check_range(Py_ssize_t pos, Py_ssize_t end, Py_ssize_t len)
{
    if (pos < 0) {
        PyErr_Format(PyExc_ValueError, "pos must be >= 0, not %zd", pos);
        return -1;
    }
    if (end > len) {
        PyErr_Format(PyExc_ValueError, "end %zd is past the end of the buffer (%zd bytes)", end, len);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * scan_tfrecords
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t start; /* payload start */
    Py_ssize_t length;
} frame_span;

/* Pass 1: locate up to SCAN_BATCH whole frames from p, checking headers in the reference's order
 * (length CRC, size limit, wholeness). Returns the frame count; *stopped says a frame stopped
 * the batch (with *status), *next is where the batch ends, *payload its payload bytes. */
static int tfrecord_locate(const unsigned char *buf, Py_ssize_t p, Py_ssize_t end, int verify,
                           const size_limit *lim, frame_span *spans, int *stopped, int *status,
                           Py_ssize_t *next, Py_ssize_t *payload)
{
    int n = 0;
    *stopped = 0;
    *payload = 0;
    while (n < SCAN_BATCH && end - p >= TFRECORD_HEADER) {
        uint64_t length = load_le64(buf + p);
        if (verify && masked_crc(buf + p, 8) != load_le32(buf + p + 8)) {
            *status = ST_BAD_HEADER;
            break;
        }
        if (too_large(lim, length)) {
            *status = ST_TOO_LARGE;
            break;
        }
        Py_ssize_t start = p + TFRECORD_HEADER;
        /* stop + FOOTER > end, written so that a huge length cannot overflow */
        if (length > (uint64_t)(end - start) || (uint64_t)(end - start) - length < TFRECORD_FOOTER) {
            *status = ST_OK;
            break;
        }
        spans[n].start = start;
        spans[n].length = (Py_ssize_t)length;
        *payload += (Py_ssize_t)length;
        n++;
        p = start + (Py_ssize_t)length + TFRECORD_FOOTER;
    }
    *stopped = n < SCAN_BATCH && end - p >= TFRECORD_HEADER;
    if (n < SCAN_BATCH && !*stopped)
        *status = ST_OK; /* fewer than HEADER bytes left */
    *next = p;
    return n;
}

/* Pass 3: copy each payload into its bytes object, checking its CRC in the same pass over the
 * source (records NULL: check only, for scan_tfrecord_spans); returns the number of good
 * frames (the first mismatch ends the batch there: it precedes any header fault found further
 * on, as in the reference). */
static int tfrecord_copy(const unsigned char *buf, const frame_span *spans, PyObject **records,
                         int n, int verify)
{
    for (int i = 0; i < n; i++) {
        const unsigned char *data = buf + spans[i].start;
        if (records == NULL) {
            if (verify && masked_crc(data, (size_t)spans[i].length) !=
                              load_le32(data + spans[i].length))
                return i;
            continue;
        }
        unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(records[i]);
        if (!verify) {
            memcpy(dst, data, (size_t)spans[i].length);
            continue;
        }
        uint32_t crc = crc32c_copy(0, dst, data, (size_t)spans[i].length);
        if (mask_crc(crc) != load_le32(data + spans[i].length))
            return i;
    }
    return n;
}

PyDoc_STRVAR(scan_tfrecords_doc,
"scan_tfrecords(buf, pos, end, verify, max_record_size, out) -> (pos, status)\n\n"
"Frame whole TFRecords from buf[pos:end], appending each payload (bytes) to the list out.\n"
"Same results as streamio.formats.tfrecord.scan_tfrecords (the reference).");

static PyObject *py_scan_tfrecords(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "pos", "end", "verify", "max_record_size", "out", NULL};
    PyObject *bufobj, *verify_obj, *limit_obj, *out;
    Py_ssize_t pos, end;
    Py_buffer view;
    size_limit lim;
    frame_span spans[SCAN_BATCH];
    PyObject *records[SCAN_BATCH];
    int status = ST_OK, verify;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnnOOO:scan_tfrecords", kwlist, &bufobj, &pos,
                                     &end, &verify_obj, &limit_obj, &out))
        return NULL;
    if (!PyList_Check(out)) {
        PyErr_Format(PyExc_TypeError, "out must be a list, not %.100s", Py_TYPE(out)->tp_name);
        return NULL;
    }
    verify = PyObject_IsTrue(verify_obj);
    if (verify < 0 || parse_limit(limit_obj, &lim) < 0)
        return NULL;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (check_range(pos, end, view.len) < 0)
        goto fail;

    const unsigned char *buf = (const unsigned char *)view.buf;
    for (;;) {
        int stopped;
        Py_ssize_t next, payload;
        int n = tfrecord_locate(buf, pos, end, verify, &lim, spans, &stopped, &status, &next,
                                &payload);
        /* Pass 2: a bytes object for each payload (allocating needs the GIL). */
        for (int i = 0; i < n; i++) {
            records[i] = PyBytes_FromStringAndSize(NULL, spans[i].length);
            if (records[i] == NULL) {
                for (int k = 0; k < i; k++)
                    Py_DECREF(records[k]);
                goto fail;
            }
        }
        /* Pass 3 (large batches without the GIL), then pass 4: hand out the good records. */
        PyThreadState *saved = payload >= GIL_RELEASE_BYTES ? PyEval_SaveThread() : NULL;
        int good = tfrecord_copy(buf, spans, records, n, verify), failed = 0;
        if (saved != NULL)
            PyEval_RestoreThread(saved);
        for (int i = 0; i < n; i++) {
            if (i < good && !failed && PyList_Append(out, records[i]) < 0)
                failed = 1;
            Py_DECREF(records[i]);
        }
        if (failed)
            goto fail;
        if (good < n) {
            pos = spans[good].start - TFRECORD_HEADER;
            status = ST_BAD_DATA;
            break;
        }
        pos = next;
        if (n < SCAN_BATCH || stopped)
            break;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(ni)", pos, status);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

PyDoc_STRVAR(scan_tfrecord_spans_doc,
"scan_tfrecord_spans(buf, pos, end, verify, max_record_size, spans, data=True)\n"
"    -> (n, pos, status)\n\n"
"Frame whole TFRecords from buf[pos:end] as scan_tfrecords does, but write each payload's\n"
"(offset in buf, length) to the writable int64 buffer spans (two entries a record) instead\n"
"of making a bytes object; stops with status OK once spans is full. data=False: the payload\n"
"CRCs are not checked (only the headers, under verify): the consumer checks each one as it\n"
"copies the record (the CRC follows the payload in buf). Same frames, pos and status as\n"
"streamio.formats.tfrecord.scan_tfrecord_spans (the reference).");

static PyObject *py_scan_tfrecord_spans(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "pos", "end", "verify", "max_record_size", "spans", "data",
                             NULL};
    PyObject *bufobj, *verify_obj, *limit_obj, *spans_obj, *data_obj = Py_True;
    Py_ssize_t pos, end, count = 0;
    Py_buffer view, out = {0};
    size_limit lim;
    frame_span spans[SCAN_BATCH];
    int status = ST_OK, verify, data;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnnOOO|O:scan_tfrecord_spans", kwlist,
                                     &bufobj, &pos, &end, &verify_obj, &limit_obj, &spans_obj,
                                     &data_obj))
        return NULL;
    verify = PyObject_IsTrue(verify_obj);
    if (verify < 0 || parse_limit(limit_obj, &lim) < 0)
        return NULL;
    data = PyObject_IsTrue(data_obj);
    if (data < 0)
        return NULL;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(spans_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto fail;
    if (out.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "spans must be a writable buffer of int64");
        goto fail;
    }
    if (check_range(pos, end, view.len) < 0)
        goto fail;
    if ((const char *)out.buf < (const char *)view.buf + view.len &&
        (const char *)view.buf < (const char *)out.buf + out.len) {
        PyErr_SetString(PyExc_ValueError, "spans overlaps buf");
        goto fail;
    }

    const unsigned char *buf = (const unsigned char *)view.buf;
    int64_t *dst = (int64_t *)out.buf;
    Py_ssize_t cap = out.len / 16;
    /* Frames are located a batch at a time, and the payload CRCs of those there is room for
     * checked (unless left to the consumer: data); the first mismatch ends the scan at its
     * frame, as in scan_tfrecords. */
    while (count < cap) {
        int stopped;
        Py_ssize_t next, payload, room = cap - count;
        int n = tfrecord_locate(buf, pos, end, verify, &lim, spans, &stopped, &status, &next,
                                &payload);
        int want = n < room ? n : (int)room;
        int good = tfrecord_copy(buf, spans, NULL, want, verify && data);
        for (int i = 0; i < good; i++) {
            dst[2 * (count + i)] = (int64_t)spans[i].start;
            dst[2 * (count + i) + 1] = (int64_t)spans[i].length;
        }
        count += good;
        if (good < want) {
            pos = spans[good].start - TFRECORD_HEADER;
            status = ST_BAD_DATA;
            break;
        }
        if (want < n) { /* out of room: the next frame (whole, its header sound) waits */
            pos = spans[want].start - TFRECORD_HEADER;
            break;
        }
        pos = next;
        if (n < SCAN_BATCH || stopped)
            break;
    }
    if (count == cap)
        status = ST_OK; /* full: what follows is not looked at (as in the reference) */
    PyBuffer_Release(&out);
    PyBuffer_Release(&view);
    return Py_BuildValue("(nni)", count, pos, status);
fail:
    if (out.obj != NULL)
        PyBuffer_Release(&out);
    PyBuffer_Release(&view);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * scan_recordio
 * ------------------------------------------------------------------------------------------- */

PyDoc_STRVAR(scan_recordio_doc,
"scan_recordio(buf, pos, end, max_record_size, out) -> (pos, status)\n\n"
"Frame whole cflag-0 RecordIO records from buf[pos:end] into the list out.\n"
"Same results as streamio.formats.recordio.scan_recordio (the reference).");

static PyObject *py_scan_recordio(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "pos", "end", "max_record_size", "out", NULL};
    PyObject *bufobj, *limit_obj, *out;
    Py_ssize_t pos, end;
    Py_buffer view;
    size_limit lim;
    int status = ST_OK;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnnOO:scan_recordio", kwlist, &bufobj, &pos,
                                     &end, &limit_obj, &out))
        return NULL;
    if (!PyList_Check(out)) {
        PyErr_Format(PyExc_TypeError, "out must be a list, not %.100s", Py_TYPE(out)->tp_name);
        return NULL;
    }
    if (parse_limit(limit_obj, &lim) < 0)
        return NULL;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (check_range(pos, end, view.len) < 0)
        goto fail;

    /* RecordIO: u32 magic | u32 lrec (cflag << 29 | length) | payload | zero pad to 4 bytes */
    const unsigned char *buf = (const unsigned char *)view.buf;
    while (end - pos >= RECORDIO_HEADER) {
        uint32_t magic = load_le32(buf + pos), lrec = load_le32(buf + pos + 4);
        if (magic != RECORDIO_MAGIC) {
            status = ST_BAD_HEADER;
            break;
        }
        Py_ssize_t length = (Py_ssize_t)(lrec & RECORDIO_LENGTH_MASK);
        if (too_large(&lim, (uint64_t)length)) {
            status = ST_TOO_LARGE;
            break;
        }
        Py_ssize_t stop = pos + RECORDIO_HEADER + length, pad = (-length) & 3;
        if (stop + pad > end) {
            status = ST_OK;
            break;
        }
        /* No checksum covers the length: take the frame only if the next one's magic follows. */
        if (end - (stop + pad) < 4 || load_le32(buf + stop + pad) != RECORDIO_MAGIC) {
            status = ST_UNCONFIRMED;
            break;
        }
        if (lrec >> 29) {
            status = ST_SPECIAL;
            break;
        }
        PyObject *rec = PyBytes_FromStringAndSize((const char *)buf + pos + RECORDIO_HEADER, length);
        if (rec == NULL)
            goto fail;
        int rc = PyList_Append(out, rec);
        Py_DECREF(rec);
        if (rc < 0)
            goto fail;
        pos = stop + pad;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(ni)", pos, status);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Resynchronisation: the next offset where a sound header starts, after corruption
 * ------------------------------------------------------------------------------------------- */

/* The framers' resync kernels take (buf, pos, end, ...) like the scans; -1 when none is found. */
static int sync_args(PyObject *args, PyObject *kwargs, const char *fmt, char **kwlist,
                     Py_buffer *view, Py_ssize_t *pos, Py_ssize_t *end, Py_ssize_t *base,
                     size_limit *lim)
{
    PyObject *bufobj, *limit_obj;
    int ok = base ? PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kwlist, &bufobj, pos, end, base,
                                                &limit_obj)
                  : PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kwlist, &bufobj, pos, end,
                                                &limit_obj);
    if (!ok || parse_limit(limit_obj, lim) < 0)
        return -1;
    if (PyObject_GetBuffer(bufobj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (check_range(*pos, *end, view->len) < 0) {
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The end of the run of identical bytes that fills buf[q:q + 12] (or q if it is not filled by
 * one): every 12-byte window inside the run is the same header, so one test covers them all. */
static Py_ssize_t uniform_run_end(const unsigned char *buf, Py_ssize_t q, Py_ssize_t end)
{
    uint64_t pattern = 0x0101010101010101ull * buf[q];
    if (load_le64(buf + q) != pattern || load_le32(buf + q + 8) != (uint32_t)pattern)
        return q;
    Py_ssize_t r = q + TFRECORD_HEADER;
    while (end - r >= 8 && load_le64(buf + r) == pattern)
        r += 8;
    while (r < end && buf[r] == buf[q])
        r++;
    return r;
}

/* Bit i set where p[i] == 0, for i in [0, 64). Portable: the high bit of each zero byte, exactly
 * (no borrow crosses bytes), the eight of a word gathered into one byte by a multiply whose
 * partial products never collide. */
static inline uint64_t zero_bytes64_portable(const unsigned char *p)
{
    const uint64_t low7 = 0x7F7F7F7F7F7F7F7Full;
    uint64_t mask = 0;
    for (int i = 0; i < 8; i++) {
        uint64_t v = load_le64(p + 8 * i);
        uint64_t high = ~(((v & low7) + low7) | v | low7);
        mask |= (((high >> 7) * 0x0102040810204080ull) >> 56) << (8 * i);
    }
    return mask;
}

#ifdef SYNC_X86
static inline uint64_t zero_bytes64_sse2(const unsigned char *p) /* every x86-64 has SSE2 */
{
    const __m128i zero = _mm_setzero_si128();
    uint64_t mask = 0;
    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 * i));
        mask |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)) << (16 * i);
    }
    return mask;
}
#endif

static inline int lowest_bit(uint64_t x) /* x != 0 */
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(x);
#else
    int i = 0;
    while (!(x & 1)) {
        x >>= 1;
        i++;
    }
    return i;
#endif
}

/* Offsets tested per block: the zero bytes among [q, q + 64) tell the candidates among offsets
 * [q, q + 56), whose top length bytes these are. */
#define SYNC_BLOCK 56

/* TFRecord: the first q in [pos, end - 12] whose length is within the limit and whose masked
 * length CRC checks out.
 *
 * A length within a limit below 2**(8k) has zero bytes k..7, so a block of 56 offsets is first
 * narrowed to the offsets whose top bytes are zero, from one bitmask of the zero bytes among 64
 * (SSE2 compares on x86-64); after a block whose last byte is not zero, the search goes on at
 * the next zero byte, which memchr finds at memory speed (random garbage: one in 256). Garbage
 * that leaves many candidates (small integers: three offsets in eight; mostly-zero bytes) pays
 * only the exact test per candidate, without a branch that depends on the data: the 8-byte CRC
 * (one crc32 instruction, inlined, where the CPU has it) is computed whether or not the length
 * is within the limit. A memchr per candidate to find the next, with branches on the length,
 * ran that garbage at 100-200 MB/s.
 * A block that starts in a run of one byte (zeros, 0xFF padding) is passed over with the run:
 * no 12 bytes of one value are a sound header (tests/formats/test_resync.py checks all 256).
 * ``zero_bytes64`` and ``crc8`` are the zero-byte mask and the CRC-32C of 8 bytes; always_inline:
 * each caller below gets its own copy with them inlined. */
static inline __attribute__((always_inline)) Py_ssize_t
tfrecord_sync_body(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, const size_limit *lim,
                   uint64_t (*zero_bytes64)(const unsigned char *),
                   uint32_t (*crc8)(const unsigned char *))
{
    const uint64_t limit = lim->limit;
    int low_bytes = 0; /* the bytes a length within the limit may use */
    if (lim->all_too_large)
        return -1;
    for (uint64_t l = limit; l; l >>= 8)
        low_bytes++;
    Py_ssize_t q = pos;
    while (end - q >= TFRECORD_HEADER) {
        Py_ssize_t run = uniform_run_end(buf, q, end);
        if (run > q) { /* the first window that differs holds buf[run] */
            q = run - TFRECORD_HEADER + 1;
            continue;
        }
        uint64_t cand;
        Py_ssize_t next;
        int to_next_zero = 0;
        if (end - q >= SYNC_BLOCK + TFRECORD_HEADER - 1) { /* the block's last header is whole */
            cand = ((uint64_t)1 << SYNC_BLOCK) - 1;
            if (low_bytes < 8) {
                uint64_t zeros = zero_bytes64(buf + q);
                for (int j = low_bytes; j < 8; j++)
                    cand &= zeros >> j; /* offset i: byte i + j is zero */
                to_next_zero = !(zeros >> 63);
            }
            next = q + SYNC_BLOCK;
        } else { /* the last few offsets (at most 55), each a candidate */
            cand = ((uint64_t)1 << (end - TFRECORD_HEADER - q + 1)) - 1;
            next = end;
        }
        while (cand) {
            Py_ssize_t r = q + lowest_bit(cand);
            cand &= cand - 1;
            uint64_t length = load_le64(buf + r);
            int sound = (length <= limit) & (mask_crc(crc8(buf + r)) == load_le32(buf + r + 8));
            if (sound)
                return r;
        }
        if (to_next_zero) {
            /* Byte q + 63 is not zero: the next candidate (r > q + 56) has its byte r + 7 zero,
             * past it. Zero bytes past end - 5 belong to no whole header. */
            Py_ssize_t from = q + 64;
            if (end - 5 < from)
                return -1;
            const unsigned char *z = memchr(buf + from, 0, (size_t)(end - 5 - from) + 1);
            if (z == NULL)
                return -1;
            next = (z - buf) - 7;
        }
        q = next;
    }
    return -1;
}

static Py_ssize_t tfrecord_sync_portable(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                                         const size_limit *lim)
{
    return tfrecord_sync_body(buf, pos, end, lim, zero_bytes64_portable, crc32c_8_portable);
}

#ifdef SYNC_X86
__attribute__((target("sse4.2")))
static inline uint32_t crc32c_8_sse42(const unsigned char *p)
{
    return ~(uint32_t)_mm_crc32_u64(0xFFFFFFFFu, load_le64(p));
}

__attribute__((target("sse4.2")))
static Py_ssize_t tfrecord_sync_sse42(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                                      const size_limit *lim)
{
    return tfrecord_sync_body(buf, pos, end, lim, zero_bytes64_sse2, crc32c_8_sse42);
}
#endif

static Py_ssize_t tfrecord_sync(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                                const size_limit *lim, int portable)
{
#ifdef SYNC_X86
    if (crc_is_hardware && !portable)
        return tfrecord_sync_sse42(buf, pos, end, lim);
#endif
    return tfrecord_sync_portable(buf, pos, end, lim);
}

PyDoc_STRVAR(find_tfrecord_sync_doc,
"find_tfrecord_sync(buf, pos, end, max_record_size) -> int\n\n"
"The first offset q in [pos, end - 12] where a sound TFRecord header starts, or -1.\n"
"Same result as streamio.formats.tfrecord.find_tfrecord_sync (the reference).");

static PyObject *tfrecord_sync_call(PyObject *args, PyObject *kwargs, const char *fmt,
                                    int portable)
{
    static char *kwlist[] = {"buf", "pos", "end", "max_record_size", NULL};
    Py_buffer view;
    Py_ssize_t pos, end, q;
    size_limit lim;
    if (sync_args(args, kwargs, fmt, kwlist, &view, &pos, &end, NULL, &lim) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (end - pos < (Py_ssize_t)TFRECORD_HEADER * 4096) {
        q = tfrecord_sync(buf, pos, end, &lim, portable);
    } else { /* a long scan of garbage: let other threads run */
        Py_BEGIN_ALLOW_THREADS
        q = tfrecord_sync(buf, pos, end, &lim, portable);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(q);
}

static PyObject *py_find_tfrecord_sync(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return tfrecord_sync_call(args, kwargs, "OnnO:find_tfrecord_sync", 0);
}

PyDoc_STRVAR(find_tfrecord_sync_portable_doc,
"_find_tfrecord_sync_portable(buf, pos, end, max_record_size) -> int\n\n"
"find_tfrecord_sync in portable C, as on CPUs other than x86-64 (for tests: on x86-64\n"
"find_tfrecord_sync uses SSE2 and, where the CPU has it, the crc32 instruction).");

static PyObject *py_find_tfrecord_sync_portable(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return tfrecord_sync_call(args, kwargs, "OnnO:_find_tfrecord_sync_portable", 1);
}

#ifdef SYNC_X86
/* RecordIO headers at the 16 u32 words of p[0:64] (their lrec words reach p[67]): four bits
 * set in the result for each word that holds the magic number followed by an lrec with cflag
 * 0 or 1 and a length within ``limit`` (at most RECORDIO_LENGTH_MASK), in SSE2. */
static inline uint64_t recordio_headers16(const unsigned char *p, uint32_t limit, int *any_magic)
{
    const __m128i magic = _mm_set1_epi32((int)RECORDIO_MAGIC), zero = _mm_setzero_si128();
    const __m128i length_mask = _mm_set1_epi32((int)RECORDIO_LENGTH_MASK);
    const __m128i max_length = _mm_set1_epi32((int)limit); /* < 2**29: signed compares hold */
    uint64_t sound = 0;
    __m128i magics = zero;
    for (int i = 0; i < 4; i++) {
        __m128i word = _mm_loadu_si128((const __m128i *)(p + 16 * i));
        __m128i lrec = _mm_loadu_si128((const __m128i *)(p + 16 * i + 4));
        __m128i is_magic = _mm_cmpeq_epi32(word, magic);
        __m128i ok = _mm_and_si128(is_magic, _mm_cmpeq_epi32(_mm_srli_epi32(lrec, 30), zero));
        ok = _mm_andnot_si128(_mm_cmpgt_epi32(_mm_and_si128(lrec, length_mask), max_length), ok);
        sound |= (uint64_t)(uint16_t)_mm_movemask_epi8(ok) << (16 * i); /* cflag <= 1 too */
        magics = _mm_or_si128(magics, is_magic);
    }
    *any_magic = _mm_movemask_epi8(magics) != 0;
    return sound;
}
#endif

/* RecordIO: the first q in [pos, end - 8] at a 4-aligned stream offset (base + q) with the magic
 * number, cflag 0 or 1 and a length within the limit. Only aligned words can start a record:
 * those are tested 16 at a time (SSE2 on x86-64; elsewhere one by one), and past 16 words
 * without the magic, memchr finds the next 0x0A byte (its first). Finding the magic with
 * memchr alone, one call per 0x0A byte, ran garbage made of magic numbers (every word the
 * magic, or the magic before a middle part's cflag 2) at 500-1000 MB/s. */
static Py_ssize_t recordio_sync(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                                Py_ssize_t base, const size_limit *lim)
{
    if (lim->all_too_large)
        return -1;
    /* the first q >= pos with base + q a multiple of 4 (two's complement: any sign of base) */
    Py_ssize_t q = pos + (Py_ssize_t)((0 - ((size_t)base + (size_t)pos)) & 3);
#ifdef SYNC_X86
    uint32_t limit = lim->limit < RECORDIO_LENGTH_MASK ? (uint32_t)lim->limit : RECORDIO_LENGTH_MASK;
    while (end - q >= 64 + 4) {
        int any_magic;
        uint64_t sound = recordio_headers16(buf + q, limit, &any_magic);
        if (sound)
            return q + lowest_bit(sound); /* a word's four bits: the lowest is its offset */
        q += 64;
        if (!any_magic) {
            /* Garbage without the magic (zeros, random bytes): the next aligned magic starts
             * with its byte 0x0A, found with memchr at memory speed; one at most at end - 8. */
            if (end - RECORDIO_HEADER < q)
                return -1;
            const unsigned char *hit = memchr(buf + q, RECORDIO_MAGIC & 0xFF,
                                              (size_t)(end - RECORDIO_HEADER - q) + 1);
            if (hit == NULL)
                return -1;
            q = hit - buf;
            q += (Py_ssize_t)((0 - ((size_t)base + (size_t)q)) & 3);
        }
    }
#endif
    for (; end - q >= RECORDIO_HEADER; q += 4) {
        if (load_le32(buf + q) == RECORDIO_MAGIC) {
            uint32_t lrec = load_le32(buf + q + 4);
            if ((lrec >> 29) <= 1 && !too_large(lim, lrec & RECORDIO_LENGTH_MASK))
                return q;
        }
    }
    return -1;
}

PyDoc_STRVAR(find_recordio_sync_doc,
"find_recordio_sync(buf, pos, end, base, max_record_size) -> int\n\n"
"The first offset q in [pos, end - 8] where a RecordIO record can start (4-aligned stream\n"
"offset base + q, magic number, cflag 0 or 1, length within the limit), or -1.\n"
"Same result as streamio.formats.recordio.find_recordio_sync (the reference).");

static PyObject *py_find_recordio_sync(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "pos", "end", "base", "max_record_size", NULL};
    Py_buffer view;
    Py_ssize_t pos, end, base, q;
    size_limit lim;
    if (sync_args(args, kwargs, "OnnnO:find_recordio_sync", kwlist, &view, &pos, &end, &base,
                  &lim) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (end - pos < 65536) {
        q = recordio_sync(buf, pos, end, base, &lim);
    } else {
        Py_BEGIN_ALLOW_THREADS
        q = recordio_sync(buf, pos, end, base, &lim);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(q);
}

PyMethodDef framing_methods[] = {
    {"find_tfrecord_sync", (PyCFunction)(void (*)(void))py_find_tfrecord_sync,
     METH_VARARGS | METH_KEYWORDS, find_tfrecord_sync_doc},
    {"_find_tfrecord_sync_portable", (PyCFunction)(void (*)(void))py_find_tfrecord_sync_portable,
     METH_VARARGS | METH_KEYWORDS, find_tfrecord_sync_portable_doc},
    {"find_recordio_sync", (PyCFunction)(void (*)(void))py_find_recordio_sync,
     METH_VARARGS | METH_KEYWORDS, find_recordio_sync_doc},
    {"scan_tfrecords", (PyCFunction)(void (*)(void))py_scan_tfrecords, METH_VARARGS | METH_KEYWORDS,
     scan_tfrecords_doc},
    {"scan_tfrecord_spans", (PyCFunction)(void (*)(void))py_scan_tfrecord_spans,
     METH_VARARGS | METH_KEYWORDS, scan_tfrecord_spans_doc},
    {"scan_recordio", (PyCFunction)(void (*)(void))py_scan_recordio, METH_VARARGS | METH_KEYWORDS,
     scan_recordio_doc},
    {NULL, NULL, 0, NULL},
};
