"""`starvecheck clean`: remove what a killed run left, and only what is provably its.

scratch/claims.py proves each path a dead run's marker names by name and place; here each is
checked on disk before it goes: no-follow opens and lstat, the caller's own, and

- multiprocessing's directory: not a link, mode 0700, holding only what
  multiprocessing puts there (sockets `listener-XXXXXXXX`, heap files
  `pym-PID-XXXXXXXX`), no live socket bound in it (scratch/inuse.py);
- Streaming's blocks and lock files: regular files that no process has open or
  mapped (a write lease, held through the unlink; where leases are not available, a
  block any process maps, or may map where its maps cannot be read, stays: scratch/inuse.py);
  a prefix's `locals` goes last, and only when nothing else of the prefix is left.

The directory's own contents are removed through descriptors, never through a link,
one level of subdirectories deep. The marker goes last, right before the rmdir, and
only when everything else is gone: what could not be removed or was refused keeps the
marker, so a later `clean` retries it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from starvecheck.scratch import inuse
from starvecheck.scratch.claims import (
    ARENA_NAME,
    LISTENER_NAME,
    LOCALS,
    Refused,
    Target,
    plan,
    temp_dir,
)
from starvecheck.scratch.leftovers import DIR_FLAGS, MARKER, MARKER_FLAGS, Leftover


@dataclass
class Cleaned:
    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # "path: why"


def remove(x: Leftover, environ: Mapping[str, str] | None = None, dry_run: bool = False) -> Cleaned:
    """Remove a dead run's directory and what its marker names, as far as each is proven
    to be the run's; the rest is said in `left`. `environ`: the caller's environment,
    whose TMPDIR says where Streaming and multiprocessing put their files."""
    out = Cleaned()
    if not x.removable:
        out.left.append(f"{x.path}: {x.why}")
        return out
    tmp = temp_dir(os.environ if environ is None else environ)
    items = plan(x, tmp)
    blocked: set[str] = set()  # Streaming prefixes with something left: `locals` stays
    for item in items:
        if isinstance(item, Refused):
            out.left.append(f"{item.path}: refused: {item.why}")
            blocked.add(item.group)
    targets = [i for i in items if isinstance(i, Target)]
    for t in targets:
        if t.kind == "pymp":
            _reclaim_pymp(t, out, dry_run)
    _reclaim_files([t for t in targets if t.kind != "pymp"], out, dry_run, blocked)
    _reclaim_dir(x, out, dry_run, finish=not out.left)
    return out


def _reclaim_pymp(t: Target, out: Cleaned, dry_run: bool) -> bool:
    """Remove multiprocessing's directory `t` where it holds only what multiprocessing
    puts there; False where something is left (and said in `out`)."""
    try:
        root = os.open(t.directory, DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as e:
        out.left.append(f"{t.path}: {e.strerror}")
        return False
    try:
        try:
            fd = os.open(t.name, DIR_FLAGS | os.O_NONBLOCK, dir_fd=root)
        except FileNotFoundError:
            return True
        except OSError as e:
            odd = e.errno in (errno.ELOOP, errno.ENOTDIR)
            out.left.append(f"{t.path}: refused: {'not a directory' if odd else e.strerror}")
            return False
        try:
            why, entries = _pymp_contents(fd, t.path)
            if why is not None:
                out.left.append(f"{t.path}: refused: {why}")
                return False
            if dry_run:
                out.removed.append(t.path)
                return True
            for entry in entries:
                os.unlink(entry, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(t.name, dir_fd=root)
        out.removed.append(t.path)
        return True
    except OSError as e:
        out.left.append(f"{t.path}: {e.strerror}")
        return False
    finally:
        os.close(root)


def _pymp_contents(fd: int, path: str) -> tuple[str | None, list[str]]:
    """Why the open directory is not multiprocessing's of a dead process, or None and
    its entries."""
    me = os.geteuid()
    st = os.fstat(fd)
    if st.st_uid != me:
        return f"it belongs to uid {st.st_uid}, not to you", []
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        mode = stat.S_IMODE(st.st_mode)
        return f"open to others (mode {mode:o}); multiprocessing makes it 0700", []
    entries = sorted(os.listdir(fd))
    sockets = False
    for entry in entries:
        est = os.stat(entry, dir_fd=fd, follow_symlinks=False)
        if est.st_uid == me and LISTENER_NAME.fullmatch(entry) and stat.S_ISSOCK(est.st_mode):
            sockets = True
        elif not (est.st_uid == me and ARENA_NAME.fullmatch(entry) and stat.S_ISREG(est.st_mode)):
            return f"it holds {entry}, which multiprocessing does not put there", []
    if sockets and (why := inuse.listening_under(path)) is not None:
        return why, []
    return None, entries


def _reclaim_files(targets: list[Target], out: Cleaned, dry_run: bool, blocked: set[str]) -> None:
    """Remove Streaming's blocks and lock files of `targets` where each is a regular
    file of the caller's that no process has open or mapped (scratch/inuse.py); each prefix's
    `locals` last, and only when nothing else of the prefix is left (`blocked`: the
    prefixes with something left, added to here)."""
    fds: dict[str, int] = {}
    try:
        found: dict[Target, os.stat_result] = {}
        for t in targets:
            st = _lstat(t, fds)
            if isinstance(st, str):
                out.left.append(f"{t.path}: refused: {st}")
                blocked.add(t.group)
            elif st is not None:
                found[t] = st
        last = sorted(found, key=lambda t: (t.kind == "shm", t.name.endswith("_" + LOCALS)))
        with inuse.quiet_lease_breaks() as leases:
            for t in last:
                if t.kind == "shm" and t.name.endswith("_" + LOCALS) and t.group in blocked:
                    why: str | None = "kept while other names of its prefix are left"
                else:
                    why = _remove_unused(t, found[t], fds[t.directory], dry_run, leases)
                if why is None:
                    out.removed.append(t.path)
                elif why:
                    out.left.append(f"{t.path}: refused: {why}")
                    blocked.add(t.group)
    finally:
        for fd in fds.values():
            os.close(fd)


def _lstat(t: Target, fds: dict[str, int]) -> os.stat_result | str | None:
    """The file's lstat where it is a regular file of the caller's; why not; None where
    it is gone."""
    try:
        if t.directory not in fds:
            fds[t.directory] = os.open(t.directory, DIR_FLAGS & ~os.O_NOFOLLOW)
        st = os.stat(t.name, dir_fd=fds[t.directory], follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror
    if stat.S_ISLNK(st.st_mode):
        return "a link"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to you"
    return st


def _remove_unused(
    t: Target, st: os.stat_result, dir_fd: int, dry_run: bool, leases: bool
) -> str | None:
    """Unlink the file proven above where it is still that file and no process has it
    open or mapped: None once removed (or, with `dry_run`, removable), "" where it is
    gone already, else why it stays. Under a write lease where the kernel grants one
    (the unlink too); else, for a block, by every process's /proc/PID/maps."""
    try:
        fd = os.open(t.name, MARKER_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return ""
    except OSError as e:
        return e.strerror
    leased = None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return "it changed while clean ran"
        leased = inuse.lease(fd) if leases else None
        if leased is False:
            seen = inuse.mapped({t.path: st}).get(t.path, "")
            return seen if "mapped by" in seen else "in use: another process has it open"
        if leased is None and t.kind == "shm":
            why = inuse.mapped({t.path: st}).get(t.path)
            if why is not None:
                return why
        if not dry_run:
            os.unlink(t.name, dir_fd=dir_fd)
        return None
    except FileNotFoundError:
        return ""
    except OSError as e:
        return e.strerror
    finally:
        if leased:
            inuse.unlease(fd)
        os.close(fd)


def _reclaim_dir(x: Leftover, out: Cleaned, dry_run: bool, finish: bool) -> None:
    """Empty the run's directory but its marker; then, if nothing is left anywhere
    (`finish`), unlink the marker and rmdir, else keep both for a later clean."""
    parent, name = os.path.split(x.path)
    try:
        parent_fd = os.open(parent, DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as e:
        out.left.append(f"{x.path}: {e.strerror}")
        return
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != x.ident:
                out.left.append(f"{x.path}: it changed while clean ran; run clean again")
                return
            emptied = _empty(fd, x.path, 2, out, dry_run, top=True)
            if not (emptied and finish):
                out.left.append(
                    f"{x.path}: kept with its marker, so that a later clean can retry what is "
                    "left (or remove it yourself)"
                )
                return
            if dry_run:
                out.removed.append(x.path)
                return
            os.unlink(MARKER, dir_fd=fd)  # last, right before the rmdir
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent_fd)
        out.removed.append(x.path)
    except FileNotFoundError:
        pass
    except OSError as e:
        out.left.append(f"{x.path}: {e.strerror}")
    finally:
        os.close(parent_fd)


def _empty(fd: int, shown: str, depth: int, out: Cleaned, dry_run: bool, top: bool) -> bool:
    """Unlink what the open directory holds (links themselves, never their targets; at
    the top, not the marker), `depth` levels of directories down; True when all of it
    is gone (or would be)."""
    try:
        entries = sorted(os.listdir(fd))
    except OSError as e:
        out.left.append(f"{shown}: {e.strerror}")
        return False
    emptied = True
    for entry in entries:
        if top and entry == MARKER:
            continue
        full = os.path.join(shown, entry)
        try:
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                if not dry_run:
                    os.unlink(entry, dir_fd=fd)
                continue
            if depth <= 1:
                out.left.append(f"{full}: deeper than starvecheck makes")
                emptied = False
                continue
            sub = os.open(entry, DIR_FLAGS, dir_fd=fd)
            try:
                done = _empty(sub, full, depth - 1, out, dry_run, top=False)
            finally:
                os.close(sub)
            if done and not dry_run:
                os.rmdir(entry, dir_fd=fd)
            emptied = emptied and done
        except FileNotFoundError:
            continue
        except OSError as e:
            out.left.append(f"{full}: {e.strerror}")
            emptied = False
    return emptied
