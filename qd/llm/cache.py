"""The on-disk response cache: a rerun replays the same answers (and spends the same budget) offline.

An answer is keyed by everything that determines it (the request, ``llm.seed``
and the sample index), not by where it came from, so it replays whichever
transport made it.

Each process appends its answers to a log of its own, ``answers-<pid>-<ns>.log``: one
line per answer, ``<key> <answer as JSON>``. A cache opened reads every log in its
folder once, keeping only where each key's line is (an index of about 150 bytes per
answer), and reads an answer back when it is asked for. So a put is one ``write`` on an
open file (a file per answer, created and renamed into place, cost a run ~0.2 ms of CPU
per model call, a tenth of what the engine spends per candidate), and no two processes
ever write one file. A line cut short by a crash is no entry (read as a miss, asked
again). A cache sees the answers written before it opened and its own: answers another process
(or another client) writes after it opened are not seen by it (a rerun opens after the run it
replays).
Caches written before the logs (one ``<key>.json`` file per answer, under a
two-character fan-out folder) are still read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
import weakref

from qd.contract import Completion

_KEY_HEX = 64  # a sha256 hex digest: the first field of a log line
_MASK32, _MASK48 = (1 << 32) - 1, (1 << 48) - 1


def _at(number: int, offset: int, length: int) -> int:
    """Where a line is, as one int (log number, offset < 2**48, length < 2**32): an index entry
    of one int object costs a third of a tuple of three."""
    return number << 80 | offset << 32 | length


class ResponseCache:
    """Answers under ``root``: this process's log, the logs found there when it opened, and an
    older cache's one file per answer."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        self._logs: list[str] = []  # log paths, by number; this process's own log joins last
        self._index: dict[bytes, int] = {}  # key digest -> where its line is (``_at``: one int, not three)
        self._own: tuple[int, int] | None = None  # this process's log: (number, fd), opened at a put
        self._finalizer: weakref.finalize | None = None  # closes the own log's fd (set with ``_own``)
        self._end = 0  # the own log's size
        self._fanned = False  # whether an older cache's folders are there
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            names = []
        for name in names:
            if name.startswith("answers-") and name.endswith(".log"):
                self._load(f"{self.root}/{name}")
            elif len(name) == 2 and os.path.isdir(f"{self.root}/{name}"):
                self._fanned = True

    @staticmethod
    def key(request: dict, seed: int | None, sample_index: int) -> str:
        """sha256 of the request with the run's seed and the sample index (stable across versions:
        a cache written before still replays)."""
        fields = {**request, "stop": request.get("stop"), "seed": seed, "sample_index": sample_index}
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def get(self, key: str) -> Completion | None:
        """The answer kept under ``key``, marked ``cached``; None when there is none."""
        where = self._index.get(bytes.fromhex(key))
        try:
            if where is not None:
                body = self._read(where)[_KEY_HEX + 1 :]
            elif self._fanned:  # an older cache's file per answer
                with open(f"{self.root}/{key[:2]}/{key}.json", "rb") as f:
                    body = f.read()
            else:
                return None
            return Completion(**{**json.loads(body), "cached": True})
        except (OSError, ValueError, TypeError):  # missing or unreadable entry: a miss, asked again
            return None

    def put(self, key: str, c: Completion) -> None:
        """Appends the answer to this process's log in one write (a full disk keeps no half line
        that a later open would take for an answer: it is cut back)."""
        body = json.dumps({f.name: getattr(c, f.name) for f in dataclasses.fields(c)})
        line = f"{key} {body}\n".encode()
        number, fd = self._own or self._open_own()
        written = os.write(fd, line)
        if written != len(line):
            os.ftruncate(fd, self._end)
            raise OSError(f"short write of a cache entry in {self._logs[number]}")
        self._index[bytes.fromhex(key)] = _at(number, self._end, len(line) - 1)
        self._end += written

    def close(self) -> None:
        """Closes this process's log (reopened by a later put)."""
        if self._own is not None:
            self._finalizer()
            self._own = None

    def _open_own(self) -> tuple[int, int]:
        os.makedirs(self.root, exist_ok=True)
        path = f"{self.root}/answers-{os.getpid()}-{time.time_ns()}.log"
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        self._finalizer = weakref.finalize(self, os.close, fd)  # a client never closed leaks no fd
        self._logs.append(path)
        self._own, self._end = (len(self._logs) - 1, fd), 0
        return self._own

    def _read(self, where: int) -> bytes:
        number, offset, length = where >> 80, (where >> 32) & _MASK48, where & _MASK32
        if self._own is not None and number == self._own[0]:
            return os.pread(self._own[1], length, offset)
        fd = os.open(self._logs[number], os.O_RDONLY)  # another process's log, or ours from before a close
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def _load(self, path: str) -> None:
        """Indexes every whole line of the log at ``path`` (a later line wins its key)."""
        number, offset = len(self._logs), 0
        try:
            with open(path, "rb") as f:
                self._logs.append(path)
                for line in f:
                    whole = line.endswith(b"\n") and line[_KEY_HEX : _KEY_HEX + 1] == b" "
                    with contextlib.suppress(ValueError):  # (a line cut short, or not one of ours)
                        if whole:
                            self._index[bytes.fromhex(line[:_KEY_HEX].decode())] = _at(
                                number, offset, len(line) - 1
                            )
                    offset += len(line)
        except OSError:
            return  # (unreadable: its answers are asked again)
