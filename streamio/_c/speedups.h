/* Shared by the C kernels of streamio._speedups (one .c file per kernel family).
 *
 * Every kernel has a pure-Python (or numpy) reference with the same signature and results,
 * errors included; tests/kernels/test_kernel_*.py hold each to it with Hypothesis on valid, mutated and
 * random input. The package works without this module: it is built as an optional extension.
 *
 *   crc.c          crc32c, crc32c_portable               the crc32c package
 *   framing.c      scan_tfrecords, scan_recordio         streamio/formats/tfrecord.py, recordio.py
 *                  find_tfrecord_sync, find_recordio_sync (the loops beside them)
 *   pb_example.c   parse_examples                        streamio/decoders/example.py
 *                  parse_sequence_examples               streamio/decoders/example.py
 *   pb_recordio.c  parse_recordio_protobuf               streamio/decoders/recordio_protobuf.py
 *                  (both over pb_wire.h, the wire reading, and pb_batch.h/.c, the batch helpers)
 *   csv.c          parse_csv_floats                      numpy.loadtxt (the CSV decoder's fast path)
 *   shuffle.c      shuffle_exchange(_int64)              streamio/pipeline/shuffle.py (_ExchangePlan)
 *   mix.c          mix_take                              streamio/pipeline/mix.py (mix_take_reference)
 *   resample.c     resample                              Pillow's Image.resize (streamio/decoders/_resample.py)
 *                  (its SSE4.1/AVX2 passes in resample_x86.c, what both share in resample.h)
 *   module.c       the module: each family's method table, shared numpy helpers
 */
#ifndef STREAMIO_SPEEDUPS_H
#define STREAMIO_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* Kernel statuses: must equal streamio/formats/_framing.py. */
enum { ST_OK = 0, ST_BAD_HEADER = 1, ST_BAD_DATA = 2, ST_TOO_LARGE = 3, ST_SPECIAL = 4,
       ST_UNCONFIRMED = 5 };

#define TFRECORD_MASK_DELTA 0xA282EAD8u
#define TFRECORD_HEADER 12
#define TFRECORD_FOOTER 4
#define RECORDIO_MAGIC 0xCED7230Au
#define RECORDIO_HEADER 8
#define RECORDIO_LENGTH_MASK ((1u << 29) - 1)

/* Verifying this many payload bytes in one batch is worth releasing the GIL for: below it the
 * CRC takes less time than a possible wait to get the GIL back from a busy thread. */
#define GIL_RELEASE_BYTES (256 * 1024)
/* Batches of at least this many records (protobuf, CSV rows) are parsed with the GIL released: the record loop is
 * pure C over buffers we hold references to, so another thread (a prefetch producer reading and
 * shuffling the next batch, or a training step) runs meanwhile on a second core. Below it the
 * release is not worth it: taking the GIL back can wait for another thread's switch interval. */
#define GIL_RELEASE_MIN_RECORDS 32

/* Little-endian loads at any alignment: one unaligned load where the host is little-endian
 * (memcpy compiles to it), bytes assembled elsewhere. */
static inline uint32_t load_le32(const unsigned char *p)
{
#if PY_LITTLE_ENDIAN
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#else
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
#endif
}

static inline uint64_t load_le64(const unsigned char *p)
{
#if PY_LITTLE_ENDIAN
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    return (uint64_t)load_le32(p) | ((uint64_t)load_le32(p + 4) << 32);
#endif
}

/* Sizes from hostile arguments (an ncols of 2**61, a batch of many records) are multiplied
 * only through these: a wrapped product would allocate a small buffer and write past it. */
static inline int checked_mul(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out)
{
    if (a < 0 || b < 0 || (b != 0 && a > PY_SSIZE_T_MAX / b)) {
        PyErr_SetString(PyExc_OverflowError, "size of a buffer to allocate overflows");
        return -1;
    }
    *out = a * b;
    return 0;
}

/* PyMem_Malloc of n items (at least one, so that NULL always means failure) of ``size`` bytes,
 * the product checked; NULL with an exception set. */
static inline void *alloc_items(Py_ssize_t n, size_t size)
{
    Py_ssize_t bytes;
    if (checked_mul(n > 0 ? n : 1, (Py_ssize_t)size, &bytes) < 0)
        return NULL;
    void *p = PyMem_Malloc((size_t)bytes);
    if (p == NULL)
        PyErr_NoMemory();
    return p;
}

/* The new capacity of a doubling array of ``cap`` items of ``size`` bytes, or -1 if its byte
 * size would overflow (these grow without the GIL: the caller reports MemoryError later). */
static inline Py_ssize_t grown_capacity(Py_ssize_t cap, size_t size, Py_ssize_t first)
{
    if (cap == 0)
        return first;
    if (cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)size)
        return -1;
    return 2 * cap;
}

/* crc.c: CRC-32C, the implementation chosen at import by crc_init(). */
typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);
typedef uint32_t (*crc_copy_fn)(uint32_t, unsigned char *, const unsigned char *, size_t);
extern crc_fn crc32c_update;    /* CRC-32C of p[0:len] continuing from crc */
extern crc_copy_fn crc32c_copy; /* the same, copying p to dst as it goes */
extern int crc_is_hardware;     /* crc_init chose the crc32 instruction (SSE4.2) */
uint32_t crc32c_8_portable(const unsigned char *p); /* CRC-32C of p[0:8], by tables */
void crc_init(void);

/* TFRecord: masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xA282EAD8. */
static inline uint32_t mask_crc(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + TFRECORD_MASK_DELTA;
}

static inline uint32_t masked_crc(const unsigned char *p, size_t len)
{
    return mask_crc(crc32c_update(0, p, len));
}

/* module.c: numpy arrays without numpy's headers. */
PyObject *array_from(PyObject *bytearray, const char *dtype);
PyObject *new_storage(Py_ssize_t n, char **data);

/* Each family's methods, added to the module by module.c. */
extern PyMethodDef crc_methods[];
extern PyMethodDef framing_methods[];
extern PyMethodDef example_methods[];
extern PyMethodDef recordio_methods[];
extern PyMethodDef csv_methods[];
extern PyMethodDef shuffle_methods[];
extern PyMethodDef mix_methods[];
extern PyMethodDef resample_methods[];

/* resample.c: picks the SIMD level at import; its name for RESAMPLE_ISA. */
void resample_init(void);
const char *resample_isa_name(void);

#endif
