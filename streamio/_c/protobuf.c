/* Protobuf parsers: parse_examples (tf.train.Example), parse_sequence_examples
 * (tf.train.SequenceExample) and parse_recordio_protobuf (SageMaker
 * aialgs.data.Record), with the wire reading and batch helpers they share. */
#include "speedups.h"

/* ---------------------------------------------------------------------------------------------
 * Protobuf wire reading (the same rules as streamio/decoders/_wire.py, error texts included)
 *
 * Protobuf wire format: a message is fields ``tag = field << 3 | wire_type`` (a varint) followed
 * by the value: 0 varint, 1 eight bytes, 2 varint length + bytes, 5 four bytes, 3/4 group
 * start/end. Every function returns 0 or -1 after writing the reason into ``err``.
 * ------------------------------------------------------------------------------------------- */

#define WIRE_MAX_VARINT_BYTES 10
#define WIRE_MAX_GROUP_DEPTH 100

typedef struct {
    char msg[160];
} wire_err;

static int wire_fail(wire_err *err, const char *msg)
{
    snprintf(err->msg, sizeof(err->msg), "%s", msg);
    return -1;
}

/* A varint at b[*pos:end] as an unsigned 64-bit value (bits past the 64th dropped). */
static inline int rd_varint(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end, uint64_t *out,
                            wire_err *err)
{
    Py_ssize_t p = *pos;
    if (p >= end)
        return wire_fail(err, "truncated varint");
    unsigned char byte = b[p++];
    if (byte < 0x80) {
        *out = byte;
        *pos = p;
        return 0;
    }
    uint64_t result = byte & 0x7F;
    int shift = 7;
    for (;;) {
        if (p >= end)
            return wire_fail(err, "truncated varint");
        byte = b[p++];
        result |= (uint64_t)(byte & 0x7F) << shift; /* shift <= 63 here */
        if (byte < 0x80) {
            *out = result;
            *pos = p;
            return 0;
        }
        shift += 7;
        if (shift >= 7 * WIRE_MAX_VARINT_BYTES)
            return wire_fail(err, "varint longer than 10 bytes");
    }
}

static inline int rd_tag(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end, uint64_t *tag,
                         wire_err *err)
{
    if (b[*pos] < 0x80) { /* callers guarantee *pos < end */
        *tag = b[(*pos)++];
        return 0;
    }
    return rd_varint(b, pos, end, tag, err);
}

/* A length prefix at *pos: the delimited bytes are [*start, *stop); *pos is left unchanged. */
static inline int rd_len(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *start,
                         Py_ssize_t *stop, wire_err *err)
{
    uint64_t length;
    if (pos < end && b[pos] < 0x80) {
        length = b[pos];
        pos += 1;
    } else if (rd_varint(b, &pos, end, &length, err) < 0) {
        return -1;
    }
    if (length > (uint64_t)(end - pos))
        return wire_fail(err, "length-delimited field runs past the end of its message");
    *start = pos;
    *stop = pos + (Py_ssize_t)length;
    return 0;
}

/* Skip the value of a field whose tag was read; *pos is just after the tag. */
static int skip_value(const unsigned char *b, uint64_t tag, Py_ssize_t *pos, Py_ssize_t end,
                      int depth, wire_err *err)
{
    uint64_t scratch;
    Py_ssize_t start, stop;
    if ((tag >> 3) == 0)
        return wire_fail(err, "field number 0");
    switch ((int)(tag & 7)) {
    case 0:
        return rd_varint(b, pos, end, &scratch, err);
    case 2:
        if (rd_len(b, *pos, end, &start, &stop, err) < 0)
            return -1;
        *pos = stop;
        return 0;
    case 5:
    case 1: {
        Py_ssize_t width = (tag & 7) == 5 ? 4 : 8;
        if (width > end - *pos)
            return wire_fail(err, "fixed-width field runs past the end of its message");
        *pos += width;
        return 0;
    }
    case 3:
        if (depth >= WIRE_MAX_GROUP_DEPTH)
            return wire_fail(err, "groups nested too deeply");
        for (;;) {
            uint64_t inner;
            if (rd_varint(b, pos, end, &inner, err) < 0)
                return -1;
            if ((inner & 7) == 4) {
                if ((inner >> 3) != (tag >> 3))
                    return wire_fail(err, "end-group tag does not match its start-group tag");
                return 0;
            }
            if (skip_value(b, inner, pos, end, depth + 1, err) < 0)
                return -1;
        }
    default:
        snprintf(err->msg, sizeof(err->msg), "invalid wire type %d", (int)(tag & 7));
        return -1;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Batch parsing helpers: record buffers, growable arrays, numpy outputs
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t n;
    const unsigned char **data;
    Py_ssize_t *len;
    Py_buffer *views; /* only for records that are not bytes */
    char *has_view;
    PyObject *seq;
} record_set;

static void records_release(record_set *rs)
{
    if (rs->views) {
        for (Py_ssize_t i = 0; i < rs->n; i++)
            if (rs->has_view[i])
                PyBuffer_Release(&rs->views[i]);
    }
    PyMem_Free(rs->views);
    PyMem_Free(rs->has_view);
    PyMem_Free(rs->data);
    PyMem_Free(rs->len);
    Py_XDECREF(rs->seq);
    memset(rs, 0, sizeof(*rs));
}

static int records_acquire(PyObject *records, record_set *rs)
{
    memset(rs, 0, sizeof(*rs));
    /* A tuple of our own: the records it holds stay alive whatever happens to the caller's list
     * (another thread while the GIL is released, or Python code run by a conversion). */
    rs->seq = PySequence_Tuple(records);
    if (rs->seq == NULL)
        return -1;
    rs->n = PyTuple_GET_SIZE(rs->seq);
    Py_ssize_t alloc = rs->n ? rs->n : 1;
    rs->data = alloc_items(alloc, sizeof(*rs->data));
    rs->len = rs->data ? alloc_items(alloc, sizeof(*rs->len)) : NULL;
    if (rs->len == NULL) {
        records_release(rs);
        return -1;
    }
    PyObject **items = &PyTuple_GET_ITEM(rs->seq, 0);
    for (Py_ssize_t i = 0; i < rs->n; i++) {
        PyObject *rec = items[i];
        if (PyBytes_CheckExact(rec)) {
            rs->data[i] = (const unsigned char *)PyBytes_AS_STRING(rec);
            rs->len[i] = PyBytes_GET_SIZE(rec);
            continue;
        }
        if (rs->views == NULL) {
            rs->views = PyMem_Calloc(alloc, sizeof(Py_buffer));
            rs->has_view = PyMem_Calloc(alloc, 1);
            if (rs->views == NULL || rs->has_view == NULL) {
                PyErr_NoMemory();
                records_release(rs);
                return -1;
            }
        }
        if (PyObject_GetBuffer(rec, &rs->views[i], PyBUF_SIMPLE) < 0) {
            records_release(rs);
            return -1;
        }
        rs->has_view[i] = 1;
        /* an empty buffer may have a NULL base: keep pointer arithmetic on a real address */
        rs->data[i] = rs->views[i].buf ? (const unsigned char *)rs->views[i].buf
                                       : (const unsigned char *)"";
        rs->len[i] = rs->views[i].len;
    }
    return 0;
}

/* Records of a shuffled batch lie scattered in memory: ask for the next ones' first cache
 * lines while parsing this one. */
#define PREFETCH_AHEAD 4

static inline void prefetch_record(const record_set *rs, Py_ssize_t i)
{
#if defined(__GNUC__) || defined(__clang__)
    const char *p = (const char *)rs->data[i];
    Py_ssize_t n = rs->len[i] < 256 ? rs->len[i] : 256;
    for (Py_ssize_t k = 0; k < n; k += 64)
        __builtin_prefetch(p + k);
#else
    (void)rs;
    (void)i;
#endif
}

typedef struct {
    Py_ssize_t rec, start, len;
} piece;

typedef struct {
    piece *items;
    Py_ssize_t n, cap;
} piece_vec;

static int pv_push(piece_vec *v, Py_ssize_t rec, Py_ssize_t start, Py_ssize_t len)
{
    if (v->n == v->cap) {
        Py_ssize_t cap = grown_capacity(v->cap, sizeof(piece), 64);
        piece *items = cap < 0 ? NULL : PyMem_RawRealloc(v->items, (size_t)cap * sizeof(piece));
        if (items == NULL)
            return -1; /* the caller sets MemoryError once it holds the GIL again */
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n].rec = rec;
    v->items[v->n].start = start;
    v->items[v->n].len = len;
    v->n++;
    return 0;
}

typedef struct {
    Py_ssize_t start, stop;
} span;

typedef struct {
    span *items;
    Py_ssize_t n, cap;
} span_vec;

static int sv_push(span_vec *v, Py_ssize_t start, Py_ssize_t stop)
{
    if (v->n == v->cap) {
        Py_ssize_t cap = grown_capacity(v->cap, sizeof(span), 32);
        span *items = cap < 0 ? NULL : PyMem_RawRealloc(v->items, (size_t)cap * sizeof(span));
        if (items == NULL)
            return -1; /* the caller sets MemoryError once it holds the GIL again */
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n].start = start;
    v->items[v->n].stop = stop;
    v->n++;
    return 0;
}

/* An int64 array of shape (rows, cols) holding ``values``. */
static PyObject *int64_matrix(const int64_t *values, Py_ssize_t rows, Py_ssize_t cols)
{
    char *data;
    Py_ssize_t cells, nbytes;
    if (checked_mul(rows, cols, &cells) < 0 || checked_mul(cells, 8, &nbytes) < 0)
        return NULL;
    PyObject *ba = new_storage(nbytes, &data);
    if (ba == NULL)
        return NULL;
    if (nbytes > 0)
        memcpy(data, values, (size_t)nbytes);
    PyObject *flat = array_from(ba, "=i8");
    Py_DECREF(ba);
    if (flat == NULL)
        return NULL;
    PyObject *out = PyObject_CallMethod(flat, "reshape", "nn", rows, cols);
    Py_DECREF(flat);
    return out;
}

/* Raise streamio.decoders._wire.WireError(message, index, field). */
static void raise_wire_error(const char *message, Py_ssize_t index, PyObject *field)
{
    PyObject *mod = PyImport_ImportModule("streamio.decoders._wire");
    if (mod == NULL)
        return;
    PyObject *cls = PyObject_GetAttrString(mod, "WireError");
    Py_DECREF(mod);
    if (cls == NULL)
        return;
    PyObject *exc;
    if (index < 0)
        exc = PyObject_CallFunction(cls, "sOO", message, Py_None, field ? field : Py_None);
    else
        exc = PyObject_CallFunction(cls, "snO", message, index, field ? field : Py_None);
    if (exc != NULL) {
        PyErr_SetObject(cls, exc);
        Py_DECREF(exc);
    }
    Py_DECREF(cls);
}

/* Feature keys: names[j] -> j, the last of equal names winning (as a dict built in order). */
typedef struct {
    Py_ssize_t n;
    const char **ptr;
    Py_ssize_t *len;
    Py_ssize_t *ids;   /* the caller's index of each name (NULL: its position) */
    Py_ssize_t *table; /* open addressing over hashes, -1 empty; NULL for few names */
    Py_ssize_t mask;
} name_index;

static uint64_t hash_bytes(const unsigned char *p, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void names_release(name_index *ix)
{
    PyMem_Free(ix->ptr);
    PyMem_Free(ix->len);
    PyMem_Free(ix->table);
    PyMem_Free(ix->ids);
    memset(ix, 0, sizeof(*ix));
}

/* ``keys`` is a sequence of bytes objects, kept alive by the caller. */
static int names_build(name_index *ix, PyObject **keys, Py_ssize_t n)
{
    memset(ix, 0, sizeof(*ix));
    ix->n = n;
    ix->ptr = alloc_items(n, sizeof(char *));
    ix->len = ix->ptr ? alloc_items(n, sizeof(Py_ssize_t)) : NULL;
    if (ix->len == NULL) {
        names_release(ix);
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!PyBytes_Check(keys[j])) {
            PyErr_Format(PyExc_TypeError, "feature names must be bytes, not %.100s",
                         Py_TYPE(keys[j])->tp_name);
            names_release(ix);
            return -1;
        }
        ix->ptr[j] = PyBytes_AS_STRING(keys[j]);
        ix->len[j] = PyBytes_GET_SIZE(keys[j]);
    }
    if (n > 8) {
        Py_ssize_t size = 16;
        while (size < 2 * n)
            size *= 2;
        ix->table = alloc_items(size, sizeof(Py_ssize_t));
        if (ix->table == NULL) {
            names_release(ix);
            return -1;
        }
        ix->mask = size - 1;
        for (Py_ssize_t k = 0; k < size; k++)
            ix->table[k] = -1;
        for (Py_ssize_t j = 0; j < n; j++) {
            Py_ssize_t slot = (Py_ssize_t)(hash_bytes((const unsigned char *)ix->ptr[j], ix->len[j]) & ix->mask);
            for (;;) {
                Py_ssize_t at = ix->table[slot];
                if (at < 0 || (ix->len[at] == ix->len[j] && memcmp(ix->ptr[at], ix->ptr[j], ix->len[j]) == 0)) {
                    ix->table[slot] = j; /* a later equal name replaces the earlier */
                    break;
                }
                slot = (slot + 1) & ix->mask;
            }
        }
    }
    return 0;
}

static Py_ssize_t names_find_local(const name_index *ix, const unsigned char *key, Py_ssize_t len)
{
    if (ix->table == NULL) {
        for (Py_ssize_t j = ix->n - 1; j >= 0; j--)
            if (ix->len[j] == len && memcmp(ix->ptr[j], key, len) == 0)
                return j;
        return -1;
    }
    Py_ssize_t slot = (Py_ssize_t)(hash_bytes(key, len) & ix->mask);
    for (;;) {
        Py_ssize_t at = ix->table[slot];
        if (at < 0)
            return -1;
        if (ix->len[at] == len && memcmp(ix->ptr[at], key, len) == 0)
            return at;
        slot = (slot + 1) & ix->mask;
    }
}

static inline Py_ssize_t names_find(const name_index *ix, const unsigned char *key, Py_ssize_t len)
{
    Py_ssize_t j = names_find_local(ix, key, len);
    return (j < 0 || ix->ids == NULL) ? j : ix->ids[j];
}

/* One map<string, Message> entry {key = 1; value = 2} at b[pos:end]: the key (last wins, empty
 * by default) and the spans of every value occurrence (appended to ``values``). */
static int map_entry(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *key_start,
                     Py_ssize_t *key_len, span_vec *values, wire_err *err)
{
    *key_start = 0;
    *key_len = 0;
    while (pos < end) {
        uint64_t tag;
        Py_ssize_t start, stop;
        if (rd_tag(b, &pos, end, &tag, err) < 0)
            return -1;
        if (tag == 0x0A || tag == 0x12) {
            if (rd_len(b, pos, end, &start, &stop, err) < 0)
                return -1;
            pos = stop;
            if (tag == 0x0A) {
                *key_start = start;
                *key_len = stop - start;
            } else if (sv_push(values, start, stop) < 0) {
                return -2; /* out of memory: the caller raises MemoryError with the GIL */
            }
        } else if (skip_value(b, tag, &pos, end, 0, err) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Per-record bookkeeping of which wanted keys were found: the spans of the last entry for each,
 * and the order in which the keys were first seen (the order the reference visits them). */
typedef struct {
    Py_ssize_t *stamp;   /* record index + 1 where found in the current record */
    Py_ssize_t *first;   /* spans of the current value in ``pool`` */
    Py_ssize_t *count;
    Py_ssize_t *order;   /* keys in first-seen order */
    Py_ssize_t norder;
    span_vec pool;
} found_set;

/* The value spans of key j (count[j] of them); NULL when there are none, so that an empty pool
 * (items still NULL) is never offset: NULL + 0 is undefined behaviour in C. */
static inline const span *found_spans(const found_set *f, Py_ssize_t j)
{
    return f->count[j] ? f->pool.items + f->first[j] : NULL;
}

static int found_init(found_set *f, Py_ssize_t nf)
{
    memset(f, 0, sizeof(*f));
    Py_ssize_t n = nf ? nf : 1;
    f->stamp = PyMem_Calloc(n, sizeof(Py_ssize_t));
    f->first = PyMem_Calloc(n, sizeof(Py_ssize_t));
    f->count = PyMem_Calloc(n, sizeof(Py_ssize_t));
    f->order = PyMem_Calloc(n, sizeof(Py_ssize_t));
    if (!f->stamp || !f->first || !f->count || !f->order) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void found_release(found_set *f)
{
    PyMem_Free(f->stamp);
    PyMem_Free(f->first);
    PyMem_Free(f->count);
    PyMem_Free(f->order);
    PyMem_RawFree(f->pool.items);
    memset(f, 0, sizeof(*f));
}

/* Walk map entries in ``spans`` (tag 1 of a Features-like message, or both maps of a Record when
 * ``two_maps``): found[j] = value spans of the last entry whose key is names[j]. */
static int collect_entries(const unsigned char *b, const span *spans, Py_ssize_t nspans,
                           const name_index *ix, const name_index *ix2, found_set *f,
                           Py_ssize_t stamp, wire_err *err)
{
    for (Py_ssize_t s = 0; s < nspans; s++) {
        Py_ssize_t pos = spans[s].start, end = spans[s].stop;
        while (pos < end) {
            uint64_t tag;
            Py_ssize_t start, stop, key_start, key_len;
            if (rd_tag(b, &pos, end, &tag, err) < 0)
                return -1;
            const name_index *lookup = tag == 0x0A ? ix : (tag == 0x12 ? ix2 : NULL);
            if (lookup == NULL) {
                if (skip_value(b, tag, &pos, end, 0, err) < 0)
                    return -1;
                continue;
            }
            if (rd_len(b, pos, end, &start, &stop, err) < 0)
                return -1;
            pos = stop;
            Py_ssize_t first = f->pool.n;
            int rc = map_entry(b, start, stop, &key_start, &key_len, &f->pool, err);
            if (rc < 0)
                return rc;
            Py_ssize_t j = names_find(lookup, b + key_start, key_len);
            if (j < 0)
                continue;
            if (f->stamp[j] != stamp) {
                f->stamp[j] = stamp;
                f->order[f->norder++] = j;
            }
            f->first[j] = first;
            f->count[j] = f->pool.n - first;
        }
    }
    return 0;
}

/* Checks of varint pieces collected for the whole batch, as decode_packed_varints makes them:
 * a piece must end with a terminating byte, and no varint may exceed 10 bytes. */
static int piece_ends_inside(const unsigned char *p, Py_ssize_t n)
{
    return n > 0 && p[n - 1] >= 0x80;
}

static int piece_has_long_varint(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t run = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (p[k] >= 0x80) {
            if (++run >= WIRE_MAX_VARINT_BYTES)
                return 1;
        } else {
            run = 0;
        }
    }
    return 0;
}

static Py_ssize_t piece_varint_count(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t c = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        c += p[k] < 0x80;
    return c;
}

/* Validate varint pieces like decode_packed_varints (over the concatenation, then piece by
 * piece to name the owner). Returns 0 if valid; else -1 with the message and the first bad
 * piece's record in *owner (-1 if none). */
static int check_varint_pieces(const record_set *rs, const piece_vec *v, const char **message,
                               Py_ssize_t *owner)
{
    int inside = 0, longer = 0;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        const unsigned char *p = rs->data[v->items[k].rec] + v->items[k].start;
        inside |= piece_ends_inside(p, v->items[k].len);
    }
    if (!inside) {
        for (Py_ssize_t k = 0; k < v->n && !longer; k++) {
            const unsigned char *p = rs->data[v->items[k].rec] + v->items[k].start;
            longer = piece_has_long_varint(p, v->items[k].len);
        }
    }
    if (!inside && !longer)
        return 0;
    *message = inside ? "packed varints end inside a varint" : "varint longer than 10 bytes";
    *owner = -1;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        const unsigned char *p = rs->data[v->items[k].rec] + v->items[k].start;
        if (piece_ends_inside(p, v->items[k].len) || piece_has_long_varint(p, v->items[k].len)) {
            *owner = v->items[k].rec;
            break;
        }
    }
    return -1;
}

/* Decode valid varint pieces into ``out`` (uint64); returns the number of values. */
static Py_ssize_t decode_varint_pieces(const record_set *rs, const piece_vec *v, uint64_t *out)
{
    Py_ssize_t m = 0;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        const unsigned char *p = rs->data[v->items[k].rec] + v->items[k].start;
        Py_ssize_t n = v->items[k].len, q = 0;
        while (q < n) {
            unsigned char byte = p[q++];
            uint64_t value = byte & 0x7F;
            int shift = 7;
            while (byte >= 0x80) { /* pieces were validated: terminated, <= 10 bytes */
                byte = p[q++];
                value |= (uint64_t)(byte & 0x7F) << shift;
                shift += 7;
            }
            out[m++] = value;
        }
    }
    return m;
}

/* One pass over a varint piece: how many varints it holds, and whether it is one that
 * check_varint_pieces would refuse (ends inside a varint, or holds one over 10 bytes). */
static int piece_scan(const unsigned char *p, Py_ssize_t n, Py_ssize_t *count)
{
    Py_ssize_t c = 0, run = 0;
    int bad = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int more = p[k] >= 0x80;
        c += !more;
        run = more ? run + 1 : 0;
        bad |= run >= WIRE_MAX_VARINT_BYTES;
    }
    *count = c;
    return bad | piece_ends_inside(p, n);
}

static Py_ssize_t varint_total(const record_set *rs, const piece_vec *v)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t k = 0; k < v->n; k++)
        total += piece_varint_count(rs->data[v->items[k].rec] + v->items[k].start, v->items[k].len);
    return total;
}

/* Concatenate fixed-width little-endian pieces into a new array of ``dtype``. */
static PyObject *fixed_values(const record_set *rs, const piece_vec *v, int width, const char *dtype)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t k = 0; k < v->n; k++)
        total += v->items[k].len;
    char *data;
    PyObject *ba = new_storage(total, &data);
    if (ba == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        memcpy(data, rs->data[v->items[k].rec] + v->items[k].start, v->items[k].len);
        data += v->items[k].len;
    }
    (void)width;
    PyObject *arr = array_from(ba, dtype); /* "<f4" / "<f8": the wire's byte order */
    Py_DECREF(ba);
#if PY_BIG_ENDIAN
    if (arr != NULL) { /* the references hand out native-order arrays */
        PyObject *native = PyObject_CallMethod(arr, "astype", "s", width == 4 ? "=f4" : "=f8");
        Py_DECREF(arr);
        arr = native;
    }
#endif
    return arr;
}

static PyObject *bytes_values(const record_set *rs, const piece_vec *v)
{
    PyObject *list = PyList_New(v->n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        PyObject *item = PyBytes_FromStringAndSize(
            (const char *)rs->data[v->items[k].rec] + v->items[k].start, v->items[k].len);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, k, item);
    }
    return list;
}

/* varint pieces -> (validated) array of ``dtype`` ("=i8" int64 or "=u8" uint64). ``total``: their
 * number of varints if the caller counted them, else -1. */
static PyObject *varint_values(const record_set *rs, const piece_vec *v, const char *dtype,
                               Py_ssize_t total)
{
    Py_ssize_t nbytes;
    char *data;
    if (total < 0)
        total = varint_total(rs, v);
    if (checked_mul(total, 8, &nbytes) < 0)
        return NULL;
    PyObject *ba = new_storage(nbytes, &data);
    if (ba == NULL)
        return NULL;
    /* a bytearray's storage is malloc'ed: aligned for uint64_t */
    decode_varint_pieces(rs, v, (uint64_t *)data);
    PyObject *arr = array_from(ba, dtype);
    Py_DECREF(ba);
    return arr;
}

/* ---------------------------------------------------------------------------------------------
 * parse_examples: tf.train.Example records -> flat values per feature + counts
 *
 * Example { Features features = 1; }  Features { map<string, Feature> feature = 1; }
 * Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
 *                        Int64List int64_list = 3; } }
 * BytesList/FloatList/Int64List { repeated ... value = 1 (packed for numbers); }
 * Same results and errors as streamio.decoders.example.parse_examples (the reference).
 * ------------------------------------------------------------------------------------------- */

#define KIND_BYTES 1
#define KIND_FLOAT 2
#define KIND_INT64 3
static const char *const example_kind_names[] = {"no value list", "bytes_list", "float_list",
                                                 "int64_list"};

/* The oneof kind set last in a Feature (spans merged) and the spans of its value list. */
static int feature_kind(const unsigned char *b, const span *spans, Py_ssize_t nspans, int *kind,
                        span_vec *lists, wire_err *err)
{
    *kind = 0;
    lists->n = 0;
    for (Py_ssize_t s = 0; s < nspans; s++) {
        Py_ssize_t pos = spans[s].start, end = spans[s].stop;
        while (pos < end) {
            uint64_t tag;
            Py_ssize_t start, stop;
            if (rd_tag(b, &pos, end, &tag, err) < 0)
                return -1;
            if (tag == 0x0A || tag == 0x12 || tag == 0x1A) {
                if (rd_len(b, pos, end, &start, &stop, err) < 0)
                    return -1;
                pos = stop;
                if ((int)(tag >> 3) != *kind) { /* switching the oneof discards the earlier list */
                    *kind = (int)(tag >> 3);
                    lists->n = 0;
                }
                if (sv_push(lists, start, stop) < 0)
                    return -2;
            } else if (skip_value(b, tag, &pos, end, 0, err) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* The value bytes of a BytesList / FloatList / Int64List, appended to ``out`` for record i;
 * *count gets the number of values (bytes: pieces, floats: bytes / 4, int64: varints). */
static int list_values(const unsigned char *b, int kind, const span_vec *lists, Py_ssize_t rec,
                       piece_vec *out, int64_t *count, wire_err *err)
{
    for (Py_ssize_t s = 0; s < lists->n; s++) {
        Py_ssize_t pos = lists->items[s].start, end = lists->items[s].stop;
        while (pos < end) {
            uint64_t tag, scratch;
            Py_ssize_t start, stop;
            if (rd_tag(b, &pos, end, &tag, err) < 0)
                return -1;
            if (tag == 0x0A) { /* packed numbers, or one bytes value */
                if (rd_len(b, pos, end, &start, &stop, err) < 0)
                    return -1;
                pos = stop;
                if (kind == KIND_FLOAT && ((stop - start) & 3))
                    return wire_fail(err, "packed float list is not a multiple of 4 bytes");
            } else if (tag == 0x0D && kind == KIND_FLOAT) { /* one unpacked float */
                if (4 > end - pos)
                    return wire_fail(err, "truncated float");
                start = pos;
                stop = pos = pos + 4;
            } else if (tag == 0x08 && kind == KIND_INT64) { /* one unpacked varint */
                start = pos;
                if (rd_varint(b, &pos, end, &scratch, err) < 0)
                    return -1;
                stop = pos;
            } else {
                if (skip_value(b, tag, &pos, end, 0, err) < 0)
                    return -1;
                continue;
            }
            if (pv_push(out, rec, start, stop - start) < 0)
                return -2;
            if (kind == KIND_FLOAT)
                *count += (stop - start) >> 2;
            else if (kind == KIND_INT64)
                *count += piece_varint_count(b + start, stop - start);
            else
                *count += 1;
        }
    }
    return 0;
}

PyDoc_STRVAR(parse_examples_doc,
"parse_examples(records, names, kinds) -> (values, counts)\n\n"
"Parse serialized tf.train.Example records; same results and errors as\n"
"streamio.decoders.example.parse_examples (the reference).");

static PyObject *field_name(PyObject *name)
{
    return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), "replace");
}

static PyObject *py_parse_examples(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"records", "names", "kinds", NULL};
    PyObject *records, *names_obj, *kinds_obj;
    PyObject *names_seq = NULL, *kinds_seq = NULL, *values = NULL, *result = NULL;
    record_set rs;
    name_index ix;
    found_set found;
    span_vec top = {0}, lists = {0};
    piece_vec *pieces = NULL;
    int *kinds = NULL;
    int64_t *counts = NULL;
    wire_err err;
    Py_ssize_t nf = 0, nrec, bad_i = -1, bad_j = -1;
    int have_rs = 0, have_ix = 0, have_found = 0, release = 0, bad_rc = 0;
    PyThreadState *tstate = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:parse_examples", kwlist, &records,
                                     &names_obj, &kinds_obj))
        return NULL;
    /* Tuples of our own: converting a kind may run Python code (__index__) that changes the
     * caller's lists; what we read must stay alive regardless. */
    names_seq = PySequence_Tuple(names_obj);
    if (names_seq == NULL)
        goto done;
    kinds_seq = PySequence_Tuple(kinds_obj);
    if (kinds_seq == NULL)
        goto done;
    nf = PyTuple_GET_SIZE(names_seq);
    if (PyTuple_GET_SIZE(kinds_seq) != nf) {
        PyErr_SetString(PyExc_ValueError, "names and kinds must have the same length");
        goto done;
    }
    /* The records too, before any conversion below can run Python code. */
    if (records_acquire(records, &rs) < 0)
        goto done;
    have_rs = 1;
    kinds = alloc_items(nf, sizeof(int));
    pieces = kinds ? PyMem_Calloc(nf ? nf : 1, sizeof(piece_vec)) : NULL;
    if (pieces == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < nf; j++) {
        long k = PyLong_AsLong(PyTuple_GET_ITEM(kinds_seq, j));
        if (k == -1 && PyErr_Occurred())
            goto done;
        if (k < KIND_BYTES || k > KIND_INT64) {
            PyErr_Format(PyExc_ValueError, "kinds must be 1 (bytes), 2 (float) or 3 (int64), not %ld", k);
            goto done;
        }
        kinds[j] = (int)k;
    }
    if (names_build(&ix, &PyTuple_GET_ITEM(names_seq, 0), nf) < 0)
        goto done;
    have_ix = 1;
    if (found_init(&found, nf) < 0)
        goto done;
    have_found = 1;
    nrec = rs.n;
    Py_ssize_t ncounts;
    if (checked_mul(nrec, nf, &ncounts) < 0)
        goto done;
    counts = alloc_items(ncounts, sizeof(int64_t));
    if (counts == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < ncounts; k++)
        counts[k] = -1;

    /* Everything is ours from here on (records and names held by tuples): no Python code. */
    release = nrec >= GIL_RELEASE_MIN_RECORDS;
    if (release)
        tstate = PyEval_SaveThread();
    /* No Python API in this loop (it may run without the GIL): a failure stops it with
     * (bad_rc, bad_i, bad_j), and the error is raised below, with the GIL held again. */
    for (Py_ssize_t i = 0; i < nrec; i++) {
        const unsigned char *b = rs.data[i];
        Py_ssize_t end = rs.len[i], pos = 0, j = -1;
        if (i + PREFETCH_AHEAD < nrec)
            prefetch_record(&rs, i + PREFETCH_AHEAD);
        int rc = 0;
        top.n = 0;
        found.pool.n = 0;
        found.norder = 0;
        /* Top level: the spans of every Example.features (field 1) occurrence, merged. */
        while (pos < end) {
            uint64_t tag;
            Py_ssize_t start, stop;
            if ((rc = rd_tag(b, &pos, end, &tag, &err)) < 0)
                break;
            if (tag == 0x0A) {
                if ((rc = rd_len(b, pos, end, &start, &stop, &err)) < 0)
                    break;
                pos = stop;
                if (sv_push(&top, start, stop) < 0) {
                    rc = -2;
                    break;
                }
            } else if ((rc = skip_value(b, tag, &pos, end, 0, &err)) < 0) {
                break;
            }
        }
        if (rc == 0)
            rc = collect_entries(b, top.items, top.n, &ix, NULL, &found, i + 1, &err);
        for (Py_ssize_t o = 0; rc == 0 && o < found.norder; o++) {
            int kind;
            j = found.order[o];
            rc = feature_kind(b, found_spans(&found, j), found.count[j], &kind, &lists, &err);
            if (rc < 0 || kind == 0) /* an empty Feature is a missing one */
                continue;
            if (kind != kinds[j]) {
                snprintf(err.msg, sizeof(err.msg), "feature holds a %s, expected a %s",
                         example_kind_names[kind], example_kind_names[kinds[j]]);
                rc = -1;
                break;
            }
            int64_t count = 0;
            rc = list_values(b, kind, &lists, i, &pieces[j], &count, &err);
            counts[i * nf + j] = count;
        }
        if (rc < 0) {
            bad_rc = rc;
            bad_i = i;
            bad_j = j;
            break;
        }
    }
    if (tstate != NULL) {
        PyEval_RestoreThread(tstate);
        tstate = NULL;
    }
    if (bad_rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    if (bad_rc < 0) {
        PyObject *field = bad_j >= 0 ? field_name(PyTuple_GET_ITEM(names_seq, bad_j)) : NULL;
        if (bad_j < 0 || field != NULL)
            raise_wire_error(err.msg, bad_i, field);
        Py_XDECREF(field);
        goto done;
    }

    values = PyList_New(nf);
    if (values == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < nf; j++) {
        PyObject *flat;
        if (kinds[j] == KIND_FLOAT) {
            flat = fixed_values(&rs, &pieces[j], 4, "<f4");
        } else if (kinds[j] == KIND_INT64) {
            const char *message;
            Py_ssize_t owner;
            if (check_varint_pieces(&rs, &pieces[j], &message, &owner) < 0) {
                PyObject *field = field_name(PyTuple_GET_ITEM(names_seq, j));
                if (field != NULL)
                    raise_wire_error(message, owner, field);
                Py_XDECREF(field);
                goto done;
            }
            flat = varint_values(&rs, &pieces[j], "=i8", -1);
        } else {
            flat = bytes_values(&rs, &pieces[j]);
        }
        if (flat == NULL)
            goto done;
        PyList_SET_ITEM(values, j, flat);
    }
    {
        PyObject *matrix = int64_matrix(counts, nrec, nf);
        if (matrix == NULL)
            goto done;
        result = PyTuple_Pack(2, values, matrix);
        Py_DECREF(matrix);
    }
done:
    if (pieces) {
        for (Py_ssize_t j = 0; j < nf; j++)
            PyMem_RawFree(pieces[j].items);
        PyMem_Free(pieces);
    }
    PyMem_RawFree(top.items);
    PyMem_RawFree(lists.items);
    PyMem_Free(kinds);
    PyMem_Free(counts);
    if (have_found)
        found_release(&found);
    if (have_rs)
        records_release(&rs);
    if (have_ix)
        names_release(&ix);
    Py_XDECREF(values);
    Py_XDECREF(names_seq);
    Py_XDECREF(kinds_seq);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * parse_sequence_examples: tf.train.SequenceExample records -> context values + counts, and for
 * each feature list the flat values of all steps, the steps per record and the values per step
 *
 * SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
 * FeatureLists { map<string, FeatureList> feature_list = 1; }
 * FeatureList { repeated Feature feature = 1; }   (one Feature per step)
 * Same results and errors as streamio.decoders.example.parse_sequence_examples (the reference).
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    int64_t *items;
    Py_ssize_t n, cap;
} i64_vec;

static int iv_push(i64_vec *v, int64_t x)
{
    if (v->n == v->cap) {
        Py_ssize_t cap = grown_capacity(v->cap, sizeof(int64_t), 64);
        int64_t *items = cap < 0 ? NULL : PyMem_RawRealloc(v->items, (size_t)cap * sizeof(int64_t));
        if (items == NULL)
            return -1; /* the caller sets MemoryError once it holds the GIL again */
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n++] = x;
    return 0;
}

/* One half of a SequenceExample: the context features or the feature lists. */
typedef struct {
    Py_ssize_t n;
    PyObject *names; /* tuple of bytes, ours */
    int *kinds;
    name_index ix;
    found_set found;
    piece_vec *pieces; /* per feature; piece.rec is the record (for the bytes and for errors) */
    i64_vec *steps;    /* feature lists: values in each step, over the batch */
    int64_t *counts;   /* (records, n): context values / feature-list steps; -1 absent */
    /* int64 features: whether the pieces need check_varint_pieces (some came from the general
     * walker, or piece_scan flagged one) and, if not, how many varints they hold */
    char *vcheck;
    Py_ssize_t *vtotal;
    int have_ix, have_found;
} seq_half;

typedef struct {
    record_set rs;
    int have_rs;
    seq_half half[2]; /* 0: context, 1: feature lists */
    span_vec top[2], lists;
} seq_state;

static void seq_release(seq_state *st)
{
    for (int h = 0; h < 2; h++) {
        seq_half *s = &st->half[h];
        for (Py_ssize_t j = 0; s->pieces && j < s->n; j++)
            PyMem_RawFree(s->pieces[j].items);
        for (Py_ssize_t j = 0; s->steps && j < s->n; j++)
            PyMem_RawFree(s->steps[j].items);
        PyMem_Free(s->pieces);
        PyMem_Free(s->steps);
        PyMem_Free(s->kinds);
        PyMem_Free(s->counts);
        PyMem_Free(s->vcheck);
        PyMem_Free(s->vtotal);
        if (s->have_ix)
            names_release(&s->ix);
        if (s->have_found)
            found_release(&s->found);
        Py_XDECREF(s->names);
        PyMem_RawFree(st->top[h].items);
    }
    PyMem_RawFree(st->lists.items);
    if (st->have_rs)
        records_release(&st->rs);
}

/* Kinds (1 bytes, 2 float, 3 int64) from a tuple of ints; 0 or -1 with an exception set. */
static int example_kinds(PyObject *kinds_seq, int *kinds)
{
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(kinds_seq); j++) {
        long k = PyLong_AsLong(PyTuple_GET_ITEM(kinds_seq, j));
        if (k == -1 && PyErr_Occurred())
            return -1;
        if (k < KIND_BYTES || k > KIND_INT64) {
            PyErr_Format(PyExc_ValueError, "kinds must be 1 (bytes), 2 (float) or 3 (int64), not %ld", k);
            return -1;
        }
        kinds[j] = (int)k;
    }
    return 0;
}

/* Set up one half from the caller's names and kinds. ``kinds_seq`` is a tuple of our own; the
 * kinds are converted (which may run Python code) only after the records were acquired. */
static int seq_half_init(seq_half *s, PyObject *kinds_seq, Py_ssize_t nrec, int steps)
{
    Py_ssize_t ncounts;
    s->n = PyTuple_GET_SIZE(s->names);
    if (PyTuple_GET_SIZE(kinds_seq) != s->n) {
        PyErr_SetString(PyExc_ValueError, "names and kinds must have the same length");
        return -1;
    }
    s->kinds = alloc_items(s->n, sizeof(int));
    s->pieces = s->kinds ? PyMem_Calloc(s->n ? s->n : 1, sizeof(piece_vec)) : NULL;
    s->steps = s->pieces && steps ? PyMem_Calloc(s->n ? s->n : 1, sizeof(i64_vec)) : NULL;
    s->vcheck = s->pieces ? PyMem_Calloc(s->n ? s->n : 1, 1) : NULL;
    s->vtotal = s->vcheck ? PyMem_Calloc(s->n ? s->n : 1, sizeof(Py_ssize_t)) : NULL;
    if (s->vtotal == NULL || (steps && s->steps == NULL)) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    if (example_kinds(kinds_seq, s->kinds) < 0)
        return -1;
    if (names_build(&s->ix, &PyTuple_GET_ITEM(s->names, 0), s->n) < 0)
        return -1;
    s->have_ix = 1;
    if (found_init(&s->found, s->n) < 0)
        return -1;
    s->have_found = 1;
    if (checked_mul(nrec, s->n, &ncounts) < 0)
        return -1;
    s->counts = alloc_items(ncounts, sizeof(int64_t));
    if (s->counts == NULL)
        return -1;
    for (Py_ssize_t k = 0; k < ncounts; k++)
        s->counts[k] = -1;
    return 0;
}

/* The spans of every SequenceExample.context (field 1) and .feature_lists (field 2), merged. */
static int seq_top_level(const unsigned char *b, Py_ssize_t end, span_vec top[2], wire_err *err)
{
    Py_ssize_t pos = 0;
    top[0].n = top[1].n = 0;
    while (pos < end) {
        uint64_t tag;
        Py_ssize_t start, stop;
        if (rd_tag(b, &pos, end, &tag, err) < 0)
            return -1;
        if (tag == 0x0A || tag == 0x12) {
            if (rd_len(b, pos, end, &start, &stop, err) < 0)
                return -1;
            pos = stop;
            if (sv_push(&top[tag == 0x12], start, stop) < 0)
                return -2;
        } else if (skip_value(b, tag, &pos, end, 0, err) < 0) {
            return -1;
        }
    }
    return 0;
}

static int kind_mismatch(int kind, int want, wire_err *err)
{
    snprintf(err->msg, sizeof(err->msg), "feature holds a %s, expected a %s",
             example_kind_names[kind], example_kind_names[want]);
    return -1;
}

/* The context features of record i, as parse_examples reads an Example's features. */
static int seq_context(const unsigned char *b, Py_ssize_t i, seq_state *st, Py_ssize_t *bad_j,
                       wire_err *err)
{
    seq_half *s = &st->half[0];
    s->found.pool.n = 0;
    s->found.norder = 0;
    int rc = collect_entries(b, st->top[0].items, st->top[0].n, &s->ix, NULL, &s->found, i + 1, err);
    for (Py_ssize_t o = 0; rc == 0 && o < s->found.norder; o++) {
        int kind;
        Py_ssize_t j = *bad_j = s->found.order[o];
        rc = feature_kind(b, found_spans(&s->found, j), s->found.count[j], &kind, &st->lists, err);
        if (rc < 0 || kind == 0) /* an empty Feature is a missing one */
            continue;
        if (kind != s->kinds[j])
            return kind_mismatch(kind, s->kinds[j], err);
        int64_t count = 0;
        rc = list_values(b, kind, &st->lists, i, &s->pieces[j], &count, err);
        s->counts[i * s->n + j] = count;
        s->vcheck[j] = 1;
    }
    return rc;
}

/* A step as every writer emits it: Feature { <kind> = { value = 1: packed bytes } }, both
 * lengths one byte, nothing else. Then the general walkers (feature_kind, list_values) would
 * find ``kind`` and the one piece [*start, end): 1 and those, else 0 (the caller walks it). */
static inline int plain_step(const unsigned char *b, Py_ssize_t s, Py_ssize_t e, int *kind,
                             Py_ssize_t *start)
{
    if (e - s < 4 || (b[s] != 0x0A && b[s] != 0x12 && b[s] != 0x1A))
        return 0;
    if (b[s + 1] >= 0x80 || b[s + 1] != e - s - 2 || b[s + 2] != 0x0A || b[s + 3] != e - s - 4)
        return 0;
    if (b[s] == 0x12 && ((e - s - 4) & 3)) /* not whole floats: the walker words the error */
        return 0;
    *kind = b[s] >> 3;
    *start = s + 4;
    return 1;
}

/* The values of one step [s, e) of feature list j of record i: pieces and their count. */
static int seq_step(const unsigned char *b, Py_ssize_t i, Py_ssize_t j, Py_ssize_t s,
                    Py_ssize_t e, seq_state *st, wire_err *err)
{
    seq_half *h = &st->half[1];
    span step = {s, e};
    int kind, rc;
    int64_t count = 0;
    Py_ssize_t start;
    if (plain_step(b, s, e, &kind, &start)) {
        if (kind != h->kinds[j])
            return kind_mismatch(kind, h->kinds[j], err);
        if (pv_push(&h->pieces[j], i, start, e - start) < 0)
            return -2;
        if (kind == KIND_FLOAT) {
            count = (e - start) >> 2;
        } else if (kind == KIND_BYTES) {
            count = 1;
        } else {
            Py_ssize_t c;
            h->vcheck[j] |= piece_scan(b + start, e - start, &c);
            h->vtotal[j] += c;
            count = c;
        }
    } else {
        if ((rc = feature_kind(b, &step, 1, &kind, &st->lists, err)) < 0)
            return rc;
        if (kind != h->kinds[j] && kind != 0)
            return kind_mismatch(kind, h->kinds[j], err);
        if ((rc = list_values(b, kind, &st->lists, i, &h->pieces[j], &count, err)) < 0)
            return rc;
        h->vcheck[j] = 1;
    }
    return iv_push(&h->steps[j], count) < 0 ? -2 : 0;
}

/* The steps of feature list j in record i: each Feature of the FeatureList is one step (an
 * empty Feature a step of no values); non-Feature fields are skipped. */
static int seq_steps(const unsigned char *b, Py_ssize_t i, Py_ssize_t j, seq_state *st,
                     wire_err *err)
{
    seq_half *s = &st->half[1];
    const span *spans = found_spans(&s->found, j);
    int64_t steps = 0;
    for (Py_ssize_t k = 0; k < s->found.count[j]; k++) {
        Py_ssize_t pos = spans[k].start, end = spans[k].stop;
        while (pos < end) {
            uint64_t tag;
            Py_ssize_t start, stop;
            int rc;
            if (rd_tag(b, &pos, end, &tag, err) < 0)
                return -1;
            if (tag != 0x0A) {
                if (skip_value(b, tag, &pos, end, 0, err) < 0)
                    return -1;
                continue;
            }
            if (rd_len(b, pos, end, &start, &stop, err) < 0)
                return -1;
            pos = stop;
            if ((rc = seq_step(b, i, j, start, stop, st, err)) < 0)
                return rc;
            steps++;
        }
    }
    s->counts[i * s->n + j] = steps;
    return 0;
}

/* Record i; on failure *half_of / *bad_j say which feature (-1: none) the error names. */
static int seq_record(seq_state *st, Py_ssize_t i, int *half_of, Py_ssize_t *bad_j, wire_err *err)
{
    const unsigned char *b = st->rs.data[i];
    seq_half *s = &st->half[1];
    *half_of = 0;
    *bad_j = -1;
    int rc = seq_top_level(b, st->rs.len[i], st->top, err);
    if (rc == 0)
        rc = seq_context(b, i, st, bad_j, err);
    if (rc < 0)
        return rc;
    *half_of = 1;
    *bad_j = -1;
    s->found.pool.n = 0;
    s->found.norder = 0;
    rc = collect_entries(b, st->top[1].items, st->top[1].n, &s->ix, NULL, &s->found, i + 1, err);
    for (Py_ssize_t o = 0; rc == 0 && o < s->found.norder; o++) {
        *bad_j = s->found.order[o];
        rc = seq_steps(b, i, *bad_j, st, err);
    }
    return rc;
}

/* The flat values of feature j of a half (checked as parse_examples checks them); NULL with an
 * exception set (a WireError naming the first record whose varints do not decode). */
static PyObject *seq_values(const seq_state *st, const seq_half *s, Py_ssize_t j)
{
    const piece_vec *v = &s->pieces[j];
    if (s->kinds[j] == KIND_FLOAT)
        return fixed_values(&st->rs, v, 4, "<f4");
    if (s->kinds[j] == KIND_BYTES)
        return bytes_values(&st->rs, v);
    const char *message;
    Py_ssize_t owner;
    if (!s->vcheck[j]) /* every piece scanned, none flagged, and counted */
        return varint_values(&st->rs, v, "=i8", s->vtotal[j]);
    if (check_varint_pieces(&st->rs, v, &message, &owner) < 0) {
        PyObject *field = field_name(PyTuple_GET_ITEM(s->names, j));
        if (field != NULL)
            raise_wire_error(message, owner, field);
        Py_XDECREF(field);
        return NULL;
    }
    return varint_values(&st->rs, v, "=i8", -1);
}

/* An int64 array of the n values at ``items`` (NULL allowed when n is 0). */
static PyObject *int64_array(const int64_t *items, Py_ssize_t n)
{
    char *data;
    Py_ssize_t nbytes;
    if (checked_mul(n, 8, &nbytes) < 0)
        return NULL;
    PyObject *ba = new_storage(nbytes, &data);
    if (ba == NULL)
        return NULL;
    if (nbytes > 0)
        memcpy(data, items, (size_t)nbytes);
    PyObject *arr = array_from(ba, "=i8");
    Py_DECREF(ba);
    return arr;
}

/* (context values, context counts, sequence values, steps, step counts) once every record
 * parsed; NULL with an exception set. Context errors come first, as in the reference. */
static PyObject *seq_results(const seq_state *st)
{
    PyObject *lists[3] = {PyList_New(st->half[0].n), PyList_New(st->half[1].n),
                          PyList_New(st->half[1].n)};
    PyObject *m[2] = {NULL, NULL}, *result = NULL;
    int ok = lists[0] && lists[1] && lists[2];
    for (int h = 0; ok && h < 2; h++) {
        for (Py_ssize_t j = 0; ok && j < st->half[h].n; j++) {
            PyObject *flat = seq_values(st, &st->half[h], j);
            ok = flat != NULL;
            if (ok)
                PyList_SET_ITEM(lists[h], j, flat);
        }
    }
    for (Py_ssize_t j = 0; ok && j < st->half[1].n; j++) {
        PyObject *per_step = int64_array(st->half[1].steps[j].items, st->half[1].steps[j].n);
        ok = per_step != NULL;
        if (ok)
            PyList_SET_ITEM(lists[2], j, per_step);
    }
    for (int h = 0; ok && h < 2; h++) {
        m[h] = int64_matrix(st->half[h].counts, st->rs.n, st->half[h].n);
        ok = m[h] != NULL;
    }
    if (ok)
        result = PyTuple_Pack(5, lists[0], m[0], lists[1], m[1], lists[2]);
    for (int k = 0; k < 3; k++)
        Py_XDECREF(lists[k]);
    Py_XDECREF(m[0]);
    Py_XDECREF(m[1]);
    return result;
}

/* Parse every record (without the GIL for large batches); NULL with an exception set. */
static PyObject *seq_parse(seq_state *st)
{
    Py_ssize_t nrec = st->rs.n, bad_i = -1, bad_j = -1;
    int rc = 0, half_of = 0;
    PyThreadState *tstate = nrec >= GIL_RELEASE_MIN_RECORDS ? PyEval_SaveThread() : NULL;
    wire_err err;
    /* No Python API in this loop: a failure stops it, and is raised below with the GIL. */
    for (Py_ssize_t i = 0; i < nrec; i++) {
        if (i + PREFETCH_AHEAD < nrec)
            prefetch_record(&st->rs, i + PREFETCH_AHEAD);
        if ((rc = seq_record(st, i, &half_of, &bad_j, &err)) < 0) {
            bad_i = i;
            break;
        }
    }
    if (tstate != NULL)
        PyEval_RestoreThread(tstate);
    if (rc == -2)
        return PyErr_NoMemory();
    if (rc < 0) {
        PyObject *field = bad_j >= 0
            ? field_name(PyTuple_GET_ITEM(st->half[half_of].names, bad_j)) : NULL;
        if (bad_j < 0 || field != NULL)
            raise_wire_error(err.msg, bad_i, field);
        Py_XDECREF(field);
        return NULL;
    }
    return seq_results(st);
}

PyDoc_STRVAR(parse_sequence_examples_doc,
"parse_sequence_examples(records, context_names, context_kinds, sequence_names, sequence_kinds)\n"
"    -> (context_values, context_counts, sequence_values, sequence_steps, step_counts)\n\n"
"Parse serialized tf.train.SequenceExample records; same results and errors as\n"
"streamio.decoders.example.parse_sequence_examples (the reference).");

static PyObject *py_parse_sequence_examples(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"records", "context_names", "context_kinds", "sequence_names",
                             "sequence_kinds", NULL};
    PyObject *records, *names[2], *kinds[2], *kinds_seq[2] = {NULL, NULL}, *result = NULL;
    seq_state st;
    memset(&st, 0, sizeof(st));
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:parse_sequence_examples", kwlist,
                                     &records, &names[0], &kinds[0], &names[1], &kinds[1]))
        return NULL;
    /* Tuples of our own, and the records, before converting a kind (__index__ may run Python
     * code that changes the caller's lists). */
    for (int h = 0; h < 2; h++) {
        if ((st.half[h].names = PySequence_Tuple(names[h])) == NULL
            || (kinds_seq[h] = PySequence_Tuple(kinds[h])) == NULL)
            goto done;
    }
    if (records_acquire(records, &st.rs) < 0)
        goto done;
    st.have_rs = 1;
    for (int h = 0; h < 2; h++) {
        if (seq_half_init(&st.half[h], kinds_seq[h], st.rs.n, h == 1) < 0)
            goto done;
    }
    result = seq_parse(&st);
done:
    seq_release(&st);
    Py_XDECREF(kinds_seq[0]);
    Py_XDECREF(kinds_seq[1]);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * parse_recordio_protobuf: SageMaker aialgs.data.Record payloads -> flat tensors + counts
 *
 * Record { map<string, Value> features = 1; map<string, Value> label = 2; ... }
 * Value { oneof { Float32Tensor float32_tensor = 2; Float64Tensor float64_tensor = 3;
 *                 Int32Tensor int32_tensor = 7; Bytes bytes = 9; } }
 * XTensor { repeated values = 1 [packed]; repeated uint64 keys = 2 [packed];
 *           repeated uint64 shape = 3 [packed]; }   Bytes { repeated bytes value = 1; ... }
 * Same results and errors as streamio.decoders.recordio_protobuf.parse_recordio_protobuf.
 * ------------------------------------------------------------------------------------------- */

#define RKIND_FLOAT32 2
#define RKIND_FLOAT64 3
#define RKIND_INT32 7
#define RKIND_BYTES 9

static const char *rkind_name(int kind)
{
    switch (kind) {
    case RKIND_FLOAT32: return "float32_tensor";
    case RKIND_FLOAT64: return "float64_tensor";
    case RKIND_INT32: return "int32_tensor";
    default: return "bytes";
    }
}

static int value_tag_kind(uint64_t tag)
{
    switch (tag) {
    case 0x12: return RKIND_FLOAT32;
    case 0x1A: return RKIND_FLOAT64;
    case 0x3A: return RKIND_INT32;
    case 0x4A: return RKIND_BYTES;
    default: return 0;
    }
}

/* The oneof kind set last in a Value (spans merged) and the spans of its tensor message(s). */
static int value_kind(const unsigned char *b, const span *spans, Py_ssize_t nspans, int *kind,
                      span_vec *tensors, wire_err *err)
{
    *kind = 0;
    tensors->n = 0;
    for (Py_ssize_t s = 0; s < nspans; s++) {
        Py_ssize_t pos = spans[s].start, end = spans[s].stop;
        while (pos < end) {
            uint64_t tag;
            Py_ssize_t start, stop;
            if (rd_tag(b, &pos, end, &tag, err) < 0)
                return -1;
            int found = value_tag_kind(tag);
            if (found) {
                if (rd_len(b, pos, end, &start, &stop, err) < 0)
                    return -1;
                pos = stop;
                if (found != *kind) { /* switching the oneof discards the earlier tensor */
                    *kind = found;
                    tensors->n = 0;
                }
                if (sv_push(tensors, start, stop) < 0)
                    return -2;
            } else if (skip_value(b, tag, &pos, end, 0, err) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* The three streams of one tensor: 0 values, 1 keys, 2 shape. */
typedef struct {
    piece_vec stream[3];
    Py_ssize_t total[3]; /* varints in each varint stream, counted as the pieces are found */
    int bad[3];          /* a piece of that stream fails check_varint_pieces: report it later */
} tensor_pieces;

/* A tensor's values, keys and shape pieces for record ``rec``, counting as it goes. The pieces
 * are appended only once the whole tensor parsed (as the reference collects spans first). */
static int tensor_values(const unsigned char *b, int kind, const span_vec *tensors, Py_ssize_t rec,
                         tensor_pieces *out, int64_t counts[3], wire_err *err)
{
    for (Py_ssize_t s = 0; s < tensors->n; s++) {
        Py_ssize_t pos = tensors->items[s].start, end = tensors->items[s].stop;
        while (pos < end) {
            uint64_t tag, scratch;
            Py_ssize_t start, stop;
            int stream;
            if (rd_tag(b, &pos, end, &tag, err) < 0)
                return -1;
            if (tag == 0x0A) { /* values: packed numbers, or one Bytes value */
                if (rd_len(b, pos, end, &start, &stop, err) < 0)
                    return -1;
                pos = stop;
                if (kind == RKIND_FLOAT32 && ((stop - start) & 3))
                    return wire_fail(err, "packed float32 values are not a multiple of 4 bytes");
                if (kind == RKIND_FLOAT64 && ((stop - start) & 7))
                    return wire_fail(err, "packed float64 values are not a multiple of 8 bytes");
                stream = 0;
            } else if (kind == RKIND_BYTES) { /* content_type and unknown fields */
                if (skip_value(b, tag, &pos, end, 0, err) < 0)
                    return -1;
                continue;
            } else if (tag == 0x12 || tag == 0x1A) { /* keys / shape, packed */
                if (rd_len(b, pos, end, &start, &stop, err) < 0)
                    return -1;
                pos = stop;
                stream = tag == 0x12 ? 1 : 2;
            } else if (tag == 0x0D && kind == RKIND_FLOAT32) {
                if (4 > end - pos)
                    return wire_fail(err, "truncated float32 value");
                start = pos;
                stop = pos = pos + 4;
                stream = 0;
            } else if (tag == 0x09 && kind == RKIND_FLOAT64) {
                if (8 > end - pos)
                    return wire_fail(err, "truncated float64 value");
                start = pos;
                stop = pos = pos + 8;
                stream = 0;
            } else if ((tag == 0x08 && kind == RKIND_INT32) || tag == 0x10 || tag == 0x18) {
                start = pos; /* one unpacked varint: an int32 value, a key, a dimension */
                if (rd_varint(b, &pos, end, &scratch, err) < 0)
                    return -1;
                stop = pos;
                stream = tag == 0x08 ? 0 : (tag == 0x10 ? 1 : 2);
            } else {
                if (skip_value(b, tag, &pos, end, 0, err) < 0)
                    return -1;
                continue;
            }
            if (pv_push(&out->stream[stream], rec, start, stop - start) < 0)
                return -2;
            if (stream == 0 && kind == RKIND_BYTES)
                counts[0] += 1;
            else if (stream == 0 && kind == RKIND_FLOAT32)
                counts[0] += (stop - start) >> 2;
            else if (stream == 0 && kind == RKIND_FLOAT64)
                counts[0] += (stop - start) >> 3;
            else {
                Py_ssize_t c;
                out->bad[stream] |= piece_scan(b + start, stop - start, &c);
                out->total[stream] += c;
                counts[stream] += c;
            }
        }
    }
    return 0;
}

/* The record the reference's _first_bad_owner names: for each varint stream (the values only for
 * int32 tensors; keys; shape) the first piece that does not decode as packed varints on its own,
 * the smallest of their records. */
static Py_ssize_t first_bad_owner(const record_set *rs, const tensor_pieces *t, int kind)
{
    Py_ssize_t best = -1;
    for (int st = kind == RKIND_INT32 ? 0 : 1; st < 3; st++) {
        const piece_vec *v = &t->stream[st];
        for (Py_ssize_t k = 0; k < v->n; k++) {
            const unsigned char *p = rs->data[v->items[k].rec] + v->items[k].start;
            if (piece_ends_inside(p, v->items[k].len) || piece_has_long_varint(p, v->items[k].len)) {
                if (best < 0 || v->items[k].rec < best)
                    best = v->items[k].rec;
                break;
            }
        }
    }
    return best;
}

static PyObject *recordio_field_name(PyObject *name_tuple)
{
    PyObject *key = PyTuple_GET_ITEM(name_tuple, 1);
    long section = PyLong_AsLong(PyTuple_GET_ITEM(name_tuple, 0));
    if (section == -1 && PyErr_Occurred())
        return NULL;
    PyObject *text = field_name(key);
    if (text == NULL || section != 2)
        return text;
    PyObject *out = PyUnicode_FromFormat("label_%U", text);
    Py_DECREF(text);
    return out;
}

/* Split names by section: features (1) and label (2) keys are looked up separately, each
 * index mapping back to the caller's position j. Checks names and kinds; 0 or -1 with an
 * exception set (ix[] then needs no release). */
static int section_names(PyObject *names_seq, PyObject *kinds_seq, Py_ssize_t nf, int *kinds,
                         name_index ix[2])
{
    int have_ix = 0;
    PyObject **by_section[2];
    Py_ssize_t n_in[2] = {0, 0}, *ids[2];
    for (int sct = 0; sct < 2; sct++) {
        by_section[sct] = PyMem_Calloc(nf ? nf : 1, sizeof(PyObject *));
        ids[sct] = PyMem_Calloc(nf ? nf : 1, sizeof(Py_ssize_t));
    }
    int ok = by_section[0] && by_section[1] && ids[0] && ids[1];
    if (!ok)
        PyErr_NoMemory();
    for (Py_ssize_t j = 0; ok && j < nf; j++) {
        PyObject *name = PyTuple_GET_ITEM(names_seq, j);
        long section = -1, k;
        if (PyTuple_Check(name) && PyTuple_GET_SIZE(name) == 2) {
            section = PyLong_AsLong(PyTuple_GET_ITEM(name, 0));
            if (section == -1 && PyErr_Occurred())
                PyErr_Clear();
        }
        if ((section != 1 && section != 2) || !PyBytes_Check(PyTuple_GET_ITEM(name, 1))) {
            PyErr_SetString(PyExc_TypeError, "names must be (section 1 or 2, key bytes) tuples");
            ok = 0;
            break;
        }
        k = PyLong_AsLong(PyTuple_GET_ITEM(kinds_seq, j));
        if (k == -1 && PyErr_Occurred()) {
            ok = 0;
            break;
        }
        if (k != RKIND_FLOAT32 && k != RKIND_FLOAT64 && k != RKIND_INT32 && k != RKIND_BYTES) {
            PyErr_Format(PyExc_ValueError, "kinds must be 2, 3, 7 or 9, not %ld", k);
            ok = 0;
            break;
        }
        kinds[j] = (int)k;
        by_section[section - 1][n_in[section - 1]] = PyTuple_GET_ITEM(name, 1);
        ids[section - 1][n_in[section - 1]++] = j;
    }
    if (ok && names_build(&ix[0], by_section[0], n_in[0]) == 0) {
        if (names_build(&ix[1], by_section[1], n_in[1]) == 0) {
            have_ix = 1;
            ix[0].ids = ids[0];
            ix[1].ids = ids[1];
            ids[0] = ids[1] = NULL;
        } else {
            names_release(&ix[0]);
        }
    }
    PyMem_Free(by_section[0]);
    PyMem_Free(by_section[1]);
    PyMem_Free(ids[0]);
    PyMem_Free(ids[1]);
    return have_ix ? 0 : -1;
}

PyDoc_STRVAR(parse_recordio_protobuf_doc,
"parse_recordio_protobuf(records, names, kinds)\n"
"    -> (values, counts, keys, key_counts, shapes, shape_counts)\n\n"
"Parse aialgs.data.Record payloads; same results and errors as\n"
"streamio.decoders.recordio_protobuf.parse_recordio_protobuf (the reference).");

static PyObject *py_parse_recordio_protobuf(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"records", "names", "kinds", NULL};
    PyObject *records, *names_obj, *kinds_obj;
    PyObject *names_seq = NULL, *kinds_seq = NULL, *result = NULL;
    PyObject *lists[3] = {NULL, NULL, NULL};
    PyObject **keys = NULL;
    record_set rs;
    name_index ix[2];
    found_set found;
    span_vec tensors = {0};
    tensor_pieces *pieces = NULL;
    int *kinds = NULL;
    int64_t *counts[3] = {NULL, NULL, NULL};
    wire_err err;
    Py_ssize_t nf = 0, nrec, bad_i = -1, bad_j = -1;
    int have_rs = 0, have_ix = 0, have_found = 0, release = 0, bad_rc = 0;
    PyThreadState *tstate = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:parse_recordio_protobuf", kwlist, &records,
                                     &names_obj, &kinds_obj))
        return NULL;
    /* Tuples of our own, as in parse_examples: sections and kinds are converted with __index__,
     * which may run Python code that changes the caller's lists. */
    names_seq = PySequence_Tuple(names_obj);
    if (names_seq == NULL)
        goto done;
    kinds_seq = PySequence_Tuple(kinds_obj);
    if (kinds_seq == NULL)
        goto done;
    nf = PyTuple_GET_SIZE(names_seq);
    if (PyTuple_GET_SIZE(kinds_seq) != nf) {
        PyErr_SetString(PyExc_ValueError, "names and kinds must have the same length");
        goto done;
    }
    /* The records too, before any conversion below can run Python code. */
    if (records_acquire(records, &rs) < 0)
        goto done;
    have_rs = 1;
    kinds = alloc_items(nf, sizeof(int));
    pieces = kinds ? PyMem_Calloc(nf ? nf : 1, sizeof(tensor_pieces)) : NULL;
    keys = pieces ? PyMem_Calloc(nf ? nf : 1, sizeof(PyObject *)) : NULL;
    if (keys == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    if (section_names(names_seq, kinds_seq, nf, kinds, ix) < 0)
        goto done;
    have_ix = 1;
    if (found_init(&found, nf) < 0)
        goto done;
    have_found = 1;
    nrec = rs.n;
    Py_ssize_t ncounts;
    if (checked_mul(nrec, nf, &ncounts) < 0)
        goto done;
    for (int st = 0; st < 3; st++) {
        counts[st] = alloc_items(ncounts, sizeof(int64_t));
        if (counts[st] == NULL)
            goto done;
        for (Py_ssize_t k = 0; k < ncounts; k++)
            counts[st][k] = st == 0 ? -1 : 0;
    }

    /* Everything is ours from here on (records and names held by tuples): no Python code. */
    release = nrec >= GIL_RELEASE_MIN_RECORDS;
    if (release)
        tstate = PyEval_SaveThread();
    /* No Python API in this loop (it may run without the GIL): see parse_examples. */
    for (Py_ssize_t i = 0; i < nrec; i++) {
        const unsigned char *b = rs.data[i];
        span whole = {0, rs.len[i]};
        if (i + PREFETCH_AHEAD < nrec)
            prefetch_record(&rs, i + PREFETCH_AHEAD);
        Py_ssize_t j = -1;
        int rc;
        found.pool.n = 0;
        found.norder = 0;
        rc = collect_entries(b, &whole, 1, &ix[0], &ix[1], &found, i + 1, &err);
        for (Py_ssize_t o = 0; rc == 0 && o < found.norder; o++) {
            int kind;
            j = found.order[o];
            rc = value_kind(b, found_spans(&found, j), found.count[j], &kind, &tensors, &err);
            if (rc < 0 || kind == 0) /* an empty Value is an absent one */
                continue;
            if (kind != kinds[j]) {
                snprintf(err.msg, sizeof(err.msg), "holds a %s where the first record has a %s",
                         rkind_name(kind), rkind_name(kinds[j]));
                rc = -1;
                break;
            }
            int64_t c[3] = {0, 0, 0};
            rc = tensor_values(b, kind, &tensors, i, &pieces[j], c, &err);
            counts[0][i * nf + j] = c[0];
            counts[1][i * nf + j] += c[1];
            counts[2][i * nf + j] += c[2];
        }
        if (rc < 0) {
            bad_rc = rc;
            bad_i = i;
            bad_j = j;
            break;
        }
    }
    if (tstate != NULL) {
        PyEval_RestoreThread(tstate);
        tstate = NULL;
    }
    if (bad_rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    if (bad_rc < 0) {
        PyObject *field = bad_j >= 0
            ? recordio_field_name(PyTuple_GET_ITEM(names_seq, bad_j)) : NULL;
        if (bad_j < 0 || field != NULL)
            raise_wire_error(err.msg, bad_i, field);
        Py_XDECREF(field);
        goto done;
    }

    for (int st = 0; st < 3; st++) {
        lists[st] = PyList_New(nf);
        if (lists[st] == NULL)
            goto done;
    }
    for (Py_ssize_t j = 0; j < nf; j++) {
        /* Varint streams are checked in the reference's order: int32 values, keys, shape. */
        for (int st = (kinds[j] == RKIND_INT32 ? 0 : 1); st < 3; st++) {
            const char *message;
            Py_ssize_t owner;
            /* the record loop scanned every piece: only a flagged stream needs the full check */
            if (pieces[j].bad[st]
                && check_varint_pieces(&rs, &pieces[j].stream[st], &message, &owner) < 0) {
                PyObject *field = recordio_field_name(PyTuple_GET_ITEM(names_seq, j));
                if (field != NULL)
                    raise_wire_error(message, first_bad_owner(&rs, &pieces[j], kinds[j]), field);
                Py_XDECREF(field);
                goto done;
            }
        }
        PyObject *flat;
        if (kinds[j] == RKIND_FLOAT32) {
            flat = fixed_values(&rs, &pieces[j].stream[0], 4, "<f4");
        } else if (kinds[j] == RKIND_FLOAT64) {
            flat = fixed_values(&rs, &pieces[j].stream[0], 8, "<f8");
        } else if (kinds[j] == RKIND_INT32) {
            /* int32 varints are sign-extended to 64 bits; protobuf keeps the low 32 */
            PyObject *wide = varint_values(&rs, &pieces[j].stream[0], "=u8",
                                           pieces[j].total[0]);
            flat = NULL;
            if (wide != NULL) {
                PyObject *low = PyObject_CallMethod(wide, "astype", "s", "=u4");
                Py_DECREF(wide);
                if (low != NULL) {
                    flat = PyObject_CallMethod(low, "view", "s", "=i4");
                    Py_DECREF(low);
                }
            }
        } else {
            flat = bytes_values(&rs, &pieces[j].stream[0]);
        }
        if (flat == NULL)
            goto done;
        PyList_SET_ITEM(lists[0], j, flat);
        for (int st = 1; st < 3; st++) {
            PyObject *arr = varint_values(&rs, &pieces[j].stream[st], "=u8", pieces[j].total[st]);
            if (arr == NULL)
                goto done;
            PyList_SET_ITEM(lists[st], j, arr);
        }
    }
    {
        PyObject *m[3] = {NULL, NULL, NULL};
        for (int st = 0; st < 3; st++) {
            m[st] = int64_matrix(counts[st], nrec, nf);
            if (m[st] == NULL)
                break;
        }
        if (m[0] && m[1] && m[2])
            result = PyTuple_Pack(6, lists[0], m[0], lists[1], m[1], lists[2], m[2]);
        for (int st = 0; st < 3; st++)
            Py_XDECREF(m[st]);
    }
done:
    if (pieces) {
        for (Py_ssize_t j = 0; j < nf; j++)
            for (int st = 0; st < 3; st++)
                PyMem_RawFree(pieces[j].stream[st].items);
        PyMem_Free(pieces);
    }
    for (int st = 0; st < 3; st++) {
        PyMem_Free(counts[st]);
        Py_XDECREF(lists[st]);
    }
    PyMem_RawFree(tensors.items);
    PyMem_Free(kinds);
    PyMem_Free(keys);
    if (have_found)
        found_release(&found);
    if (have_rs)
        records_release(&rs);
    if (have_ix) {
        names_release(&ix[0]);
        names_release(&ix[1]);
    }
    Py_XDECREF(names_seq);
    Py_XDECREF(kinds_seq);
    return result;
}

PyMethodDef protobuf_methods[] = {
    {"parse_examples", (PyCFunction)(void (*)(void))py_parse_examples, METH_VARARGS | METH_KEYWORDS,
     parse_examples_doc},
    {"parse_recordio_protobuf", (PyCFunction)(void (*)(void))py_parse_recordio_protobuf,
     METH_VARARGS | METH_KEYWORDS, parse_recordio_protobuf_doc},
    {"parse_sequence_examples", (PyCFunction)(void (*)(void))py_parse_sequence_examples,
     METH_VARARGS | METH_KEYWORDS, parse_sequence_examples_doc},
    {NULL, NULL, 0, NULL},
};
