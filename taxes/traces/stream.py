"""Read a Chrome trace document one event at a time, in bounded memory.

A trace of a million events is a few hundred MB of JSON; `json.loads` of the whole file builds every event
as a dict at once (about 1 GB per million events). This reader decodes the document's top-level keys one
by one and the `traceEvents` array element by element with the standard library's scanner, from a
window of text refilled in chunks, so an event exists only while the caller reads it. Plain or gzip
(told by the first two bytes, whatever the file's name); the bare-array form is read the same way.

Everything malformed is a one-line TaxesError: not UTF-8, truncated or malformed JSON, NaN or Infinity,
nesting deep enough to exhaust the stack, more than `limit` bytes once decompressed. Bounded on any input:
only regular files are opened (a FIFO or a device such as /dev/zero could block or never end) unless the
caller allows them; a document that starts with anything but an object or an array is refused at its
first byte; one value (an event, a top-level key's) longer than MAX_VALUE_CHARS fails in one line instead
of growing the window without end, and while a value is incomplete the window grows geometrically, so the
text is copied and re-scanned O(its length) times in all; a gzip stream that expands more than
MAX_GZIP_RATIO times is a bomb, refused once it has produced GZIP_CHECK_BYTES.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import stat
import zlib
from decimal import Decimal
from pathlib import Path

from taxes.errors import TaxesError
from taxes.sanitize import reject_constant

CHUNK_BYTES = 8 << 20
REFILL_CHARS = 1 << 20  # keep at least this much text ahead of the cursor, so most events decode in one go
MAX_VALUE_CHARS = 64 << 20  # one event or metadata value; Kineto's are a few kB
MAX_GZIP_RATIO = 200  # real traces expand 5-50 times; a bomb of one repeated byte about 1000 times
GZIP_CHECK_BYTES = 16 << 20  # the ratio is judged once this much has come out
_VALUE_START = frozenset('{["-0123456789tfnNI')  # a JSON value (and the NaN / Infinity constants refused later)
_WS = re.compile(r"[ \t\n\r]*")
_SEP = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


def one_line(message: str) -> TaxesError:
    """The error as one printable line: a file or kernel name may hold line breaks or control bytes."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(message))
    return TaxesError(text if len(text) <= 400 else text[:397] + "...")


def file_kind(path) -> str | None:
    """None for a regular file (or a link to one); else what it is, for a one-line refusal. Never opens
    the path (opening a FIFO blocks until a writer comes)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot read it ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def check_regular(path, what: str = "trace", special: bool = False) -> None:
    """Refuse, in one line, a path that is missing, a directory, or (unless `special`) not a regular file."""
    kind = file_kind(path)
    if kind is None:
        return
    if kind == "no such file" or kind.startswith("cannot read"):
        raise one_line(f"{path}: {kind}" + (f" (the {what})" if what != "trace" else ""))
    if kind == "a directory":
        raise one_line(f"{path}: a directory, not a {what} file")
    if not special:
        raise one_line(f"{path}: {kind}, not a regular file; pass --allow-special-files to read a {what} from it")


def read_side_file(path, what: str, limit: int, special: bool = False) -> bytes:
    """A small file beside the traces (what: "plain step times", "patterns"), at most `limit` bytes; refused
    in one line when missing, a directory, special (unless `special`), unreadable or larger."""
    check_regular(path, what, special)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise one_line(f"{path}: cannot read the {what} file ({e.strerror or e})") from None
    if len(data) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit:,} bytes"
        raise one_line(f"{path}: larger than {size}; not a {what} file")
    return data


class TraceStream:
    """`for event in stream.events(): ...`; afterwards `stream.meta` holds every other top-level key."""

    def __init__(self, path, limit: int, exact: bool = False, special: bool = False):
        self.path = Path(path)
        self.limit = limit
        self.special = special  # read FIFOs and devices too (the caller asked for them)
        self.meta: dict = {}
        self._decoder = json.JSONDecoder(parse_constant=reject_constant, parse_float=Decimal if exact else float)
        self._scan = self._decoder.scan_once
        self._raw = None
        self._file = None
        self._text_decoder = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._read = 0

    # ---- the text window -------------------------------------------------------------------------

    def _open(self):
        check_regular(self.path, "trace", self.special)
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            raise one_line(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise one_line(f"{self.path}: a directory, not a trace file") from None
        except OSError as e:
            raise one_line(f"{self.path}: cannot read it ({e.strerror or e})") from None
        self._file = f
        magic = f.read(2)
        if file_kind(self.path) is None:
            f.seek(0)
            if magic != b"\x1f\x8b" and os.fstat(f.fileno()).st_size > self.limit:
                raise one_line(f"{self.path}: larger than {self.limit >> 20} MiB; refusing to parse it")
        elif magic == b"\x1f\x8b":  # a pipe cannot be rewound to the gzip header
            raise one_line(f"{self.path}: gzip from a special file; decompress it to a regular file first")
        elif magic:
            self._buf = self._text_decoder.decode(magic)
            self._read = len(magic)
        self._raw = gzip.GzipFile(fileobj=f) if magic == b"\x1f\x8b" else f

    def _refill(self, want: int = CHUNK_BYTES) -> bool:
        """Append the next `want` bytes of text to the window (dropping what was read); False at the end."""
        if self._eof:
            return False
        try:
            data = self._raw.read(want)
        except (OSError, EOFError, zlib.error) as e:
            raise one_line(f"{self.path}: a truncated or corrupt gzip file ({e})") from None
        self._read += len(data)
        if self._read > self.limit:
            raise one_line(f"{self.path}: larger than {self.limit >> 20} MiB decompressed; refusing to parse it")
        if self._raw is not self._file and self._read > GZIP_CHECK_BYTES:
            packed = max(1, self._file.tell())
            if self._read > MAX_GZIP_RATIO * packed:
                raise one_line(f"{self.path}: {packed:,} bytes of gzip expand to more than {self._read:,}: not a trace "
                               "(a gzip bomb); refusing to parse it")
        try:
            text = self._text_decoder.decode(data, final=not data)
        except UnicodeDecodeError:
            raise one_line(f"{self.path}: not a trace (not UTF-8 text)") from None
        if not data:
            self._eof = True
        self._buf = self._buf[self._pos:] + text
        self._pos = 0
        return bool(data) or bool(text)

    def _skip_ws(self) -> str:
        """The next non-blank character ("" at the end of the file)."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._refill():
                return ""

    def _malformed(self, why: str) -> TaxesError:
        return one_line(f"{self.path}: not complete JSON, truncated or malformed ({why})")

    def _offset(self) -> int:
        return self._read - len(self._buf) + self._pos

    def _value(self):
        """Decode the value at the cursor. A value that fails or ends at the window's end may continue
        in the next chunk: read as much again as is pending (the window doubles) and decode again, up to
        MAX_VALUE_CHARS; a character no value can start with fails at once."""
        c = self._skip_ws()
        if c and c not in _VALUE_START:
            raise self._malformed(f"{c!r} cannot start a JSON value (offset {self._offset()})")
        while True:
            try:
                value, end = self._scan(self._buf, self._pos)
                if end < len(self._buf) or self._eof:
                    self._pos = end
                    return value
            except StopIteration:
                if self._eof:
                    raise self._malformed(f"no JSON value at offset {self._offset()}") from None
            except json.JSONDecodeError as e:
                if self._eof:
                    raise self._malformed(str(e).splitlines()[0]) from None
            except RecursionError:
                raise one_line(f"{self.path}: not a trace (nested too deeply)") from None
            except ValueError as e:  # NaN / Infinity, an integer of too many digits
                raise self._malformed(str(e).splitlines()[0]) from None
            pending = len(self._buf) - self._pos
            if pending > MAX_VALUE_CHARS:
                raise self._malformed(f"no JSON value completes within {MAX_VALUE_CHARS >> 20} MiB at offset "
                                      f"{self._offset()}")
            self._refill(max(CHUNK_BYTES, pending))  # at the end of the file this marks it ended; the next pass decides

    def _expect(self, chars: str) -> str:
        c = self._skip_ws()
        if c == "" or c not in chars:
            raise self._malformed(f"expected {' or '.join(repr(x) for x in chars)}, found {c!r}" if c else "it ends early")
        self._pos += 1
        return c

    # ---- the document ----------------------------------------------------------------------------

    def events(self):
        """Yield every element of traceEvents (or of a bare top-level array), in file order."""
        self._open()
        try:
            first = self._skip_ws()
            if first == "[":
                self._pos += 1
                yield from self._array()
                self._trailing()
                return
            if first != "{":
                if first == "":
                    raise self._malformed("the file is empty")
                if first not in _VALUE_START:
                    raise one_line(f"{self.path}: not a trace (it starts with {first!r}, not a JSON object)")
                value = self._value()
                if isinstance(value, (dict, list)):
                    raise self._malformed("unexpected data")
                raise one_line(f"{self.path}: not a Chrome trace (no traceEvents list)")
            self._pos += 1
            found = False
            if self._skip_ws() == "}":
                self._pos += 1
            else:
                while True:
                    if self._skip_ws() != '"':
                        raise self._malformed("expected a key")
                    key = self._value()
                    self._expect(":")
                    if key == "traceEvents" and self._skip_ws() == "[":
                        self._pos += 1
                        found = True
                        yield from self._array()
                    else:
                        self.meta[key] = self._value()
                    if self._expect(",}") == "}":
                        break
            self._trailing()
            if not found:
                raise one_line(f"{self.path}: not a Chrome trace (no traceEvents list)")
        finally:
            if self._raw is not None:
                self._raw.close()
            if self._file is not None:
                self._file.close()

    def _array(self):
        if self._skip_ws() == "]":
            self._pos += 1
            return
        scan, sep = self._scan, _SEP.match
        while True:
            if len(self._buf) - self._pos < REFILL_CHARS and not self._eof:
                self._refill()
            buf, pos = self._buf, self._pos
            try:  # the common case: a whole event, then its separator, inside the window
                value, end = scan(buf, pos)
                m = sep(buf, end) if end < len(buf) else None
            except (StopIteration, ValueError, RecursionError):
                m = None
            if m is None or (m.end() == len(buf) and not self._eof):
                yield from self._array_slowly()
                return
            self._pos = m.end()
            yield value
            if m.group(1) == "]":
                return

    def _array_slowly(self):
        """The rest of the array, one careful step at a time (refilling mid-value, precise errors)."""
        while True:
            if self._skip_ws() == "":
                raise self._malformed("it ends inside traceEvents")
            yield self._value()
            if self._expect(",]") == "]":
                return

    def _trailing(self):
        if self._skip_ws() != "":
            raise self._malformed("extra data after the document")
