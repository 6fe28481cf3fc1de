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

PyDoc_STRVAR(parse_csv_floats_doc,
"parse_csv_floats(rows, ncols, delimiter=b',', usecols=None, double=False) -> ndarray | None\n\n"
"Parse unquoted CSV rows (bytes, no line terminators) of exactly ncols decimal numbers into a\n"
"(len(rows), len(usecols) or ncols) float32 (float64 if double) array, with the values\n"
"numpy.loadtxt gives; None if any row (or used field) is not that simple, or not bytes.");

static PyObject *py_parse_csv_floats(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"rows", "ncols", "delimiter", "usecols", "double", NULL};
    PyObject *rows, *usecols_obj = Py_None, *result = NULL, *storage = NULL, *seq = NULL;
    Py_ssize_t ncols, nout;
    Py_buffer delim = {0};
    int want_double = 0, verdict = NUM_OK;
    Py_ssize_t *slot = NULL; /* column -> output position, -1 unused */
    const unsigned char **data = NULL;
    Py_ssize_t *lens = NULL;
    slow_number *slow = NULL;
    Py_ssize_t nslow = 0, slow_cap = 0;
    char *out;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On|y*Op:parse_csv_floats", kwlist, &rows,
                                     &ncols, &delim, &usecols_obj, &want_double))
        return NULL;
    unsigned char sep = ',';
    if (delim.buf != NULL) {
        if (delim.len != 1) {
            PyErr_SetString(PyExc_ValueError, "delimiter must be one byte");
            goto done;
        }
        sep = ((const unsigned char *)delim.buf)[0];
    }
    if (ncols < 0) {
        PyErr_SetString(PyExc_ValueError, "ncols must not be negative");
        goto done;
    }
    /* The rows in a tuple of our own, taken before any call that can run Python code (usecols'
     * __index__): the bytes objects it holds stay alive (and immutable) while we read them, with
     * or without the GIL, whatever the caller's list goes through. */
    seq = PySequence_Tuple(rows);
    if (seq == NULL)
        goto done;
    Py_ssize_t nrows = PyTuple_GET_SIZE(seq), ncells;
    if (ncols == 0) { /* rows of no fields: nothing this kernel can say */
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    slot = alloc_items(ncols, sizeof(Py_ssize_t)); /* ncols is the caller's: checked */
    if (slot == NULL)
        goto done;
    if (usecols_obj == Py_None) {
        for (Py_ssize_t c = 0; c < ncols; c++)
            slot[c] = c;
        nout = ncols;
    } else {
        /* A tuple of our own: an item's __index__ may change the caller's list meanwhile. */
        PyObject *cols = PySequence_Tuple(usecols_obj);
        if (cols == NULL)
            goto done;
        nout = PyTuple_GET_SIZE(cols);
        for (Py_ssize_t c = 0; c < ncols; c++)
            slot[c] = -1;
        for (Py_ssize_t k = 0; k < nout; k++) {
            Py_ssize_t c = PyNumber_AsSsize_t(PyTuple_GET_ITEM(cols, k), PyExc_OverflowError);
            if (c == -1 && PyErr_Occurred()) {
                Py_DECREF(cols);
                goto done;
            }
            if (c < 0 || c >= ncols || slot[c] >= 0) {
                Py_DECREF(cols);
                PyErr_SetString(PyExc_ValueError, "usecols must hold distinct indices below ncols");
                goto done;
            }
            slot[c] = k;
        }
        Py_DECREF(cols);
    }
    data = alloc_items(nrows, sizeof(*data));
    lens = data ? alloc_items(nrows, sizeof(*lens)) : NULL;
    if (lens == NULL)
        goto done;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        PyObject *row = PyTuple_GET_ITEM(seq, r);
        if (!PyBytes_Check(row)) { /* other bytes-likes: the caller's general path takes them */
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        data[r] = (const unsigned char *)PyBytes_AS_STRING(row);
        lens[r] = PyBytes_GET_SIZE(row);
    }
    int width = want_double ? 8 : 4;
    Py_ssize_t nbytes;
    if (checked_mul(nrows, nout, &ncells) < 0 || checked_mul(ncells, width, &nbytes) < 0)
        goto done;
    storage = new_storage(nbytes, &out);
    if (storage == NULL)
        goto done;

    /* Parse the rows (held by ``seq``) without the GIL. Numbers that need the correctly
     * rounding slow path are noted and converted afterwards, with it. */
    PyThreadState *csv_state = nrows >= GIL_RELEASE_MIN_RECORDS ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t r = 0; r < nrows && verdict != NUM_BAD; r++) {
        const unsigned char *p = data[r], *stop = data[r] + lens[r];
        for (Py_ssize_t c = 0; c < ncols; c++) {
            const unsigned char *field = p, *fend;
            double value;
            int kind;
            if (slot[c] < 0) { /* an unused column: only find its end */
                const unsigned char *next = memchr(p, sep, (size_t)(stop - p));
                fend = next ? next : stop;
                kind = NUM_OK;
            } else {
                kind = parse_decimal(p, stop, sep, &value, &fend);
                if (kind == NUM_BAD) {
                    verdict = NUM_BAD;
                    break;
                }
            }
            /* a separator must follow every field but the last, and none the last */
            if ((fend == stop) != (c == ncols - 1)) {
                verdict = NUM_BAD;
                break;
            }
            p = fend + 1;
            if (slot[c] < 0)
                continue;
            Py_ssize_t cell = r * nout + slot[c];
            if (kind == NUM_SLOW) {
                if (nslow == slow_cap) {
                    Py_ssize_t cap = grown_capacity(slow_cap, sizeof(slow_number), 64);
                    slow_number *grown =
                        cap < 0 ? NULL : PyMem_RawRealloc(slow, (size_t)cap * sizeof(slow_number));
                    if (grown == NULL) {
                        verdict = -1;
                        break;
                    }
                    slow = grown;
                    slow_cap = cap;
                }
                slow[nslow].cell = cell;
                slow[nslow].p = field;
                slow[nslow].n = fend - field;
                nslow++;
                value = 0.0;
            }
            if (want_double)
                ((double *)out)[cell] = value;
            else
                ((float *)out)[cell] = (float)value;
        }
        if (verdict == -1)
            break;
    }
    if (csv_state != NULL)
        PyEval_RestoreThread(csv_state);
    if (verdict == -1) {
        PyErr_NoMemory();
        goto done;
    }
    if (verdict == NUM_BAD) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    for (Py_ssize_t k = 0; k < nslow; k++) {
        char small[64], *text = small;
        if (slow[k].n >= (Py_ssize_t)sizeof(small)) {
            text = PyMem_Malloc(slow[k].n + 1);
            if (text == NULL) {
                PyErr_NoMemory();
                goto done;
            }
        }
        memcpy(text, slow[k].p, slow[k].n);
        text[slow[k].n] = '\0';
        char *end;
        double value = PyOS_string_to_double(text, &end, NULL);
        int failed = (value == -1.0 && PyErr_Occurred()) || end != text + slow[k].n;
        if (text != small)
            PyMem_Free(text);
        if (failed) { /* not expected for the grammar above; let the caller's path decide */
            PyErr_Clear();
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        if (want_double)
            ((double *)out)[slow[k].cell] = value;
        else
            ((float *)out)[slow[k].cell] = (float)value;
    }
    {
        PyObject *flat = array_from(storage, want_double ? "=f8" : "=f4");
        if (flat != NULL) {
            result = PyObject_CallMethod(flat, "reshape", "nn", nrows, nout);
            Py_DECREF(flat);
        }
    }
done:
    if (delim.buf != NULL)
        PyBuffer_Release(&delim);
    PyMem_Free(slot);
    PyMem_Free(data);
    PyMem_Free(lens);
    PyMem_RawFree(slow);
    Py_XDECREF(storage);
    Py_XDECREF(seq);
    return result;
}

PyMethodDef csv_methods[] = {
    {"parse_csv_floats", (PyCFunction)(void (*)(void))py_parse_csv_floats,
     METH_VARARGS | METH_KEYWORDS, parse_csv_floats_doc},
    {NULL, NULL, 0, NULL},
};
