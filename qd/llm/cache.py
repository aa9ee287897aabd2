"""The on-disk response cache: a rerun replays the same answers (and spends the same budget) offline.

An answer is keyed by everything that determines it (the request, ``llm.seed``
and the sample index), not by where it came from, so it replays whichever
transport made it. One JSON file per answer, under a two-character fan-out
folder; a missing or unreadable file is a miss, written again after the call.
"""

from __future__ import annotations

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
        self.root = Path(root)
        self._folders: set[Path] = set()  # fan-out folders made (or found) by this process
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
            return Completion(**{**json.loads(self._path(key).read_text()), "cached": True})
        except (OSError, ValueError, TypeError):  # missing or unreadable entry: a miss, rewritten later
            return None

    def put(self, key: str, c: Completion) -> None:
        """Write atomically (temp file in the same folder, then rename) so readers never see half a file.

        One write per answer, on the loop's thread: the temp name is unique without a random draw
        (this process's id and a counter), and each folder is made once."""
        path = self._path(key)
        if path.parent not in self._folders:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._folders.add(path.parent)
        body = json.dumps({f.name: getattr(c, f.name) for f in dataclasses.fields(c)}).encode()
        tmp = path.parent / f".tmp-{os.getpid()}-{next(self._temps)}.json"
        try:
            with open(tmp, "xb") as f:
                f.write(body)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"
