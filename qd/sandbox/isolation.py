"""The kernel side of the sandbox's isolation: namespaces, mounts, capabilities, prctl.

Everything here is a thin, checked wrapper around a Linux call made through ctypes,
or a decision about which of them to make. The worker calls it once, before its first
fork (``enter_namespaces``, ``private_filesystem``, ``cut_network``); a run's child only
drops what it must (``prctl``, ``set_capabilities``). Each namespace or mount is
optional: a kernel that refuses one leaves that part of the isolation off, and the
worker's hello says which parts are on.

Standard library only (the worker runs it under ``python -I``; see ``worker.py``).
"""

import ctypes
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 8, 36, 38
CAP_DAC_READ_SEARCH = 2
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # the same on every architecture
OPEN_TREE_CLONE, MOVE_MOUNT_F_EMPTY_PATH, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 1, 4, 0x8000, 1
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000
# QD_SANDBOX_NAMESPACES=0: no namespaces at all, for systems where they misbehave (and to test that path)
NAMESPACES = os.environ.get("QD_SANDBOX_NAMESPACES", "1") != "0"
TMP_DIRS = [d for d in ("/tmp", "/dev/shm") if os.path.isdir(d)]

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def prctl(option: int, value: int) -> None:
    _check(
        _libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
        "prctl",
    )


def mount(source, target: str, fstype, flags: int, data=None) -> None:
    def c(text):
        return None if text is None else text.encode()

    _check(_libc.mount(c(source), c(target), c(fstype), ctypes.c_ulong(flags), c(data)), f"mount {target}")


def _syscall(number: int, *args) -> int:
    ret = _libc.syscall(ctypes.c_long(number), *args)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syscall {number}: {os.strerror(err)}")
    return ret


def _set_read_only(fd: int, path: str, read_only: bool, flags: int) -> None:
    """Set (or clear) the read-only attribute of the mount at ``path`` (relative to ``fd``)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0) if read_only else _MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0)
    _syscall(
        SYS_MOUNT_SETATTR,
        ctypes.c_int(fd),
        path.encode(),
        ctypes.c_uint(flags),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )


def _read_only_except(writable: list[str]) -> None:
    """Make every mount of this (private) mount namespace read-only, except ``writable``."""
    _set_read_only(AT_FDCWD, "/", True, AT_RECURSIVE)
    for path in writable:
        _set_read_only(AT_FDCWD, path, False, 0)


def _clone(path: str) -> int:
    """A detached copy of the mount tree at ``path``, as a file descriptor."""
    return _syscall(
        SYS_OPEN_TREE,
        ctypes.c_int(AT_FDCWD),
        path.encode(),
        ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC),
    )


def _attach(tree: int, target: str) -> None:
    """Mount the detached tree ``tree`` on ``target``, and close its descriptor."""
    try:
        _syscall(
            SYS_MOVE_MOUNT,
            ctypes.c_int(tree),
            b"",
            ctypes.c_int(AT_FDCWD),
            target.encode(),
            ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
        )
    finally:
        os.close(tree)


def _private(path: str) -> bool:
    return path.startswith(tuple(d + "/" for d in TMP_DIRS))


def needed_paths(search_path: list[str]) -> list[str]:
    """Directories a candidate must read: the Python installation and every entry of
    ``search_path`` (a ``sys.path``), wherever they live."""
    paths = set()
    for path in [*search_path, sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)]:
        for candidate in (os.path.abspath(path or "."), os.path.realpath(path or ".")):
            if candidate not in ("/", *TMP_DIRS) and os.path.isdir(candidate):
                paths.add(candidate)
    return sorted(paths)


def outside_private(paths: list[str]) -> list[str]:
    """The ``paths`` that are not under /tmp or /dev/shm (the host's view of them is kept)."""
    return [p for p in paths if not _private(p)]


def kept_private(host_path: list[str], cwd: str) -> list[str]:
    """The directories under /tmp or /dev/shm to mount back into the private tmpfs (read-only,
    outermost only): the environment the host runs in, its Python and ``host_path`` (the
    host's ``sys.path``: site-packages, an editable install's source), so that an entry can
    import what the user installed in a virtual environment under /tmp. The working
    directory (``sys.path[0]`` of ``python -m``) is the user's files, not their environment:
    it stays hidden like the rest of /tmp."""
    kept: list[str] = []
    for path in sorted(p for p in needed_paths(host_path) if _private(p) and p != cwd):
        if not any(path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


def top_entry(path: str) -> str:
    """The entry of /tmp (or /dev/shm) that ``path`` lies under, e.g. /tmp/ci for /tmp/ci/venv/lib."""
    top = next(d for d in TMP_DIRS if path.startswith(d + "/"))
    return os.path.join(top, path[len(top) + 1 :].split("/")[0])


def hidden_directories(paths: list[str]) -> list[tuple[str, list[str]]]:
    """Directories other users cannot cross on the way to ``paths`` (e.g. /root, 0700,
    holding a pyenv Python), each with its entries that lead there; outermost first."""
    plan: dict[str, set[str]] = {}
    for path in paths:
        parent = "/"
        for name in path.strip("/").split("/"):
            child = os.path.join(parent, name)
            if not os.stat(parent).st_mode & 0o001:
                plan.setdefault(parent, set()).add(child)
            parent = child
    return [(d, sorted(plan[d])) for d in sorted(plan)]


def reveal(plan: list[tuple[str, list[str]]]) -> None:
    """Cover each hidden directory with an empty tmpfs and mount back only the entries
    that lead to Python, so the sandbox uid can import but sees nothing else there."""
    trees = {keep: _clone(keep) for _, keeps in plan for keep in keeps}
    for hidden, keeps in plan:
        mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        for keep in keeps:
            os.mkdir(keep, 0o755)
            _attach(trees[keep], keep)


def _read_only_clones(paths: list[str]) -> dict[str, int]:
    """A detached, read-only copy of each path's mount tree, taken before the tmpfs hides it."""
    trees: dict[str, int] = {}
    try:
        for path in paths:
            trees[path] = _clone(path)
            _set_read_only(trees[path], "", True, AT_EMPTY_PATH | AT_RECURSIVE)
    except OSError:
        for tree in trees.values():
            os.close(tree)
        raise
    return trees


def _mount_back(trees: dict[str, int]) -> None:
    """Mount each tree at its own path in the fresh tmpfs (each attached one leaves
    ``trees``). The directories leading to a tree are made in a small tmpfs of their own,
    then made read-only: a candidate can neither write beside the trees nor move them away."""
    for top in sorted({top_entry(path) for path in trees}):
        skeleton = top not in trees
        os.mkdir(top, 0o755)
        if skeleton:
            mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        for path in sorted(p for p in trees if top_entry(p) == top):
            parent = top
            for name in path[len(top) + 1 :].split("/") if skeleton else []:
                parent = os.path.join(parent, name)
                os.mkdir(parent)
                os.chmod(parent, 0o755)  # whatever the umask: the sandbox uid must cross it
            _attach(trees.pop(path), path)
        if skeleton:
            _set_read_only(AT_FDCWD, top, True, 0)


def set_capabilities(mask: int) -> None:
    """Keep only the capabilities in ``mask`` (effective and permitted; none inheritable)."""
    data = (_CapData * 2)(_CapData(mask, mask, 0))
    _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")


def enter_namespaces() -> dict[str, bool]:
    """Become pid 1 of a new PID namespace (inside a new user namespace when not root),
    in a private mount namespace. Each is optional: returns which ones it got.

    The process that called this stays outside, waits for the new pid 1 and exits
    with its status; only pid 1 returns. Must run before any thread starts.
    """
    got = dict.fromkeys(("pid", "user", "mount"), False)
    if not NAMESPACES:
        return got
    uid, gid = os.geteuid(), os.getegid()
    try:
        if uid != 0:
            unshare(CLONE_NEWUSER)
            got["user"] = True
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        unshare(CLONE_NEWPID)
        got["pid"] = True
    except OSError:
        pass
    if got["pid"]:
        pid = os.fork()
        if pid:
            os.closerange(0, 2)  # the parent must see EOF as soon as pid 1 dies
            _, status = os.waitpid(pid, 0)
            os._exit(min(abs(os.waitstatus_to_exitcode(status)), 255))
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # Mounts made later must not propagate back to the host: only a private namespace will do.
    got["mount"] = succeeds(unshare, CLONE_NEWNS) and succeeds(mount, None, "/", None, MS_REC | MS_PRIVATE)
    return got


def succeeds(fn, *args) -> bool:
    """Whether ``fn(*args)`` ran without an OSError: each part of the isolation is optional."""
    try:
        fn(*args)
        return True
    except OSError:
        return False


def cut_network(network: bool) -> bool:
    """Unless ``network`` is allowed, move into a new, empty network namespace; whether it did."""
    return NAMESPACES and not network and succeeds(unshare, CLONE_NEWNET)


def private_filesystem(pid_ns: bool, file_mb: int, kept: list[str]) -> dict[str, bool]:
    """In the worker's own mount namespace: a proc for its PID namespace, fresh tmpfs on
    /tmp and /dev/shm (wiped after every run) with the ``kept`` paths that were there
    mounted back read-only (a virtual environment under /tmp: see ``kept_private``),
    everything else read-only. Returns which of these it got."""
    features = {}
    features["private_proc"] = pid_ns and succeeds(
        mount, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC
    )
    try:
        trees = _read_only_clones(kept)
    except OSError:  # they stay hidden, as everything else under /tmp
        trees = {}
    size = f"size={4 * file_mb}m,nr_inodes=10000,mode=1777"
    features["private_tmp"] = all(
        [succeeds(mount, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, size) for path in TMP_DIRS]
    )
    if features["private_tmp"]:
        succeeds(_mount_back, trees)
    for tree in trees.values():  # the ones not mounted back
        os.close(tree)
    features["read_only_fs"] = features["private_tmp"] and succeeds(_read_only_except, TMP_DIRS)
    return features
