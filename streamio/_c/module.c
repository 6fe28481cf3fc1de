/* streamio._speedups: C versions of streamio's hot kernels, one source file per kernel family
 * (see speedups.h). This file makes the module and holds the helpers several families share. */
#include "speedups.h"

/* numpy, imported on first use: the module is built without numpy's headers, so arrays are made
 * with numpy.frombuffer over a bytearray we filled (writable, as the references' arrays are). */
static PyObject *np_frombuffer = NULL;

PyObject *array_from(PyObject *bytearray, const char *dtype)
{
    if (np_frombuffer == NULL) {
        PyObject *np = PyImport_ImportModule("numpy");
        if (np == NULL)
            return NULL;
        np_frombuffer = PyObject_GetAttrString(np, "frombuffer");
        Py_DECREF(np);
        if (np_frombuffer == NULL)
            return NULL;
    }
    return PyObject_CallFunction(np_frombuffer, "Os", bytearray, dtype);
}

/* A new zero-filled bytearray of n bytes (writable storage for an output array). */
PyObject *new_storage(Py_ssize_t n, char **data)
{
    PyObject *ba = PyByteArray_FromStringAndSize(NULL, n);
    if (ba == NULL)
        return NULL;
    *data = PyByteArray_AS_STRING(ba);
    return ba;
}

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    "streamio._speedups",
    "C versions of streamio's hot kernels (optional; the pure-Python references are the spec).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    PyMethodDef *families[] = {crc_methods, framing_methods, example_methods, recordio_methods,
                               csv_methods, shuffle_methods, resample_methods, mix_methods};
    crc_init();
    resample_init();
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        if (PyModule_AddFunctions(m, families[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (PyModule_AddIntConstant(m, "HARDWARE_CRC32C", crc_is_hardware) < 0 ||
        PyModule_AddStringConstant(m, "RESAMPLE_ISA", resample_isa_name()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
