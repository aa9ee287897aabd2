"""The on-disk response cache: a rerun replays the same answers (and spends the same budget) offline.

An answer is keyed by everything that determines it (the request, ``llm.seed``
and the sample index), not by where it came from, so it replays whichever
transport made it. One JSON file per answer, under a two-character fan-out
folder; a missing or unreadable file is a miss, written again after the call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
from pathlib import Path

from qd.contract import Completion


class ResponseCache:
    """Answers under ``root``, one file per key (``root/ab/ab....json``)."""

    def __init__(self, root: str | Path):
        self.root = os.fspath(root)
        self._folders: set[str] = set()  # fan-out folders made (or found) by this process
        self._temps = itertools.count()

    @staticmethod
    def key(request: dict, seed: int | None, sample_index: int) -> str:
        """sha256 of the request with the run's seed and the sample index (stable across versions:
        a cache written before still replays)."""
        fields = {**request, "stop": request.get("stop"), "seed": seed, "sample_index": sample_index}
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def get(self, key: str) -> Completion | None:
        """The answer kept under ``key``, marked ``cached``; None when there is none."""
        try:
            with open(self._path(key), "rb") as f:
                return Completion(**{**json.loads(f.read()), "cached": True})
        except (OSError, ValueError, TypeError):  # missing or unreadable entry: a miss, rewritten later
            return None

    def put(self, key: str, c: Completion) -> None:
        """Write atomically (temp file in the same folder, then rename) so readers never see half a file.

        One write per answer, on the loop's thread, so it is made of the fewest system calls
        (a file opened, written, closed and renamed; strings for paths, no ``pathlib`` objects):
        the temp name is unique without a random draw (this process's id and a counter), and
        each folder is made once."""
        folder = f"{self.root}/{key[:2]}"
        if folder not in self._folders:
            os.makedirs(folder, exist_ok=True)
            self._folders.add(folder)
        body = json.dumps({f.name: getattr(c, f.name) for f in dataclasses.fields(c)}).encode()
        tmp = f"{folder}/.tmp-{os.getpid()}-{next(self._temps)}.json"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                if os.write(fd, body) != len(body):  # (a full disk: no half answer is kept)
                    raise OSError(f"short write of a cache entry under {folder}")
            finally:
                os.close(fd)
            os.replace(tmp, f"{folder}/{key}.json")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _path(self, key: str) -> str:
        return f"{self.root}/{key[:2]}/{key}.json"
