/* What the protobuf kernels (pb_example.c, pb_recordio.c) share around the wire reading of
 * pb_wire.h: the batch's record buffers, growable arrays, feature-key lookup, map entries and
 * oneofs, and the record walk: inline here, as they run for every record; the once-per-batch
 * parts (argument taking, numpy outputs, errors) are in pb_batch.c, documented there. */
#ifndef STREAMIO_PB_BATCH_H
#define STREAMIO_PB_BATCH_H

#include "pb_wire.h"

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
static inline void *vec_grow(void *items, Py_ssize_t *cap, size_t size, Py_ssize_t first)
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

static inline int pv_push(piece_vec *v, Py_ssize_t rec, Py_ssize_t start, Py_ssize_t len)
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

static inline int sv_push(span_vec *v, Py_ssize_t start, Py_ssize_t stop)
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

static inline int iv_push(i64_vec *v, int64_t x)
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

static inline uint64_t hash_bytes(const unsigned char *p, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
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
static inline int map_entry(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end,
                            Py_ssize_t *key_start, Py_ssize_t *key_len, span_vec *values,
                            wire_err *err)
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

/* Walk map entries in ``spans`` (tag 1 of a Features-like message, or both maps of a Record when
 * ``ix2`` is given) of record ``stamp`` - 1: ``f`` is emptied, then found[j] = the value spans of
 * the last entry whose key is names[j]. */
static inline int collect_entries(const unsigned char *b, const span *spans, Py_ssize_t nspans,
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
static inline int oneof_last(const unsigned char *b, const span *spans, Py_ssize_t nspans,
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
static inline int piece_ends_inside(const unsigned char *p, Py_ssize_t n)
{
    return n > 0 && p[n - 1] >= 0x80;
}

static inline Py_ssize_t piece_varint_count(const unsigned char *p, Py_ssize_t n)
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

/* One pass over a varint piece: how many varints it holds, and whether it is one that
 * check_varint_pieces would refuse (ends inside a varint, or holds one over 10 bytes). */
static inline int piece_scan(const unsigned char *p, Py_ssize_t n, Py_ssize_t *count)
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

/* ---------------------------------------------------------------------------------------------
 * What every kernel does around its record walk: take the arguments, walk the records (without
 * the GIL for a large batch), raise the first failure as a _WireError naming record and feature
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
static inline int walk_records(const record_set *rs, record_parser parse, void *state, walk_fault *fault)
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

/* The name a _WireError gives feature j of a kernel's names tuple; NULL with an exception set. */
typedef PyObject *(*field_namer)(PyObject *names, Py_ssize_t j);

/* pb_batch.c (hidden: other extensions in the process may define the same names). */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden)
#endif
void records_release(record_set *rs);
int records_acquire(PyObject *records, record_set *rs);
void names_release(name_index *ix);
int names_build(name_index *ix, PyObject **keys, Py_ssize_t n);
int found_init(found_set *f, Py_ssize_t nf);
void found_release(found_set *f);
int piece_is_bad(const record_set *rs, const piece *pc);
int check_varint_pieces(const record_set *rs, const piece_vec *v, const char **message,
                        Py_ssize_t *owner);
PyObject *fixed_values(const record_set *rs, const piece_vec *v, int width, const char *dtype);
PyObject *bytes_values(const record_set *rs, const piece_vec *v);
PyObject *varint_values(const record_set *rs, const piece_vec *v, const char *dtype,
                        Py_ssize_t total);
PyObject *int64_array(const int64_t *items, Py_ssize_t n);
PyObject *int64_matrix(const int64_t *values, Py_ssize_t rows, Py_ssize_t cols);
int64_t *counts_new(Py_ssize_t rows, Py_ssize_t cols, int64_t fill);
void kernel_args_release(kernel_args *ka);
int kernel_args_take(kernel_args *ka, PyObject *records, PyObject *const names[],
                     PyObject *const kinds[], int npairs);
int kind_at(PyObject *kinds, Py_ssize_t j, uint32_t allowed, const char *allowed_text,
            int *kind);
void raise_field_error(const char *message, Py_ssize_t index, PyObject *names,
                       Py_ssize_t j, field_namer namer);
PyObject *raise_walk_fault(const walk_fault *f, const kernel_args *ka, field_namer namer);
PyObject *example_field_name(PyObject *names, Py_ssize_t j);
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

#endif
