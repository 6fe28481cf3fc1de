/* parse_examples (tf.train.Example) and parse_sequence_examples (tf.train.SequenceExample),
 * over the wire reading and batch helpers of pb_wire.h and pb_batch.h. */
#include "pb_batch.h"

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

/* The flat values of feature j of a part (checked as the reference checks them); NULL with an
 * exception set (a _WireError naming the first record whose varints do not decode). */
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

PyMethodDef example_methods[] = {
    {"parse_examples", (PyCFunction)(void (*)(void))py_parse_examples, METH_VARARGS | METH_KEYWORDS,
     parse_examples_doc},
    {"parse_sequence_examples", (PyCFunction)(void (*)(void))py_parse_sequence_examples,
     METH_VARARGS | METH_KEYWORDS, parse_sequence_examples_doc},
    {NULL, NULL, 0, NULL},
};
