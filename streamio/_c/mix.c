#include "speedups.h"

/* ---------------------------------------------------------------------------------------------
 * interleave: the placement of streamio.mix
 *
 * out[t] = the next item of parts[choices[t]], for t in order. Same result (and the same errors)
 * as streamio.pipeline.mix.interleave_reference, in one pass without per-item Python work.
 * ------------------------------------------------------------------------------------------- */

PyDoc_STRVAR(interleave_doc,
"interleave(choices, parts, starts) -> list\n\n"
"out[t] is the next item of parts[choices[t]], starting at parts[k][starts[k]]: choices a\n"
"contiguous buffer of uint8 part numbers, parts a list of lists, starts a list of ints, one\n"
"per part; parts[k] holds at least as many items from starts[k] on as choices name k.");

static PyObject *py_interleave(PyObject *self, PyObject *args)
{
    PyObject *choices_obj, *parts, *starts, *out = NULL;
    Py_buffer view = {0};
    Py_ssize_t counts[256] = {0}, taken[256] = {0};
    PyObject **items[256];
    if (!PyArg_ParseTuple(args, "OO!O!:interleave", &choices_obj, &PyList_Type, &parts,
                          &PyList_Type, &starts))
        return NULL;
    if (PyObject_GetBuffer(choices_obj, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (view.ndim > 1 || view.itemsize != 1) {
        PyErr_SetString(PyExc_TypeError, "choices must be a 1-D buffer of uint8");
        goto done;
    }
    const unsigned char *choices = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    /* Before anything of parts is looked at: allocating can run a garbage collection, whose
     * finalizers could change the lists. Nothing below calls back into Python. */
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t t = 0; t < n; t++)
        counts[choices[t]]++;
    Py_ssize_t nparts = PyList_GET_SIZE(parts);
    if (nparts > 256) { /* a uint8 names at most 256 */
        PyErr_Format(PyExc_ValueError, "at most 256 parts, not %zd", nparts);
        goto fail;
    }
    for (Py_ssize_t k = nparts; k < 256; k++) {
        if (counts[k]) {
            PyErr_Format(PyExc_ValueError, "choice %zd names no part (%zd parts)", k, nparts);
            goto fail;
        }
    }
    if (PyList_GET_SIZE(starts) != nparts) {
        PyErr_Format(PyExc_ValueError, "starts has %zd entries for %zd parts",
                     PyList_GET_SIZE(starts), nparts);
        goto fail;
    }
    for (Py_ssize_t k = 0; k < nparts; k++) {
        PyObject *part = PyList_GET_ITEM(parts, k), *start_obj = PyList_GET_ITEM(starts, k);
        if (!PyList_Check(part)) {
            PyErr_Format(PyExc_TypeError, "parts[%zd] must be a list", k);
            goto fail;
        }
        if (!PyLong_CheckExact(start_obj)) {
            PyErr_Format(PyExc_TypeError, "starts[%zd] must be an int", k);
            goto fail;
        }
        Py_ssize_t start = PyLong_AsSsize_t(start_obj), size = PyList_GET_SIZE(part);
        if (start == -1 && PyErr_Occurred())
            goto fail;
        if (start < 0 || start > size || size - start < counts[k]) {
            PyErr_Format(PyExc_ValueError, "parts[%zd] holds %zd items from %zd for %zd choices",
                         k, size, start, counts[k]);
            goto fail;
        }
        /* An empty list has no item array (NULL): no offset from it (undefined behaviour,
         * even by 0); nothing is read from it, as counts[k] is 0. */
        PyObject **first = PySequence_Fast_ITEMS(part);
        items[k] = first == NULL ? NULL : first + start;
    }
    for (Py_ssize_t t = 0; t < n; t++) {
        unsigned char k = choices[t];
        PyObject *item = items[k][taken[k]++];
        Py_INCREF(item);
        PyList_SET_ITEM(out, t, item);
    }
    goto done;
fail:
    Py_CLEAR(out); /* a list with empty (NULL) slots is freed safely */
done:
    PyBuffer_Release(&view);
    return out;
}

PyMethodDef mix_methods[] = {
    {"interleave", py_interleave, METH_VARARGS, interleave_doc},
    {NULL, NULL, 0, NULL},
};
