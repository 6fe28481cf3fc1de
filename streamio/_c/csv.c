#include "speedups.h"

/* ---------------------------------------------------------------------------------------------
 * parse_csv_floats: unquoted CSV rows of decimal numbers -> a (rows, columns) float array
 *
 * The values are those numpy.loadtxt gives (it parses every field to a correctly rounded double
 * with PyOS_string_to_double, then casts to float32 if asked): fields of at most 19 significant
 * digits and a small exponent are converted exactly with one IEEE multiplication or division
 * (Clinger's fast path: both operands are exact doubles), the rest with PyOS_string_to_double.
 * Anything but a plain decimal number (spaces, quotes, inf/nan, an empty field, a row with
 * another number of fields) returns None: the caller's general path then decides.
 * ------------------------------------------------------------------------------------------- */

static const double exact_pow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

enum { NUM_OK = 0, NUM_SLOW = 1, NUM_BAD = 2 };

/* Parse the field at p (up to ``stop`` or the first ``sep``) as
 * [+-] (digits [. digits] | . digits) [(e|E) [+-] digits]; *next is where the field ends.
 * All digits go into one integer w (leading zeros included: they leave it 0), so at most 19
 * digits keep it exact; longer numbers take the slow path. */
static inline int parse_decimal(const unsigned char *p, const unsigned char *stop, unsigned char sep,
                                double *out, const unsigned char **next)
{
    int negative = 0;
    uint64_t w = 0;
    long exp10 = 0;
    unsigned d;
    const unsigned char *first;
    Py_ssize_t ndigits;
    if (p < stop && (*p == '+' || *p == '-'))
        negative = *p++ == '-';
    first = p;
    while (p < stop && (d = (unsigned)*p - '0') < 10) {
        w = w * 10 + d;
        p++;
    }
    ndigits = p - first;
    if (p < stop && *p == '.') {
        const unsigned char *frac = ++p;
        while (p < stop && (d = (unsigned)*p - '0') < 10) {
            w = w * 10 + d;
            p++;
        }
        exp10 = -(long)(p - frac);
        ndigits += p - frac;
    }
    if (ndigits == 0)
        return NUM_BAD;
    if (p < stop && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        long e = 0;
        p++;
        if (p < stop && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        if (p >= stop || (unsigned)*p - '0' >= 10)
            return NUM_BAD;
        while (p < stop && (d = (unsigned)*p - '0') < 10) {
            if (e < 100000)
                e = e * 10 + d;
            p++;
        }
        exp10 += eneg ? -e : e;
    }
    if (p < stop && *p != sep)
        return NUM_BAD;
    *next = p;
    if (ndigits > 19) /* w wrapped: only the correctly rounding slow path can read it */
        return NUM_SLOW;
    if (w == 0) {
        *out = negative ? -0.0 : 0.0;
        return NUM_OK;
    }
    if (w > ((uint64_t)1 << 53) || exp10 < -22 || exp10 > 22)
        return NUM_SLOW;
    double value = (double)w;
    value = exp10 < 0 ? value / exact_pow10[-exp10] : value * exact_pow10[exp10];
    *out = negative ? -value : value;
    return NUM_OK;
}

typedef struct {
    Py_ssize_t cell; /* index into the output */
    const unsigned char *p;
    Py_ssize_t n;
} slow_number;

/* One call's work: rows (held by a tuple of ours) -> out[nrows * nout] floats or doubles. */
typedef struct {
    Py_ssize_t nrows, ncols, nout;
    const unsigned char **data;
    Py_ssize_t *lens;
    Py_ssize_t *slot; /* column -> output position, -1 unused */
    int identity;     /* slot[c] == c for every column: every column used, in order */
    unsigned char sep;
    int want_double;
    char *out;
    slow_number *slow; /* numbers left to the correctly rounding path, converted with the GIL */
    Py_ssize_t nslow, slow_cap;
} csv_job;

/* slot[] from usecols (None: every column, in order); -1 with an exception set. */
static int csv_columns(PyObject *usecols_obj, csv_job *job)
{
    job->slot = alloc_items(job->ncols, sizeof(Py_ssize_t)); /* ncols is the caller's: checked */
    if (job->slot == NULL)
        return -1;
    if (usecols_obj == Py_None) {
        for (Py_ssize_t c = 0; c < job->ncols; c++)
            job->slot[c] = c;
        job->nout = job->ncols;
        job->identity = 1;
        return 0;
    }
    /* A tuple of our own: an item's __index__ may change the caller's list meanwhile. */
    PyObject *cols = PySequence_Tuple(usecols_obj);
    if (cols == NULL)
        return -1;
    job->nout = PyTuple_GET_SIZE(cols);
    for (Py_ssize_t c = 0; c < job->ncols; c++)
        job->slot[c] = -1;
    for (Py_ssize_t k = 0; k < job->nout; k++) {
        Py_ssize_t c = PyNumber_AsSsize_t(PyTuple_GET_ITEM(cols, k), PyExc_OverflowError);
        if (c == -1 && PyErr_Occurred()) {
            Py_DECREF(cols);
            return -1;
        }
        if (c < 0 || c >= job->ncols || job->slot[c] >= 0) {
            Py_DECREF(cols);
            PyErr_SetString(PyExc_ValueError, "usecols must hold distinct indices below ncols");
            return -1;
        }
        job->slot[c] = k;
    }
    Py_DECREF(cols);
    job->identity = job->nout == job->ncols;
    for (Py_ssize_t c = 0; c < job->ncols && job->identity; c++)
        job->identity = job->slot[c] == c;
    return 0;
}

static inline void csv_store(const csv_job *job, Py_ssize_t cell, double value)
{
    if (job->want_double)
        ((double *)job->out)[cell] = value;
    else
        ((float *)job->out)[cell] = (float)value;
}

/* Note a number for the slow path; -1 when out of memory (runs without the GIL). */
static int csv_defer(csv_job *job, Py_ssize_t cell, const unsigned char *p, Py_ssize_t n)
{
    if (job->nslow == job->slow_cap) {
        Py_ssize_t cap = grown_capacity(job->slow_cap, sizeof(slow_number), 64);
        slow_number *grown =
            cap < 0 ? NULL : PyMem_RawRealloc(job->slow, (size_t)cap * sizeof(slow_number));
        if (grown == NULL)
            return -1;
        job->slow = grown;
        job->slow_cap = cap;
    }
    job->slow[job->nslow].cell = cell;
    job->slow[job->nslow].p = p;
    job->slow[job->nslow].n = n;
    job->nslow++;
    return 0;
}

/* Parse row r: NUM_OK, NUM_BAD (not a plain row of ncols numbers) or -1 (out of memory).
 * The job's fields are read once into locals (stores into the output could otherwise be taken
 * to change them), and rows that use every column in order skip the slot lookups. */
static int csv_row(csv_job *job, Py_ssize_t r)
{
    const unsigned char *p = job->data[r], *stop = job->data[r] + job->lens[r];
    const Py_ssize_t ncols = job->ncols, last = ncols - 1;
    const Py_ssize_t *slot = job->slot;
    const unsigned char sep = job->sep;
    const int every = job->nout == ncols && job->identity;
    const int want_double = job->want_double;
    char *const out = job->out;
    const Py_ssize_t base = r * job->nout;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        const unsigned char *field = p, *fend;
        double value = 0.0;
        int kind = NUM_OK;
        const Py_ssize_t at = every ? c : slot[c];
        if (at < 0) { /* an unused column: only find its end */
            const unsigned char *next = memchr(p, sep, (size_t)(stop - p));
            fend = next ? next : stop;
        } else if ((kind = parse_decimal(p, stop, sep, &value, &fend)) == NUM_BAD) {
            return NUM_BAD;
        }
        /* a separator must follow every field but the last, and none the last */
        if ((fend == stop) != (c == last))
            return NUM_BAD;
        p = fend + 1;
        if (at < 0)
            continue;
        Py_ssize_t cell = base + at;
        if (kind == NUM_SLOW && csv_defer(job, cell, field, fend - field) < 0)
            return -1;
        if (want_double)
            ((double *)out)[cell] = value;
        else
            ((float *)out)[cell] = (float)value;
    }
    return NUM_OK;
}

/* The deferred numbers, with PyOS_string_to_double: 0, 1 (not a number after all: the caller's
 * general path decides) or -1 with an exception set. */
static int csv_convert_slow(const csv_job *job)
{
    for (Py_ssize_t k = 0; k < job->nslow; k++) {
        const slow_number *num = &job->slow[k];
        char small[64], *text = small, *end;
        if (num->n >= (Py_ssize_t)sizeof(small)) {
            text = PyMem_Malloc(num->n + 1);
            if (text == NULL) {
                PyErr_NoMemory();
                return -1;
            }
        }
        memcpy(text, num->p, num->n);
        text[num->n] = '\0';
        double value = PyOS_string_to_double(text, &end, NULL);
        int failed = (value == -1.0 && PyErr_Occurred()) || end != text + num->n;
        if (text != small)
            PyMem_Free(text);
        if (failed) { /* not expected for the grammar above */
            PyErr_Clear();
            return 1;
        }
        csv_store(job, num->cell, value);
    }
    return 0;
}

/* Point data/lens at the rows (bytes in ``seq``, a tuple of ours): 0, 1 (a row is not bytes:
 * the caller's general path takes other bytes-likes) or -1 with an exception set. */
static int csv_take_rows(PyObject *seq, csv_job *job)
{
    job->nrows = PyTuple_GET_SIZE(seq);
    job->data = alloc_items(job->nrows, sizeof(*job->data));
    job->lens = job->data ? alloc_items(job->nrows, sizeof(*job->lens)) : NULL;
    if (job->lens == NULL)
        return -1;
    for (Py_ssize_t r = 0; r < job->nrows; r++) {
        PyObject *row = PyTuple_GET_ITEM(seq, r);
        if (!PyBytes_Check(row))
            return 1;
        job->data[r] = (const unsigned char *)PyBytes_AS_STRING(row);
        job->lens[r] = PyBytes_GET_SIZE(row);
    }
    return 0;
}

/* Parse every row into a new bytearray (returned), then the deferred numbers; Py_None (new
 * reference) when the kernel declines the input. */
static PyObject *csv_parse(csv_job *job)
{
    Py_ssize_t ncells, nbytes;
    int verdict = NUM_OK;
    if (checked_mul(job->nrows, job->nout, &ncells) < 0 ||
        checked_mul(ncells, job->want_double ? 8 : 4, &nbytes) < 0)
        return NULL;
    PyObject *storage = new_storage(nbytes, &job->out);
    if (storage == NULL)
        return NULL;
    /* The rows are immutable bytes held by our tuple: parse them without the GIL. */
    PyThreadState *state = job->nrows >= GIL_RELEASE_MIN_RECORDS ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t r = 0; r < job->nrows && verdict == NUM_OK; r++)
        verdict = csv_row(job, r);
    if (state != NULL)
        PyEval_RestoreThread(state);
    int slow = verdict == NUM_OK ? csv_convert_slow(job) : 0;
    if (verdict == -1 || slow < 0) {
        if (verdict == -1)
            PyErr_NoMemory();
        Py_DECREF(storage);
        return NULL;
    }
    if (verdict == NUM_BAD || slow == 1) {
        Py_DECREF(storage);
        Py_RETURN_NONE;
    }
    return storage;
}

PyDoc_STRVAR(parse_csv_floats_doc,
"parse_csv_floats(rows, ncols, delimiter=b',', usecols=None, double=False) -> ndarray | None\n\n"
"Parse unquoted CSV rows (bytes, no line terminators) of exactly ncols decimal numbers into a\n"
"(len(rows), len(usecols) or ncols) float32 (float64 if double) array, with the values\n"
"numpy.loadtxt gives; None if any row (or used field) is not that simple, or not bytes.");

static PyObject *py_parse_csv_floats(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"rows", "ncols", "delimiter", "usecols", "double", NULL};
    PyObject *rows, *usecols_obj = Py_None, *result = NULL, *seq = NULL;
    Py_buffer delim = {0};
    csv_job job;
    memset(&job, 0, sizeof(job));
    job.sep = ',';

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On|y*Op:parse_csv_floats", kwlist, &rows,
                                     &job.ncols, &delim, &usecols_obj, &job.want_double))
        return NULL;
    if (delim.buf != NULL && delim.len != 1) {
        PyErr_SetString(PyExc_ValueError, "delimiter must be one byte");
        goto done;
    }
    if (delim.buf != NULL)
        job.sep = ((const unsigned char *)delim.buf)[0];
    if (job.ncols < 0) {
        PyErr_SetString(PyExc_ValueError, "ncols must not be negative");
        goto done;
    }
    /* The rows in a tuple of our own, taken before any call that can run Python code (usecols'
     * __index__): the bytes objects it holds stay alive (and immutable) while we read them, with
     * or without the GIL, whatever the caller's list goes through. */
    seq = PySequence_Tuple(rows);
    if (seq == NULL)
        goto done;
    if (job.ncols == 0) { /* rows of no fields: nothing this kernel can say */
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    if (csv_columns(usecols_obj, &job) < 0)
        goto done;
    int taken = csv_take_rows(seq, &job);
    if (taken != 0) {
        if (taken > 0) {
            Py_INCREF(Py_None);
            result = Py_None;
        }
        goto done;
    }
    PyObject *storage = csv_parse(&job);
    if (storage == NULL || storage == Py_None) {
        result = storage;
        goto done;
    }
    PyObject *flat = array_from(storage, job.want_double ? "=f8" : "=f4");
    Py_DECREF(storage);
    if (flat != NULL) {
        result = PyObject_CallMethod(flat, "reshape", "nn", job.nrows, job.nout);
        Py_DECREF(flat);
    }
done:
    if (delim.buf != NULL)
        PyBuffer_Release(&delim);
    PyMem_Free(job.slot);
    PyMem_Free(job.data);
    PyMem_Free(job.lens);
    PyMem_RawFree(job.slow);
    Py_XDECREF(seq);
    return result;
}

PyMethodDef csv_methods[] = {
    {"parse_csv_floats", (PyCFunction)(void (*)(void))py_parse_csv_floats,
     METH_VARARGS | METH_KEYWORDS, parse_csv_floats_doc},
    {NULL, NULL, 0, NULL},
};
