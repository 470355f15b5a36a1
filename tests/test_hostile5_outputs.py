"""The fifth hostile sweep, outputs and other users (issue 58, part 3), tried as an
attacker would: another user's FIFO, socket, device, link to a FIFO, to /dev/kmsg or
to /dev/stdout, or file in a sticky directory; links of another user in the middle of
the path (to a directory only root may write, to /proc, through `..`, two links deep,
one swapped in for a directory while the command runs); loops and chains of links;
names of 255 and 256 bytes, with 2-, 3- and 4-byte UTF-8 characters where the
temporary name is cut; paths of 4095 and 4096 bytes; write-only, search-only and
closed directories; a mount point; --json, --markdown and --plot given together with
one of them bad.

Each case runs as tests/test_hostile4_outputs.py's do (`play`): no traceback, no hang,
the exit status expected, the victims' bytes and mtime unchanged, no temporary file
and no process left. The other user is uid 65534 (tests/test_hostile.py's NOBODY)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.test_hostile4_outputs import SC, Plan, _shared, _victim, play

OTHER = 65534
THEIR_LINK = "is a symbolic link of another user (uid 65534)"
OF_ANOTHER = "of another user (uid 65534) in a shared sticky directory"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def _theirs(path: Path) -> Path:
    os.lchown(path, OTHER, OTHER)
    return path


def _env_json(path: Path | str) -> list[str]:
    return [*SC, "env", "--json", str(path)]


def _private(tmp: Path) -> Path:
    """A directory only root may write, with a file in it that must not change."""
    d = tmp / "private"
    d.mkdir(mode=0o700)
    _victim(d)
    return d


def _holds_only(d: Path, *others: str) -> Callable[[subprocess.CompletedProcess], None]:
    def check(p: subprocess.CompletedProcess) -> None:
        assert sorted(x.name for x in d.iterdir()) == sorted(["victim", *others])

    return check


def _is_report(path: Path, command: str = "env") -> Callable[[subprocess.CompletedProcess], None]:
    def check(p: subprocess.CompletedProcess) -> None:
        assert path.is_file() and not path.is_symlink()
        assert json.loads(path.read_text())["command"] == command

    return check


def _held_reader(fifo: Path) -> Callable[[subprocess.CompletedProcess], None]:
    """A reader waiting on the FIFO that never reads: whatever is sent stays; the
    check says nothing was."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)

    def check(p: subprocess.CompletedProcess) -> None:
        try:
            got = os.read(fd, 1 << 16)
        except BlockingIOError:
            got = b""
        finally:
            os.close(fd)
        assert got == b"", got[:200]

    return check


def _reading(fifo: Path, got: list[str]) -> Callable[[], Callable[[], None]]:
    def start() -> Callable[[], None]:
        def read() -> None:
            with open(fifo) as f:
                got.append(f.read())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        return lambda: t.join(30)

    return start


def _fifo(where: Path, owner: int | None = OTHER) -> Path:
    os.mkfifo(where)
    if owner is not None:
        os.chown(where, owner, owner)
    return where


def _node(where: Path, owner: int | None = OTHER) -> Path:
    try:
        os.mknod(where, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    except OSError as e:
        pytest.skip(f"cannot make a device node here: {e}")
    if owner is not None:
        os.chown(where, owner, owner)
    return where


# ---------------------------------------------------------------- another user's files


def their_fifo_with_a_reader(tmp: Path) -> Plan:
    fifo = _fifo(_shared(tmp) / "r.json")
    return Plan(_env_json(fifo), 2, f"a FIFO {OF_ANOTHER}", check=_held_reader(fifo))


def their_fifo_markdown_no_reader(tmp: Path) -> Plan:
    fifo = _fifo(_shared(tmp) / "r.md")
    return Plan([*SC, "env", "--markdown", str(fifo)], 2, f"a FIFO {OF_ANOTHER}")


def their_listening_socket(tmp: Path) -> Plan:
    path = _shared(tmp) / "r.json"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen(1)
    _theirs(path)
    return Plan(_env_json(path), 2, f"a socket {OF_ANOTHER}", during=lambda: s.close)


def their_character_device(tmp: Path) -> Plan:
    return Plan(_env_json(_node(_shared(tmp) / "r.json")), 2, f"a character device {OF_ANOTHER}")


def their_link_to_our_fifo(tmp: Path) -> Plan:
    fifo = _fifo(tmp / "fifo", owner=None)
    link = _shared(tmp) / "r.json"
    link.symlink_to(fifo)
    _theirs(link)
    return Plan(_env_json(link), 2, THEIR_LINK, check=_held_reader(fifo))


def their_link_to_dev_kmsg(tmp: Path) -> Plan:
    if not os.path.exists("/dev/kmsg"):
        pytest.skip("no /dev/kmsg here")
    link = _shared(tmp) / "r.json"
    link.symlink_to("/dev/kmsg")
    _theirs(link)
    return Plan(_env_json(link), 2, THEIR_LINK)


def their_link_to_dev_null(tmp: Path) -> Plan:
    link = _shared(tmp) / "r.md"
    link.symlink_to("/dev/null")
    _theirs(link)
    return Plan([*SC, "env", "--markdown", str(link)], 2, THEIR_LINK)


def their_link_to_dev_stdout(tmp: Path) -> Plan:
    link = _shared(tmp) / "r.json"
    link.symlink_to("/dev/stdout")
    _theirs(link)
    return Plan(_env_json(link), 2, THEIR_LINK)


def their_link_to_a_device_node_of_ours(tmp: Path) -> Plan:
    node = _node(tmp / "node", owner=None)
    link = _shared(tmp) / "r.json"
    link.symlink_to(node)
    _theirs(link)
    return Plan(_env_json(link), 2, THEIR_LINK)


def their_file_markdown(tmp: Path) -> Plan:
    bait = _theirs(_victim(_shared(tmp), "r.md"))
    return Plan([*SC, "env", "--markdown", str(bait)], 2, "an existing file of another user",
                [bait])  # fmt: skip


def hard_link_to_a_root_file_in_a_sticky_directory(tmp: Path) -> Plan:
    """Root's own file under a second name: replaced by the report, never written into."""
    v = _victim(tmp)
    target = _shared(tmp) / "r.json"
    os.link(v, target)
    return Plan(_env_json(target), 0, None, [v], _is_report(target))


def fifo_of_the_directorys_owner_with_a_reader(tmp: Path) -> Plan:
    """Their own sticky directory, their FIFO: the kernel's rule lets it through."""
    d = _shared(tmp)
    os.chown(d, OTHER, OTHER)
    fifo = _fifo(d / "r.json")
    got: list[str] = []

    def check(p: subprocess.CompletedProcess) -> None:
        assert got and json.loads(got[0])["command"] == "env"

    return Plan(_env_json(fifo), 0, check=check, during=_reading(fifo, got))


def our_fifo_in_a_sticky_directory_with_a_reader(tmp: Path) -> Plan:
    fifo = _fifo(_shared(tmp) / "r.json", owner=None)
    got: list[str] = []

    def check(p: subprocess.CompletedProcess) -> None:
        assert got and json.loads(got[0])["command"] == "env"

    return Plan(_env_json(fifo), 0, check=check, during=_reading(fifo, got))


def their_fifo_in_a_group_writable_sticky_directory(tmp: Path) -> Plan:
    d = tmp / "group"
    d.mkdir()
    d.chmod(0o1770)
    fifo = _fifo(d / "r.json")
    return Plan(_env_json(fifo), 2, f"a FIFO {OF_ANOTHER}", check=_held_reader(fifo))


# ---------------------------------------------------------------- links on the way


def their_link_on_the_way_to_a_root_only_directory(tmp: Path) -> Plan:
    private = _private(tmp)
    x = _theirs(_link(_shared(tmp) / "x", private))
    return Plan(_env_json(x / "r.json"), 2, f"{x} {THEIR_LINK}", [private / "victim"],
                _holds_only(private))  # fmt: skip


def _link(link: Path, target: Path | str) -> Path:
    link.symlink_to(target)
    return link


def their_link_on_the_way_to_proc(tmp: Path) -> Plan:
    x = _theirs(_link(_shared(tmp) / "x", "/proc/self"))
    return Plan(_env_json(x / "environ"), 2, THEIR_LINK)


def their_link_on_the_way_to_a_fifo_directory(tmp: Path) -> Plan:
    fifos = tmp / "fifos"
    fifos.mkdir()
    fifo = _fifo(fifos / "r.json", owner=None)
    x = _theirs(_link(_shared(tmp) / "x", fifos))
    return Plan(_env_json(x / "r.json"), 2, THEIR_LINK, check=_held_reader(fifo))


def their_link_in_a_directory_that_is_not_sticky(tmp: Path) -> Plan:
    private = _private(tmp)
    x = _theirs(_link(tmp / "x", private))
    return Plan(_env_json(x / "r.json"), 2, THEIR_LINK, [private / "victim"],
                _holds_only(private))  # fmt: skip


def their_link_behind_a_root_link(tmp: Path) -> Plan:
    private = _private(tmp)
    shared = _shared(tmp)
    theirs = _theirs(_link(shared / "theirs", private))
    ours = _link(tmp / "ours", theirs)
    return Plan(_env_json(ours / "r.json"), 2, f"{theirs} {THEIR_LINK}", [private / "victim"],
                _holds_only(private))  # fmt: skip


def their_link_then_dot_dot_relative(tmp: Path) -> Plan:
    private = _private(tmp)
    (private / "in").mkdir()
    _theirs(_link(_shared(tmp) / "x", private / "in"))
    return Plan([*SC, "env", "--json", "shared/x/../r.json"], 2, THEIR_LINK, [private / "victim"],
                _holds_only(private, "in"))  # fmt: skip


def their_link_named_last_after_root_links(tmp: Path) -> Plan:
    v = _victim(tmp)
    fifo = _fifo(tmp / "fifo", owner=None)
    d = _shared(tmp)
    _theirs(_link(d / "r.json", fifo))
    _link(tmp / "via", d)
    return Plan(_env_json(tmp / "via" / "r.json"), 2, THEIR_LINK, [v], _held_reader(fifo))


def root_links_on_the_way_are_followed(tmp: Path) -> Plan:
    real = tmp / "real"
    real.mkdir()
    _link(tmp / "b", "real")
    _link(tmp / "a", tmp / "b")
    return Plan(_env_json(tmp / "a" / "r.json"), 0, check=_is_report(real / "r.json"))


def chain_of_40_links_on_the_way(tmp: Path) -> Plan:
    (tmp / "real").mkdir()
    _link(tmp / "l0", "real")
    for i in range(1, 40):
        _link(tmp / f"l{i}", f"l{i - 1}")
    return Plan(_env_json(tmp / "l39" / "r.json"), 0, check=_is_report(tmp / "real" / "r.json"))


def chain_of_41_links_on_the_way(tmp: Path) -> Plan:
    (tmp / "real").mkdir()
    _link(tmp / "l0", "real")
    for i in range(1, 41):
        _link(tmp / f"l{i}", f"l{i - 1}")
    return Plan(_env_json(tmp / "l40" / "r.json"), 2, "too many levels of symbolic links")


def loop_of_links_on_the_way(tmp: Path) -> Plan:
    _link(tmp / "a", "b")
    _link(tmp / "b", "a")
    return Plan(_env_json(tmp / "a" / "r.json"), 2, "a: too many levels of symbolic links")


def dangling_root_link_on_the_way(tmp: Path) -> Plan:
    _link(tmp / "gone", tmp / "never-made")
    return Plan(_env_json(tmp / "gone" / "r.json"), 2, f"directory {tmp}/gone does not exist")


def a_file_on_the_way(tmp: Path) -> Plan:
    v = _victim(tmp)
    return Plan(_env_json(v / "r.json"), 2, f"{v}: not a directory", [v])


def directory_swapped_for_their_link_during_the_run(tmp: Path) -> Plan:
    """Their directory, in a sticky one, swapped as fast as they can for their link to
    a directory only root may write, and back."""
    private = _private(tmp)
    shared = _shared(tmp)
    d = shared / "d"
    d.mkdir()
    os.chown(d, OTHER, OTHER)

    def race() -> Callable[[], None]:
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    os.rename(d, shared / "spare")
                    _theirs(_link(d, private))
                    os.unlink(d)
                    os.rename(shared / "spare", d)
                except OSError:
                    pass

        t = threading.Thread(target=loop, daemon=True)
        t.start()

        def end() -> None:
            stop.set()
            t.join()

        return end

    return Plan(_env_json(d / "r.json"), (0, 2), None, [private / "victim"],
                _holds_only(private), during=race)  # fmt: skip


def a_mount_point_on_the_way(tmp: Path) -> Plan:
    src, mnt = tmp / "src", tmp / "mnt"
    src.mkdir()
    mnt.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")

    def check(p: subprocess.CompletedProcess) -> None:
        subprocess.run(["umount", str(mnt)], check=True)
        _is_report(src / "r.json")(p)

    return Plan(_env_json(mnt / "r.json"), 0, check=check)


# ---------------------------------------------------------------- names and paths


def name_of_255_bytes(tmp: Path) -> Plan:
    name = "n" * 250 + ".json"
    return Plan(_env_json(tmp / name), 0, check=_is_report(tmp / name))


def name_of_256_bytes(tmp: Path) -> Plan:
    return Plan(_env_json(tmp / ("n" * 251 + ".json")), 2, "a name of 256 bytes")


def name_with_4_byte_characters_at_the_cut(tmp: Path) -> Plan:
    name = "𝄞" * 62 + ".js"  # 251 bytes
    return Plan(_env_json(tmp / name), 0, check=_is_report(tmp / name))


def name_with_3_byte_characters_of_254_bytes(tmp: Path) -> Plan:
    name = "€" * 84 + "ab"
    return Plan([*SC, "env", "--markdown", str(tmp / name)], 0,
                check=lambda p: (tmp / name).is_file())  # fmt: skip


def name_of_2_byte_characters_of_256_bytes(tmp: Path) -> Plan:
    return Plan(_env_json(tmp / ("é" * 128)), 2, "a name of 256 bytes")


def _deep(tmp: Path, total: int) -> Path:
    """A path of `total` bytes whose directories exist, the last name 'r.json' or so."""
    d = tmp
    while len(str(d)) + 1 + 200 + 1 + 10 < total:
        d = d / ("d" * 200)
    d.mkdir(parents=True, exist_ok=True)
    name = "r" * (total - len(str(d)) - 1)
    return d / name


def path_of_4095_bytes(tmp: Path) -> Plan:
    path = _deep(tmp, 4095)
    assert len(str(path).encode()) == 4095
    return Plan(_env_json(path), 0, check=_is_report(path))


def path_of_4096_bytes(tmp: Path) -> Plan:
    path = _deep(tmp, 4096)
    return Plan(_env_json(path), 2, "a path of 4096 bytes")


def ends_with_a_slash(tmp: Path) -> Plan:
    return Plan(_env_json(f"{tmp}/new/"), 2, "names a directory (ends with /)")


def dot_dot_as_the_name(tmp: Path) -> Plan:
    (tmp / "d").mkdir()
    return Plan(_env_json(tmp / "d" / ".."), 2, "is a directory")


# ---------------------------------------------------------------- directories


def _their_dir(tmp: Path, mode: int) -> Path:
    d = tmp / f"d{mode:o}"
    d.mkdir()
    os.chown(d, OTHER, OTHER)
    d.chmod(mode)
    return d


def nobody_write_only_directory(tmp: Path) -> Plan:
    d = _their_dir(tmp, 0o300)
    return Plan(_env_json(d / "r.json"), 0, check=_is_report(d / "r.json"), as_nobody=True)


def nobody_write_only_directory_markdown_and_json(tmp: Path) -> Plan:
    d = _their_dir(tmp, 0o300)

    def check(p: subprocess.CompletedProcess) -> None:
        assert sorted(x.name for x in d.iterdir()) == ["r.json", "r.md"]

    return Plan([*SC, "env", "--json", str(d / "r.json"), "--markdown", str(d / "r.md")], 0,
                check=check, as_nobody=True)  # fmt: skip


def nobody_search_only_directory(tmp: Path) -> Plan:
    d = _their_dir(tmp, 0o100)
    return Plan(_env_json(d / "r.json"), 2, "not writable", as_nobody=True)


def nobody_write_but_no_search(tmp: Path) -> Plan:
    d = _their_dir(tmp, 0o200)
    return Plan(_env_json(d / "r.json"), 2, "cannot be searched (no x permission)",
                as_nobody=True)  # fmt: skip


def nobody_own_file_in_a_search_only_directory(tmp: Path) -> Plan:
    d = _their_dir(tmp, 0o700)
    (d / "r.json").write_text("old\n")
    os.chown(d / "r.json", OTHER, OTHER)
    d.chmod(0o100)
    return Plan(_env_json(d / "r.json"), 0, check=_is_report(d / "r.json"), as_nobody=True)


def nobody_through_a_link_of_another_user(tmp: Path) -> Plan:
    """Not only root is protected: uid 65534 follows no link of uid 1's."""
    d = _their_dir(tmp, 0o755)
    x = _link(_shared(tmp) / "x", d)
    os.lchown(x, 1, 1)
    return Plan(_env_json(x / "r.json"), 2, "is a symbolic link of another user (uid 1)",
                as_nobody=True)  # fmt: skip


def nobody_through_a_root_link(tmp: Path) -> Plan:
    d = _their_dir(tmp, 0o755)
    x = _link(_shared(tmp) / "x", d)
    return Plan(_env_json(x / "r.json"), 0, check=_is_report(d / "r.json"), as_nobody=True)


# ---------------------------------------------------------------- several outputs, one bad


def _no_outputs(*paths: Path) -> Callable[[subprocess.CompletedProcess], None]:
    def check(p: subprocess.CompletedProcess) -> None:
        assert not any(x.exists() for x in paths), paths
        assert p.stdout == ""  # refused before the run

    return check


def json_good_markdown_their_fifo(tmp: Path) -> Plan:
    fifo = _fifo(_shared(tmp) / "r.md")
    return Plan([*SC, "env", "--json", str(tmp / "r.json"), "--markdown", str(fifo)], 2,
                f"--markdown {fifo}: a FIFO", check=_no_outputs(tmp / "r.json"))  # fmt: skip


def json_through_their_link_markdown_good(tmp: Path) -> Plan:
    private = _private(tmp)
    x = _theirs(_link(_shared(tmp) / "x", private))
    return Plan([*SC, "env", "--json", str(x / "r.json"), "--markdown", str(tmp / "r.md")], 2,
                THEIR_LINK, [private / "victim"], _no_outputs(tmp / "r.md"))  # fmt: skip


def plot_through_their_link_json_and_markdown_good(tmp: Path) -> Plan:
    private = _private(tmp)
    x = _theirs(_link(_shared(tmp) / "x", private))
    good = [tmp / "r.json", tmp / "r.md"]
    return Plan([*SC, "pad", "--quick", "--json", str(good[0]), "--markdown", str(good[1]),
                 "--plot", str(x / "p.png")], 2, f"--plot {x}/p.png: {x} {THEIR_LINK}",
                [private / "victim"], _no_outputs(*good))  # fmt: skip


def plot_name_of_256_bytes_others_good(tmp: Path) -> Plan:
    good = [tmp / "r.json", tmp / "r.md"]
    return Plan([*SC, "pad", "--quick", "--json", str(good[0]), "--markdown", str(good[1]),
                 "--plot", str(tmp / ("p" * 252 + ".png"))], 2, "a name of 256 bytes",
                check=_no_outputs(*good))  # fmt: skip


def markdown_through_their_link_named_last_plot_good(tmp: Path) -> Plan:
    fifo = _fifo(tmp / "fifo", owner=None)
    link = _theirs(_link(_shared(tmp) / "r.md", fifo))
    return Plan([*SC, "pad", "--quick", "--markdown", str(link), "--plot", str(tmp / "p.png")],
                2, THEIR_LINK, check=_no_outputs(tmp / "p.png"))  # fmt: skip


CASES: dict[str, Callable[[Path], Plan]] = {
    f.__name__: f
    for f in (
        their_fifo_with_a_reader, their_fifo_markdown_no_reader, their_listening_socket,
        their_character_device, their_link_to_our_fifo, their_link_to_dev_kmsg,
        their_link_to_dev_null, their_link_to_dev_stdout, their_link_to_a_device_node_of_ours,
        their_file_markdown, hard_link_to_a_root_file_in_a_sticky_directory,
        fifo_of_the_directorys_owner_with_a_reader, our_fifo_in_a_sticky_directory_with_a_reader,
        their_fifo_in_a_group_writable_sticky_directory,
        their_link_on_the_way_to_a_root_only_directory, their_link_on_the_way_to_proc,
        their_link_on_the_way_to_a_fifo_directory, their_link_in_a_directory_that_is_not_sticky,
        their_link_behind_a_root_link, their_link_then_dot_dot_relative,
        their_link_named_last_after_root_links, root_links_on_the_way_are_followed,
        chain_of_40_links_on_the_way, chain_of_41_links_on_the_way, loop_of_links_on_the_way,
        dangling_root_link_on_the_way, a_file_on_the_way,
        directory_swapped_for_their_link_during_the_run, a_mount_point_on_the_way,
        name_of_255_bytes, name_of_256_bytes, name_with_4_byte_characters_at_the_cut,
        name_with_3_byte_characters_of_254_bytes, name_of_2_byte_characters_of_256_bytes,
        path_of_4095_bytes, path_of_4096_bytes, ends_with_a_slash, dot_dot_as_the_name,
        nobody_write_only_directory, nobody_write_only_directory_markdown_and_json,
        nobody_search_only_directory, nobody_write_but_no_search,
        nobody_own_file_in_a_search_only_directory, nobody_through_a_link_of_another_user,
        nobody_through_a_root_link, json_good_markdown_their_fifo,
        json_through_their_link_markdown_good, plot_through_their_link_json_and_markdown_good,
        plot_name_of_256_bytes_others_good, markdown_through_their_link_named_last_plot_good,
    )
}  # fmt: skip


@pytest.fixture
def sweep_dir() -> Iterator[Path]:
    """Under /tmp, open to uid 65534 (pytest's own are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="sc-hostile5-"))
    top.chmod(0o755)
    yield top
    subprocess.run(["umount", str(top / "mnt")], capture_output=True)
    for root, dirs, _ in os.walk(top):  # closed directories, opened to be removed
        for d in dirs:
            path = os.path.join(root, d)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("name", list(CASES))
def test_output(name: str, sweep_dir: Path) -> None:
    started = time.monotonic()
    play(name, CASES[name](sweep_dir), sweep_dir)
    assert time.monotonic() - started < 60
