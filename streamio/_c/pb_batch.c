/* The once-per-batch parts of the protobuf kernels (see pb_batch.h): record buffers, the
 * feature-key index, varint pieces to numpy arrays, the kernels' arguments and their errors. */
#include "pb_batch.h"

void records_release(record_set *rs)
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

int records_acquire(PyObject *records, record_set *rs)
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

void names_release(name_index *ix)
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
int names_build(name_index *ix, PyObject **keys, Py_ssize_t n)
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

int found_init(found_set *f, Py_ssize_t nf)
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

void found_release(found_set *f)
{
    PyMem_Free(f->stamp);
    PyMem_Free(f->first);
    PyMem_Free(f->count);
    PyMem_Free(f->order);
    PyMem_RawFree(f->pool.items);
    memset(f, 0, sizeof(*f));
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

/* Whether a piece does not decode as packed varints on its own. */
int piece_is_bad(const record_set *rs, const piece *pc)
{
    const unsigned char *p = piece_bytes(rs, pc);
    return piece_ends_inside(p, pc->len) || piece_has_long_varint(p, pc->len);
}

/* Validate varint pieces like decode_packed_varints (over the concatenation, then piece by
 * piece to name the owner). Returns 0 if valid; else -1 with the message and the first bad
 * piece's record in *owner (-1 if none). */
int check_varint_pieces(const record_set *rs, const piece_vec *v, const char **message,
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

static Py_ssize_t varint_total(const record_set *rs, const piece_vec *v)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t k = 0; k < v->n; k++)
        total += piece_varint_count(piece_bytes(rs, &v->items[k]), v->items[k].len);
    return total;
}

/* Concatenate fixed-width little-endian pieces into a new array of ``dtype``. */
PyObject *fixed_values(const record_set *rs, const piece_vec *v, int width, const char *dtype)
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

PyObject *bytes_values(const record_set *rs, const piece_vec *v)
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
PyObject *varint_values(const record_set *rs, const piece_vec *v, const char *dtype,
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
PyObject *int64_array(const int64_t *items, Py_ssize_t n)
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
PyObject *int64_matrix(const int64_t *values, Py_ssize_t rows, Py_ssize_t cols)
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
int64_t *counts_new(Py_ssize_t rows, Py_ssize_t cols, int64_t fill)
{
    Py_ssize_t cells;
    if (checked_mul(rows, cols, &cells) < 0)
        return NULL;
    int64_t *counts = alloc_items(cells, sizeof(int64_t));
    for (Py_ssize_t k = 0; counts != NULL && k < cells; k++)
        counts[k] = fill;
    return counts;
}

void kernel_args_release(kernel_args *ka)
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
int kernel_args_take(kernel_args *ka, PyObject *records, PyObject *const names[],
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
int kind_at(PyObject *kinds, Py_ssize_t j, uint32_t allowed, const char *allowed_text,
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

/* Raise streamio.decoders.wire._WireError(message, index, field); index -1 is None. */
static void raise_wire_error(const char *message, Py_ssize_t index, PyObject *field)
{
    PyObject *mod = PyImport_ImportModule("streamio.decoders.wire");
    if (mod == NULL)
        return;
    PyObject *cls = PyObject_GetAttrString(mod, "_WireError");
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

/* Raise _WireError(message, index, field name of names[j]); no field when j is -1. */
void raise_field_error(const char *message, Py_ssize_t index, PyObject *names,
                       Py_ssize_t j, field_namer namer)
{
    PyObject *field = j >= 0 ? namer(names, j) : NULL;
    if (j < 0 || field != NULL)
        raise_wire_error(message, index, field);
    Py_XDECREF(field);
}

/* Raise the failure that stopped walk_records; always NULL. */
PyObject *raise_walk_fault(const walk_fault *f, const kernel_args *ka, field_namer namer)
{
    if (f->rc == -2)
        return PyErr_NoMemory();
    raise_field_error(f->err.msg, f->index, ka->names[f->pair], f->field, namer);
    return NULL;
}

/* A field_namer: names[j] (bytes) as text. */
PyObject *example_field_name(PyObject *names, Py_ssize_t j)
{
    PyObject *name = PyTuple_GET_ITEM(names, j);
    return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), "replace");
}
