"""CSV rows into numpy columns, a whole batch at a time.

Records are CSV rows as the ``"csv"`` framer delivers them: one row's bytes without its line
terminator, quoted newlines kept (RFC 4180: a quoted field may hold delimiters, doubled quotes
and newlines).

Two paths give the same results (a Hypothesis test holds them to it). The fast one hands the
whole batch to numpy's C parser (``np.loadtxt`` on the list of rows: no per-value Python work);
it is taken when every selected column is numeric (float or integer), no field is quoted, and
the batch parses cleanly (missing values are first rewritten to ``nan`` in the joined bytes).
Anything else (quotes, ``str`` columns, a bad value) goes through the general path: Python's C
``csv`` module splits the rows, numpy converts each column block, and a failure is traced to
the exact row and column for the error message. The column plan and the numpy fast path are in
``_csv_plan``."""

from __future__ import annotations

import codecs
import csv as _csv
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DecodeError
from ..errors import UsageError, UsageTypeError
from ._csv_plan import _TEXT, _fields_per_row_ok, _loadtxt, _Plan
from ._csv_rows import (DEFAULT_MAX_COLUMNS, TABLE_MIN_BYTES, RowFaults, RowPlace, fixed_width,
                        more_fields_than, row_index as _row_index, table_budget)
from .example import _Where
from .sparse import SparseBatch
from .spec import FieldSpec

try:  # the C kernel (streamio/_c/csv.c): exactly np.loadtxt's values for plain numbers
    from .._speedups import parse_csv_floats as _c_parse_csv_floats
except ImportError:  # pragma: no cover - depends on the build
    _c_parse_csv_floats = None

__all__ = ["Csv"]

DEFAULT_DTYPE = "float32"
DEFAULT_DELIMITER = ","
DEFAULT_QUOTECHAR = '"'
DEFAULT_ENCODING = "utf-8"
DEFAULT_NA_VALUES = ("",)
ON_ERROR_CHOICES = ("raise", "skip", "warn")
LABEL = "label"
FEATURES = "features"

_BOM = codecs.BOM_UTF8
_NUMERIC = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
            "uint32", "uint64", "bool"}
# A column value that numpy parses as a number must never be treated as a missing value by the
# fast path, so the fast path is off when a na_value is itself a number.


def _dtype_name(dtype: Any) -> str:
    if dtype is str:
        return "str"
    if dtype is bytes:
        return "bytes"
    if isinstance(dtype, str) and dtype in _TEXT:
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name in _NUMERIC:
        return name
    raise UsageError(f"CSV column dtype must be one of {sorted(_NUMERIC | _TEXT)}, not {dtype!r}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


Column = Union[int, str]


class Csv:
    """Decode CSV rows into numpy arrays.

    * ``as_columns=False`` (default): the selected non-label columns stack into
      ``batch["features"]`` ``(B, F)`` of ``dtype``; ``batch["label"]`` ``(B,)`` holds
      ``label_column`` (an index or a header name) when given. SageMaker's CSV convention (no
      header, label first) is ``Csv(label_column=0)``.
    * ``as_columns=True``: one ``(B,)`` array per selected column, named from the header (or
      ``c0, c1, ...``); the label column, if any, is ``batch["label"]``. ``dtype`` may be a dict
      ``{column name or index: dtype}`` (unlisted columns: ``"float32"``); ``"str"`` columns give
      object arrays of ``str``, ``"bytes"`` of the raw ``bytes``.
    * ``columns``: the columns to keep (indices or header names), in output order; default all.
    * ``header=True``: the first row names the columns. SageMaker Pipe mode concatenates files,
      so each file's header arrives as a row; a row equal to the header is dropped where it
      cannot be a data row (its values do not parse as the columns' dtypes) or where it starts
      with a BOM (a file's start). Otherwise it is data: pandas writes the header ``0,1,2`` for
      a plain array, and rows ``0,1,2`` under it are rows. (A :class:`~streamio.Dataset` reads
      each source's first row as its header itself.) The header is taken from the first row
      this decoder sees: ``fresh()`` gives a decoder for a new stream (a new epoch starts with
      a header again).
    * A UTF-8 byte-order mark at the start of a row is dropped; ``encoding`` decodes header and
      ``str`` columns (it must be ASCII-compatible, as the row framing is byte-based).
    * ``na_values``: strings that mean "missing": NaN in float columns, an error in integer ones.
    * Numbers are ASCII, as ``np.loadtxt`` and pandas read them (spaces around them allowed):
      ``"１２"`` (full-width), ``"١"`` or ``"1_0"``, which Python's ``float()`` would read, are a
      :class:`~streamio.errors.DecodeError` whatever else is in the batch; as ``"str"`` columns
      they are kept as written. A number beyond float32's range is ``inf``.
    * Fields of any length up to the framer's ``max_record_size`` (the csv module's
      ``field_size_limit()`` is neither needed nor changed).

    * ``max_columns``: a row with more fields is a bad row, found before anything is made per
      field (a row within ``max_record_size`` may hold 128M one-byte fields; the decoder's
      working memory is about 200 bytes a column). Fields are never padded to the longest one
      beyond a bound of the batch's own size, so one long field among many columns costs its
      length once.

    A value that does not parse, a row with the wrong number of fields or more than
    ``max_columns``, or a row that is not valid CSV or text is a bad row: ``on_error="raise"``
    (default) raises :class:`~streamio.errors.DecodeError` naming the source, the row's byte
    offset, the record and the column; ``"skip"`` drops the row from its batch (which is then
    shorter) and counts it in the epoch's ``stats()`` (``skipped_records``, ``decoder_skipped``,
    by column in ``decoder_skipped_fields``, and the first errors themselves in
    ``decoder_skips``); ``"warn"`` also warns (``StreamioWarning``) with that error. A bad
    header, or options that do not fit the columns, always raise.

    The byte offset (of the row's first byte, in the decompressed stream) is given where a
    :class:`~streamio.Dataset` reads the source in this process and decodes rows in their
    order: ``batch()`` (or no batch) with no ``shuffle``, no reordering ``map`` and no
    round-robin shard before it, the row among the last few MiB read
    (:data:`~streamio.formats.text.ROW_OFFSET_BYTES`, or two reads if larger). Elsewhere it is
    None: shuffled rows, a round-robin shard, rows held back longer than that (a ``prefetch``
    of many MiB before ``batch()``), DataLoader workers fed one shared stream, ``decode_batch``
    called directly without ``row_offset`` (a callable: record index -> byte offset or None).
    """

    #: ``decode_batch`` takes ``row_offset=`` (what a Dataset passes where it knows row starts).
    takes_row_offsets = True

    def __init__(self, *, header: bool = False, label_column: Optional[Column] = None,
                 columns: Optional[Sequence[Column]] = None,
                 dtype: Union[Any, Mapping[Column, Any]] = DEFAULT_DTYPE,
                 as_columns: bool = False, delimiter: str = DEFAULT_DELIMITER,
                 quotechar: Optional[str] = DEFAULT_QUOTECHAR, encoding: str = DEFAULT_ENCODING,
                 na_values: Sequence[str] = DEFAULT_NA_VALUES,
                 max_columns: int = DEFAULT_MAX_COLUMNS, on_error: str = "raise") -> None:
        if not isinstance(header, bool):
            raise UsageTypeError(f"header must be True or False, not {header!r}")
        if not isinstance(as_columns, bool):
            raise UsageTypeError(f"as_columns must be True or False, not {as_columns!r}")
        for name, char in (("delimiter", delimiter), ("quotechar", quotechar)):
            if char is None and name == "quotechar":
                continue
            if not isinstance(char, str) or len(char) != 1 or char in "\r\n" or ord(char) > 127:
                raise UsageError(f"{name} must be one ASCII character other than CR/LF, not {char!r}")
        if delimiter == quotechar:
            raise UsageError("delimiter and quotechar must differ")
        try:
            codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise UsageError(f"unknown encoding {encoding!r}") from None
        probe = "\n\r,;\t\"'0123456789.-+eE" + delimiter
        try:
            ascii_compatible = probe.encode(encoding) == probe.encode("ascii")
        except UnicodeError:
            ascii_compatible = False
        if not ascii_compatible:
            raise UsageError(f"encoding {encoding!r} is not ASCII-compatible; CSV rows are framed"
                             " by bytes, so use UTF-8, Latin-1, ISO-8859-x, cp125x or similar")
        if isinstance(label_column, bool) or not isinstance(label_column, (int, str, type(None))):
            raise UsageTypeError(f"label_column must be a column index or name, not {label_column!r}")
        if columns is not None:
            if isinstance(columns, (str, bytes)):
                raise UsageTypeError(f"columns must be a sequence of indices or names, not {columns!r}")
            columns = tuple(columns)
            for col in columns:
                if isinstance(col, bool) or not isinstance(col, (int, str)):
                    raise UsageTypeError(f"columns must hold column indices or names, not {col!r}")
            if len(set(columns)) != len(columns):
                raise UsageError(f"columns lists a column twice: {columns!r}")
        if isinstance(dtype, Mapping):
            dtypes = {}
            for key, value in dtype.items():
                if isinstance(key, bool) or not isinstance(key, (int, str)):
                    raise UsageTypeError(f"dtype keys must be column indices or names, not {key!r}")
                dtypes[key] = _dtype_name(value)
            dtype_option: Union[str, Dict[Column, str]] = dtypes
        else:
            dtype_option = _dtype_name(dtype)
        if isinstance(na_values, (str, bytes)):
            raise UsageTypeError(f"na_values must be a sequence of str, not {na_values!r}")
        na_values = tuple(na_values)
        for value in na_values:
            if not isinstance(value, str):
                raise UsageTypeError(f"na_values must hold str, not {value!r}")
        if isinstance(max_columns, bool) or not isinstance(max_columns, int):
            raise UsageTypeError(f"max_columns must be an int, not {max_columns!r}")
        if max_columns < 1:
            raise UsageError(f"max_columns must be positive, not {max_columns}")
        if on_error not in ON_ERROR_CHOICES:
            raise UsageError(f"on_error must be one of {ON_ERROR_CHOICES}, not {on_error!r}")
        self._options = dict(header=header, label_column=label_column, columns=columns,
                             dtype=dtype_option, as_columns=as_columns, delimiter=delimiter,
                             quotechar=quotechar, encoding=encoding, na_values=na_values,
                             max_columns=max_columns, on_error=on_error)
        self.header = header
        self.label_column = label_column
        self.columns = columns
        self.dtype = dtype_option
        self.as_columns = as_columns
        self.delimiter = delimiter
        self.quotechar = quotechar
        self.encoding = encoding
        self.na_values = na_values
        self.max_columns = max_columns
        self.on_error = on_error
        self._delimiter_byte = delimiter.encode("ascii")
        self._quote_byte = None if quotechar is None else quotechar.encode("ascii")
        self._na_set = frozenset(na_values)
        self._fast_ok = not any(_is_number(value) for value in na_values)
        # Missing values, for the fast path: a whole field equal to a na_value becomes "nan".
        self._na_tokens = [re.compile(re.escape(v.encode(encoding)) + b"(?![^" + re.escape(
            self._delimiter_byte) + b"\n])") for v in set(na_values) if v]
        self._na_empty = "" in na_values
        # strict: a quote left open, or text after a closing quote, is an error (RFC 4180)
        self._csv_options = dict(delimiter=delimiter, quotechar=quotechar or '"', strict=True,
                                 quoting=_csv.QUOTE_MINIMAL if quotechar else _csv.QUOTE_NONE)
        self.reset()

    def reset(self) -> None:
        """Forget the header and column plan: the next row starts a new stream."""
        self._names: Optional[List[str]] = None
        self._header_row: Optional[bytes] = None
        # Whether the header row would decode as a data row (None: not known yet). If it would,
        # a row equal to it later in the stream is data, unless a BOM marks a file's start.
        self._header_is_data: Optional[bool] = None
        self._plan: Optional[_Plan] = None

    def fresh(self) -> "Csv":
        """An unprimed copy with the same options, for a new stream."""
        return Csv(**self._options)

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"Csv({options})"

    def output_spec(self) -> Optional[Dict[str, FieldSpec]]:
        plan = self._plan
        if plan is None:
            return None
        out = {}
        for name, cols, dtype in plan.outputs:
            kind = "object" if dtype in _TEXT else "dense"
            np_dtype = np.dtype(object) if dtype in _TEXT else np.dtype(dtype)
            out[name] = FieldSpec(kind, np_dtype, () if isinstance(cols, int) else (len(cols),))
        return out

    # --- decoding -----------------------------------------------------------------------------

    def decode_batch(self, records: Sequence[bytes], *, source: Optional[str] = None,
                     first_index: int = 0,
                     row_offset: Optional[Callable[[int], Optional[int]]] = None
                     ) -> Dict[str, Union[np.ndarray, SparseBatch]]:
        plan = self._plan
        if (_c_parse_csv_floats is not None and plan is not None and plan.fast and self._fast_ok
                and plan.fast_dtype in (np.float32, np.float64)
                and (self._header_row is None or self._header_is_data
                     or self._header_row not in records)):
            # Rows that are all plain decimal numbers (no quote, CR, BOM, blank or missing value:
            # any of those makes the kernel return None) need no joining or cleaning: parse
            # them at once, as np.loadtxt would. A repeated header that cannot be data is
            # dropped by the path below.
            ncols = len(plan.names)
            table = _c_parse_csv_floats(records, ncols, self._delimiter_byte,
                                        None if len(plan.used) == ncols else plan.used,
                                        plan.fast_dtype == np.float64)
            if table is not None:
                return plan.assemble_fast(table)
        where = RowPlace(source, first_index, row_offset)
        rows = list(records)
        positions: Optional[np.ndarray] = None  # batch row -> index in records, once rows are dropped
        wide = self._too_wide(rows)
        if wide:
            rows, positions = self._drop_wide(rows, wide, where)
        joined = b"\n".join(rows)
        bom: Optional[List[bool]] = None  # which rows began with a BOM (a file's first row)
        if _BOM in joined or b"\r" in joined:
            if _BOM in joined:
                bom = [row.startswith(_BOM) for row in rows]
            rows = [_clean(row) for row in rows]
            joined = b"\n".join(rows)
        if self.header:
            if self._header_row is None:
                if not rows:
                    return {}
                self._take_header(rows[0], where)
                positions = (np.arange(len(rows)) if positions is None else positions)[1:]
                rows = rows[1:]
                bom = bom[1:] if bom is not None else None
                joined = b"\n".join(rows)
            if rows and self._header_row in joined:
                # A row equal to the header is a repeated header (files concatenated into one
                # stream, as SageMaker Pipe mode does) only where it cannot be a data row, or
                # where a BOM shows that a file starts there. pandas writes the header "0,1,2"
                # above data rows that may read "0,1,2": those are data.
                header = self._header_row
                if self._header_may_be_data(where, positions):
                    keep = [row != header or not (bom is not None and bom[k])
                            for k, row in enumerate(rows)]
                else:
                    keep = [row != header for row in rows]
                if not all(keep):
                    base = positions if positions is not None else np.arange(len(rows))
                    positions = base[np.array(keep, dtype=bool)]
                    rows = [row for row, kept in zip(rows, keep) if kept]
                    joined = b"\n".join(rows)
        if self._plan is None:
            if not rows:
                return {}
            if self._names is None:
                first = self._split_rows([rows[0]], where, positions)[0]
                self._names = [f"c{k}" for k in range(len(first))]
            self._plan = self._make_plan(where, positions)
        plan = self._plan
        if not rows:
            return plan.empty()
        quoted = self._quote_byte is not None and self._quote_byte in joined
        # Quoted batches take the general path: numpy's parser is laxer about quotes than RFC
        # 4180 (it reads '"1"2' as 12) and the two paths must agree.
        if plan.fast and self._fast_ok and not quoted:
            result = self._fast(rows, joined, plan)
            if result is not None:
                return result
        return self._general(rows, plan, where, positions, quoted, self.on_error)

    def _too_wide(self, rows: List[bytes]) -> List[int]:
        """The rows with more than ``max_columns`` fields (only a row at least that long can)."""
        limit = self.max_columns
        if max(map(len, rows), default=0) < limit:
            return []
        return [k for k, row in enumerate(rows) if len(row) >= limit and more_fields_than(
            row, self._delimiter_byte, self._quote_byte, limit)]

    def _drop_wide(self, rows: List[bytes], wide: List[int], where: _Where
                   ) -> Tuple[List[bytes], np.ndarray]:
        """Raise for the first row over ``max_columns``, or drop them all; ``(rows, positions)``.
        A header over the limit always raises: no row could be read without it."""
        on_error = "raise" if self.header and self._header_row is None and wide[0] == 0 else self.on_error
        faults = RowFaults(on_error, where, None)
        for k in wide:
            faults.fault(f"row has more than max_columns={self.max_columns} fields", k, None)
        keep = faults.keep(len(rows))
        return [row for row, kept in zip(rows, keep) if kept], np.flatnonzero(keep)

    def _header_may_be_data(self, where: _Where, positions: Optional[np.ndarray]) -> bool:
        """Whether the header row decodes as a data row (its values parse as the columns')."""
        if self._header_is_data is None:
            if self._plan is None:
                self._plan = self._make_plan(where, positions)
            header = self._header_row
            quoted = self._quote_byte is not None and self._quote_byte in header
            try:
                self._general([header], self._plan, _Where(None, 0), None, quoted)
            except DecodeError:
                self._header_is_data = False
            else:
                self._header_is_data = True
        return self._header_is_data

    def _take_header(self, row: bytes, where: _Where) -> None:
        fields = self._split_rows([row], where, None)[0]
        if len(set(fields)) != len(fields):
            raise where.error(f"the header names a column twice: {fields!r}", 0, None)
        self._names = fields
        self._header_row = row

    def _make_plan(self, where: _Where, positions: Optional[np.ndarray]) -> "_Plan":
        names = self._names or []

        def resolve(col: Column) -> int:
            if isinstance(col, str):
                if col not in names:
                    known = ", ".join(map(repr, names[:20]))
                    raise where.error(f"no column named {col!r} (columns: {known})",
                                      _row_index(positions, 0), col)
                return names.index(col)
            index = col + len(names) if col < 0 else col
            if not 0 <= index < len(names):
                raise where.error(f"column index {col} is out of range: rows have {len(names)}"
                                  " fields", _row_index(positions, 0), None)
            return index

        label = None if self.label_column is None else resolve(self.label_column)
        selected = list(range(len(names))) if self.columns is None else [resolve(c) for c in self.columns]
        feature_cols = [c for c in selected if c != label]

        def dtype_of(index: int) -> str:
            if isinstance(self.dtype, str):
                return self.dtype
            for key in (names[index], index, index - len(names)):
                if key in self.dtype:
                    return self.dtype[key]
            return DEFAULT_DTYPE

        outputs: List[Tuple[str, Union[int, List[int]], str]] = []
        if self.as_columns:
            for c in feature_cols:
                outputs.append((names[c], c, dtype_of(c)))
        else:
            kinds = {dtype_of(c) for c in feature_cols}
            if len(kinds) > 1:
                raise where.error(f"as_columns=False stacks the features into one array, but the"
                                  f" dtypes given differ: {sorted(kinds)}", _row_index(positions, 0), None)
            outputs.append((FEATURES, feature_cols, kinds.pop() if kinds else DEFAULT_DTYPE))
        if label is not None:
            outputs.append((LABEL, label, dtype_of(label)))
        seen = set()
        for name, _, _ in outputs:
            if name in seen:
                raise where.error(f"two outputs would both be named {name!r}", _row_index(positions, 0), name)
            seen.add(name)
        return _Plan(names, outputs, label, feature_cols)

    def _fast(self, rows: List[bytes], joined: bytes, plan: "_Plan") -> Optional[Dict[str, np.ndarray]]:
        """numpy's C parser over a whole unquoted batch; None if it cannot take it as it is."""
        ncols = len(plan.names)
        every_column = len(plan.used) == ncols
        # numpy's parser reads non-ASCII text (a full-width digit, a no-break space) as Python's
        # float() does, and ends lines at CR; numbers here are ASCII, and a row that would come
        # out as no line at all makes loadtxt warn "input contained no data".
        if not joined.isascii() or b"\r" in joined or joined.count(b"\n") != len(rows) - 1:
            return None
        # With usecols, loadtxt does not check that rows agree on their number of fields.
        if not every_column and not _fields_per_row_ok(joined, self._delimiter_byte, len(rows), ncols):
            return None
        table = _loadtxt(rows, plan, self.delimiter, every_column)
        if table is None and (self._na_empty or self._na_tokens):
            marked, found = self._mark_missing(joined)
            if found:
                table = _loadtxt(marked.split(b"\n"), plan, self.delimiter, every_column)
        if table is None or table.shape[0] != len(rows) or (
                every_column and table.ndim == 2 and table.shape[1] != ncols):
            return None  # a bad value, a blank row skipped, or rows of another width
        return plan.assemble_fast(table)

    def _mark_missing(self, joined: bytes) -> Tuple[bytes, bool]:
        """``joined`` (unquoted rows) with every field equal to a na_value replaced by "nan"."""
        d = self._delimiter_byte
        out = joined
        for pattern in self._na_tokens:  # tokens are rare: check each hit's left edge by hand
            pieces, last = [], 0
            for hit in pattern.finditer(out):
                start = hit.start()
                if start == 0 or out[start - 1:start] in (d, b"\n"):
                    pieces.append(out[last:start])
                    pieces.append(b"nan")
                    last = hit.end()
            if pieces:
                pieces.append(out[last:])
                out = b"".join(pieces)
        if self._na_empty:  # empty fields: between two delimiters, or at a row's edge
            out = out.replace(d + d, d + b"nan" + d).replace(d + d, d + b"nan" + d)
            out = out.replace(b"\n" + d, b"\nnan" + d).replace(d + b"\n", d + b"nan\n")
            if out.startswith(d):
                out = b"nan" + out
            if out.endswith(d):
                out = out + b"nan"
        return out, out != joined

    def _split_rows(self, rows: List[bytes], where: _Where, positions: Optional[np.ndarray],
                    faults: Optional[RowFaults] = None) -> List[Optional[List[str]]]:
        """Fields of each row as str (the csv module: RFC 4180 quoting); None for a row that
        ``faults`` drops."""
        faults = faults or RowFaults("raise", where, positions)
        texts = []
        for k, row in enumerate(rows):
            try:
                texts.append(row.decode(self.encoding))
            except UnicodeDecodeError as exc:
                faults.reject(self._undecodable(row, exc, where, _row_index(positions, k)), k)
                texts.append("")
        # The csv module refuses fields over its process-wide field_size_limit() (131,072
        # characters by default); raising it would change it for the user's whole process, so
        # rows long enough to hold such a field are split by _split_long_row instead.
        long = _csv.field_size_limit()
        try:
            if max(map(len, texts), default=0) > long:
                raise _csv.Error("a long row")
            parsed = list(_csv.reader(texts, **self._csv_options))
        except _csv.Error:
            parsed = None
        if parsed is None or len(parsed) != len(texts):
            # A row the csv module could not keep to itself (a quote left open), or a long
            # one: row by row, to name a bad row.
            parsed = []
            for k, text in enumerate(texts):
                try:
                    if len(text) > long:
                        fields = [self._split_long_row(text)]
                    else:
                        fields = list(_csv.reader([text], **self._csv_options))
                except _csv.Error as exc:
                    reason = ("a quoted field is not closed" if "end of data" in str(exc) else str(exc))
                    faults.fault(f"row is not valid CSV: {reason}", k, None)
                    fields = [None]
                if len(fields) != 1:
                    faults.fault("row is not valid CSV: a quoted field is not closed", k, None)
                    fields = [None]
                parsed.append(fields[0])
        for k in faults.bad:
            parsed[k] = None
        return parsed

    def _split_long_row(self, text: str) -> List[str]:
        """One row's fields as the csv module splits them (strict RFC 4180 quoting: a quote
        opens a field only at its start; after the closing quote, a delimiter or the end),
        for rows too long for its field_size_limit(). ``str.find`` does the scanning."""
        delimiter, quote = self.delimiter, self.quotechar
        fields: List[str] = []
        pos, n = 0, len(text)
        if not n:
            return fields  # the csv module: an empty line has no fields
        while True:
            if quote is not None and text.startswith(quote, pos):
                parts, p = [], pos + 1
                while True:
                    close = text.find(quote, p)
                    if close < 0:
                        raise _csv.Error("unexpected end of data")
                    parts.append(text[p:close])
                    if text.startswith(quote, close + 1):  # a doubled quote
                        parts.append(quote)
                        p = close + 2
                        continue
                    p = close + 1
                    break
                if p < n and text[p] != delimiter:
                    raise _csv.Error(f"'{delimiter}' expected after '{quote}'")
                fields.append("".join(parts))
                if p >= n:
                    return fields
                pos = p + 1
                continue
            end = text.find(delimiter, pos)
            field = text[pos:] if end < 0 else text[pos:end]
            if "\n" in field or "\r" in field:
                raise _csv.Error("new-line character seen in unquoted field")
            fields.append(field)
            if end < 0:
                return fields
            pos = end + 1

    def _undecodable(self, row: bytes, exc: UnicodeDecodeError, where: _Where, index: Optional[int]
                     ) -> DecodeError:
        # Latin-1 never fails and keeps byte offsets: split with it to name the column.
        text = row.decode("latin-1")
        try:
            if len(text) > _csv.field_size_limit():
                fields = self._split_long_row(text)
            else:
                fields = next(_csv.reader([text], **self._csv_options), [])
        except _csv.Error:
            fields = []
        field = None
        for k, value in enumerate(fields):
            try:
                value.encode("latin-1").decode(self.encoding)
            except UnicodeDecodeError:
                names = self._names
                field = names[k] if names is not None and k < len(names) else f"c{k}"
                break
        return where.error(f"row is not valid {self.encoding}: {exc.reason} at byte {exc.start}"
                           " (pass encoding= for other text encodings)", index, field)

    def _general(self, rows: List[bytes], plan: "_Plan", where: _Where,
                 positions: Optional[np.ndarray], quoted: bool, on_error: str = "raise"
                 ) -> Dict[str, np.ndarray]:
        faults = RowFaults(on_error, where, positions)
        ncols = len(plan.names)
        if not quoted and plan.no_text:
            # No quotes: a plain split is exact, and numbers need no decoding.
            fields_per_row: List[Any] = [row.split(self._delimiter_byte) for row in rows]
            na = frozenset(value.encode(self.encoding) for value in self.na_values)
            filler: List[Any] = [b"0"] * ncols  # stands in for a dropped row's fields
        else:
            fields_per_row = self._split_rows(rows, where, positions, faults)
            na = self._na_set
            filler = ["0"] * ncols
            if faults.bad:
                fields_per_row = [filler if f is None else f for f in fields_per_row]
        lengths = np.fromiter(map(len, fields_per_row), dtype=np.int64, count=len(fields_per_row))
        for k in np.flatnonzero(lengths != ncols).tolist():
            n = int(lengths[k])
            field = plan.names[n] if n < ncols else f"c{ncols} (beyond the last column)"
            faults.fault(f"row has {n} fields, expected {ncols}", k, field)
            fields_per_row[k] = filler
        # One table of every field, unless one long field would pad every cell to its length:
        # then column by column, long fields apart.
        table = fixed_width(fields_per_row, table_budget(rows)) if ncols else None
        if table is not None and table.ndim != 2:  # no columns at all
            table = np.empty((len(rows), ncols), dtype="S1")

        def column(c: int) -> Any:
            return table[:, c] if table is not None else [f[c] for f in fields_per_row]

        out: Dict[str, np.ndarray] = {}
        for name, cols, dtype in plan.outputs:
            if isinstance(cols, int):
                out[name] = self._convert(column(cols), dtype, [plan.names[cols]], na, faults)
            elif dtype in _TEXT or table is None:
                block = np.empty((len(rows), len(cols)), dtype=object if dtype in _TEXT else dtype)
                for k, c in enumerate(cols):
                    block[:, k] = self._convert(column(c), dtype, [plan.names[c]], na, faults)
                out[name] = block
            else:  # one conversion for the whole block
                out[name] = self._convert(table[:, cols], dtype, [plan.names[c] for c in cols], na,
                                          faults)
        keep = faults.keep(len(rows))
        if keep is not None:
            out = {name: values[keep] for name, values in out.items()}
        return out

    def _convert(self, column: Any, dtype: str, names: List[str], na: frozenset,
                 faults: RowFaults, rows: Optional[List[int]] = None) -> np.ndarray:
        """Convert a column ``(B,)`` (an array, or a list of fields) or a block ``(B,
        len(names))`` of fields to ``dtype``; a bad value is a fault of its row (``rows[i]``
        for element row ``i``, if given). A dropped row's value is a stand-in."""
        if dtype in _TEXT:
            values = column.tolist() if isinstance(column, np.ndarray) else column
            if dtype == "str":
                values = [v.decode(self.encoding) if isinstance(v, bytes) else v for v in values]
            else:
                values = [v if isinstance(v, bytes) else v.encode(self.encoding) for v in values]
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            return arr
        if isinstance(column, list):
            return self._convert_list(column, dtype, names, na, faults)
        target = np.dtype(dtype)

        def fail(message: str, flat_index: int) -> None:
            row, col = divmod(flat_index, len(names)) if column.ndim == 2 else (flat_index, 0)
            faults.fault(message, row if rows is None else rows[row], names[col])

        if target.kind in "iuf":
            bad = _non_number_text(column)
            if bad is not None:
                for k in np.flatnonzero(bad).tolist():  # raising: at the first
                    fail(f"{self._text(column.ravel()[k].item())!r} is not a valid {dtype} value in"
                         f" column {names[k % len(names)]!r} (numbers are ASCII, as numpy and"
                         " pandas read them)", k)
                column = _stand_in(column, bad)
        if na:
            missing = np.isin(column, list(na))
            if missing.any():
                if target.kind != "f":
                    for k in np.flatnonzero(missing.ravel()).tolist():
                        fail(f"missing value {self._text(column.ravel()[k].item())!r} in {dtype}"
                             f" column {names[k % len(names)]!r}", k)
                    column = _stand_in(column, missing.ravel())
                else:
                    # wide enough for "nan" (an S1 column would truncate it)
                    column = column.astype(np.promote_types(column.dtype, column.dtype.kind + "3"))
                    column[missing] = "nan"
        converted = _as_dtype(column, target)
        if converted is not None:
            return converted
        # Find the values that do not convert (the first, when raising), for the message.
        bad = np.zeros(column.size, dtype=bool)
        for k, value in enumerate(column.ravel().tolist()):
            if _as_dtype(np.array([value]), target) is None:
                fail(f"{self._text(value)!r} is not a valid {dtype} value in column"
                     f" {names[k % len(names)]!r}", k)
                bad[k] = True
        converted = _as_dtype(_stand_in(column, bad), target) if bad.any() else None
        if converted is None:
            raise faults.where.error(f"columns {names!r} do not convert to {dtype}", None, names[0])
        return converted

    def _convert_list(self, values: List[Any], dtype: str, names: List[str], na: frozenset,
                      faults: RowFaults) -> np.ndarray:
        """One numeric column given as a list of fields: in one fixed-width array where that is
        small, else the long fields one by one (a long field costs its own length once)."""
        array = fixed_width(values, TABLE_MIN_BYTES)
        if array is not None:
            return self._convert(array, dtype, names, na, faults)
        longest = max(1, TABLE_MIN_BYTES // (4 * len(values)))
        long = [k for k, value in enumerate(values) if len(value) > longest]
        short = list(values)
        stand_in = b"0" if isinstance(values[0], bytes) else "0"
        for k in long:
            short[k] = stand_in
        out = self._convert(np.array(short), dtype, names, na, faults)
        for k in long:
            out[k] = self._convert(np.array([values[k]]), dtype, names, na, faults, [k])[0]
        return out

    def _text(self, value: Any) -> Any:
        """A field as the user wrote it: decoded if it decodes, else the raw bytes."""
        if isinstance(value, bytes):
            try:
                return value.decode(self.encoding)
            except UnicodeDecodeError:
                return value
        return value


def _non_number_text(column: np.ndarray) -> Optional[np.ndarray]:
    """Which values (of ``column.ravel()``) hold a non-ASCII character or an underscore, or None
    if none does. Python's ``float()`` (which numpy's ``astype`` uses on text) reads ``"１２"``,
    ``"١"`` and ``"1_0"``; ``np.loadtxt``, pandas and the C kernel do not: a number is ASCII,
    whichever path its batch takes."""
    flat = np.ascontiguousarray(column.ravel())
    if not flat.size or flat.dtype.kind not in "SU" or not flat.dtype.itemsize:
        return None
    codes = flat.view(np.uint32 if flat.dtype.kind == "U" else np.uint8).reshape(flat.size, -1)
    bad = ((codes > 127) | (codes == ord("_"))).any(axis=1)
    return bad if bad.any() else None


def _stand_in(column: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """A copy of ``column`` with "0" for the values ``bad`` marks (flat): their rows are dropped."""
    out = column.copy()
    out.reshape(-1)[bad] = b"0" if out.dtype.kind == "S" else "0"
    return out


def _as_dtype(column: np.ndarray, target: np.dtype) -> Optional[np.ndarray]:
    """``column`` (text) as ``target``, or None if a value does not convert."""
    try:
        if target.kind == "b":
            return _to_bool(column)
        # A number beyond float32's range is inf, as in np.loadtxt and the C kernel, with
        # no "overflow encountered in cast" warning (np.errstate is thread-local).
        with np.errstate(over="ignore", invalid="ignore"):
            return column.astype(target)
    except (ValueError, OverflowError, UnicodeError):
        return None


_TRUE = frozenset(["1", "true", "True", "TRUE", b"1", b"true", b"True", b"TRUE"])
_FALSE = frozenset(["0", "false", "False", "FALSE", b"0", b"false", b"False", b"FALSE"])


def _to_bool(column: np.ndarray) -> np.ndarray:
    out = np.empty(column.size, dtype=bool)
    for k, value in enumerate(column.ravel().tolist()):
        value = value.strip()
        if value in _TRUE:
            out[k] = True
        elif value in _FALSE:
            out[k] = False
        else:
            raise ValueError(value)
    return out.reshape(column.shape)


def _clean(row: bytes) -> bytes:
    if row.startswith(_BOM):
        row = row[len(_BOM):]
    if row.endswith(b"\r"):  # a CRLF terminator the framer left half of
        row = row[:-1]
    return row
