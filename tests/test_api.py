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
                 "SourceError"]:
        assert name in streamio.__all__


@pytest.mark.parametrize("layer", ["formats", "decoders", "codecs"])
def test_pure_layers_import_nothing_that_does_io(layer):
    for path in (PKG / layer).glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in IO_MODULES, f"{path.name} imports {name}"


def test_no_seek_tell_or_getsize_anywhere():
    for path in PKG.rglob("*.py"):
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
