"""Atomic saves: a save killed at any moment leaves the previous contents
or the new ones, whole, never a mix.

`atomic_directory(target)` yields a fresh, empty sibling directory
`.<name>.partial-<pid>-<token>` (same parent, so the same file system) to
write into. When the block ends without an error, every file in it is
flushed to disk (`os.fsync`), and four steps replace `target`:

1. the sibling is renamed `.<name>.complete-<pid>-<token>` (it is whole);
2. the previous `target`, if any, is renamed aside to `.<name>.old-...`;
3. the complete sibling is renamed to `target`;
4. the old directory is removed.

Each step is one `os.rename` inside one directory, which POSIX file systems
perform atomically, so whatever the moment of a kill, `target` is either
the old directory or the new one, except between steps 2 and 3, where it is
missing and both whole versions lie beside it. `recover(target)` finishes
such an interrupted save (the complete sibling becomes `target`) and
removes the leftovers of saves that died earlier (partial directories,
old directories); every save runs it first, and loading a preset runs it
when the directory is missing. Leftovers of a save that is still running
(its process id is alive, on POSIX) are left alone; two processes saving
into the same directory at once is not supported (the last one wins).

A directory is replaced as a whole: afterwards it holds exactly the files
of its last save. So that a mistyped path cannot delete unrelated files,
`target` must be missing, empty, or hold one of the `markers` files that
the save itself writes (e.g. `config.json`), and must not contain the
working directory. Saving needs write access to the parent directory.

`atomic_file(path)` does the same for one file (a temporary sibling, fsync,
`os.replace`).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

PARTIAL, COMPLETE, OLD = "partial", "complete", "old"
_SIBLING = re.compile(
    r"^\.(?P<name>.+)\.(?P<state>partial|complete|old)-(?P<pid>\d+)-[0-9a-f]+$"
)


def _sibling(target: Path, state: str, token: str) -> Path:
    return target.parent / f".{target.name}.{state}-{os.getpid()}-{token}"


def _alive(pid: int) -> bool:
    """Whether process `pid` (not this one) runs; False where we cannot tell."""
    if pid == os.getpid() or os.name != "posix":  # no signal-0 probe on Windows
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # it exists, under another user
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True


def leftovers(target) -> dict[str, list[Path]]:
    """`{state: [paths]}` of the siblings earlier saves into `target` left."""
    target = Path(target)
    found: dict[str, list[Path]] = {PARTIAL: [], COMPLETE: [], OLD: []}
    try:
        entries = list(os.scandir(target.parent))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        match = _SIBLING.match(entry.name)
        if match and match["name"] == target.name:
            found[match["state"]].append(target.parent / entry.name)
    return found


def _pid(path: Path) -> int:
    return int(_SIBLING.match(path.name)["pid"])


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def recover(target, *, only_if_missing: bool = False) -> None:
    """Brings `target` to the state of the last save that finished writing.

    A complete sibling (a save killed during its swap) replaces `target`;
    partial and old siblings of dead saves are removed; an old sibling
    comes back only if `target` is missing and no complete one exists. With
    `only_if_missing`, nothing is done while `target` exists.

    Raises:
        FileNotFoundError: `target` is missing, the whole new version lies
            beside it, and it cannot be renamed (e.g. a read-only
            directory): the message names the rename that finishes the save.
    """
    target = Path(target)
    missing = not os.path.lexists(target)
    if only_if_missing and not missing:
        return
    found = leftovers(target)
    if not any(found.values()):
        return
    dead = {s: [p for p in v if not _alive(_pid(p))] for s, v in found.items()}
    # Between steps 2 and 3 the saving process is alive a few microseconds
    # more: while `target` is missing, its complete sibling counts too.
    complete = sorted(found[COMPLETE] if missing else dead[COMPLETE], key=_mtime)
    old = sorted(dead[OLD], key=_mtime)
    if complete:
        newest = complete.pop()
        if missing:
            _finish(newest, target)
        else:
            _swap(newest, target)
    elif missing and old:
        os.rename(old.pop(), target)  # no whole new version: the old is back
    for path in complete + dead[PARTIAL] + old:
        _remove(path)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _finish(complete: Path, target: Path) -> None:
    """Step 3 of an interrupted save."""
    try:
        os.rename(complete, target)
    except FileNotFoundError:
        if not target.exists():
            raise
        return  # the saving process finished its own swap meanwhile
    except OSError as error:
        raise FileNotFoundError(
            f"{target} is missing: a save into it was interrupted after writing "
            f"everything to {complete}. Rename that directory to {target} to "
            f"finish the save ({error})."
        ) from None
    _fsync_dir(target.parent)


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":  # directories cannot be opened on Windows
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not sync directories
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root) -> None:
    """Flushes every file and directory under `root` to disk."""
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync_file(os.path.join(directory, name))
        _fsync_dir(Path(directory))


def _swap(new: Path, target: Path) -> None:
    """Steps 2-4 of the module docstring: `new` (complete) becomes `target`."""
    old = None
    if os.path.lexists(target):
        old = _sibling(target, OLD, secrets.token_hex(4))
        os.rename(target, old)
    try:
        os.rename(new, target)
    except FileNotFoundError:
        if not target.exists():  # `recover` elsewhere did not finish it either
            raise
    _fsync_dir(target.parent)
    if old is not None:
        _remove(old)


def _check_target(target: Path, markers: tuple[str, ...]) -> None:
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise ValueError(
            f"Cannot save into {target}: it contains the working directory, and a "
            "save replaces the whole directory. Save into a new or empty directory."
        )
    if not os.path.lexists(target):
        return
    if not target.is_dir():
        raise ValueError(
            f"Cannot save into {target}: it is a file, not a directory. Pass a "
            "directory path (it is created if needed)."
        )
    names = os.listdir(target)
    if names and not any(name in names for name in markers):
        raise ValueError(
            f"Cannot save into {target}: it holds files that were not written by "
            f"this kind of save (e.g. {sorted(names)[0]!r}; none of {list(markers)}), "
            "and a save replaces the whole directory. Save into a new or empty "
            "directory, or remove those files first."
        )


@contextlib.contextmanager
def atomic_directory(target, markers: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yields an empty directory that replaces `target` when the block ends.

    See the module docstring for the steps and what a kill leaves.

    Args:
        target: the directory to write (created with its parents if needed;
            a symbolic link is followed, the directory it names replaced).
        markers: file names the save writes; an existing non-empty `target`
            must hold one of them.

    Raises:
        ValueError: `target` is a file, holds other files, or contains the
            working directory.
    """
    target = Path(os.path.realpath(target))
    _check_target(target, markers)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    token = secrets.token_hex(4)
    partial = _sibling(target, PARTIAL, token)
    partial.mkdir()
    try:
        yield partial
        fsync_tree(partial)
        complete = _sibling(target, COMPLETE, token)
        os.rename(partial, complete)
    except BaseException:
        _remove(partial)
        raise
    _swap(complete, target)


@contextlib.contextmanager
def atomic_file(path) -> Iterator[Path]:
    """Yields a temporary sibling path that replaces file `path` at the end
    (after fsync); removed instead if the block raises. Leftovers of killed
    saves into `path` are removed first."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in leftovers(path)[PARTIAL]:
        if not _alive(_pid(stale)):
            _remove(stale)
    partial = _sibling(path, PARTIAL, secrets.token_hex(4))
    try:
        yield partial
        _fsync_file(str(partial))
        os.replace(partial, path)
    except BaseException:
        _remove(partial)
        raise
    _fsync_dir(path.parent)
