#include "speedups.h"

/* ---------------------------------------------------------------------------------------------
 * shuffle_exchange: the steady state of a full shuffle buffer
 *
 * for j in range(len(slots)): out[j] = buf[slots[j]]; buf[slots[j]] = items[j]
 * ``buf`` is a 1-D numpy object array (written in place through the buffer protocol), ``slots``
 * an int64 array (indices as numpy reads them: negative ones count from the end). Same result as
 * streamio.pipeline.shuffle._ExchangePlan.apply (the reference), without per-item Python work.
 * ------------------------------------------------------------------------------------------- */

/* Nonzero (IndexError set) when a slot is outside a buffer of n, negative slots counting from
 * the end as numpy reads them. Both kernels check every slot before changing anything. */
static int slots_out_of_bounds(const int64_t *slots, Py_ssize_t k, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t at = slots[j] < 0 ? slots[j] + n : slots[j];
        if (at < 0 || at >= n) {
            PyErr_Format(PyExc_IndexError, "slot %lld is out of bounds for a buffer of %zd",
                         (long long)slots[j], n);
            return 1;
        }
    }
    return 0;
}

PyDoc_STRVAR(shuffle_exchange_doc,
"shuffle_exchange(buf, slots, items) -> list\n\n"
"For each j in order: emit buf[slots[j]] and put items[j] in its place. buf: a 1-D numpy\n"
"object array (changed in place); slots: int64 array; returns the emitted items.");

static PyObject *py_shuffle_exchange(PyObject *self, PyObject *args)
{
    PyObject *buf_obj, *slots_obj, *items_obj, *items = NULL, *out = NULL;
    Py_buffer bufv = {0}, slotv = {0};
    if (!PyArg_ParseTuple(args, "OOO:shuffle_exchange", &buf_obj, &slots_obj, &items_obj))
        return NULL;
    if (PyObject_GetBuffer(buf_obj, &bufv, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (bufv.ndim != 1 || bufv.format == NULL || strcmp(bufv.format, "O") != 0 ||
        bufv.itemsize != (Py_ssize_t)sizeof(PyObject *)) {
        PyErr_SetString(PyExc_TypeError, "buf must be a 1-D numpy array of dtype object");
        goto done;
    }
    if (PyObject_GetBuffer(slots_obj, &slotv, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (slotv.ndim != 1 || slotv.itemsize != 8 || slotv.format == NULL ||
        (strcmp(slotv.format, "l") != 0 && strcmp(slotv.format, "q") != 0 &&
         strcmp(slotv.format, "<q") != 0 && strcmp(slotv.format, "=q") != 0)) {
        PyErr_SetString(PyExc_TypeError, "slots must be a 1-D int64 array");
        goto done;
    }
    /* A tuple of our own: PyList_New below can run a garbage collection, whose finalizers may
     * change the caller's list. */
    items = PySequence_Tuple(items_obj);
    if (items == NULL)
        goto done;
    Py_ssize_t k = slotv.len / 8, n = bufv.len / (Py_ssize_t)sizeof(PyObject *);
    if (PyTuple_GET_SIZE(items) != k) {
        PyErr_SetString(PyExc_ValueError, "slots and items must have the same length");
        goto done;
    }
    const int64_t *slots = (const int64_t *)slotv.buf;
    if (slots_out_of_bounds(slots, k, n)) /* check first: a failure leaves buf untouched */
        goto done;
    out = PyList_New(k);
    if (out == NULL)
        goto done;
    PyObject **cells = (PyObject **)bufv.buf;
    PyObject **news = &PyTuple_GET_ITEM(items, 0);
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t at = slots[j] < 0 ? slots[j] + n : slots[j];
        PyObject *old = cells[at];
        if (old == NULL) { /* numpy fills object arrays with None, but be safe */
            old = Py_None;
            Py_INCREF(old);
        }
        Py_INCREF(news[j]);
        cells[at] = news[j];
        PyList_SET_ITEM(out, j, old); /* the buffer's reference moves to the list */
    }
done:
    if (bufv.obj != NULL)
        PyBuffer_Release(&bufv);
    if (slotv.obj != NULL)
        PyBuffer_Release(&slotv);
    Py_XDECREF(items);
    return out;
}

PyDoc_STRVAR(shuffle_exchange_int64_doc,
"shuffle_exchange_int64(buf, slots, new, out) -> None\n\n"
"shuffle_exchange for a parallel int64 array (the ids or sizes that travel with the items):\n"
"for each j in order, out[j] = buf[slots[j]]; buf[slots[j]] = new[j]. All four are 1-D int64\n"
"arrays; buf and out are written in place.");

static int int64_vector(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS |
                                          (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->ndim != 1 || view->itemsize != 8 || view->format == NULL ||
        (strcmp(view->format, "l") != 0 && strcmp(view->format, "q") != 0 &&
         strcmp(view->format, "<q") != 0 && strcmp(view->format, "=q") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D int64 array", name);
        return -1;
    }
    return 0;
}

static PyObject *py_shuffle_exchange_int64(PyObject *self, PyObject *args)
{
    PyObject *objs[4];
    Py_buffer views[4];
    static const char *const names[4] = {"buf", "slots", "new", "out"};
    PyObject *result = NULL;
    memset(views, 0, sizeof(views));
    if (!PyArg_ParseTuple(args, "OOOO:shuffle_exchange_int64", &objs[0], &objs[1], &objs[2],
                          &objs[3]))
        return NULL;
    for (int v = 0; v < 4; v++)
        if (int64_vector(objs[v], &views[v], v == 0 || v == 3, names[v]) < 0)
            goto done;
    Py_ssize_t n = views[0].len / 8, k = views[1].len / 8;
    if (views[2].len / 8 != k || views[3].len / 8 != k) {
        PyErr_SetString(PyExc_ValueError, "slots, new and out must have the same length");
        goto done;
    }
    int64_t *buf = (int64_t *)views[0].buf, *out = (int64_t *)views[3].buf;
    const int64_t *slots = (const int64_t *)views[1].buf, *news = (const int64_t *)views[2].buf;
    if (slots_out_of_bounds(slots, k, n)) /* check first: a failure leaves buf untouched */
        goto done;
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t at = slots[j] < 0 ? slots[j] + n : slots[j];
        int64_t value = news[j]; /* read first: new and out may be the same array */
        out[j] = buf[at];
        buf[at] = value;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int v = 0; v < 4; v++)
        if (views[v].obj != NULL)
            PyBuffer_Release(&views[v]);
    return result;
}

PyMethodDef shuffle_methods[] = {
    {"shuffle_exchange", py_shuffle_exchange, METH_VARARGS, shuffle_exchange_doc},
    {"shuffle_exchange_int64", py_shuffle_exchange_int64, METH_VARARGS,
     shuffle_exchange_int64_doc},
    {NULL, NULL, 0, NULL},
};
