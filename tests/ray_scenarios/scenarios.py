"""streamio on a real local Ray (nothing mocked): run by tests/adapters/test_ray.py inside a
private network namespace with only loopback up (Ray binds every interface and probes 8.8.8.8 to
find its address). Not named test_*.py, so the suite's own collection never runs it outside the
namespace.

One Ray instance for the whole module (starting Ray costs seconds on 2 cores).
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ray
import streamio
import streamio.ray as sray
from streamio import Example, FixedLen, VarLen, encode_example, write_records

ROOT = Path(__file__).resolve().parents[2]
DECODER = Example({"x": FixedLen((4,), "float32"), "y": FixedLen((), "int64")})


def examples(ids) -> list:
    return [encode_example({"x": np.full(4, i, dtype=np.float32), "y": int(i)}) for i in ids]


def ids_of(ds) -> list:
    return sorted(int(v) for batch in ds.iter_batches(batch_size=97, batch_format="numpy")
                  for v in batch["y"])


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    # 4 logical CPUs on a 2-core machine: the TorchTrainer's 2 workers hold 2, read tasks need
    # the others. Loopback only; no dashboard. address="local": always a cluster of its own, never
    # one that another process on this machine started (ray.init(address=None) joins the cluster
    # named in /tmp/ray, which the private network namespace does not make private).
    ray.init(address="local", num_cpus=4, object_store_memory=256 << 20, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield
    ray.shutdown()


def test_several_files_exactly_once(tmp_path):
    for f in range(5):
        write_records(tmp_path / f"part{f}.tfrecord", "tfrecord",
                      examples(range(f * 1000, f * 1000 + 1000)))
    ds = sray.read(str(tmp_path / "*.tfrecord"), "tfrecord", decoder=DECODER, parallelism=3)
    assert ids_of(ds) == list(range(5000))
    tasks = sray.Datasource(str(tmp_path), "tfrecord", decoder=DECODER).get_read_tasks(3)
    assert len(tasks) == 3  # whole files, spread over the tasks asked for
    assert sorted(n for t in tasks for n in t.metadata.input_files) == sorted(
        str(tmp_path / f"part{f}.tfrecord") for f in range(5))


def test_big_file_split_by_byte_range(tmp_path):
    path = tmp_path / "big.tfrecord"
    write_records(path, "tfrecord", examples(range(20000)))
    source = sray.Datasource(str(path), "tfrecord", decoder=DECODER)
    assert len(source.get_read_tasks(4)) == 4  # one file, four byte ranges
    ds = sray.read(str(path), "tfrecord", decoder=DECODER, parallelism=4)
    assert ids_of(ds) == list(range(20000))
    # Raw records, RecordIO, and blocks smaller than a range: still each record once.
    write_records(tmp_path / "big.rec", "recordio", [b"r%d" % i for i in range(7000)])
    raw = sray.read(str(tmp_path / "big.rec"), "recordio", parallelism=3, rows_per_block=500)
    got = sorted(r["record"] for r in raw.take_all())
    assert got == sorted(b"r%d" % i for i in range(7000))


def test_gzip_file_is_one_task(tmp_path):
    plain = tmp_path / "a.tfrecord"
    write_records(plain, "tfrecord", examples(range(3000)))
    (tmp_path / "a.tfrecord.gz").write_bytes(gzip.compress(plain.read_bytes()))
    source = sray.Datasource(str(tmp_path / "a.tfrecord.gz"), "tfrecord", decoder=DECODER)
    assert len(source.get_read_tasks(4)) == 1  # a compressed file cannot be split
    ds = sray.read(str(tmp_path / "a.tfrecord.gz"), "tfrecord", decoder=DECODER, parallelism=4)
    assert ids_of(ds) == list(range(3000))


def test_http_source_split_by_range(tmp_path, http_server):
    write_records(tmp_path / "h.tfrecord", "tfrecord", examples(range(6000)))
    url = http_server.put("/data/h.tfrecord", (tmp_path / "h.tfrecord").read_bytes())
    assert len(sray.Datasource(url, "tfrecord", decoder=DECODER).get_read_tasks(3)) == 3
    ds = sray.read(url, "tfrecord", decoder=DECODER, parallelism=3)
    assert ids_of(ds) == list(range(6000))
    ranged = [h for _, h in http_server.requests if "Range" in h]
    assert len(ranged) >= 2  # the later ranges were asked for from their offsets


def test_fifo_fed_by_another_process(tmp_path, fifo):
    path = tmp_path / "in.tfrecord"
    write_records(path, "tfrecord", examples(range(4000)))
    pipe = fifo.make(path.read_bytes(), 1000, 7, 65536)
    source = sray.Datasource(pipe, "tfrecord", decoder=DECODER)
    assert source.supports_distributed_reads is False  # its task runs on the driver's node
    assert len(source.get_read_tasks(4)) == 1
    ds = ray.data.read_datasource(source)
    assert ids_of(ds) == list(range(4000))


def test_pipe_file_object_read_by_a_task(tmp_path):
    """A pipe the driver holds (stdin works the same way): the task opens /proc/<pid>/fd/<n>."""
    path = tmp_path / "p.tfrecord"
    write_records(path, "tfrecord", examples(range(3000)))
    read_end, write_end = os.pipe()
    writer = subprocess.Popen([sys.executable, "-c",
                               "import sys, shutil; shutil.copyfileobj(open(sys.argv[1], 'rb'),"
                               " open(int(sys.argv[2]), 'wb'))", str(path), str(write_end)],
                              pass_fds=(write_end,))
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            source = sray.Datasource(pipe, "tfrecord", decoder=DECODER)
            assert source.supports_distributed_reads is False
            assert ids_of(ray.data.read_datasource(source)) == list(range(3000))
    finally:
        writer.wait(60)
    with open(path, "rb") as regular, pytest.raises(streamio.UsageError, match="its path"):
        sray.read(regular, "tfrecord")


def test_iter_torch_batches_and_stages(tmp_path):
    torch = pytest.importorskip("torch")
    write_records(tmp_path / "t.tfrecord", "tfrecord", examples(range(2000)))
    ds = sray.read(str(tmp_path / "t.tfrecord"), "tfrecord", decoder=DECODER, parallelism=2)
    shapes = set()
    seen = []
    for batch in ds.iter_torch_batches(batch_size=256):
        assert batch["x"].dtype == torch.float32
        shapes.add(tuple(batch["x"].shape[1:]))
        assert torch.equal(batch["x"][:, 0].long(), batch["y"])
        seen.extend(batch["y"].tolist())
    assert shapes == {(4,)} and sorted(seen) == list(range(2000))
    doubled = ds.map_batches(lambda b: {"y2": b["y"] * 2}, batch_format="numpy")
    assert sorted(r["y2"] for r in doubled.take_all()) == list(range(0, 4000, 2))
    shuffled = ds.random_shuffle(seed=1)
    assert sorted(r["y"] for r in shuffled.take_all()) == list(range(2000))
    a, b = ds.streaming_split(2, equal=False)
    import threading
    out: dict = {}
    threads = [threading.Thread(target=lambda k, it: out.__setitem__(
        k, [int(v) for bt in it.iter_batches(batch_size=100) for v in bt["y"]]), args=(k, it))
        for k, it in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(out["a"] + out["b"]) == list(range(2000))
    ds.write_parquet(str(tmp_path / "pq"))
    import pyarrow.parquet as pq
    table = pq.read_table(str(tmp_path / "pq"))
    assert sorted(table.column("y").to_pylist()) == list(range(2000))


def test_varlen_and_bytes_columns(tmp_path):
    records = [encode_example({"v": list(range(i % 4 + 1)), "s": b"k%d" % i, "y": i})
               for i in range(500)]
    write_records(tmp_path / "v.tfrecord", "tfrecord", records)
    dec = Example({"v": VarLen("int64"), "s": FixedLen((), "bytes"), "y": FixedLen((), "int64")})
    rows = sray.read(str(tmp_path / "v.tfrecord"), "tfrecord", decoder=dec).take_all()
    rows.sort(key=lambda r: r["y"])
    assert [list(r["v"]) for r in rows] == [list(range(i % 4 + 1)) for i in range(500)]
    assert [r["v_len"] for r in rows] == [i % 4 + 1 for i in range(500)]
    assert [r["s"] for r in rows] == [b"k%d" % i for i in range(500)]


def test_blocks_of_several_decoded_batches(tmp_path):
    """A block holds several decoded batches (16,384 rows each) as Arrow chunks: the values,
    VarLen lengths (padded to each batch's own longest) and tensors come out as decoded."""
    n = 40_000
    records = [encode_example({"x": np.full(8, i, dtype=np.float32), "y": i,
                               "v": list(range(1 + (i % 3 if i < 20_000 else i % 5)))})
               for i in range(n)]
    write_records(tmp_path / "b.tfrecord", "tfrecord", records)
    dec = Example({"x": FixedLen((8,), "float32"), "y": FixedLen((), "int64"),
                   "v": VarLen("int64")})
    ds = sray.read(str(tmp_path / "b.tfrecord"), "tfrecord", decoder=dec, rows_per_block=n,
                   parallelism=1)
    batches = list(ds.iter_batches(batch_size=4096, batch_format="numpy"))
    y = np.concatenate([b["y"] for b in batches])
    np.testing.assert_array_equal(y, np.arange(n))
    x = np.concatenate([b["x"] for b in batches])
    assert x.shape == (n, 8) and (x == y[:, None]).all()
    lengths = np.concatenate([b["v_len"] for b in batches])
    want = [1 + (i % 3 if i < 20_000 else i % 5) for i in range(n)]
    np.testing.assert_array_equal(lengths, want)
    values = [list(v) for b in batches for v in b["v"]]
    assert values == [list(range(k)) for k in want]


def test_recordio_protobuf(tmp_path):
    features = np.arange(600, dtype=np.float32).reshape(200, 3)
    streamio.write_recordio_protobuf(tmp_path / "p.rec", features, np.arange(200.0))
    ds = sray.read(str(tmp_path / "p.rec"), "recordio", decoder=streamio.RecordIOProtobuf())
    batch = ds.take_batch(1000, batch_format="numpy")
    order = np.argsort(batch["label_values"][:, 0])
    assert np.array_equal(batch["values"][order], features)


def test_corrupt_record_surfaces_as_streamio_error(tmp_path):
    path = tmp_path / "bad.tfrecord"
    write_records(path, "tfrecord", examples(range(100)))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a payload byte: its data CRC fails
    path.write_bytes(bytes(data))
    ds = sray.read(str(path), "tfrecord", decoder=DECODER)
    with pytest.raises(streamio.FormatError) as info:
        ds.take_all()
    assert str(path) in str(info.value) and "offset" in str(info.value)


def test_missing_file_surfaces_as_source_error(tmp_path):
    write_records(tmp_path / "a.tfrecord", "tfrecord", examples(range(10)))
    ds = sray.read([str(tmp_path / "a.tfrecord"), str(tmp_path / "gone.tfrecord")], "tfrecord",
                   decoder=DECODER)
    with pytest.raises(streamio.SourceError, match="gone.tfrecord"):
        ds.take_all()


def test_sink_round_trip(tmp_path):
    ds = sray.read([str(p) for p in _parts(tmp_path, 3, 700)], "tfrecord")  # raw records
    shards = sray.write(ds, str(tmp_path / "out" / "train"), "tfrecord", index=True,
                        records_per_shard=500)
    assert shards and all(os.path.exists(s) and os.path.exists(s + ".index") for s in shards)
    back = streamio.Dataset(shards, "tfrecord", decoder=DECODER)
    assert sorted(int(v) for v in np.concatenate([b["y"] for b in back.batch(512)])) == list(
        range(2100))
    # Examples encoded from columns, gzip, RecordIO: read back by streamio.
    decoded = sray.read(str(tmp_path / "in"), "tfrecord", decoder=DECODER)
    rec = sray.write(decoded, str(tmp_path / "ex" / "e"), "recordio", encode="example",
                     compression="gzip")
    assert all(s.endswith(".rec.gz") for s in rec)
    back = streamio.Dataset(rec, "recordio", decoder=DECODER).batch(4096)
    batch = {k: np.concatenate([b[k] for b in back]) for k in ("x", "y")}
    order = np.argsort(batch["y"])
    assert np.array_equal(batch["y"][order], np.arange(2100))
    assert np.array_equal(batch["x"][order][:, 0], np.arange(2100, dtype=np.float32))
    # TensorFlow reads the TFRecord shards (in its own process: not in a Ray worker's).
    code = ("import sys, tensorflow as tf\n"
            "n = sum(1 for _ in tf.data.TFRecordDataset(sys.argv[1:]))\nprint(n)")
    out = subprocess.run([sys.executable, "-c", code, *shards], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "2100"


def test_write_of_a_decoded_dataset_without_encode_fails_on_the_driver(tmp_path):
    """The column check runs before any task: a UsageError raised by write() itself (no Ray
    frame in its traceback), nothing written, naming encode='example'."""
    decoded = sray.read([str(p) for p in _parts(tmp_path, 2, 50)], "tfrecord", decoder=DECODER)
    with pytest.raises(streamio.UsageError, match="encode='example'") as info:
        sray.write(decoded, str(tmp_path / "out" / "e"), "tfrecord")
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    assert not [f for f in frames if "/ray/" in f], frames
    assert "x, y" in str(info.value)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def _parts(tmp_path, n, per):
    (tmp_path / "in").mkdir(exist_ok=True)
    paths = []
    for f in range(n):
        path = tmp_path / "in" / f"p{f}.tfrecord"
        write_records(path, "tfrecord", examples(range(f * per, f * per + per)))
        paths.append(path)
    return paths


def test_torch_trainer_two_workers(tmp_path):
    pytest.importorskip("torch")
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    _parts(tmp_path, 2, 2000)
    ds = sray.read(str(tmp_path / "in"), "tfrecord", decoder=DECODER)

    def train_loop(config):
        import torch
        import ray.train

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        shard = ray.train.get_dataset_shard("train")
        rows = 0
        for batch in shard.iter_torch_batches(batch_size=256):
            loss = ((model(batch["x"]).squeeze(1) - batch["y"].float()) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rows += len(batch["y"])
        rank = ray.train.get_context().get_world_rank()
        (config["out"] / f"rank{rank}").write_text(str(rows))

    trainer = TorchTrainer(train_loop, train_loop_config={"out": tmp_path},
                           datasets={"train": ds},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=ray.train.RunConfig(storage_path=str(tmp_path / "runs")))
    result = trainer.fit()
    assert result.error is None
    rows = [int((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    # Each worker trained on its shard; Ray Train's equal split may drop a few rows.
    assert min(rows) > 0 and 4000 - 2 <= sum(rows) <= 4000


def test_docs_snippets(tmp_path, monkeypatch):
    """Every ```python block of docs/ray.md runs, in order, in one namespace (in tmp_path)."""
    text = (ROOT / "docs" / "ray.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__docs__"}
    for block in blocks:
        exec(compile(block, "docs/ray.md", "exec"), scope)
