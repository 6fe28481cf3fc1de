/* Framing scans: scan_tfrecords and scan_recordio (see streamio/formats/_framing.py). */
#include "speedups.h"

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
 * source; returns the number of good frames (the first mismatch ends the batch there: it
 * precedes any header fault found further on, as in the reference). */
static int tfrecord_copy(const unsigned char *buf, const frame_span *spans, PyObject **records,
                         int n, int verify)
{
    for (int i = 0; i < n; i++) {
        const unsigned char *data = buf + spans[i].start;
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

/* TFRecord: the first q in [pos, end - 12] whose length is within the limit and whose masked
 * length CRC checks out. With a limit below 2**56 a sound length has a zero top byte (offset
 * 7): memchr skips random garbage to the next candidate at memory speed. The CRC is computed
 * once per distinct length in a row: garbage that passes the size test is mostly runs (zeros)
 * repeating one length. */
static Py_ssize_t tfrecord_sync(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                                const size_limit *lim)
{
    uint64_t last_length = 0;
    uint32_t last_crc = 0;
    int have_last = 0, top_zero = lim->limit < ((uint64_t)1 << 56);
    if (lim->all_too_large)
        return -1;
    for (Py_ssize_t q = pos; end - q >= TFRECORD_HEADER; q++) {
        if (top_zero && buf[q + 7] != 0) {
            const unsigned char *z = memchr(buf + q + 7, 0, (size_t)(end - TFRECORD_HEADER - q) + 1);
            if (z == NULL)
                return -1;
            q = (z - buf) - 7;
        }
        uint64_t length = load_le64(buf + q);
        if (too_large(lim, length))
            continue;
        if (!have_last || length != last_length) {
            last_length = length;
            last_crc = masked_crc(buf + q, 8);
            have_last = 1;
        }
        if (last_crc == load_le32(buf + q + 8))
            return q;
        Py_ssize_t run = uniform_run_end(buf, q, end); /* zeros, 0xFF padding... */
        if (run > q)
            q = run - TFRECORD_HEADER; /* the next window holds buf[run], which differs */
    }
    return -1;
}

PyDoc_STRVAR(find_tfrecord_sync_doc,
"find_tfrecord_sync(buf, pos, end, max_record_size) -> int\n\n"
"The first offset q in [pos, end - 12] where a sound TFRecord header starts, or -1.\n"
"Same result as streamio.formats.tfrecord.find_tfrecord_sync (the reference).");

static PyObject *py_find_tfrecord_sync(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "pos", "end", "max_record_size", NULL};
    Py_buffer view;
    Py_ssize_t pos, end, q;
    size_limit lim;
    if (sync_args(args, kwargs, "OnnO:find_tfrecord_sync", kwlist, &view, &pos, &end, NULL,
                  &lim) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (end - pos < (Py_ssize_t)TFRECORD_HEADER * 4096) {
        q = tfrecord_sync(buf, pos, end, &lim);
    } else { /* a long scan of garbage: let other threads run */
        Py_BEGIN_ALLOW_THREADS
        q = tfrecord_sync(buf, pos, end, &lim);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(q);
}

/* RecordIO: the first q in [pos, end - 8] at a 4-aligned stream offset (base + q) with the magic
 * number, cflag 0 or 1 and a length within the limit. memchr finds the magic's first byte
 * (0x0A, little-endian) at memory speed; garbage rarely holds it. */
static Py_ssize_t recordio_sync(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                                Py_ssize_t base, const size_limit *lim)
{
    Py_ssize_t q = pos;
    while (end - q >= RECORDIO_HEADER) {
        const unsigned char *hit = memchr(buf + q, RECORDIO_MAGIC & 0xFF,
                                          (size_t)(end - RECORDIO_HEADER - q) + 1);
        if (hit == NULL)
            return -1;
        q = hit - buf;
        if (((base + q) & 3) == 0 && load_le32(buf + q) == RECORDIO_MAGIC) {
            uint32_t lrec = load_le32(buf + q + 4);
            if ((lrec >> 29) <= 1 && !too_large(lim, lrec & RECORDIO_LENGTH_MASK))
                return q;
        }
        q++;
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
    {"find_recordio_sync", (PyCFunction)(void (*)(void))py_find_recordio_sync,
     METH_VARARGS | METH_KEYWORDS, find_recordio_sync_doc},
    {"scan_tfrecords", (PyCFunction)(void (*)(void))py_scan_tfrecords, METH_VARARGS | METH_KEYWORDS,
     scan_tfrecords_doc},
    {"scan_recordio", (PyCFunction)(void (*)(void))py_scan_recordio, METH_VARARGS | METH_KEYWORDS,
     scan_recordio_doc},
    {NULL, NULL, 0, NULL},
};
