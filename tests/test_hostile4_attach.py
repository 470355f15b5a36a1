"""Hostile round 4 (issue 48), attach's reading of another process: a job's source
files as a hostile job would name them, and a py-spy that misbehaves.

Source files (stages/attach/source.py, rights.py): links at every component, `..`,
relative names, /proc's magic links, FIFOs, sockets, devices, a directory, huge and
sparse files, NUL bytes, invalid UTF-8, long lines and paths, files the job's user may
not read by mode, group or ACL, odd ids, a component swapped for a link in a loop
while attach reads, a job in another mount namespace, a job gone. Each file holds the
SENTINEL line that would make a sample `gpu-wait`: a case reads it or refuses it as
the job's own rights say, never a file the job may not read, never a traceback; a
FIFO's writer is never released. Most cases call the reader directly with a job root
built in a temporary directory and nobody's rights (fast); the e2e cases run attach
with a fake py-spy naming such files on a real job run as nobody (slow).

py-spy (stages/attach/spy.py, tests/loops/fake_spy.py): one that hangs, leaves a child
holding its output, prints garbage, writes garbage samples, panics, exits at once:
exit 0 with one caveat, bounded in time, nothing left running (marker scan).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.attach import rights, source, spy
from starvecheck.stages.attach.source import JobFiles, Lines, Refused
from tests.loops.attachjob import (
    GPU_LINE,
    NOBODY,
    attach,
    can_switch_user,
    fake_spy,
    job,
    none_left,
    shared_dir,
    stacks_file,
)

SENTINEL = b"SENTINEL"
RIGHTS = rights.Rights((rights.Identity(NOBODY, NOBODY),), frozenset())
CASE_S = 20  # no fast case waits longer (SIGALRM): a hang is a failure, not a stuck run
SLOW_CASE_S = 240


@pytest.fixture(autouse=True)
def bounded(request: pytest.FixtureRequest) -> Iterator[None]:
    def late(signum: int, frame: object) -> None:
        raise TimeoutError("the case hung")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(SLOW_CASE_S if request.node.get_closest_marker("slow") else CASE_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def jobroot(tmp_path: Path) -> Iterator[Path]:
    """A job's root directory (as /proc/PID/root would give it): /code/train.py
    readable by anyone, /secret (0700, root's) holding a root-only train.py, and a
    directory nobody may write into: /shared (1777) for the job's own links."""
    top = tmp_path / "root"
    for d, mode in (("", 0o755), ("code", 0o755), ("secret", 0o700), ("shared", 0o1777)):
        (top / d).mkdir(exist_ok=True)
        (top / d).chmod(mode)
    (top / "code" / "train.py").write_text(GPU_LINE)
    (top / "code" / "train.py").chmod(0o644)
    (top / "secret" / "train.py").write_text(GPU_LINE)
    (top / "secret" / "train.py").chmod(0o644)  # its directory alone keeps it root's
    yield top


def files_in(top: Path, cwd: str | None = None, who: rights.Rights = RIGHTS) -> JobFiles:
    fd = os.open(top, os.O_PATH | os.O_DIRECTORY)
    cwd_fd = os.open(top / cwd, os.O_PATH | os.O_DIRECTORY) if cwd else None
    return JobFiles(fd, cwd_fd, who)


def outcome(files: JobFiles, path: str) -> str:
    """'read' (the sentinel's file), 'none' (not there), or the refusal's reason."""
    try:
        data = files.read(path)
    except Refused as e:
        return str(e)
    if data is None:
        return "none"
    return "read" if SENTINEL in data else "read-other"


# --- links, `..`, relative names -------------------------------------------------------


@pytest.mark.parametrize(
    "make, path, expected",
    [
        # a link at the first component, into the root-only directory
        (lambda t: (t / "lnk").symlink_to(t / "secret"), "/lnk/train.py", source.LINK),
        # at a middle component
        (lambda t: (t / "shared" / "s").symlink_to(t / "secret"), "/shared/s/train.py",
         source.LINK),
        # relative link target, middle component
        (lambda t: (t / "shared" / "s").symlink_to("../secret"), "/shared/s/train.py",
         source.LINK),
        # the last component a link to the root-only file
        (lambda t: (t / "shared" / "t.py").symlink_to(t / "secret" / "train.py"),
         "/shared/t.py", source.LINK),
        # the last component a link to an ordinary readable file: still not followed
        (lambda t: (t / "shared" / "t.py").symlink_to(t / "code" / "train.py"),
         "/shared/t.py", source.LINK),
        # a link followed by `..`: the walk never goes through it
        (lambda t: (t / "shared" / "s").symlink_to(t / "secret"), "/shared/s/../code/train.py",
         source.LINK),
        # a chain of links
        (lambda t: ((t / "shared" / "a").symlink_to(t / "shared" / "b"),
                    (t / "shared" / "b").symlink_to(t / "secret")),
         "/shared/a/train.py", source.LINK),
        # a dangling link
        (lambda t: (t / "shared" / "d").symlink_to("/nowhere"), "/shared/d/train.py",
         source.LINK),
        # `..` above the job's root stays at its root (RESOLVE_IN_ROOT's rule)
        (lambda t: None, "/../../code/train.py", "read"),
        # `..` into the root-only directory: its search permission is checked
        (lambda t: None, "/code/../secret/train.py", source.NOT_THEIRS),
        # the plain file the job may read: read
        (lambda t: None, "/code/train.py", "read"),
        # `.` and doubled slashes
        (lambda t: None, "//code/./train.py", "read"),
        # the root-only directory named directly
        (lambda t: None, "/secret/train.py", source.NOT_THEIRS),
        # the root's name outside the job's root: not there from inside it
        (lambda t: None, str(Path("/tmp/../etc/passwd")), "none"),
    ],
)  # fmt: skip
def test_paths_with_links_and_dots(jobroot, make, path, expected):
    make(jobroot)
    f = files_in(jobroot)
    try:
        assert outcome(f, path) == expected
    finally:
        f.close()


@pytest.mark.parametrize(
    "path, expected",
    [
        ("train.py", "read"),  # in the working directory
        ("./train.py", "read"),
        ("../secret/train.py", "none"),  # above the working directory: not followed
        ("../../../etc/passwd", "none"),
        ("missing.py", "none"),
    ],
)
def test_relative_names_in_the_working_directory(jobroot, path, expected):
    f = files_in(jobroot, cwd="code")
    try:
        assert outcome(f, path) == expected
    finally:
        f.close()


@pytest.mark.parametrize(
    "path",
    ["", "<string>", "<frozen importlib._bootstrap>", "/code/train.py\0/secret/train.py",
     "/" + "a" * 5000, "/" + "/".join(["code"] * 100) + "/train.py",
     "/code/train.py (deleted)", "/code/..", "/code/train.py/.."],
)  # fmt: skip
def test_names_that_are_no_file_are_not_read_and_not_said(jobroot, path):
    with Lines(files_in(jobroot)) as lines:
        assert lines(path, 3) is None
    assert lines.refused == {}


# --- what is not a regular file ----------------------------------------------------------


def test_a_fifo_is_never_opened(jobroot):
    fifo = jobroot / "shared" / "train.py"
    os.mkfifo(fifo, 0o666)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w')"])
    try:
        time.sleep(0.3)
        f = files_in(jobroot)
        assert outcome(f, "/shared/train.py") == source.NOT_REGULAR
        f.close()
        time.sleep(0.5)
        assert writer.poll() is None, "the FIFO was opened: its writer went on"
    finally:
        writer.kill()
        writer.wait()


def test_a_socket_is_not_read(jobroot):
    path = jobroot / "shared" / "train.py"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        f = files_in(jobroot)
        assert outcome(f, "/shared/train.py") == source.NOT_REGULAR
        f.close()


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/dev/urandom", "/dev/tty"])
def test_a_device_is_not_opened(path):
    f = files_in(Path("/"))
    try:
        assert outcome(f, path) in (source.NOT_REGULAR, "none")
    finally:
        f.close()


def test_a_directory_is_not_a_source(jobroot):
    f = files_in(jobroot)
    assert outcome(f, "/code") == source.NOT_REGULAR
    f.close()


# --- sizes and contents --------------------------------------------------------------------


def test_a_sparse_gigabyte_is_refused_without_reading_it(jobroot):
    big = jobroot / "code" / "big.py"
    with open(big, "wb") as out:
        out.truncate(1 << 30)
    big.chmod(0o644)
    t0 = time.monotonic()
    f = files_in(jobroot)
    assert outcome(f, "/code/big.py") == source.TOO_LARGE
    f.close()
    assert time.monotonic() - t0 < 5.0  # never read: a stat


@pytest.mark.parametrize("size, expected", [(source.MAX_BYTES, "read"),
                                            (source.MAX_BYTES + 1, source.TOO_LARGE)])  # fmt: skip
def test_the_size_bound_at_its_edge(jobroot, size, expected):
    path = jobroot / "code" / "edge.py"
    path.write_bytes(GPU_LINE.encode().ljust(size, b"#"))
    path.chmod(0o644)
    f = files_in(jobroot)
    assert outcome(f, "/code/edge.py") == expected
    f.close()


@pytest.mark.parametrize(
    "content, line",
    [
        (b"a\0b\n\0\0\nloss.item()\0\n", "loss.item()\0"),
        (b"\xff\xfe\n\x80\x81\nloss.item() \xc3\x28\n", "loss.item() \ufffd("),
        (b"x" * (source.MAX_BYTES - 20) + b"\n\nloss.item()\n", "loss.item()"),
    ],
)
def test_nul_bytes_invalid_utf8_and_long_lines_are_read_as_text(jobroot, content, line):
    path = jobroot / "code" / "odd.py"
    path.write_bytes(content)
    path.chmod(0o644)
    with Lines(files_in(jobroot)) as lines:
        assert lines("/code/odd.py", 3) == line


# --- the job's user's rights ----------------------------------------------------------------


def _file(top: Path, mode: int, uid: int = 0, gid: int = 0, dir_mode: int = 0o755) -> str:
    d = top / "own"
    d.mkdir(exist_ok=True)
    d.chmod(dir_mode)
    path = d / "train.py"
    path.write_text(GPU_LINE)
    path.chmod(mode)
    os.chown(path, uid, gid)
    return "/own/train.py"


@pytest.mark.parametrize(
    "mode, uid, gid, dir_mode, who, expected",
    [
        (0o600, 0, 0, 0o755, RIGHTS, source.NOT_THEIRS),  # root's alone
        (0o600, NOBODY, 0, 0o755, RIGHTS, "read"),  # the job's own
        (0o640, 0, NOBODY, 0o755, RIGHTS, "read"),  # its group's
        # a member of the file's group is refused by 0604 (the kernel's rule)
        (0o604, 0, NOBODY, 0o755, RIGHTS, source.NOT_THEIRS),
        # the owner is refused by 0066, whatever the others may
        (0o066, NOBODY, 0, 0o755, RIGHTS, source.NOT_THEIRS),
        # a directory it may search but not list: enough
        (0o644, 0, 0, 0o711, RIGHTS, "read"),
        # a directory it may list but not search: not enough
        (0o644, 0, 0, 0o774, RIGHTS, source.NOT_THEIRS),
        # a supplementary group grants
        (0o640, 0, 4242, 0o755, rights.Rights((rights.Identity(NOBODY, NOBODY),),
                                              frozenset({4242})), "read"),
        # real uid may, effective may not (a set-uid job): every id must
        (0o600, NOBODY, 0, 0o755, rights.Rights((rights.Identity(NOBODY, NOBODY),
                                                 rights.Identity(1234, 1234)),
                                                frozenset()), source.NOT_THEIRS),
        # root in attach's user namespace with CAP_DAC_READ_SEARCH reads what root may
        (0o600, 0, 0, 0o700, rights.Rights((rights.Identity(0, 0),), frozenset(), True),
         "read"),
        # root without the capability: the mode bits (others' here)
        (0o060, 1, 1, 0o755, rights.Rights((rights.Identity(0, 0),), frozenset()),
         source.NOT_THEIRS),
    ],
)  # fmt: skip
def test_the_jobs_rights_by_mode(jobroot, mode, uid, gid, dir_mode, who, expected):
    path = _file(jobroot, mode, uid, gid, dir_mode)
    f = files_in(jobroot, who=who)
    assert outcome(f, path) == expected
    f.close()


def _acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


UNDEF = 0xFFFFFFFF


@pytest.mark.parametrize(
    "mode, acl, expected",
    [
        # others may read, a named entry for the job's user says no: refused
        (0o644, _acl((rights.USER_OBJ, 6, UNDEF), (rights.USER, 0, NOBODY),
                     (rights.GROUP_OBJ, 4, UNDEF), (rights.MASK, 4, UNDEF),
                     (rights.OTHER, 4, UNDEF)), source.NOT_THEIRS),
        # others may not, a named entry grants the job's user: read
        (0o600, _acl((rights.USER_OBJ, 6, UNDEF), (rights.USER, 4, NOBODY),
                     (rights.GROUP_OBJ, 0, UNDEF), (rights.MASK, 4, UNDEF),
                     (rights.OTHER, 0, UNDEF)), "read"),
        # a named group grants, the mask takes it away: refused
        (0o600, _acl((rights.USER_OBJ, 6, UNDEF), (rights.GROUP_OBJ, 0, UNDEF),
                     (rights.GROUP, 4, NOBODY), (rights.MASK, 0, UNDEF),
                     (rights.OTHER, 0, UNDEF)), source.NOT_THEIRS),
    ],
)  # fmt: skip
def test_the_jobs_rights_by_acl(jobroot, mode, acl, expected):
    path = _file(jobroot, mode)
    try:
        os.setxattr(jobroot / "own" / "train.py", rights.ACL_XATTR, acl)
    except OSError as e:
        pytest.skip(f"this filesystem holds no POSIX ACL: {e.strerror}")
    f = files_in(jobroot)
    assert outcome(f, path) == expected
    f.close()


@pytest.mark.parametrize(
    "data",
    [b"", b"\x02\0\0\0\x01", b"\x03\0\0\0" + b"\0" * 8, _acl((0x40, 4, 0)),
     struct.pack("<I", 2) + b"\0" * 8 * (rights.MAX_ACL_ENTRIES + 1)],
)  # fmt: skip
def test_a_garbled_acl_is_no_acl_entries(data):
    assert rights.parse_acl(data) is None


@pytest.mark.parametrize(
    "status",
    [
        "Name:\tx\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n",
        "Name:\tx\nUid:\t65534\t65534\t65534\nGid:\t1\t1\t1\t1\nGroups:\t\n",
        "Name:\tx\nUid:\tnobody\nGid:\t1\t1\t1\t1\nGroups:\t\n",
        "Name:\tx\nUid:\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\nGroups:\t1 two 3\n",
        "Name:\tx\nUid:\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\nGroups:\t" + "7 " * 70_000 + "\n",
        "\0\0\0garbage",
    ],
)
def test_a_job_whose_status_is_odd_gets_nothing_read(tmp_path, status):
    (tmp_path / "proc" / "42").mkdir(parents=True)
    (tmp_path / "proc" / "42" / "status").write_text(status)
    assert rights.of_job(42, SysRoot(tmp_path)) is None
    files = JobFiles.of(42, SysRoot(tmp_path))
    assert files.rights is None and files.read("/etc/passwd") is None  # no root: nothing


def test_a_job_gone_or_a_zombie_has_no_files():
    p = subprocess.Popen(["true"])
    time.sleep(0.5)  # a zombie until waited for
    with Lines.of(p.pid) as lines:
        assert lines("/etc/passwd", 1) is None
    p.wait()
    with Lines.of(p.pid) as lines:
        assert lines("/etc/passwd", 1) is None


def test_beyond_the_files_bound_nothing_more_is_read(jobroot):
    with Lines(files_in(jobroot)) as lines:
        for i in range(source.MAX_FILES):
            lines(f"/code/missing{i}.py", 1)
        assert lines("/code/train.py", 3) is None
    assert lines.refused == {}


# --- the time of check against the time of use --------------------------------------------


def test_a_component_swapped_for_a_link_in_a_loop_never_leads_to_roots_file(jobroot):
    shared = jobroot / "shared"
    (shared / "mid").mkdir()
    (shared / "mid").chmod(0o755)
    (shared / "mid" / "train.py").write_text("harmless\n\n\n")
    (shared / "mid" / "train.py").chmod(0o644)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.rename(shared / "mid", shared / "hold")
                os.symlink(jobroot / "secret", shared / "mid")
                os.unlink(shared / "mid")
                os.rename(shared / "hold", shared / "mid")

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    seen: set[str] = set()
    try:
        f = files_in(jobroot)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            seen.add(outcome(f, "/shared/mid/train.py"))
        f.close()
    finally:
        stop.set()
        t.join()
    assert "read" not in seen, seen  # the sentinel: root's file
    assert seen <= {"read-other", "none", source.LINK}, seen


def test_a_file_swapped_for_a_fifo_in_a_loop_never_opens_it(jobroot):
    shared = jobroot / "shared"
    fifo = shared / "fifo"
    os.mkfifo(fifo, 0o666)
    (shared / "plain").write_text("harmless\n")
    (shared / "plain").chmod(0o644)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w')"])
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.link(shared / "fifo", shared / "train.py")
                os.unlink(shared / "train.py")
                os.link(shared / "plain", shared / "train.py")
                os.unlink(shared / "train.py")

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    try:
        f = files_in(jobroot)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            outcome(f, "/shared/train.py")
        f.close()
        stop.set()
        t.join()
        time.sleep(0.3)
        assert writer.poll() is None, "the FIFO was opened: its writer went on"
    finally:
        stop.set()
        writer.kill()
        writer.wait()


# --- real jobs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nobody_ok() -> None:
    why = can_switch_user()
    if why:
        pytest.skip(why)


@pytest.mark.slow
def test_real_job_proc_magic_links_are_not_followed(nobody_ok):
    with shared_dir() as shared, job(str(shared / "train.py"), shared, NOBODY) as p:
        with Lines.of(p.pid) as lines:
            for path in (f"/proc/{p.pid}/root/etc/shadow", "/proc/self/root/etc/shadow",
                         f"/proc/{p.pid}/fd/0", f"/proc/{p.pid}/cwd/train.py",
                         "/proc/thread-self/root/etc/shadow"):  # fmt: skip
                assert lines(path, 1) is None
            assert lines("/etc/shadow", 1) is None  # 0640 root:shadow: not nobody's
        assert set(lines.refused.values()) <= {source.LINK, source.NOT_THEIRS}
        assert lines.refused, lines.refused


@pytest.mark.slow
def test_a_job_in_another_mount_namespace_is_read_in_its_own(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (a mount namespace)")
    where = tmp_path / "mnt"
    where.mkdir()
    (where / "train.py").write_text("host's file\n")
    script = (f"mount -t tmpfs none {where} && printf 'a\\nb\\njobs file\\n' > "
              f"{where}/train.py && echo up && exec sleep 60")  # fmt: skip
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          script], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        with Lines.of(p.pid) as lines:
            assert lines(str(where / "train.py"), 3) == "jobs file"
    finally:
        p.kill()
        p.wait()
    assert (where / "train.py").read_text() == "host's file\n"


@pytest.fixture(scope="module")
def nobody_job(nobody_ok, tmp_path_factory) -> Iterator[tuple[int, Path, Path]]:
    """A job run as nobody (attach's target), a 0700 directory of root's holding the
    sentinel file, and a shared directory for the job's own links and files."""
    secret = tmp_path_factory.mktemp("secret")
    secret.chmod(0o700)
    (secret / "train.py").write_text(GPU_LINE)
    (secret / "train.py").chmod(0o644)
    with shared_dir() as shared, job(str(shared / "train.py"), shared, NOBODY) as p:
        yield p.pid, secret, shared


def _hostile_path(case: str, secret: Path, shared: Path) -> str:
    if case == "link-middle":
        (shared / "code").symlink_to(secret)
        return str(shared / "code" / "train.py")
    if case == "link-last":
        (shared / "t.py").symlink_to(secret / "train.py")
        return str(shared / "t.py")
    if case == "fifo":
        os.mkfifo(shared / "fifo.py", 0o666)
        return str(shared / "fifo.py")
    if case == "dev-zero":
        return "/dev/zero"
    if case == "sparse":
        with open(shared / "big.py", "wb") as out:
            out.truncate(1 << 30)
        return str(shared / "big.py")
    return str(secret / "train.py")  # "root-only"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["link-middle", "link-last", "fifo", "dev-zero", "sparse",
                                  "root-only"])  # fmt: skip
def test_attach_on_a_job_naming_hostile_files(nobody_job, tmp_path, case):
    pid, secret, shared = nobody_job
    path = _hostile_path(case, secret, shared)
    stacks = stacks_file(tmp_path, "<module> (<string>:4)", f"<module> ({path}:3)")
    fake = fake_spy(tmp_path, "stacks")
    r = attach(pid, fake, "--duration", "1", FAKE_SPY_STACKS=str(stacks))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "gpu-wait" not in r.shares(), r.shares()  # the sentinel line never read
    assert len(r.caveats("Source lines of")) == 1, r.stage()["caveats"]
    assert none_left(fake.marker) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "behaviour",
    ["hang", "child-holds", "garbage", "raw-garbage", "slow-exit", "error", "fifo-output"],
)
def test_attach_with_a_misbehaving_py_spy(nobody_job, tmp_path, behaviour):
    pid = nobody_job[0]
    fake = fake_spy(tmp_path, behaviour)
    try:
        r = attach(pid, fake, "--duration", "1", timeout=120)
    finally:
        left = none_left(fake.marker)
    assert left == [], left
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert r.took_s < 1 + spy.END_GRACE_S + spy.STOP_S + spy.REAP_S + 40, r.took_s
    said = [c for c in r.stage()["caveats"] if "Python stacks of" in c]
    assert len(said) <= 1, said
    assert "Traceback" not in " ".join(said)


@pytest.mark.slow
def test_attach_with_a_py_spy_that_cannot_be_run(nobody_job, tmp_path):
    fake = fake_spy(tmp_path, "stacks")
    fake.path.chmod(0o644)  # not executable: py-spy could not be started
    r = attach(nobody_job[0], fake, "--duration", "1")
    assert r.returncode == 0, r.stderr
    assert any("py-spy could not be started" in c for c in r.stage()["caveats"])


# --- filesystems a job's user may serve --------------------------------------------------


def _mount_of(path: Path) -> int:
    fd = os.open(path, os.O_PATH)
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            return int(next(x for x in f if x.startswith("mnt_id:")).split()[1])
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "fstype, expected",
    [("fuse.sshfs", source.ON_FUSE), ("fuse", source.ON_FUSE), ("fuseblk", source.ON_FUSE),
     ("ext4", "read"), (None, source.UNKNOWN_MOUNT)],
)  # fmt: skip
def test_a_file_on_fuse_is_never_touched(jobroot, tmp_path, fstype, expected):
    # The job's mount table as a fake machine gives it: the directory's own mount listed
    # with `fstype` (None: not listed at all).
    fake = tmp_path / "sysroot" / "proc" / "42"
    fake.mkdir(parents=True)
    line = f"{_mount_of(jobroot)} 1 0:99 / / rw - {fstype} none rw\n" if fstype else ""
    (fake / "mountinfo").write_text("1 0 0:1 / / rw - ext4 /dev/x rw\n" + line)
    f = files_in(jobroot)
    f.mounts = source.Mounts(SysRoot(tmp_path / "sysroot"), 42)
    try:
        assert outcome(f, "/code/train.py") == expected
    finally:
        f.close()
