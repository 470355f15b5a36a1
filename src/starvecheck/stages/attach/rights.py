"""What the job's own user may read (`attach`): a job's source files are read only where
the job itself could read them, so that attach, often root, never reads for the job a
file its user may not (a path through /root, a 0600 file of another user).

The job's credentials come from /proc/PID/status (through the fake-machine root):
its real, effective and filesystem uid and gid, and its supplementary groups. The
kernel checks a file access against the filesystem ids (normally the effective ones);
attach asks that every one of the three be allowed, so that neither a set-id program
nor a process between two setuid calls gets a file read that one of its ids may not.
Each is checked as the kernel's generic_permission does: the owner's bits for the
owner, else the group's for a member of the file's group (a member is refused by
0604, as the kernel refuses it), else the others'. A file or directory with a POSIX
access ACL (the `system.posix_acl_access` attribute) is checked against its entries
the way fs/posix_acl.c does (named users, named groups, the mask); an attribute that
cannot be read or parsed refuses. Capabilities count only for a job whose every uid is
0 in attach's own user namespace, holding CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH:
root in a container's user namespace holds them over its own files, not the node's.
Not modelled, so possibly more permissive than the kernel: an LSM's rules (SELinux,
AppArmor), ID-mapped mounts, and a thread that changed its ids alone (the process's
main thread's are read).
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from dataclasses import dataclass

from starvecheck.probe import process
from starvecheck.probe.sysroot import SysRoot

READ, SEARCH = 4, 1  # the permission bits asked for
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
ACL_XATTR = "system.posix_acl_access"
# fs/posix_acl.c's tags
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
MAX_ACL_ENTRIES = 4096


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int


@dataclass(frozen=True)
class Rights:
    """A job's credentials: each identity must be allowed (see the module docstring)."""

    ids: tuple[Identity, ...]
    groups: frozenset[int]
    override: bool = False  # root in attach's user namespace with a DAC capability

    @property
    def uid(self) -> int:
        return self.ids[0].uid

    def in_group(self, who: Identity, gid: int) -> bool:
        return gid == who.gid or gid in self.groups


def of_job(pid: int, root: SysRoot | None = None) -> Rights | None:
    """The job's credentials from /proc/PID/status; None where a line attach needs is
    missing or garbled (then nothing is read for it)."""
    root = root or SysRoot.from_environ()
    s = process.status(root, pid)
    if s is None or s.groups is None:
        return None
    pairs = ((s.uid, s.gid), (s.euid, s.egid), (s.fsuid, s.fsgid))
    if any(u is None or g is None for u, g in pairs):
        return None
    ids = tuple(dict.fromkeys(Identity(u, g) for u, g in pairs if u is not None and g is not None))
    caps = s.cap_eff or 0
    dac = bool(caps >> CAP_DAC_OVERRIDE & 1 or caps >> CAP_DAC_READ_SEARCH & 1)
    override = dac and all(i.uid == 0 for i in ids) and _same_user_ns(root, pid)
    return Rights(ids, frozenset(s.groups), override)


def _same_user_ns(root: SysRoot, pid: int) -> bool:
    theirs = root.readlink(f"/proc/{pid}/ns/user").value
    ours = root.readlink("/proc/self/ns/user").value
    return theirs is not None and theirs == ours


def parse_acl(data: bytes) -> list[tuple[int, int, int]] | None:
    """A `system.posix_acl_access` value: version 2, then (tag, perm, id) entries,
    little-endian; None where it is not one."""
    if len(data) < 4 or (len(data) - 4) % 8 or (len(data) - 4) // 8 > MAX_ACL_ENTRIES:
        return None
    if struct.unpack_from("<I", data)[0] != 2:
        return None
    entries = [struct.unpack_from("<HHI", data, 4 + 8 * i) for i in range((len(data) - 4) // 8)]
    if any(tag not in (USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER) for tag, _, _ in entries):
        return None
    return sorted(entries)  # the kernel keeps them sorted by tag, then id


def acl_of(fd: int) -> tuple[bool, list[tuple[int, int, int]] | None]:
    """(whether it could be told, the entries or None for none) of the file `fd` holds
    (an O_PATH descriptor: read through /proc/self/fd, which names that very file)."""
    try:
        data = os.getxattr(f"/proc/self/fd/{fd}", ACL_XATTR)
    except OSError as e:
        return (e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)), None
    entries = parse_acl(data)
    return entries is not None, entries


def _by_mode(rights: Rights, who: Identity, st: os.stat_result, want: int) -> bool:
    mode = st.st_mode
    if who.uid == st.st_uid:
        bits = mode >> 6
    elif rights.in_group(who, st.st_gid):
        bits = mode >> 3
    else:
        bits = mode
    return bits & want == want


def _by_acl(
    rights: Rights, who: Identity, st: os.stat_result, acl: list[tuple[int, int, int]], want: int
) -> bool:
    """fs/posix_acl.c's posix_acl_permission, for one identity."""
    found = False
    for at, (tag, perm, id_) in enumerate(acl):
        if tag == USER_OBJ and who.uid == st.st_uid:
            return perm & want == want
        if tag == USER and id_ == who.uid:
            return _masked(acl, at, perm, want)
        owner = st.st_gid if tag == GROUP_OBJ else id_
        if tag in (GROUP_OBJ, GROUP) and rights.in_group(who, owner):
            found = True
            if perm & want == want:
                return _masked(acl, at, perm, want)
        if tag == OTHER:
            return not found and perm & want == want
    return False


def _masked(acl: list[tuple[int, int, int]], at: int, perm: int, want: int) -> bool:
    mask = next((p for tag, p, _ in acl[at + 1 :] if tag == MASK), None)
    return (perm & (7 if mask is None else mask) & want) == want


def allowed(rights: Rights, fd: int, st: os.stat_result, want: int) -> bool:
    """Whether every identity of the job may `want` (READ, SEARCH) the file `fd` holds,
    whose stat is `st`."""
    if rights.override:
        return True
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return False
    told, acl = acl_of(fd)
    if not told:
        return False
    if acl is None:
        return all(_by_mode(rights, who, st, want) for who in rights.ids)
    return all(_by_acl(rights, who, st, acl, want) for who in rights.ids)
