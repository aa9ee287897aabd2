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
AT_FDCWD = -100
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


def _read_only_except(writable: list[str]) -> None:
    """Make every mount of this (private) mount namespace read-only, except ``writable``."""
    for path, attr, flags in [
        ("/", _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0), AT_RECURSIVE),
        *((w, _MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0), 0) for w in writable),
    ]:
        _syscall(
            SYS_MOUNT_SETATTR,
            ctypes.c_int(AT_FDCWD),
            path.encode(),
            ctypes.c_uint(flags),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )


def needed_paths() -> list[str]:
    """Directories a candidate must read: the Python installation and sys.path (not /tmp: it is private)."""
    paths = set()
    for path in [*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)]:
        for candidate in (os.path.abspath(path or "."), os.path.realpath(path or ".")):
            if (
                candidate != "/"
                and os.path.isdir(candidate)
                and not candidate.startswith(("/tmp/", "/dev/shm/"))
            ):
                paths.add(candidate)
    return sorted(paths)


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
    trees = {
        keep: _syscall(
            SYS_OPEN_TREE,
            ctypes.c_int(AT_FDCWD),
            keep.encode(),
            ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC),
        )
        for _, keeps in plan
        for keep in keeps
    }
    for hidden, keeps in plan:
        mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        for keep in keeps:
            os.mkdir(keep, 0o755)
            _syscall(
                SYS_MOVE_MOUNT,
                ctypes.c_int(trees[keep]),
                b"",
                ctypes.c_int(AT_FDCWD),
                keep.encode(),
                ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
            )
            os.close(trees[keep])


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


def private_filesystem(pid_ns: bool, file_mb: int) -> dict[str, bool]:
    """In the worker's own mount namespace: a proc for its PID namespace, fresh tmpfs on
    /tmp and /dev/shm (wiped after every run), everything else read-only. Returns which
    of these it got."""
    features = {}
    features["private_proc"] = pid_ns and succeeds(
        mount, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC
    )
    size = f"size={4 * file_mb}m,nr_inodes=10000,mode=1777"
    features["private_tmp"] = all(
        [succeeds(mount, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, size) for path in TMP_DIRS]
    )
    features["read_only_fs"] = features["private_tmp"] and succeeds(_read_only_except, TMP_DIRS)
    return features
