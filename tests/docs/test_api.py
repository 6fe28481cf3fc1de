"""The public surface and the house rules that keep the layers honest."""

from __future__ import annotations

import ast
import pathlib
import pickle

import pytest

import streamio
from streamio import errors

PKG = pathlib.Path(streamio.__file__).parent
IO_MODULES = {"os", "io", "socket", "threading", "http", "urllib", "requests", "smart_open",
              "select", "fcntl", "subprocess", "multiprocessing", "shutil", "tempfile", "sys"}


def test_all_is_sorted_and_complete():
    assert streamio.__all__ == sorted(streamio.__all__)
    for name in streamio.__all__:
        assert hasattr(streamio, name), name
    for name in ["read_records", "write_records", "PipeChannel", "StreamioError", "FormatError",
                 "CorruptRecordError", "TruncatedStreamError", "RecordTooLargeError",
                 "SourceError", "mix"]:
        assert name in streamio.__all__


# What a pure layer may import from streamio itself: the other pure layers, the errors and the
# C kernels. Anything else (sources, reader, pipeline, sagemaker, ...) reads or writes.
PURE_STREAMIO_MODULES = {"formats", "decoders", "codecs", "errors", "_speedups"}


def _imported_modules(path: pathlib.Path) -> list:
    """Every module ``path`` imports, relative imports resolved to ``streamio.*`` names."""
    package = ["streamio", *path.relative_to(PKG).parent.parts]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1])
            if node.module:
                names.append(f"{base}.{node.module}")
            else:  # from .. import sources
                names += [f"{base}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("layer", ["formats", "decoders", "codecs"])
def test_pure_layers_import_nothing_that_does_io(layer):
    paths = sorted((PKG / layer).rglob("*.py"))
    assert paths
    for path in paths:
        for name in _imported_modules(path):
            parts = name.split(".")
            assert parts[0] not in IO_MODULES, f"{path.name} imports {name}"
            if parts[0] == "streamio" and len(parts) > 1:
                assert parts[1] in PURE_STREAMIO_MODULES, f"{path.name} imports {name}"


def test_every_registered_framer_is_defined_in_formats():
    import streamio.sagemaker  # noqa: F401 - so a format it registered would be checked too
    from streamio.formats import FORMATS, make_framer

    options = {"sagemaker-manifest": {"attributes": 2}}
    for name in FORMATS:
        framer = make_framer(name, source="s", **options.get(name, {}))
        module = type(framer).__module__
        assert module.startswith("streamio.formats."), f"format {name!r}: {module}"


def test_sans_io_sagemaker_parts_stay_importable_from_their_first_home():
    from streamio import formats, sagemaker
    from streamio.formats import sagemaker_wrapping, whole_object
    from streamio.sagemaker import wrapping

    for name in ("RecordIOUnwrapper", "ManifestGroupFramer", "split_manifest_record"):
        assert getattr(wrapping, name) is getattr(sagemaker_wrapping, name)
        assert name in wrapping.__all__
    assert sagemaker.split_manifest_record is sagemaker_wrapping.split_manifest_record
    assert sagemaker.WholeObjectFramer is whole_object.WholeObjectFramer
    assert formats.FORMATS["object"] and formats.FORMATS["sagemaker-manifest"]


def test_no_seek_tell_or_getsize_anywhere():
    for path in PKG.rglob("*.py"):
        if path.relative_to(PKG).as_posix() == "sources/ranged.py":
            # The one place a source is positioned (byte-range splits): it opens only sources
            # that can be (regular files, HTTP Range, S3 through smart_open), once, at open.
            continue
        text = path.read_text()
        for bad in (".seek(", ".tell(", "getsize("):
            assert bad not in text, f"{path.name} uses {bad}"


def test_error_tree():
    for cls in (errors.CorruptRecordError, errors.TruncatedStreamError,
                errors.RecordTooLargeError, errors.DecodeError):
        assert issubclass(cls, errors.FormatError)
    for cls in (errors.FormatError, errors.SourceError, errors.UsageError,
                errors.MissingDependencyError):
        assert issubclass(cls, errors.StreamioError)
    assert issubclass(errors.MissingDependencyError, ImportError)


def test_format_errors_survive_pickling_with_their_attributes():
    err = errors.CorruptRecordError("bad crc", source="s3://b/k", offset=17, record_index=3)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.CorruptRecordError
    assert (back.source, back.offset, back.record_index) == ("s3://b/k", 17, 3)
    assert str(back) == str(err) == "bad crc (source s3://b/k, byte offset 17, record 3)"
    dec = pickle.loads(pickle.dumps(errors.DecodeError("x", record_index=2, field="f")))
    assert dec.field == "f" and "field 'f'" in str(dec)


def test_missing_dependency_names_the_pip_install():
    with pytest.raises(errors.MissingDependencyError, match=r"pip install 'streamio\[nope\]'"):
        errors.require("surely_not_installed_module", "nope")


def test_py_typed_is_shipped():
    assert (PKG / "py.typed").exists()


# -- usage mistakes ---------------------------------------------------------------------------
def test_usage_errors_are_streamio_errors_and_the_builtins_they_replace():
    assert issubclass(errors.UsageError, errors.StreamioError)
    assert issubclass(errors.UsageError, ValueError)
    assert issubclass(errors.UsageTypeError, errors.StreamioError)
    assert issubclass(errors.UsageTypeError, TypeError)
    assert not issubclass(errors.UsageTypeError, ValueError)  # `except ValueError` unchanged
    assert "UsageTypeError" in errors.__doc__ and "UsageTypeError" in streamio.__all__


@pytest.mark.parametrize("call, builtin", [
    (lambda: streamio.read_records(b"", "tfrecord", on_error="ignore"), ValueError),
    (lambda: streamio.read_records(b"", "tfrecord", max_record_size="big"), TypeError),
    (lambda: streamio.read_records(b"", "nope"), ValueError),
    (lambda: streamio.read_records(12, "tfrecord"), TypeError),
    (lambda: streamio.read_records(b"", "tfrecord", read_timeout=-1), ValueError),
    (lambda: streamio.Dataset(b"", "tfrecord").batch(0), ValueError),
    (lambda: streamio.Dataset(b"", "tfrecord").batch(2.5), TypeError),
    (lambda: streamio.Dataset(b"", "tfrecord").shard(2, 2), ValueError),
    (lambda: streamio.FixedLen(-1, "float32"), ValueError),
    (lambda: streamio.Example([1]), TypeError),
    (lambda: streamio.Csv(header="yes"), TypeError),
    (lambda: streamio.write_records(b"", "csv", []), ValueError),
    (lambda: streamio.PipeChannel("/tmp/x", start_epoch=-1), ValueError),
])
def test_every_bad_argument_is_catchable_both_ways(call, builtin):
    with pytest.raises(builtin) as info:
        call()
    assert isinstance(info.value, errors.StreamioError), type(info.value)


# Raises of a bare ValueError/TypeError that are internal control flow, never seen by users.
_INTERNAL_RAISES = {("cli.py", "_preview"), ("pipeline/dataset.py", "build"),
                    ("decoders/csv.py", "_to_bool"), ("bench/peers.py", None),
                    # a C kernel's reference raises what the kernel raises (internal misuse)
                    ("pipeline/mix.py", "mix_take_reference"), ("pipeline/mix.py", "_span_part"),
                    ("pipeline/mix.py", "_take_call"), ("pipeline/mix.py", "_take_parts"),
                    ("formats/tfrecord.py", "scan_tfrecord_spans")}


def test_no_bare_value_or_type_error_is_raised_for_arguments():
    """Every argument check raises UsageError / UsageTypeError (issue 10, finding 12)."""
    found = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        tree = ast.parse(path.read_text())
        owner = {}  # node -> name of the innermost function holding it
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(func):
                    owner[node] = func.name  # inner functions are walked later and win
        for node in ast.walk(tree):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and isinstance(node.exc.func, ast.Name)
                    and node.exc.func.id in ("ValueError", "TypeError")):
                name = owner.get(node)
                if (rel, name) not in _INTERNAL_RAISES and (rel, None) not in _INTERNAL_RAISES:
                    found.append(f"{rel}:{node.lineno} in {name}")
    assert not found, found


def test_a_keyword_typo_is_named_with_a_suggestion():
    with pytest.raises(errors.UsageTypeError, match=r"compresion=; did you mean compression="):
        streamio.Dataset(b"", "tfrecord", compresion="gzip")
    with pytest.raises(TypeError, match=r"decodr=; did you mean decoder="):
        streamio.Dataset(b"", "tfrecord", decodr=None)
    with pytest.raises(TypeError, match=r"quotechr=; did you mean quotechar="):
        list(streamio.read_records(b"a\n", "csv", quotechr="'"))
    assert list(streamio.read_records(b"'a,b',c\n", "csv", quotechar="'")) == [b"'a,b',c"]


def test_repr_shows_sources_arguments_and_stages(tmp_path):
    paths = []
    for k in range(6):
        paths.append(str(tmp_path / f"part-{k}.tfrecord"))
        streamio.write_records(paths[-1], "tfrecord", [b"x"])
    ds = (streamio.Dataset(str(tmp_path / "*.tfrecord"), "tfrecord", compression=None,
                           decoder=streamio.Example({"y": streamio.FixedLen([], "int64")}))
          .shuffle(100, seed=3).batch(8, drop_last=True).prefetch())
    text = repr(ds)
    assert text.startswith(f"Dataset([{paths[0]!r}, {paths[1]!r}, {paths[2]!r}, ... (6 sources),"
                           f" {paths[5]!r}], 'tfrecord', decoder=Example(")
    assert "compression=None" in text
    assert text.endswith(".shuffle(100, seed=3).batch(8, drop_last=True).prefetch()")
    assert repr(streamio.Dataset(paths[0], "tfrecord")) == f"Dataset({paths[0]!r}, 'tfrecord')"


def test_len_explains_that_a_stream_has_no_length():
    ds = streamio.Dataset(b"", "tfrecord")
    with pytest.raises(TypeError, match=r"stream.*call ds\.to_torch\(\)") as info:
        len(ds)
    assert isinstance(info.value, errors.UsageTypeError)
    assert list(ds) == []  # list() asks len() for a size hint: a TypeError is ignored there


def test_read_records_takes_several_sources_globs_and_directories(tmp_path):
    for k in range(3):
        streamio.write_records(str(tmp_path / f"p{k}.tfrecord"), "tfrecord", [b"%d" % k])
    (tmp_path / ".hidden").write_bytes(b"junk")
    assert list(streamio.read_records(str(tmp_path / "p*.tfrecord"), "tfrecord")) == [
        b"0", b"1", b"2"]
    assert list(streamio.read_records(str(tmp_path), "tfrecord")) == [b"0", b"1", b"2"]
    assert list(streamio.read_records([str(tmp_path / "p2.tfrecord"), b""], "tfrecord")) == [b"2"]
    with pytest.raises(errors.UsageError, match="no files match"):
        streamio.read_records(str(tmp_path / "*.rec"), "recordio")


def test_errors_can_be_rebuilt_from_their_message():
    """What DataLoader does with a worker's exception: type(message=...)."""
    for cls in (errors.StreamioError, errors.UsageError, errors.UsageTypeError,
                errors.CorruptRecordError, errors.DecodeError, errors.SourceError,
                errors.MissingDependencyError):
        assert cls.message  # torch looks for a truthy class attribute
        err = cls(message="worker 1 said no")
        assert str(err) == err.message == "worker 1 said no"


def test_licence_file_and_metadata():
    root = PKG.parent
    text = (root / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202
    setup = ast.parse((root / "setup.py").read_text())
    call = next(n for n in ast.walk(setup) if isinstance(n, ast.Call)
                and getattr(n.func, "id", None) == "setup")
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords
              if k.arg in ("license", "license_expression", "license_files", "classifiers")}
    assert kwargs["license_expression"] == kwargs["license"] == "Apache-2.0"
    assert kwargs["license_files"] == ["LICENSE"]
    assert "Programming Language :: Python :: 3" in kwargs["classifiers"]
