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

/* Bytes [start, stop) of the record being parsed. */
typedef struct {
    Py_ssize_t start, stop;
} span;

/* A bit per field number (below 32): the length-delimited fields a walker wants. */
#define FIELD_BIT(n) (1u << (n))

/* Whether ``tag`` is that of a length-delimited field whose number is in ``wanted``. The usual
 * sets are plain compares (the walkers' sets are constants once inlined: the hot loops keep
 * the cost of comparing tags directly). */
static inline int field_wanted(uint64_t tag, uint32_t wanted)
{
    if (wanted == FIELD_BIT(1))
        return tag == 0x0A;
    if (wanted == (FIELD_BIT(1) | FIELD_BIT(2)))
        return tag == 0x0A || tag == 0x12;
    /* wire type 2 and a field number below 32 (one test), then is that field wanted */
    return (tag & ~(uint64_t)0xF8) == 2 && (wanted & FIELD_BIT(tag >> 3));
}

/* The next length-delimited field of b[*pos:end] whose number is in ``wanted``, every other field
 * skipped: 1 with its number and the span of its bytes (*pos just after them), 0 at the end of
 * the message, -1 if malformed. */
static inline int next_field(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end,
                             uint32_t wanted, uint64_t *field, span *value, wire_err *err)
{
    while (*pos < end) {
        uint64_t tag;
        if (rd_tag(b, pos, end, &tag, err) < 0)
            return -1;
        if (field_wanted(tag, wanted)) {
            if (rd_len(b, *pos, end, &value->start, &value->stop, err) < 0)
                return -1;
            *pos = value->stop;
            *field = tag >> 3;
            return 1;
        }
        if (skip_value(b, tag, pos, end, 0, err) < 0)
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Batch parsing helpers: record buffers, growable arrays, feature keys, numpy outputs
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

/* Growable arrays, filled without the GIL: a failed push returns -1 and the caller sets
 * MemoryError once it holds the GIL again. vec_grow gives the storage with room for one more
 * item (the same block or a larger one, ``first`` items at first), or NULL when out of memory
 * or when the byte size would overflow; the old block is kept on failure. */
static void *vec_grow(void *items, Py_ssize_t *cap, size_t size, Py_ssize_t first)
{
    Py_ssize_t grown = grown_capacity(*cap, size, first);
    void *p = grown < 0 ? NULL : PyMem_RawRealloc(items, (size_t)grown * size);
    if (p != NULL)
        *cap = grown;
    return p;
}

/* A piece of record ``rec``: bytes [start, start + len) of it. */
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
        piece *items = vec_grow(v->items, &v->cap, sizeof(piece), 64);
        if (items == NULL)
            return -1;
        v->items = items;
    }
    v->items[v->n].rec = rec;
    v->items[v->n].start = start;
    v->items[v->n].len = len;
    v->n++;
    return 0;
}

typedef struct {
    span *items;
    Py_ssize_t n, cap;
} span_vec;

static int sv_push(span_vec *v, Py_ssize_t start, Py_ssize_t stop)
{
    if (v->n == v->cap) {
        span *items = vec_grow(v->items, &v->cap, sizeof(span), 32);
        if (items == NULL)
            return -1;
        v->items = items;
    }
    v->items[v->n].start = start;
    v->items[v->n].stop = stop;
    v->n++;
    return 0;
}

typedef struct {
    int64_t *items;
    Py_ssize_t n, cap;
} i64_vec;

static int iv_push(i64_vec *v, int64_t x)
{
    if (v->n == v->cap) {
        int64_t *items = vec_grow(v->items, &v->cap, sizeof(int64_t), 64);
        if (items == NULL)
            return -1;
        v->items = items;
    }
    v->items[v->n++] = x;
    return 0;
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

/* Fill the hash table of names (more than 8 of them); 0 or -1 with an exception set. */
static int names_hash(name_index *ix)
{
    Py_ssize_t size = 16;
    while (size < 2 * ix->n)
        size *= 2;
    ix->table = alloc_items(size, sizeof(Py_ssize_t));
    if (ix->table == NULL)
        return -1;
    ix->mask = size - 1;
    for (Py_ssize_t k = 0; k < size; k++)
        ix->table[k] = -1;
    for (Py_ssize_t j = 0; j < ix->n; j++) {
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
    return 0;
}

/* ``keys`` is a sequence of bytes objects, kept alive by the caller. 0, or -1 with an exception
 * set and nothing to release. */
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
    if (n > 8 && names_hash(ix) < 0) {
        names_release(ix);
        return -1;
    }
    return 0;
}

static inline Py_ssize_t names_find_local(const name_index *ix, const unsigned char *key, Py_ssize_t len)
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
static inline int map_entry(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *key_start,
                     Py_ssize_t *key_len, span_vec *values, wire_err *err)
{
    uint64_t field;
    span v;
    int rc;
    *key_start = 0;
    *key_len = 0;
    while ((rc = next_field(b, &pos, end, FIELD_BIT(1) | FIELD_BIT(2), &field, &v, err)) > 0) {
        if (field == 1) {
            *key_start = v.start;
            *key_len = v.stop - v.start;
        } else if (sv_push(values, v.start, v.stop) < 0) {
            return -2; /* out of memory: the caller raises MemoryError with the GIL */
        }
    }
    return rc;
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
 * ``ix2`` is given) of record ``stamp`` - 1: ``f`` is emptied, then found[j] = the value spans of
 * the last entry whose key is names[j]. */
static int collect_entries(const unsigned char *b, const span *spans, Py_ssize_t nspans,
                           const name_index *ix, const name_index *ix2, found_set *f,
                           Py_ssize_t stamp, wire_err *err)
{
    uint32_t wanted = FIELD_BIT(1) | (ix2 != NULL ? FIELD_BIT(2) : 0);
    f->pool.n = 0;
    f->norder = 0;
    for (Py_ssize_t s = 0; s < nspans; s++) {
        Py_ssize_t pos = spans[s].start, end = spans[s].stop;
        uint64_t field;
        span entry;
        int rc;
        while ((rc = next_field(b, &pos, end, wanted, &field, &entry, err)) > 0) {
            Py_ssize_t first = f->pool.n, key_start, key_len;
            rc = map_entry(b, entry.start, entry.stop, &key_start, &key_len, &f->pool, err);
            if (rc < 0)
                return rc;
            Py_ssize_t j = names_find(field == 1 ? ix : ix2, b + key_start, key_len);
            if (j < 0)
                continue;
            if (f->stamp[j] != stamp) {
                f->stamp[j] = stamp;
                f->order[f->norder++] = j;
            }
            f->first[j] = first;
            f->count[j] = f->pool.n - first;
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The member of a oneof set last in a message (its spans merged), among the length-delimited
 * fields in ``members``: *kind is its field number (0: none set) and ``values`` the spans of its
 * occurrences (switching members discards the earlier ones, as protobuf merging does). */
static int oneof_last(const unsigned char *b, const span *spans, Py_ssize_t nspans,
                      uint32_t members, int *kind, span_vec *values, wire_err *err)
{
    *kind = 0;
    values->n = 0;
    for (Py_ssize_t s = 0; s < nspans; s++) {
        Py_ssize_t pos = spans[s].start, end = spans[s].stop;
        uint64_t field;
        span v;
        int rc;
        while ((rc = next_field(b, &pos, end, members, &field, &v, err)) > 0) {
            if ((int)field != *kind) {
                *kind = (int)field;
                values->n = 0;
            }
            if (sv_push(values, v.start, v.stop) < 0)
                return -2;
        }
        if (rc < 0)
            return rc;
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

static inline const unsigned char *piece_bytes(const record_set *rs, const piece *pc)
{
    return rs->data[pc->rec] + pc->start;
}

/* Whether a piece does not decode as packed varints on its own. */
static int piece_is_bad(const record_set *rs, const piece *pc)
{
    const unsigned char *p = piece_bytes(rs, pc);
    return piece_ends_inside(p, pc->len) || piece_has_long_varint(p, pc->len);
}

/* Validate varint pieces like decode_packed_varints (over the concatenation, then piece by
 * piece to name the owner). Returns 0 if valid; else -1 with the message and the first bad
 * piece's record in *owner (-1 if none). */
static int check_varint_pieces(const record_set *rs, const piece_vec *v, const char **message,
                               Py_ssize_t *owner)
{
    int inside = 0, longer = 0;
    for (Py_ssize_t k = 0; k < v->n; k++)
        inside |= piece_ends_inside(piece_bytes(rs, &v->items[k]), v->items[k].len);
    for (Py_ssize_t k = 0; !inside && k < v->n && !longer; k++)
        longer = piece_has_long_varint(piece_bytes(rs, &v->items[k]), v->items[k].len);
    if (!inside && !longer)
        return 0;
    *message = inside ? "packed varints end inside a varint" : "varint longer than 10 bytes";
    *owner = -1;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        if (piece_is_bad(rs, &v->items[k])) {
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
        const unsigned char *p = piece_bytes(rs, &v->items[k]);
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
        total += piece_varint_count(piece_bytes(rs, &v->items[k]), v->items[k].len);
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
        memcpy(data, piece_bytes(rs, &v->items[k]), v->items[k].len);
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
        PyObject *item = PyBytes_FromStringAndSize((const char *)piece_bytes(rs, &v->items[k]),
                                                   v->items[k].len);
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

/* An int64 array of shape (rows, cols) holding ``values``. */
static PyObject *int64_matrix(const int64_t *values, Py_ssize_t rows, Py_ssize_t cols)
{
    Py_ssize_t cells;
    if (checked_mul(rows, cols, &cells) < 0)
        return NULL;
    PyObject *flat = int64_array(values, cells);
    if (flat == NULL)
        return NULL;
    PyObject *out = PyObject_CallMethod(flat, "reshape", "nn", rows, cols);
    Py_DECREF(flat);
    return out;
}

/* A (rows, cols) table of counts, every cell ``fill``; NULL with an exception set. */
static int64_t *counts_new(Py_ssize_t rows, Py_ssize_t cols, int64_t fill)
{
    Py_ssize_t cells;
    if (checked_mul(rows, cols, &cells) < 0)
        return NULL;
    int64_t *counts = alloc_items(cells, sizeof(int64_t));
    for (Py_ssize_t k = 0; counts != NULL && k < cells; k++)
        counts[k] = fill;
    return counts;
}

/* ---------------------------------------------------------------------------------------------
 * What every kernel does around its record walk: take the arguments, walk the records (without
 * the GIL for a large batch), raise the first failure as a WireError naming record and feature
 * ------------------------------------------------------------------------------------------- */

/* A kernel's arguments: the records and one or two (names, kinds) pairs (a SequenceExample has a
 * context pair and a feature-list pair), all as tuples of our own. They are taken before any item
 * is converted: converting a kind or a section (__index__) may run Python code that changes or
 * empties the caller's lists, and the record walk may run without the GIL. */
typedef struct {
    record_set rs;
    int have_rs;
    PyObject *names[2], *kinds[2]; /* tuples, ours */
} kernel_args;

static void kernel_args_release(kernel_args *ka)
{
    for (int h = 0; h < 2; h++) {
        Py_XDECREF(ka->names[h]);
        Py_XDECREF(ka->kinds[h]);
    }
    if (ka->have_rs)
        records_release(&ka->rs);
    memset(ka, 0, sizeof(*ka));
}

/* 0, or -1 with an exception set; release ``ka`` either way. */
static int kernel_args_take(kernel_args *ka, PyObject *records, PyObject *const names[],
                            PyObject *const kinds[], int npairs)
{
    memset(ka, 0, sizeof(*ka));
    for (int h = 0; h < npairs; h++) {
        if ((ka->names[h] = PySequence_Tuple(names[h])) == NULL
            || (ka->kinds[h] = PySequence_Tuple(kinds[h])) == NULL)
            return -1;
    }
    for (int h = 0; h < npairs; h++) {
        if (PyTuple_GET_SIZE(ka->kinds[h]) != PyTuple_GET_SIZE(ka->names[h])) {
            PyErr_SetString(PyExc_ValueError, "names and kinds must have the same length");
            return -1;
        }
    }
    if (records_acquire(records, &ka->rs) < 0)
        return -1;
    ka->have_rs = 1;
    return 0;
}

/* Item j of a kinds tuple, which must be one of the kinds in ``allowed`` (a bit per kind, named
 * by ``allowed_text`` in the error); 0, or -1 with an exception set. May run Python code. */
static int kind_at(PyObject *kinds, Py_ssize_t j, uint32_t allowed, const char *allowed_text,
                   int *kind)
{
    long k = PyLong_AsLong(PyTuple_GET_ITEM(kinds, j));
    if (k == -1 && PyErr_Occurred())
        return -1;
    if (k < 0 || k >= 32 || !(allowed & FIELD_BIT(k))) {
        PyErr_Format(PyExc_ValueError, "kinds must be %s, not %ld", allowed_text, k);
        return -1;
    }
    *kind = (int)k;
    return 0;
}

/* Where a record walk stopped: rc -1 for malformed protobuf (the reason in ``err``), -2 for out
 * of memory; the record, and the feature the error names (-1: none) in names tuple ``pair``. */
typedef struct {
    int rc;
    Py_ssize_t index, field;
    int pair;
    wire_err err;
} walk_fault;

/* Parse record i into the kernel's state: 0, or -1 / -2 with ``fault``'s field, pair and err
 * set. Runs without the GIL: no Python API. */
typedef int (*record_parser)(void *state, Py_ssize_t i, walk_fault *fault);

/* Parse every record in order, stopping at the first failure (0, or its rc). The loop is pure C
 * over buffers the kernel holds references to, so a large batch is walked without the GIL. */
static int walk_records(const record_set *rs, record_parser parse, void *state, walk_fault *fault)
{
    Py_ssize_t nrec = rs->n;
    PyThreadState *tstate = nrec >= GIL_RELEASE_MIN_RECORDS ? PyEval_SaveThread() : NULL;
    fault->rc = 0;
    fault->index = -1;
    for (Py_ssize_t i = 0; i < nrec; i++) {
        if (i + PREFETCH_AHEAD < nrec)
            prefetch_record(rs, i + PREFETCH_AHEAD);
        fault->field = -1;
        fault->pair = 0;
        if ((fault->rc = parse(state, i, fault)) < 0) {
            fault->index = i;
            break;
        }
    }
    if (tstate != NULL)
        PyEval_RestoreThread(tstate);
    return fault->rc;
}

/* Raise streamio.decoders._wire.WireError(message, index, field); index -1 is None. */
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

/* The name a WireError gives feature j of a kernel's names tuple; NULL with an exception set. */
typedef PyObject *(*field_namer)(PyObject *names, Py_ssize_t j);

/* Raise WireError(message, index, field name of names[j]); no field when j is -1. */
static void raise_field_error(const char *message, Py_ssize_t index, PyObject *names,
                              Py_ssize_t j, field_namer namer)
{
    PyObject *field = j >= 0 ? namer(names, j) : NULL;
    if (j < 0 || field != NULL)
        raise_wire_error(message, index, field);
    Py_XDECREF(field);
}

/* Raise the failure that stopped walk_records; always NULL. */
static PyObject *raise_walk_fault(const walk_fault *f, const kernel_args *ka, field_namer namer)
{
    if (f->rc == -2)
        return PyErr_NoMemory();
    raise_field_error(f->err.msg, f->index, ka->names[f->pair], f->field, namer);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * parse_examples: tf.train.Example records -> flat values per feature + counts
 * parse_sequence_examples: tf.train.SequenceExample records -> context values + counts, and for
 * each feature list the flat values of all steps, the steps per record and the values per step
 *
 * Example { Features features = 1; }  Features { map<string, Feature> feature = 1; }
 * Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
 *                        Int64List int64_list = 3; } }
 * BytesList/FloatList/Int64List { repeated ... value = 1 (packed for numbers); }
 * SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
 * FeatureLists { map<string, FeatureList> feature_list = 1; }
 * FeatureList { repeated Feature feature = 1; }   (one Feature per step)
 *
 * An Example reads as a SequenceExample without feature lists (its features in field 1, as the
 * context is), so one walk serves both kernels. Same results and errors as
 * streamio.decoders.example.parse_examples / parse_sequence_examples (the references).
 * ------------------------------------------------------------------------------------------- */

#define KIND_BYTES 1
#define KIND_FLOAT 2
#define KIND_INT64 3
#define FEATURE_KINDS (FIELD_BIT(KIND_BYTES) | FIELD_BIT(KIND_FLOAT) | FIELD_BIT(KIND_INT64))
static const char *const example_kind_names[] = {"no value list", "bytes_list", "float_list",
                                                 "int64_list"};

static int kind_mismatch(int kind, int want, wire_err *err)
{
    snprintf(err->msg, sizeof(err->msg), "feature holds a %s, expected a %s",
             example_kind_names[kind], example_kind_names[want]);
    return -1;
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

/* The wanted features of one part of every record: an Example's features, or a SequenceExample's
 * context or feature lists. */
typedef struct {
    Py_ssize_t n;
    PyObject *names; /* the kernel_args tuple (borrowed) */
    int *kinds;
    name_index ix;
    found_set found;
    piece_vec *pieces; /* per feature; piece.rec is the record (for the bytes and for errors) */
    i64_vec *steps;    /* feature lists: values in each step, over the batch */
    int64_t *counts;   /* (records, n): values / feature-list steps; -1 absent */
    /* int64 features: whether the pieces need check_varint_pieces (some came from the general
     * walker, or piece_scan flagged one) and, if not, how many varints they hold */
    char *vcheck;
    Py_ssize_t *vtotal;
    int have_ix, have_found;
} feature_set;

typedef struct {
    kernel_args args;
    int nparts;          /* 1: Example; 2: SequenceExample */
    feature_set part[2]; /* 0: features (context), 1: feature lists */
    span_vec top[2], lists;
} example_batch;

static void feature_set_release(feature_set *s)
{
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
    memset(s, 0, sizeof(*s));
}

static void example_batch_release(example_batch *eb)
{
    for (int h = 0; h < 2; h++) {
        feature_set_release(&eb->part[h]);
        PyMem_RawFree(eb->top[h].items);
    }
    PyMem_RawFree(eb->lists.items);
    kernel_args_release(&eb->args);
}

/* Set up a part from a names and a kinds tuple of kernel_args (``steps``: a feature-list part);
 * 0, or -1 with an exception set. Converting the kinds may run Python code. */
static int feature_set_init(feature_set *s, PyObject *names, PyObject *kinds, Py_ssize_t nrec,
                            int steps)
{
    s->names = names;
    s->n = PyTuple_GET_SIZE(names);
    Py_ssize_t n1 = s->n ? s->n : 1;
    s->kinds = alloc_items(s->n, sizeof(int));
    s->pieces = s->kinds ? PyMem_Calloc(n1, sizeof(piece_vec)) : NULL;
    s->steps = s->pieces && steps ? PyMem_Calloc(n1, sizeof(i64_vec)) : NULL;
    s->vcheck = s->pieces ? PyMem_Calloc(n1, 1) : NULL;
    s->vtotal = s->vcheck ? PyMem_Calloc(n1, sizeof(Py_ssize_t)) : NULL;
    if (s->vtotal == NULL || (steps && s->steps == NULL)) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < s->n; j++) {
        if (kind_at(kinds, j, FEATURE_KINDS, "1 (bytes), 2 (float) or 3 (int64)", &s->kinds[j]) < 0)
            return -1;
    }
    if (names_build(&s->ix, &PyTuple_GET_ITEM(names, 0), s->n) < 0)
        return -1;
    s->have_ix = 1;
    s->have_found = 1; /* found_init leaves it safe to release */
    if (found_init(&s->found, s->n) < 0)
        return -1;
    s->counts = counts_new(nrec, s->n, -1);
    return s->counts == NULL ? -1 : 0;
}

/* The spans of every occurrence of field 1 (and of field 2 when ntop is 2) of the message
 * b[0:end], each field's merged: Example.features; SequenceExample.context, .feature_lists. */
static int top_level(const unsigned char *b, Py_ssize_t end, span_vec top[], int ntop,
                     wire_err *err)
{
    uint32_t wanted = FIELD_BIT(1) | (ntop == 2 ? FIELD_BIT(2) : 0);
    Py_ssize_t pos = 0;
    uint64_t field;
    span v;
    int rc;
    top[0].n = top[1].n = 0;
    while ((rc = next_field(b, &pos, end, wanted, &field, &v, err)) > 0) {
        if (sv_push(&top[field - 1], v.start, v.stop) < 0)
            return -2;
    }
    return rc;
}

/* The features of record i in the spans ``top`` of its Features message(s): each wanted
 * feature's values appended to its pieces, their number to its counts. On failure *bad_j is the
 * feature being read (-1: none). */
static int read_features(const unsigned char *b, Py_ssize_t i, const span_vec *top,
                         feature_set *s, span_vec *lists, Py_ssize_t *bad_j, wire_err *err)
{
    int rc = collect_entries(b, top->items, top->n, &s->ix, NULL, &s->found, i + 1, err);
    for (Py_ssize_t o = 0; rc == 0 && o < s->found.norder; o++) {
        int kind;
        Py_ssize_t j = *bad_j = s->found.order[o];
        rc = oneof_last(b, found_spans(&s->found, j), s->found.count[j], FEATURE_KINDS, &kind,
                        lists, err);
        if (rc < 0 || kind == 0) /* an empty Feature is a missing one */
            continue;
        if (kind != s->kinds[j])
            return kind_mismatch(kind, s->kinds[j], err);
        int64_t count = 0;
        rc = list_values(b, kind, lists, i, &s->pieces[j], &count, err);
        s->counts[i * s->n + j] = count;
        s->vcheck[j] = 1;
    }
    return rc;
}

/* A step as every writer emits it: Feature { <kind> = { value = 1: packed bytes } }, both
 * lengths one byte, nothing else. Then the general walkers (oneof_last, list_values) would
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
static int read_step(const unsigned char *b, Py_ssize_t i, Py_ssize_t j, Py_ssize_t s,
                     Py_ssize_t e, example_batch *eb, wire_err *err)
{
    feature_set *h = &eb->part[1];
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
        if ((rc = oneof_last(b, &step, 1, FEATURE_KINDS, &kind, &eb->lists, err)) < 0)
            return rc;
        if (kind != h->kinds[j] && kind != 0) /* an empty Feature: a step of no values */
            return kind_mismatch(kind, h->kinds[j], err);
        if ((rc = list_values(b, kind, &eb->lists, i, &h->pieces[j], &count, err)) < 0)
            return rc;
        h->vcheck[j] = 1;
    }
    return iv_push(&h->steps[j], count) < 0 ? -2 : 0;
}

/* The steps of feature list j in record i: each Feature of the FeatureList is one step;
 * non-Feature fields are skipped. */
static int read_steps(const unsigned char *b, Py_ssize_t i, Py_ssize_t j, example_batch *eb,
                      wire_err *err)
{
    feature_set *s = &eb->part[1];
    const span *spans = found_spans(&s->found, j);
    int64_t steps = 0;
    for (Py_ssize_t k = 0; k < s->found.count[j]; k++) {
        Py_ssize_t pos = spans[k].start, end = spans[k].stop;
        uint64_t field;
        span feature;
        int rc;
        while ((rc = next_field(b, &pos, end, FIELD_BIT(1), &field, &feature, err)) > 0) {
            if ((rc = read_step(b, i, j, feature.start, feature.stop, eb, err)) < 0)
                return rc;
            steps++;
        }
        if (rc < 0)
            return rc;
    }
    s->counts[i * s->n + j] = steps;
    return 0;
}

/* The feature lists of record i (in the spans eb->top[1]); *bad_j as for read_features. */
static int read_feature_lists(const unsigned char *b, Py_ssize_t i, example_batch *eb,
                              Py_ssize_t *bad_j, wire_err *err)
{
    feature_set *s = &eb->part[1];
    int rc = collect_entries(b, eb->top[1].items, eb->top[1].n, &s->ix, NULL, &s->found, i + 1,
                             err);
    for (Py_ssize_t o = 0; rc == 0 && o < s->found.norder; o++) {
        *bad_j = s->found.order[o];
        rc = read_steps(b, i, *bad_j, eb, err);
    }
    return rc;
}

/* Record i of an Example or SequenceExample batch (a record_parser). */
static int example_record(void *state, Py_ssize_t i, walk_fault *fault)
{
    example_batch *eb = state;
    const unsigned char *b = eb->args.rs.data[i];
    int rc = top_level(b, eb->args.rs.len[i], eb->top, eb->nparts, &fault->err);
    if (rc == 0)
        rc = read_features(b, i, &eb->top[0], &eb->part[0], &eb->lists, &fault->field,
                           &fault->err);
    if (rc < 0 || eb->nparts == 1)
        return rc;
    fault->pair = 1;
    fault->field = -1;
    return read_feature_lists(b, i, eb, &fault->field, &fault->err);
}

/* A field_namer: names[j] (bytes) as text. */
static PyObject *example_field_name(PyObject *names, Py_ssize_t j)
{
    PyObject *name = PyTuple_GET_ITEM(names, j);
    return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), "replace");
}

/* The flat values of feature j of a part (checked as the reference checks them); NULL with an
 * exception set (a WireError naming the first record whose varints do not decode). */
static PyObject *feature_values(const record_set *rs, const feature_set *s, Py_ssize_t j)
{
    const piece_vec *v = &s->pieces[j];
    if (s->kinds[j] == KIND_FLOAT)
        return fixed_values(rs, v, 4, "<f4");
    if (s->kinds[j] == KIND_BYTES)
        return bytes_values(rs, v);
    const char *message;
    Py_ssize_t owner;
    if (!s->vcheck[j]) /* every piece scanned, none flagged, and counted */
        return varint_values(rs, v, "=i8", s->vtotal[j]);
    if (check_varint_pieces(rs, v, &message, &owner) < 0) {
        raise_field_error(message, owner, s->names, j, example_field_name);
        return NULL;
    }
    return varint_values(rs, v, "=i8", -1);
}

/* A list of one array per feature of a part: its flat values (``per_step`` 0) or, for feature
 * lists, the number of values in each step (``per_step`` 1); NULL with an exception set. */
static PyObject *feature_arrays(const record_set *rs, const feature_set *s, int per_step)
{
    PyObject *list = PyList_New(s->n);
    for (Py_ssize_t j = 0; list != NULL && j < s->n; j++) {
        PyObject *arr = per_step ? int64_array(s->steps[j].items, s->steps[j].n)
                                 : feature_values(rs, s, j);
        if (arr == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, j, arr);
    }
    return list;
}

/* parse_examples: (values, counts); parse_sequence_examples: (context values, context counts,
 * sequence values, steps, step counts). Context errors come first, as in the reference. */
static PyObject *example_results(const example_batch *eb)
{
    const record_set *rs = &eb->args.rs;
    PyObject *values[2] = {NULL, NULL}, *counts[2] = {NULL, NULL}, *per_step = NULL;
    PyObject *result = NULL;
    int ok = 1;
    for (int h = 0; ok && h < eb->nparts; h++)
        ok = (values[h] = feature_arrays(rs, &eb->part[h], 0)) != NULL;
    if (ok && eb->nparts == 2)
        ok = (per_step = feature_arrays(rs, &eb->part[1], 1)) != NULL;
    for (int h = 0; ok && h < eb->nparts; h++)
        ok = (counts[h] = int64_matrix(eb->part[h].counts, rs->n, eb->part[h].n)) != NULL;
    if (ok && eb->nparts == 1)
        result = PyTuple_Pack(2, values[0], counts[0]);
    else if (ok)
        result = PyTuple_Pack(5, values[0], counts[0], values[1], counts[1], per_step);
    for (int h = 0; h < 2; h++) {
        Py_XDECREF(values[h]);
        Py_XDECREF(counts[h]);
    }
    Py_XDECREF(per_step);
    return result;
}

/* Both kernels: the arguments taken, the parts set up, the records walked, the results built. */
static PyObject *example_kernel(PyObject *records, PyObject *const names[],
                                PyObject *const kinds[], int nparts)
{
    example_batch eb;
    walk_fault fault;
    PyObject *result = NULL;
    memset(&eb, 0, sizeof(eb));
    eb.nparts = nparts;
    if (kernel_args_take(&eb.args, records, names, kinds, nparts) < 0)
        goto done;
    for (int h = 0; h < nparts; h++) {
        if (feature_set_init(&eb.part[h], eb.args.names[h], eb.args.kinds[h], eb.args.rs.n,
                             h == 1) < 0)
            goto done;
    }
    if (walk_records(&eb.args.rs, example_record, &eb, &fault) < 0)
        raise_walk_fault(&fault, &eb.args, example_field_name);
    else
        result = example_results(&eb);
done:
    example_batch_release(&eb);
    return result;
}

PyDoc_STRVAR(parse_examples_doc,
"parse_examples(records, names, kinds) -> (values, counts)\n\n"
"Parse serialized tf.train.Example records; same results and errors as\n"
"streamio.decoders.example.parse_examples (the reference).");

static PyObject *py_parse_examples(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"records", "names", "kinds", NULL};
    PyObject *records, *names, *kinds;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:parse_examples", kwlist, &records,
                                     &names, &kinds))
        return NULL;
    return example_kernel(records, &names, &kinds, 1);
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
    PyObject *records, *names[2], *kinds[2];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:parse_sequence_examples", kwlist,
                                     &records, &names[0], &kinds[0], &names[1], &kinds[1]))
        return NULL;
    return example_kernel(records, names, kinds, 2);
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
#define RECORDIO_KINDS (FIELD_BIT(RKIND_FLOAT32) | FIELD_BIT(RKIND_FLOAT64) \
                        | FIELD_BIT(RKIND_INT32) | FIELD_BIT(RKIND_BYTES))

static const char *rkind_name(int kind)
{
    switch (kind) {
    case RKIND_FLOAT32: return "float32_tensor";
    case RKIND_FLOAT64: return "float64_tensor";
    case RKIND_INT32: return "int32_tensor";
    default: return "bytes";
    }
}

/* The three streams of one tensor: 0 values, 1 keys, 2 shape. */
typedef struct {
    piece_vec stream[3];
    Py_ssize_t total[3]; /* varints in each varint stream, counted as the pieces are found */
    int bad[3];          /* a piece of that stream fails check_varint_pieces: report it later */
} tensor_pieces;

/* A tensor's values, keys and shape pieces for record ``rec``, counting as it goes. A failure
 * stops the whole batch, so pieces appended before it never reach a result. */
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
            if (piece_is_bad(rs, &v->items[k])) {
                if (best < 0 || v->items[k].rec < best)
                    best = v->items[k].rec;
                break;
            }
        }
    }
    return best;
}

/* A field_namer: the key of names[j] = (section, key), "label_" + key for the label section. */
static PyObject *recordio_field_name(PyObject *names, Py_ssize_t j)
{
    PyObject *name = PyTuple_GET_ITEM(names, j);
    long section = PyLong_AsLong(PyTuple_GET_ITEM(name, 0));
    if (section == -1 && PyErr_Occurred())
        return NULL;
    PyObject *text = example_field_name(name, 1); /* the key, name[1] */
    if (text == NULL || section != 2)
        return text;
    PyObject *out = PyUnicode_FromFormat("label_%U", text);
    Py_DECREF(text);
    return out;
}

/* The section (1 features, 2 label) of a name that is a (section, key bytes) tuple; else -1 with
 * TypeError. May run Python code. */
static int name_section(PyObject *name)
{
    long section = -1;
    if (PyTuple_Check(name) && PyTuple_GET_SIZE(name) == 2) {
        section = PyLong_AsLong(PyTuple_GET_ITEM(name, 0));
        if (section == -1 && PyErr_Occurred())
            PyErr_Clear();
    }
    if ((section != 1 && section != 2) || !PyBytes_Check(PyTuple_GET_ITEM(name, 1))) {
        PyErr_SetString(PyExc_TypeError, "names must be (section 1 or 2, key bytes) tuples");
        return -1;
    }
    return (int)section;
}

/* Split names by section: features (1) and label (2) keys are looked up separately, each
 * index mapping back to the caller's position j. Checks names and kinds; 0 or -1 with an
 * exception set (ix[] then needs no release). */
static int section_names(PyObject *names, PyObject *kinds_seq, Py_ssize_t nf, int *kinds,
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
        PyObject *name = PyTuple_GET_ITEM(names, j);
        int sct = name_section(name) - 1;
        ok = sct >= 0 && kind_at(kinds_seq, j, RECORDIO_KINDS, "2, 3, 7 or 9", &kinds[j]) == 0;
        if (ok) {
            by_section[sct][n_in[sct]] = PyTuple_GET_ITEM(name, 1);
            ids[sct][n_in[sct]++] = j;
        }
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

typedef struct {
    kernel_args args;
    Py_ssize_t nf;
    int *kinds;
    name_index ix[2]; /* keys of the features (section 1) and label (section 2) maps */
    found_set found;
    tensor_pieces *pieces;
    int64_t *counts[3]; /* (records, nf) for each stream: values (-1 absent), keys, shape */
    span_vec tensors;
    int have_ix, have_found;
} recordio_batch;

static void recordio_release(recordio_batch *rb)
{
    for (Py_ssize_t j = 0; rb->pieces && j < rb->nf; j++)
        for (int st = 0; st < 3; st++)
            PyMem_RawFree(rb->pieces[j].stream[st].items);
    PyMem_Free(rb->pieces);
    for (int st = 0; st < 3; st++)
        PyMem_Free(rb->counts[st]);
    PyMem_RawFree(rb->tensors.items);
    PyMem_Free(rb->kinds);
    if (rb->have_found)
        found_release(&rb->found);
    if (rb->have_ix) {
        names_release(&rb->ix[0]);
        names_release(&rb->ix[1]);
    }
    kernel_args_release(&rb->args);
}

/* Set up from the arguments (converting sections and kinds may run Python code); 0 or -1 with
 * an exception set. */
static int recordio_init(recordio_batch *rb)
{
    Py_ssize_t nf = rb->nf = PyTuple_GET_SIZE(rb->args.names[0]);
    rb->kinds = alloc_items(nf, sizeof(int));
    rb->pieces = rb->kinds ? PyMem_Calloc(nf ? nf : 1, sizeof(tensor_pieces)) : NULL;
    if (rb->pieces == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    if (section_names(rb->args.names[0], rb->args.kinds[0], nf, rb->kinds, rb->ix) < 0)
        return -1;
    rb->have_ix = 1;
    rb->have_found = 1; /* found_init leaves it safe to release */
    if (found_init(&rb->found, nf) < 0)
        return -1;
    for (int st = 0; st < 3; st++) {
        if ((rb->counts[st] = counts_new(rb->args.rs.n, nf, st == 0 ? -1 : 0)) == NULL)
            return -1;
    }
    return 0;
}

/* Record i of a Record batch (a record_parser). */
static int recordio_record(void *state, Py_ssize_t i, walk_fault *fault)
{
    recordio_batch *rb = state;
    const unsigned char *b = rb->args.rs.data[i];
    span whole = {0, rb->args.rs.len[i]};
    int rc = collect_entries(b, &whole, 1, &rb->ix[0], &rb->ix[1], &rb->found, i + 1, &fault->err);
    for (Py_ssize_t o = 0; rc == 0 && o < rb->found.norder; o++) {
        int kind;
        Py_ssize_t j = fault->field = rb->found.order[o];
        rc = oneof_last(b, found_spans(&rb->found, j), rb->found.count[j], RECORDIO_KINDS, &kind,
                        &rb->tensors, &fault->err);
        if (rc < 0 || kind == 0) /* an empty Value is an absent one */
            continue;
        if (kind != rb->kinds[j]) {
            snprintf(fault->err.msg, sizeof(fault->err.msg),
                     "holds a %s where the first record has a %s", rkind_name(kind),
                     rkind_name(rb->kinds[j]));
            return -1;
        }
        int64_t c[3] = {0, 0, 0};
        Py_ssize_t cell = i * rb->nf + j;
        rc = tensor_values(b, kind, &rb->tensors, i, &rb->pieces[j], c, &fault->err);
        rb->counts[0][cell] = c[0];
        rb->counts[1][cell] += c[1];
        rb->counts[2][cell] += c[2];
    }
    return rc;
}

/* The flat values of tensor j, its varint streams checked first (in the reference's order: int32
 * values, keys, shape); NULL with an exception set. */
static PyObject *tensor_flat(const recordio_batch *rb, Py_ssize_t j)
{
    const record_set *rs = &rb->args.rs;
    const tensor_pieces *t = &rb->pieces[j];
    int kind = rb->kinds[j];
    for (int st = (kind == RKIND_INT32 ? 0 : 1); st < 3; st++) {
        const char *message;
        Py_ssize_t owner;
        /* the record walk scanned every piece: only a flagged stream needs the full check */
        if (t->bad[st] && check_varint_pieces(rs, &t->stream[st], &message, &owner) < 0) {
            raise_field_error(message, first_bad_owner(rs, t, kind), rb->args.names[0], j,
                              recordio_field_name);
            return NULL;
        }
    }
    if (kind == RKIND_FLOAT32)
        return fixed_values(rs, &t->stream[0], 4, "<f4");
    if (kind == RKIND_FLOAT64)
        return fixed_values(rs, &t->stream[0], 8, "<f8");
    if (kind == RKIND_BYTES)
        return bytes_values(rs, &t->stream[0]);
    /* int32 varints are sign-extended to 64 bits; protobuf keeps the low 32 */
    PyObject *wide = varint_values(rs, &t->stream[0], "=u8", t->total[0]), *low, *flat = NULL;
    if (wide == NULL)
        return NULL;
    low = PyObject_CallMethod(wide, "astype", "s", "=u4");
    Py_DECREF(wide);
    if (low != NULL) {
        flat = PyObject_CallMethod(low, "view", "s", "=i4");
        Py_DECREF(low);
    }
    return flat;
}

/* (values, counts, keys, key counts, shapes, shape counts); NULL with an exception set. */
static PyObject *recordio_results(const recordio_batch *rb)
{
    const record_set *rs = &rb->args.rs;
    PyObject *lists[3], *m[3] = {NULL, NULL, NULL}, *result = NULL;
    int ok = 1;
    for (int st = 0; st < 3; st++)
        ok &= (lists[st] = PyList_New(rb->nf)) != NULL;
    for (Py_ssize_t j = 0; ok && j < rb->nf; j++) {
        for (int st = 0; ok && st < 3; st++) {
            PyObject *arr = st == 0 ? tensor_flat(rb, j)
                : varint_values(rs, &rb->pieces[j].stream[st], "=u8", rb->pieces[j].total[st]);
            if ((ok = arr != NULL))
                PyList_SET_ITEM(lists[st], j, arr);
        }
    }
    for (int st = 0; ok && st < 3; st++)
        ok = (m[st] = int64_matrix(rb->counts[st], rs->n, rb->nf)) != NULL;
    if (ok)
        result = PyTuple_Pack(6, lists[0], m[0], lists[1], m[1], lists[2], m[2]);
    for (int st = 0; st < 3; st++) {
        Py_XDECREF(lists[st]);
        Py_XDECREF(m[st]);
    }
    return result;
}

PyDoc_STRVAR(parse_recordio_protobuf_doc,
"parse_recordio_protobuf(records, names, kinds)\n"
"    -> (values, counts, keys, key_counts, shapes, shape_counts)\n\n"
"Parse aialgs.data.Record payloads; same results and errors as\n"
"streamio.decoders.recordio_protobuf.parse_recordio_protobuf (the reference).");

static PyObject *py_parse_recordio_protobuf(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"records", "names", "kinds", NULL};
    PyObject *records, *names, *kinds, *result = NULL;
    recordio_batch rb;
    walk_fault fault;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:parse_recordio_protobuf", kwlist, &records,
                                     &names, &kinds))
        return NULL;
    memset(&rb, 0, sizeof(rb));
    if (kernel_args_take(&rb.args, records, &names, &kinds, 1) == 0 && recordio_init(&rb) == 0) {
        if (walk_records(&rb.args.rs, recordio_record, &rb, &fault) < 0)
            raise_walk_fault(&fault, &rb.args, recordio_field_name);
        else
            result = recordio_results(&rb);
    }
    recordio_release(&rb);
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
