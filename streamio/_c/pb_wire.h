/* Protobuf wire reading, shared by the protobuf kernels (pb_batch.c, pb_example.c,
 * pb_recordio.c): inline, as it runs for every field of every record. */
#ifndef STREAMIO_PB_WIRE_H
#define STREAMIO_PB_WIRE_H

#include "speedups.h"

/* ---------------------------------------------------------------------------------------------
 * Protobuf wire reading (the same rules as streamio/decoders/wire.py, error texts included)
 *
 * Protobuf wire format: a message is fields ``tag = field << 3 | wire_type`` (a varint) followed
 * by the value: 0 varint, 1 eight bytes, 2 varint length + bytes, 5 four bytes, 3/4 group
 * start/end. Every function returns 0 or -1 after writing the reason into ``err``.
 * ------------------------------------------------------------------------------------------- */

#define WIRE_MAX_VARINT_BYTES 10
#define WIRE_MAX_GROUP_DEPTH 100

typedef struct {
    char msg[160];
} wire_err;

static inline int wire_fail(wire_err *err, const char *msg)
{
    snprintf(err->msg, sizeof(err->msg), "%s", msg);
    return -1;
}

/* A varint at b[*pos:end] as an unsigned 64-bit value (bits past the 64th dropped). */
static inline int rd_varint(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end, uint64_t *out,
                            wire_err *err)
{
    Py_ssize_t p = *pos;
    if (p >= end)
        return wire_fail(err, "truncated varint");
    unsigned char byte = b[p++];
    if (byte < 0x80) {
        *out = byte;
        *pos = p;
        return 0;
    }
    uint64_t result = byte & 0x7F;
    int shift = 7;
    for (;;) {
        if (p >= end)
            return wire_fail(err, "truncated varint");
        byte = b[p++];
        result |= (uint64_t)(byte & 0x7F) << shift; /* shift <= 63 here */
        if (byte < 0x80) {
            *out = result;
            *pos = p;
            return 0;
        }
        shift += 7;
        if (shift >= 7 * WIRE_MAX_VARINT_BYTES)
            return wire_fail(err, "varint longer than 10 bytes");
    }
}

static inline int rd_tag(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end, uint64_t *tag,
                         wire_err *err)
{
    if (b[*pos] < 0x80) { /* callers guarantee *pos < end */
        *tag = b[(*pos)++];
        return 0;
    }
    return rd_varint(b, pos, end, tag, err);
}

/* A length prefix at *pos: the delimited bytes are [*start, *stop); *pos is left unchanged. */
static inline int rd_len(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *start,
                         Py_ssize_t *stop, wire_err *err)
{
    uint64_t length;
    if (pos < end && b[pos] < 0x80) {
        length = b[pos];
        pos += 1;
    } else if (rd_varint(b, &pos, end, &length, err) < 0) {
        return -1;
    }
    if (length > (uint64_t)(end - pos))
        return wire_fail(err, "length-delimited field runs past the end of its message");
    *start = pos;
    *stop = pos + (Py_ssize_t)length;
    return 0;
}

/* Skip the value of a field whose tag was read; *pos is just after the tag. */
static inline int skip_value(const unsigned char *b, uint64_t tag, Py_ssize_t *pos, Py_ssize_t end,
                             int depth, wire_err *err)
{
    uint64_t scratch;
    Py_ssize_t start, stop;
    if ((tag >> 3) == 0)
        return wire_fail(err, "field number 0");
    switch ((int)(tag & 7)) {
    case 0:
        return rd_varint(b, pos, end, &scratch, err);
    case 2:
        if (rd_len(b, *pos, end, &start, &stop, err) < 0)
            return -1;
        *pos = stop;
        return 0;
    case 5:
    case 1: {
        Py_ssize_t width = (tag & 7) == 5 ? 4 : 8;
        if (width > end - *pos)
            return wire_fail(err, "fixed-width field runs past the end of its message");
        *pos += width;
        return 0;
    }
    case 3:
        if (depth >= WIRE_MAX_GROUP_DEPTH)
            return wire_fail(err, "groups nested too deeply");
        for (;;) {
            uint64_t inner;
            if (rd_varint(b, pos, end, &inner, err) < 0)
                return -1;
            if ((inner & 7) == 4) {
                if ((inner >> 3) != (tag >> 3))
                    return wire_fail(err, "end-group tag does not match its start-group tag");
                return 0;
            }
            if (skip_value(b, inner, pos, end, depth + 1, err) < 0)
                return -1;
        }
    default:
        snprintf(err->msg, sizeof(err->msg), "invalid wire type %d", (int)(tag & 7));
        return -1;
    }
}

/* Bytes [start, stop) of the record being parsed. */
typedef struct {
    Py_ssize_t start, stop;
} span;

/* A bit per field number (below 32): the length-delimited fields a walker wants. */
#define FIELD_BIT(n) (1u << (n))

/* Whether ``tag`` is that of a length-delimited field whose number is in ``wanted``. The usual
 * sets are plain compares (the walkers' sets are constants once inlined: the hot loops keep
 * the cost of comparing tags directly). */
static inline int field_wanted(uint64_t tag, uint32_t wanted)
{
    if (wanted == FIELD_BIT(1))
        return tag == 0x0A;
    if (wanted == (FIELD_BIT(1) | FIELD_BIT(2)))
        return tag == 0x0A || tag == 0x12;
    /* wire type 2 and a field number below 32 (one test), then is that field wanted */
    return (tag & ~(uint64_t)0xF8) == 2 && (wanted & FIELD_BIT(tag >> 3));
}

/* The next length-delimited field of b[*pos:end] whose number is in ``wanted``, every other field
 * skipped: 1 with its number and the span of its bytes (*pos just after them), 0 at the end of
 * the message, -1 if malformed. */
static inline int next_field(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end,
                             uint32_t wanted, uint64_t *field, span *value, wire_err *err)
{
    while (*pos < end) {
        uint64_t tag;
        if (rd_tag(b, pos, end, &tag, err) < 0)
            return -1;
        if (field_wanted(tag, wanted)) {
            if (rd_len(b, *pos, end, &value->start, &value->stop, err) < 0)
                return -1;
            *pos = value->stop;
            *field = tag >> 3;
            return 1;
        }
        if (skip_value(b, tag, pos, end, 0, err) < 0)
            return -1;
    }
    return 0;
}

#endif
