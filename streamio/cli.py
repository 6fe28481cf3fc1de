"""The ``streamio`` command: count, head, serve-pipe, pack, diagnose, demo, bench.

``python -m streamio`` is the same command. Errors from streamio print one line and exit 1.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from typing import Optional, Sequence

from .errors import StreamioError
from .reader import RecordReader

FORMAT_CHOICES = ("tfrecord", "recordio", "csv", "lines")
COMPRESSION_CHOICES = ("infer", "none", "gzip", "zlib")
SERVE_CHUNK = 1024 * 1024


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _compression(value: str) -> Optional[str]:
    return None if value == "none" else value


def _reader(args) -> RecordReader:
    options = {}
    if getattr(args, "multipart", None):
        options["multipart"] = args.multipart
    return RecordReader(args.source, args.format, compression=_compression(args.compression),
                        verify=not args.no_verify, on_error=args.on_error, **options)


def cmd_count(args) -> int:
    reader = _reader(args)
    count = sum(len(records) for records in reader.record_lists())
    print(count)
    stats = reader.stats
    if stats.skipped_records:
        print(f"skipped {stats.skipped_records} damaged records ({stats.skipped_bytes} bytes)",
              file=sys.stderr)
    return 0


def _preview(record: bytes, width: int) -> str:
    text = record[:width]
    try:
        shown = text.decode("utf-8")
        if not shown.isprintable():
            raise ValueError
        shown = repr(shown)
    except (UnicodeDecodeError, ValueError):
        shown = text.hex(" ")
    return shown + (" ..." if len(record) > width else "")


def cmd_head(args) -> int:
    reader = _reader(args)
    shown = 0
    with reader:
        for records in reader.record_lists():
            for record in records:
                if shown >= args.n:
                    return 0
                print(f"{shown}\t{len(record)} bytes\t{_preview(record, args.width)}")
                shown += 1
    return 0


def serve_pipe(channel: str, epochs: int, files: Sequence[str], *, start_epoch: int = 0,
               open_timeout: float = 300.0, log=None) -> None:
    """Emulate SageMaker Pipe mode: for each epoch create ``<channel>_<epoch>`` as a FIFO, stream
    the files into it (concatenated, as SageMaker does), close it and remove it.

    Opening the FIFO for writing waits for the reader; ``open_timeout`` bounds that wait.
    """
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"not a file: {path}")
    for epoch in range(start_epoch, start_epoch + epochs):
        fifo = f"{channel}_{epoch}"
        if os.path.exists(fifo):
            if not stat.S_ISFIFO(os.stat(fifo).st_mode):
                raise FileExistsError(f"{fifo} exists and is not a FIFO")
        else:
            os.mkfifo(fifo)
        try:
            fd = _open_writer(fifo, open_timeout)
            sent = 0
            try:
                for path in files:
                    with open(path, "rb", buffering=0) as f:
                        while True:
                            block = f.read(SERVE_CHUNK)
                            if not block:
                                break
                            view = memoryview(block)
                            while view:
                                n = os.write(fd, view)
                                view = view[n:]
                                sent += n
            except BrokenPipeError:
                if log:
                    print(f"epoch {epoch}: reader closed {fifo} early after {sent} bytes", file=log)
            finally:
                os.close(fd)
            if log:
                print(f"epoch {epoch}: served {sent} bytes on {fifo}", file=log)
        finally:
            try:
                os.unlink(fifo)
            except FileNotFoundError:
                pass


def _open_writer(fifo: str, timeout: float) -> int:
    # O_WRONLY|O_NONBLOCK fails with ENXIO until a reader has the FIFO open: poll for it, so a
    # reader that never comes cannot hang us forever.
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != 6:  # ENXIO: no reader yet
                raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reader opened {fifo} within {timeout:g} s") from None
            time.sleep(0.005)
            continue
        os.set_blocking(fd, True)
        return fd


def cmd_serve_pipe(args) -> int:
    serve_pipe(args.channel, args.epochs, args.files, start_epoch=args.start_epoch,
               open_timeout=args.open_timeout, log=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    run_demo(framework=args.framework, epochs=args.epochs, workdir=args.workdir,
             records=args.records, batch_size=args.batch_size, device=args.device, seed=args.seed)
    return 0


def cmd_bench(args) -> int:
    from .bench import main as bench_main

    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamio", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def reading(p):
        p.add_argument("source", help="path, FIFO, '-' (stdin) or URL")
        p.add_argument("--format", "-f", required=True, choices=FORMAT_CHOICES)
        p.add_argument("--compression", "-c", default="infer", choices=COMPRESSION_CHOICES)
        p.add_argument("--on-error", default="raise", choices=("raise", "skip", "warn"))
        p.add_argument("--no-verify", action="store_true", help="skip TFRecord CRC checks")
        p.add_argument("--multipart", choices=("dmlc", "concat"), help="RecordIO part joining")

    p = sub.add_parser("count", help="print the number of records")
    reading(p)
    p.set_defaults(func=cmd_count)
    p = sub.add_parser("head", help="show the first records (length and a preview)")
    reading(p)
    p.add_argument("-n", type=int, default=10, help="how many records (default 10)")
    p.add_argument("--width", type=int, default=60, help="preview bytes per record")
    p.set_defaults(func=cmd_head)
    p = sub.add_parser("serve-pipe", help="emulate SageMaker Pipe mode: FILES into CHANNEL_<epoch>")
    p.add_argument("--channel", required=True, help="path prefix, e.g. /opt/ml/input/data/train")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--start-epoch", type=int, default=0)
    p.add_argument("--open-timeout", type=float, default=300.0,
                   help="seconds to wait for a reader to open each FIFO")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_serve_pipe)
    p = sub.add_parser("demo", help="train a tiny model from a Pipe mode FIFO on bundled data")
    p.add_argument("--framework", default="torch", choices=("torch", "tf"))
    p.add_argument("--epochs", type=_positive, default=2)
    p.add_argument("--records", type=_positive, default=4096, help="synthetic records to write")
    p.add_argument("--batch-size", type=_positive, default=64)
    p.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    p.add_argument("--workdir", default=None,
                   help="keep the data and FIFOs here (default: a temporary dir, removed)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("bench", help="benchmark streamio against its peers (see --help)",
                       add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)
    from .tools.diagnose import add_cli as add_diagnose
    from .tools.pack import add_cli as add_pack

    add_pack(sub)
    add_diagnose(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # argparse cannot pass options like --rounds through REMAINDER
        from .bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StreamioError as exc:
        print(f"streamio: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, FileExistsError, TimeoutError) as exc:
        print(f"streamio: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `streamio head ... | head -1`
        try:
            sys.stdout.close()
        except OSError:
            pass
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
