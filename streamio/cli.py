"""The streamio command (its subcommands are listed in ``streamio --help``).

``python -m streamio`` is the same command. Errors from streamio print one line and exit 1;
warnings (``--on-error warn``) print one line each, without a file name. Subcommands are built in
:func:`build_parser`, one ``cmd_*`` function each.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings
from typing import Any, Iterator, Optional, Sequence, TextIO

from .codecs import infer_compression
from .errors import PackError, StreamioError, StreamioWarning, UsageError
from .formats import SUFFIX_FORMATS
from .reader import ReaderStats, RecordReader, expand_sources

FORMAT_CHOICES = ("tfrecord", "recordio", "csv", "lines")
COMPRESSION_CHOICES = ("infer", "none", "gzip", "zlib", "zstd")


#: ``count`` shows progress on a terminal once it has run this long, then this often.
PROGRESS_DELAY_S = 1.0
PROGRESS_INTERVAL_S = 0.25


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def _compression(value: str) -> Optional[str]:
    return None if value == "none" else value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def _reader_options(args) -> dict:
    options: dict[str, Any] = dict(compression=_compression(args.compression),
                                   verify=not args.no_verify, on_error=args.on_error)
    if getattr(args, "multipart", None):
        options["multipart"] = args.multipart
    # --timeout bounds every wait (the first data too); --open-timeout overrides the first.
    timeout = getattr(args, "timeout", None)
    open_timeout = getattr(args, "open_timeout", None)
    if timeout is not None:
        options["read_timeout"] = timeout
    if open_timeout is not None or timeout is not None:
        options["open_timeout"] = open_timeout if open_timeout is not None else timeout
    return options


def format_from_names(sources: Sequence[Any]) -> str:
    """The format the sources' names say (``x.tfrecord``, ``x.rec.gz``: see
    ``formats.SUFFIX_FORMATS``), for a command given no ``--format``; a name that says none (a
    FIFO called ``pipe``, stdin) or names that disagree are a :class:`UsageError`."""
    found = {}
    for source in sources:
        name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else str(source)
        base = name.split("?", 1)[0]
        if infer_compression(base):
            base = os.path.splitext(base)[0]
        fmt = SUFFIX_FORMATS.get(os.path.splitext(base)[1].lower())
        if fmt is None:
            raise UsageError(f"cannot tell the format of {name} from its name: pass --format"
                             f" ({', '.join(FORMAT_CHOICES)})")
        found.setdefault(fmt, name)
    if len(found) > 1:
        named = ", ".join(f"{name} ({fmt})" for fmt, name in found.items())
        raise UsageError(f"the sources' names say different formats ({named}): pass --format")
    return next(iter(found))


def _readers(args) -> Iterator[RecordReader]:
    """One reader per source named on the command line (globs and directories expanded). All
    are built (their arguments checked) before the first is read; each opens its source only
    when it is read, one at a time, in order. Without ``--format`` the names say it."""
    sources = expand_sources(list(args.sources))
    if args.format is None:
        args.format = format_from_names(sources)
    options = _reader_options(args)
    readers = [RecordReader(source, args.format, **options) for source in sources]
    yield from readers


class Progress:
    """A one-line progress display (records, MB, MB/s) rewritten in place on a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.start = time.monotonic()
        self.next = self.start + PROGRESS_DELAY_S
        self.shown = False

    def update(self, records: int, nbytes: int) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + PROGRESS_INTERVAL_S
        elapsed = now - self.start
        self.stream.write(f"\r{records:,} records  {nbytes / 1e6:,.1f} MB"
                          f"  {nbytes / 1e6 / elapsed:,.1f} MB/s\x1b[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:  # leave the terminal line clean for the result
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def cmd_count(args) -> int:
    progress = Progress(sys.stderr) if sys.stderr.isatty() else None
    total = 0
    done = ReaderStats()  # of the sources read to the end
    try:
        for reader in _readers(args):
            with reader:
                for records in reader.record_lists():
                    total += len(records)
                    if progress is not None:
                        progress.update(total, done.bytes_read + reader.stats.bytes_read)
            done.add(reader.stats)
    finally:
        if progress is not None:
            progress.close()
    print(total)
    if done.skipped_records:
        print(f"skipped {done.skipped_records} damaged records ({done.skipped_bytes} bytes)",
              file=sys.stderr)
    return 0


def cmd_head(args) -> int:
    from .tools.preview import preview

    shown = 0
    if args.n == 0:
        return 0
    for reader in _readers(args):
        with reader:
            for records in reader.record_lists():
                for record in records:
                    print(f"{shown}\t{len(record)} bytes\t"
                          f"{preview(record, args.format, args.width)}")
                    shown += 1
                    if shown >= args.n:
                        return 0
    return 0


def cmd_serve_pipe(args) -> int:
    from .tools.serve_pipe import serve_pipe

    serve_pipe(args.channel, args.epochs, args.files, start_epoch=args.start_epoch,
               open_timeout=args.open_timeout, log=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from .tools.demo import run_demo

    run_demo(framework=args.framework, epochs=args.epochs, workdir=args.workdir,
             records=args.records, batch_size=args.batch_size, device=args.device, seed=args.seed)
    return 0


def cmd_bench(args) -> int:
    from .bench import main as bench_main

    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="streamio")
    parser.add_argument("--version", action="version", version=f"streamio {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def reading(p):
        p.add_argument("sources", nargs="+", metavar="SOURCE",
                       help="path, glob, directory, FIFO, '-' (stdin) or URL; several are read in"
                            " order")
        p.add_argument("--format", "-f", choices=FORMAT_CHOICES,
                       help="default: from the names (.tfrecord, .rec, .csv, .txt, .jsonl;"
                            " after .gz/.zst)")
        p.add_argument("--compression", "-c", default="infer", choices=COMPRESSION_CHOICES)
        p.add_argument("--on-error", default="raise", choices=("raise", "skip", "warn"))
        p.add_argument("--no-verify", action="store_true", help="skip TFRecord CRC checks")
        p.add_argument("--multipart", choices=("dmlc", "concat"), help="RecordIO part joining")
        p.add_argument("--timeout", type=_positive_seconds, metavar="SECONDS",
                       help="fail if the source keeps us waiting this long: for the first data"
                            " (a FIFO's writer, an HTTP answer) and between reads")
        p.add_argument("--open-timeout", type=_positive_seconds, metavar="SECONDS",
                       help="wait this long for the first data instead (default: --timeout)")

    p = sub.add_parser("count", help="print the number of records (progress on a terminal)")
    reading(p)
    p.set_defaults(func=cmd_count)
    p = sub.add_parser("head", help="show the first records (length and a preview: Examples"
                                    " decoded, text rows as text)")
    reading(p)
    p.add_argument("-n", "--n", type=_non_negative, default=10,
                   help="how many records (default 10)")
    p.add_argument("--width", type=_positive, default=100,
                   help="preview characters per record (default 100)")
    p.set_defaults(func=cmd_head)
    p = sub.add_parser("serve-pipe", help="emulate SageMaker Pipe mode: FILES into CHANNEL_<epoch>")
    p.add_argument("--channel", required=True, help="path prefix, e.g. /opt/ml/input/data/train")
    p.add_argument("--epochs", type=_positive, default=1)
    p.add_argument("--start-epoch", type=_non_negative, default=0)
    p.add_argument("--open-timeout", type=float, default=300.0,
                   help="seconds to wait for a reader to open each FIFO")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_serve_pipe)
    p = sub.add_parser("demo", help="train a tiny model from a Pipe mode FIFO on bundled data")
    p.add_argument("--framework", default="auto", choices=("auto", "numpy", "torch", "tf"),
                   help="auto (the default): torch if it is installed, else numpy")
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
    from .sagemaker.emulator import add_cli as add_sagemaker_local

    add_sagemaker_local(sub)
    from .tools.diagnose import add_cli as add_diagnose
    from .tools.index import add_cli as add_index
    from .tools.pack import add_cli as add_pack

    add_pack(sub)
    add_diagnose(sub)
    add_index(sub)
    parser.description = f"The streamio command: {', '.join(sub.choices)}."
    for command in sub.choices.values():  # a mistake in a command's options shows its usage
        command.set_defaults(command_parser=command)
    return parser


#: A hint in Python syntax ("pass compression='gzip'") for an option the command line has.
_PYTHON_OPTION = re.compile(r"\b(format|compression)=(?:'([\w-]+)'|(None))")


def command_line_hint(message: str) -> str:
    """``message`` with hints in Python syntax given as command-line options:
    ``compression='gzip'`` -> ``--compression gzip``, ``compression=None`` -> ``--compression
    none``, ``format='tfrecord'`` -> ``--format tfrecord``."""
    return _PYTHON_OPTION.sub(lambda m: f"--{m.group(1)} {m.group(2) or 'none'}", message)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # argparse cannot pass options like --rounds through REMAINDER
        from .bench import main as bench_main

        return bench_main(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would blame the top-level command, and show its usage
        getattr(args, "command_parser", parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    _log_to_stderr()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return args.func(args)
    except StreamioError as exc:
        print(f"streamio: {type(exc).__name__}: {command_line_hint(str(exc))}"
              f"{_skip_hint(args, exc)}", file=sys.stderr)
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


def _skip_hint(args: Any, exc: StreamioError) -> str:
    """How to go on past a bad file, where the command can (``pack --on-error skip``)."""
    if (isinstance(exc, PackError) and exc.path is not None
            and getattr(args, "on_error", None) == "raise"):
        return " (pass --on-error skip to skip such files; they are listed on stderr)"
    return ""


def _log_to_stderr() -> None:
    """The library's log lines (a long wait on a source says what it waits for) on stderr, as
    ``streamio: ...``, unless the logger has handlers already (a caller's main())."""
    import logging

    logger = logging.getLogger("streamio")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("streamio: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                  line: Optional[str] = None) -> None:
    """Warnings as one line, without the file and line inside streamio that issued them."""
    label = "warning" if issubclass(category, StreamioWarning) else category.__name__
    print(f"streamio: {label}: {message}", file=sys.stderr if file is None else file)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
