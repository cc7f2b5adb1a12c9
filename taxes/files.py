"""Every file taxes writes goes through here: `-o PATH`, `--plot PATH`, result documents, profiles; and the
one way taxes opens a file the user names as input (open_regular).

- Only regular files are written. A PATH that names a directory, a device (/dev/full, /dev/null), a FIFO, a
  socket, or a symbolic link to one of those is refused before any work, and again just before the new
  file is published, whatever --force says: a rename over /dev/full would replace the device node itself.
- `-` is standard output.
- A file is written to a temporary name in the same directory, flushed, then renamed: readers see the old
  file or the whole new one (a run killed mid-write leaves at most a stray `.taxes-*.tmp`). The temporary
  name is short and fixed in length, so any name that fits the file system (up to NAME_MAX) can be written.
- Without force an existing file is kept: the check is made before the work, and the publish itself never
  replaces (a hard link fails on an existing name), so two runs cannot clobber each other either.
- A PATH that ends in a separator (`-o newdir/`) names a directory, never a file called `newdir`.
- A failure is one TaxesError line naming the path, printable (taxes.sanitize).

Inputs (documents, hardware profiles, traces) and files appended to (`$GITHUB_STEP_SUMMARY`) are opened with
open_regular: a FIFO, a device (/dev/zero), a socket or a directory is refused before a byte is read or
written, so nothing blocks on a FIFO nobody writes and nothing reads an endless device.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path

from taxes.errors import TaxesError
from taxes.sanitize import path as shown

STDOUT = "-"
TMP_PREFIX = ".taxes-"
TMP_SUFFIX = ".tmp"


class NotARegularFile(OSError):
    """The output path names something other than a regular file (or a link to one)."""


def _kind(mode: int) -> str | None:
    """What a non-regular file is, for the message; None for a regular file."""
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None if stat.S_ISREG(mode) else "not a regular file"


def existing_kind(path: str | Path) -> str | None:
    """None when nothing is at `path`, "file" for a regular file (or a link to one, or a dangling link,
    which a rename replaces harmlessly), else what it is ("a directory", "a character device", ...)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except OSError:  # a dangling link: the rename replaces the link, nothing it points to
            return "file"
        what = _kind(st.st_mode)
        return "file" if what is None else f"a symbolic link to {what}"
    return _kind(st.st_mode) or "file"


def refuse_non_regular(path: str | Path) -> None:
    what = existing_kind(path)
    if what not in (None, "file"):
        raise NotARegularFile(errno.EINVAL, f"{what}, not a regular file; taxes writes only regular files", str(path))


def names_a_directory(path: str | Path) -> bool:
    """`newdir/` (or `newdir/.`): the user named a directory, whatever is there."""
    text = os.fspath(path)
    return text.endswith((os.sep, "/", os.sep + ".", "/."))


def open_regular(path: str | Path, append: bool = False):
    """A regular file the user named, opened for reading in binary (append: for appending text, created
    when missing). Anything else (a FIFO, a device, a socket, a directory, or a link to one) raises
    NotARegularFile before a byte is read or written: the file is opened without blocking and judged by
    what the open descriptor is, so nothing swapped in between a check and the open gets through."""
    what = existing_kind(path)
    if what not in (None, "file"):
        raise NotARegularFile(errno.EINVAL, f"{what}, not a regular file", str(path))
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT) if append else os.O_RDONLY
    fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotARegularFile(errno.EINVAL, f"{kind}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a" if append else "rb", **({"encoding": "utf-8"} if append else {}))
    except BaseException:
        os.close(fd)
        raise


def check_output(path: str | None, force: bool, what: str = "") -> None:
    """Before any work: `path` can be written (stdout, or a regular file in an existing directory, new
    or --force). One TaxesError line otherwise."""
    if path is None or path == STDOUT:
        return
    label = f"{what} {shown(path)}".strip()
    if not str(path):
        raise TaxesError(f"{what or 'output'}: an empty file name".strip())
    if names_a_directory(path) and not os.path.isdir(path):
        raise TaxesError(f"{label}: names a directory (it ends in '/'), and there is none; name a file")
    try:
        refuse_non_regular(path)
    except NotARegularFile as e:
        raise TaxesError(f"{label}: {e.strerror}") from None
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise TaxesError(f"{label}: its directory does not exist")
    if not force and os.path.lexists(path):
        raise TaxesError(f"{label}: already exists; pass --force to replace it (or choose another name)")


def write_atomic(path: str | Path, data: str | bytes, overwrite: bool = True) -> None:
    """Write a regular file atomically (see the module docstring). Raises OSError: FileExistsError when
    overwrite is False and the name is taken, NotARegularFile for a device, FIFO, directory, ..."""
    if names_a_directory(path):  # Path() would drop the '/' and write a file of the directory's name
        raise NotARegularFile(errno.EISDIR, "names a directory (it ends in '/'), not a file", os.fspath(path))
    path = Path(path)
    refuse_non_regular(path)
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "File exists", str(path))
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=TMP_SUFFIX, dir=str(path.parent))
    try:
        try:  # keep the replaced file's permissions; a new file gets the usual 0666 & ~umask
            perm = os.stat(path).st_mode & 0o777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            perm = 0o666 & ~umask
        os.chmod(tmp, perm)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        refuse_non_regular(path)  # again: something may have appeared there while we wrote
        if overwrite:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _publish_new(tmp: str, path: Path) -> None:
    """Give the finished temporary file its name only if that name is free."""
    try:
        os.link(tmp, path)  # fails with FileExistsError if path exists: no check-then-write race
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links: check, then rename (a narrow race remains)
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def write_error(path: str | Path, e: OSError) -> TaxesError:
    """The one-line error for a failed write."""
    if isinstance(e, FileExistsError):
        return TaxesError(f"{shown(path)}: already exists; pass --force to replace it (or choose another name)")
    if isinstance(e, NotARegularFile):
        return TaxesError(f"{shown(path)}: {e.strerror}")
    return TaxesError(f"{shown(path)}: cannot write it ({e.strerror or e})")


def write_stdout(data: str | bytes) -> None:
    """Data to standard output, flushed now so that a full disk or a closed pipe is met here."""
    if isinstance(data, bytes):
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        sys.stdout.write(data)
        sys.stdout.flush()


def write_output(path: str | None, data: str | bytes, force: bool = False, announce: bool = True) -> str | None:
    """Data to `path` (atomically, regular files only), or to stdout when path is None or "-". Returns the
    path written, or None for stdout; announces "wrote PATH" on stderr when asked."""
    if path is None or path == STDOUT:
        write_stdout(data)
        return None
    try:
        write_atomic(path, data, overwrite=force)
    except OSError as e:
        raise write_error(path, e) from None
    if announce:
        announce_written(path)
    return str(path)


def announce_written(path) -> None:
    sys.stderr.write(f"wrote {shown(path)}\n")
    sys.stderr.flush()


class BrokenGzip(ValueError):
    """A truncated or corrupt gzip stream (read_maybe_gzip)."""


def read_maybe_gzip(path: str | Path, limit: int) -> bytes:
    """The file's bytes, decompressed when it is gzip (by its magic number, whatever its name), at most
    limit + 1 of them, so a caller can refuse more and a gzip bomb stops there. OSError as open and read
    raise it (NotARegularFile for a FIFO, device, socket or directory); BrokenGzip for a truncated or corrupt gzip stream. (Result documents and taxes analyze's
    traces both read through here.)"""
    import gzip
    import zlib

    with open_regular(path) as f:  # a FIFO or a device is refused, never read (NotARegularFile)
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if not gz:
            return f.read(limit + 1)
        try:
            with gzip.open(f) as g:
                return g.read(limit + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise BrokenGzip(str(e)) from None
