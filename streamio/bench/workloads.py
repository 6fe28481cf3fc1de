"""The workloads: generated records (TFRecord Examples, large records, CSV, RecordIO-protobuf)
written to files the cases read, through a FIFO or directly."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..decoders.wire import len_field
from .config import (ADAPTER_PARTS, BenchConfig, CSV_FEATURES, EXAMPLE_FLOATS, LARGE_RECORD_SIZE,
                     RECORDIO_FEATURES, SEED)


# -- workloads ----------------------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    path: str
    records: int
    nbytes: int
    meta: dict = field(default_factory=dict)


def _template_rows(n: int, parts: list, fills: dict) -> np.ndarray:
    """Rows of identical layout: ``parts`` (bytes, or a fill name) joined; ``fills`` (n, k) uint8."""
    width = sum(len(p) if isinstance(p, bytes) else fills[p].shape[1] for p in parts)
    rows = np.empty((n, width), dtype=np.uint8)
    at = 0
    for part in parts:
        if isinstance(part, bytes):
            rows[:, at:at + len(part)] = np.frombuffer(part, dtype=np.uint8)
            at += len(part)
        else:
            block = fills[part]
            rows[:, at:at + block.shape[1]] = block
            at += block.shape[1]
    return rows


def _tfrecord_frames(payloads: np.ndarray) -> np.ndarray:
    """TFRecord frames of equal-length payloads: u64 length | u32 masked crc | data | u32 masked crc."""
    from ..formats.tfrecord import masked_crc32c

    n, length = payloads.shape
    head = np.frombuffer(length.to_bytes(8, "little"), dtype=np.uint8)
    head_crc = np.frombuffer(masked_crc32c(head.tobytes()).to_bytes(4, "little"), dtype=np.uint8)
    crcs = np.fromiter((masked_crc32c(row) for row in payloads), dtype="<u4", count=n)
    frames = np.empty((n, 12 + length + 4), dtype=np.uint8)
    frames[:, :8] = head
    frames[:, 8:12] = head_crc
    frames[:, 12:12 + length] = payloads
    frames[:, 12 + length:] = crcs.view(np.uint8).reshape(n, 4)
    return frames


def example_payloads(n: int, rng: np.random.Generator) -> tuple:
    """``n`` serialized tf.train.Example: ``x`` float32[32], ``label`` int64 in [0, 10).

    Every record has the same layout (the label fits one varint byte), so the batch is built as
    rows of a template with numpy rather than serialised one by one. Returns (payloads, x, label).
    """
    x = rng.standard_normal((n, EXAMPLE_FLOATS), dtype=np.float32)
    label = rng.integers(0, 10, n, dtype=np.int64)
    marker = b"\0" * (4 * EXAMPLE_FLOATS)  # the only run of 128 zero bytes in the message
    float_list = len_field(1, marker)  # FloatList { repeated float value = 1 [packed] }
    int64_list = len_field(1, b"\0")  # Int64List { repeated int64 value = 1 [packed] }
    entry_x = len_field(1, b"x") + len_field(2, len_field(2, float_list))  # Feature.float_list = 2
    entry_label = len_field(1, b"label") + len_field(2, len_field(3, int64_list))  # Feature.int64_list = 3
    example = len_field(1, len_field(1, entry_x) + len_field(1, entry_label))  # Example.features, Features.feature
    i = example.index(marker)
    # The label's one varint byte is the last byte of the message (its entry comes last).
    parts = [example[:i], "x", example[i + len(marker):-1], "label"]
    fills = {"x": x.view(np.uint8).reshape(n, -1), "label": label.astype(np.uint8).reshape(n, 1)}
    return _template_rows(n, parts, fills), x, label


def recordio_protobuf_payloads(n: int, rng: np.random.Generator) -> tuple:
    """``n`` SageMaker Records: features["values"] float32[128], label["values"] float32[1].

    The layout SageMaker's ``write_numpy_to_dense_tensor`` produces:
    Record { features = 1: map<string, Value>; label = 2 }, Value.float32_tensor = 2,
    Float32Tensor.values = 1 (packed).
    """
    x = rng.standard_normal((n, RECORDIO_FEATURES), dtype=np.float32)
    label = rng.integers(0, 2, n).astype(np.float32)
    mx, ml = b"\1" * (4 * RECORDIO_FEATURES), b"\2" * 4
    feat = len_field(1, len_field(1, b"values") + len_field(2, len_field(2, len_field(1, mx))))
    lab = len_field(2, len_field(1, b"values") + len_field(2, len_field(2, len_field(1, ml))))
    record = feat + lab
    i = record.index(mx)
    j = record.index(ml)
    parts = [record[:i], "x", record[i + len(mx):j], "label", record[j + 4:]]
    fills = {"x": x.view(np.uint8).reshape(n, -1), "label": label.view(np.uint8).reshape(n, 4)}
    return _template_rows(n, parts, fills), x, label


def _recordio_frames(payloads: np.ndarray) -> np.ndarray:
    """RecordIO frames of equal-length payloads: u32 magic | u32 length (cflag 0) | data | pad."""
    n, length = payloads.shape
    pad = -length & 3
    head = np.frombuffer((0xCED7230A).to_bytes(4, "little") + length.to_bytes(4, "little"),
                         dtype=np.uint8)
    frames = np.zeros((n, 8 + length + pad), dtype=np.uint8)
    frames[:, :8] = head
    frames[:, 8:8 + length] = payloads
    return frames


def make_workloads(cfg: BenchConfig, tmpdir: str) -> dict:
    rng = np.random.default_rng(SEED)
    out: dict = {}
    wanted = set(cfg.workloads)
    for name, count in (("examples", cfg.examples), ("pipeline", cfg.pipeline_records),
                        ("adapters", cfg.adapter_records)):
        if name not in wanted:
            continue
        payloads, _, _ = example_payloads(count, rng)
        frames = _tfrecord_frames(payloads)
        path = os.path.join(tmpdir, f"{name}.tfrecord")
        frames.tofile(path)
        meta = {"payload_bytes": payloads.shape[1], "framed_bytes": frames.shape[1]}
        if name == "adapters":  # the same records again, in part files
            bounds = np.linspace(0, count, ADAPTER_PARTS + 1).astype(int)
            meta["parts"] = []
            for k in range(ADAPTER_PARTS):
                part = os.path.join(tmpdir, f"{name}-part-{k}.tfrecord")
                frames[bounds[k]:bounds[k + 1]].tofile(part)
                meta["parts"].append(part)
        out[name] = Workload(name, path, count, frames.nbytes, meta)
    if "large" in wanted:
        from ..formats.tfrecord import encode_tfrecord

        path = os.path.join(tmpdir, "large.tfrecord")
        block = rng.integers(0, 256, LARGE_RECORD_SIZE + 4096, dtype=np.uint8).tobytes()
        nbytes = 0
        with open(path, "wb") as f:
            for i in range(cfg.large_records):
                start = (i * 97) % 4096  # distinct records without generating 100 MB of randomness
                frame = encode_tfrecord(block[start:start + LARGE_RECORD_SIZE])
                f.write(frame)
                nbytes += len(frame)
        out["large"] = Workload("large", path, cfg.large_records, nbytes,
                                {"record_bytes": LARGE_RECORD_SIZE})
    if "csv" in wanted:
        path = os.path.join(tmpdir, "rows.csv")
        label = rng.integers(0, 10, cfg.csv_rows)
        feats = rng.standard_normal((cfg.csv_rows, CSV_FEATURES)).round(5)
        table = np.column_stack([label, feats])
        np.savetxt(path, table, fmt=["%d"] + ["%.5f"] * CSV_FEATURES, delimiter=",")
        out["csv"] = Workload("csv", path, cfg.csv_rows, os.stat(path).st_size,
                              {"columns": CSV_FEATURES + 1, "header": False})
    if "recordio" in wanted:
        payloads, _, _ = recordio_protobuf_payloads(cfg.recordio_rows, rng)
        frames = _recordio_frames(payloads)
        path = os.path.join(tmpdir, "dense.recordio")
        frames.tofile(path)
        out["recordio"] = Workload("recordio", path, cfg.recordio_rows, frames.nbytes,
                                   {"payload_bytes": payloads.shape[1],
                                    "features": RECORDIO_FEATURES})
    return out
