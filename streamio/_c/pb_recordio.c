/* parse_recordio_protobuf (SageMaker aialgs.data.Record), over the wire reading and batch
 * helpers of pb_wire.h and pb_batch.h. */
#include "pb_batch.h"

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

PyMethodDef recordio_methods[] = {
    {"parse_recordio_protobuf", (PyCFunction)(void (*)(void))py_parse_recordio_protobuf,
     METH_VARARGS | METH_KEYWORDS, parse_recordio_protobuf_doc},
    {NULL, NULL, 0, NULL},
};
