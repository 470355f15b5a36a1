"""The mount table: /dev/shm, and the filesystem under a data path.

/proc/self/mountinfo (not /proc/mounts) because it carries each mount's root
within its filesystem, which cgroup v1 path resolution needs, and the device
number, which leads to /sys/dev/block/<maj:min> for "is this disk rotational".
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass

from starvecheck.probe.fact import Fact
from starvecheck.probe.sysroot import SysRoot
from starvecheck.probe.text import is_uint


@dataclass(frozen=True)
class Mount:
    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str  # the path inside the filesystem that is mounted here
    mount_point: str
    options: str
    fstype: str
    source: str
    super_options: str

    def option(self, name: str) -> str | None:
        """A superblock option's value (`size` of a tmpfs), or "" for a flag, or None."""
        for opt in self.super_options.split(","):
            key, sep, value = opt.partition("=")
            if key == name:
                return value if sep else ""
        return None


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040, ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse /proc/<pid>/mountinfo; lines that do not parse are skipped."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        a, b = left.split(), right.split()
        if len(a) < 6 or len(b) < 2:
            continue
        majmin = a[2].split(":")
        if (
            not is_uint(a[0])
            or not is_uint(a[1])
            or len(majmin) != 2
            or not all(is_uint(x) for x in majmin)
        ):
            continue
        mounts.append(
            Mount(
                mount_id=int(a[0]),
                parent_id=int(a[1]),
                major=int(majmin[0]),
                minor=int(majmin[1]),
                root=_unescape(a[3]),
                mount_point=_unescape(a[4]),
                options=a[5],
                fstype=b[0],
                source=_unescape(b[1]),
                super_options=b[2] if len(b) > 2 else "",
            )
        )
    return mounts


def mount_for(mounts: list[Mount], path: str) -> Mount | None:
    """The mount that serves `path` (absolute, normalised): longest mount point that
    is a prefix; of several mounts stacked on one point, the last one (on top)."""
    path = posixpath.normpath(path)
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point
        inside = path == mp or path.startswith(mp.rstrip("/") + "/") or mp == "/"
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = m
    return best


def read_mounts(root: SysRoot) -> Fact[list[Mount]]:
    text = root.read("/proc/self/mountinfo")
    if not text.known:
        return Fact.unknown(text.reason or "no mountinfo")
    mounts = parse_mountinfo(text.value or "")
    if not mounts:
        return Fact.unknown("/proc/self/mountinfo has no parsable lines")
    return Fact.of(mounts)


# ---------------------------------------------------------------- /dev/shm

SIZE_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_tmpfs_size(value: str, mem_total_bytes: int | None = None) -> int | None:
    """tmpfs `size=` option: bytes with k/m/g/t suffix, or a percentage of RAM."""
    m = re.fullmatch(r"(\d+)([kKmMgGtT%]?)", value.strip())
    if not m:
        return None
    number, suffix = int(m.group(1)), m.group(2).lower()
    if suffix == "%":
        return mem_total_bytes * number // 100 if mem_total_bytes else None
    return number * SIZE_SUFFIX[suffix]


@dataclass(frozen=True)
class ShmFacts:
    mounted: bool
    fstype: str | None
    size: Fact[int]
    free: Fact[int]


def probe_shm(root: SysRoot, mounts: Fact[list[Mount]], mem_total: int | None) -> ShmFacts:
    if not mounts.known:
        reason = f"mount table unreadable: {mounts.reason}"
        return ShmFacts(False, None, Fact.unknown(reason), Fact.unknown(reason))
    shm = [m for m in mounts.value or [] if m.mount_point == "/dev/shm"]
    if not shm:
        reason = "/dev/shm is not mounted"
        return ShmFacts(False, None, Fact.unknown(reason), Fact.unknown(reason))
    top = shm[-1]
    # statvfs is the truth on the real machine (it also gives free space); a fake
    # sysroot's /dev/shm is a plain directory, so there only `size=` can be read.
    if root.real:
        try:
            st = os.statvfs("/dev/shm")
            return ShmFacts(
                True,
                top.fstype,
                Fact.of(st.f_blocks * st.f_frsize),
                Fact.of(st.f_bavail * st.f_frsize),
            )
        except OSError as e:
            statvfs_reason = f"statvfs(/dev/shm) failed: {e.strerror}"
    else:
        statvfs_reason = "free space is not known for a fake sysroot"
    size_opt = top.option("size")
    if size_opt:
        size = parse_tmpfs_size(size_opt, mem_total)
        if size is not None:
            return ShmFacts(True, top.fstype, Fact.of(size), Fact.unknown(statvfs_reason))
    if top.fstype == "tmpfs" and mem_total:
        # A tmpfs mounted without size= gets half of RAM (Documentation/filesystems/tmpfs.rst).
        return ShmFacts(True, top.fstype, Fact.of(mem_total // 2), Fact.unknown(statvfs_reason))
    reason = f"no size= option on /dev/shm and {statvfs_reason}"
    return ShmFacts(True, top.fstype, Fact.unknown(reason), Fact.unknown(reason))


# ---------------------------------------------------------------- storage under a path

# Filesystems whose reads cross a network (or a user-space daemon that usually
# does): a training set on them is read at network latency, per file.
NETWORK_FS = {
    "nfs": "NFS",
    "nfs4": "NFS",
    "cifs": "SMB/CIFS",
    "smb3": "SMB",
    "smbfs": "SMB",
    "lustre": "Lustre",
    "gpfs": "IBM Spectrum Scale (GPFS)",
    "beegfs": "BeeGFS",
    "ceph": "CephFS",
    "glusterfs": "GlusterFS",
    "9p": "9P (VM shared folder)",
    "afs": "AFS",
    "wekafs": "WekaFS",
    "orangefs": "OrangeFS",
    "pvfs2": "OrangeFS",
    "virtiofs": "virtiofs (VM shared folder)",
    "davfs": "WebDAV",
    "sshfs": "SSHFS",
}
LOCAL_MEMORY_FS = {"tmpfs", "ramfs"}


def classify_fs(fstype: str) -> tuple[str, bool]:
    """(kind, network): kind is "network", "fuse", "memory" or "local"."""
    if fstype in NETWORK_FS:
        return "network", True
    if fstype == "fuse" or fstype.startswith("fuse."):
        # s3fs, gcsfuse, goofys, juicefs, mountpoint-s3, blobfuse...: object stores
        # and network filesystems in user space. Treated as network until shown otherwise.
        return "fuse", True
    if fstype in LOCAL_MEMORY_FS:
        return "memory", False
    return "local", False


@dataclass(frozen=True)
class StorageFacts:
    path: str
    mount_point: Fact[str]
    fstype: Fact[str]
    source: Fact[str]
    kind: Fact[str]
    network: Fact[bool]
    rotational: Fact[bool]
    free_bytes: Fact[int]


def probe_storage(root: SysRoot, mounts: Fact[list[Mount]], path: str) -> StorageFacts:
    """Facts about the filesystem that holds `path` (absolute, as the sysroot sees it)."""
    free = _free_bytes(root, path)
    mount = mount_for(mounts.value, path) if mounts.known and mounts.value else None
    if mount is None:
        reason = f"no mount found for {path}" if mounts.known else f"mount table: {mounts.reason}"
        u: Fact = Fact.unknown(reason)
        return StorageFacts(path, u, u, u, u, u, u, free)
    kind, network = classify_fs(mount.fstype)
    return StorageFacts(
        path=path,
        mount_point=Fact.of(mount.mount_point),
        fstype=Fact.of(mount.fstype),
        source=Fact.of(mount.source),
        kind=Fact.of(kind),
        network=Fact.of(network),
        rotational=_rotational(root, mount, kind),
        free_bytes=free,
    )


def _rotational(root: SysRoot, mount: Mount, kind: str) -> Fact[bool]:
    if kind != "local":
        return Fact.absent(f"{mount.fstype} is not backed by a local block device")
    if mount.major == 0:
        return Fact.absent(f"{mount.fstype} has no block device (device 0:{mount.minor})")
    dev = f"/sys/dev/block/{mount.major}:{mount.minor}"
    # A partition has no queue/ of its own; its disk is the parent directory in
    # sysfs (the real /sys/dev/block entries are links into /sys/devices/.../sdX/sdX1).
    candidates = [f"{dev}/queue/rotational", f"{dev}/../queue/rotational"]
    if root.exists(f"{dev}/partition") and not root.exists(f"{dev}/queue"):
        # Fake trees cannot hold the parent link: the whole disk is minor 0 for
        # NVMe and virtio, and minor rounded down to a multiple of 16 for sd.
        whole = mount.minor - (mount.minor % 16 if mount.major == 8 else mount.minor)
        candidates.append(f"/sys/dev/block/{mount.major}:{whole}/queue/rotational")
    for candidate in candidates:
        text = root.read(candidate)
        if text.known and (text.value or "").strip() in ("0", "1"):
            return Fact.of((text.value or "").strip() == "1")
    return Fact.unknown(f"no queue/rotational for block device {mount.major}:{mount.minor}")


def _free_bytes(root: SysRoot, path: str) -> Fact[int]:
    if not root.real:
        return Fact.unknown("free space is not known for a fake sysroot")
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Fact.unknown(f"statvfs({path}) failed: {e.strerror}")
    return Fact.of(st.f_bavail * st.f_frsize)
