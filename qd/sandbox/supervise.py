"""Watching a run: its child's output and model calls, its limits, the reply, the clean-up.

``Supervisor`` polls one run's child (and the host's pipe, for a cancel or an answer)
until the child exits or breaks a limit, then ``Reaper`` kills and reaps whatever the
run left behind; ``run_reply`` turns what was seen into the reply the host gets (a clean
exit's result forwarded unread: ``protocol.pack_reply``).

Standard library only (the worker runs it under ``python -I``; see ``worker.py``).
"""

import os
import select
import signal
import time

from .model_calls import MAX_PENDING, CallChannel
from .protocol import ANSWER, CANCEL, CHUNK, FINAL, RUN, RUN_CALLS, read_frame

DRAIN_S = 1.0  # how long to wait for output pipes to close once the child is gone


class RunningChild:
    """A forked child waiting for its request: its pid, a pidfd for it, and the worker's
    ends of its pipes (request; stdout, stderr, result; model calls in, answers out)."""

    def __init__(self, pid: int, request_w: int, outputs: list[int], call_r: int, answer_w: int):
        self.pid, self.request_w, self.outputs = pid, request_w, outputs
        self.call_r, self.answer_w = call_r, answer_w
        self.pidfd = os.pidfd_open(pid)

    def close(self) -> None:
        for fd in (*self.outputs, self.call_r, self.answer_w, self.pidfd):
            os.close(fd)


class Reaper:
    """Kills and reaps what a run leaves behind: the child, its process group, and the
    orphans that reach the worker (pid 1 of its PID namespace, or a subreaper)."""

    def __init__(self, pid_ns: bool):
        self.pid_ns = pid_ns
        self.protected = set() if pid_ns else set(self.children())  # the worker's own helpers

    def kill_all(self, pid: int) -> None:
        """SIGKILL the child and everything it started."""
        for kill, target in ((os.kill, -1),) if self.pid_ns else ((os.killpg, pid), (os.kill, pid)):
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def sweep(self, pid: int) -> None:
        """Kill and reap whatever the run left behind (daemons, orphans, zombies)."""
        if self.pid_ns:
            # pid 1 of the namespace: kill(-1) reaches every other process in it, and
            # every orphan is our child, so reap until there are none left.
            while True:
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    return
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        # As a subreaper, orphans of the run become our children: kill until none are left.
        while kids := set(self.children()) - self.protected:
            for kid in kids:
                try:
                    os.kill(kid, signal.SIGKILL)
                    os.waitpid(kid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass

    @staticmethod
    def children() -> list[int]:
        me, kids = str(os.getpid()), []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        stat = f.read()
                except OSError:
                    continue
                if stat[stat.rindex(b")") + 2 :].split()[1].decode() == me:
                    kids.append(int(name))
        return kids


class _Capture:
    """Keeps the first and last ``keep`` bytes of a stream and counts the rest."""

    def __init__(self, keep: int):
        self.keep, self.head, self.tail, self.total = keep, bytearray(), bytearray(), 0

    def __iadd__(self, data: bytes):
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            del self.tail[: -self.keep]
        return self


def _truncate(capture: _Capture) -> str:
    cut = capture.total - len(capture.head) - len(capture.tail)
    middle = f"\n... [{cut} bytes cut] ...\n" if cut else ""
    return capture.head.decode(errors="replace") + middle + capture.tail.decode(errors="replace")


def _exit_verdict(status: int, cpu: float, result: bytes, lim: dict) -> dict | None:
    """The error of a child that did not end cleanly with a result; None for one that did
    (its result goes to the host as it is: ``protocol.pack_reply``)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= lim["cpu_s"] - 0.05):
            return {"error": f"cpu time limit ({lim['cpu_s']} s)"}
        return {"error": f"killed by {signal.Signals(sig).name}"}
    code = os.WEXITSTATUS(status)
    if code or not result:
        return {"error": f"exited with code {code}" + ("" if code else " without a result")}
    return None


def run_reply(watched: tuple, seconds: float, lim: dict) -> tuple[dict, bytes]:
    """The host's reply for a run (its message, and the child's result to forward unread, or
    b""): ``watched`` is what ``Supervisor.watch`` returned."""
    reason, status, cpu, (out, err, res) = watched
    message = {
        "ok": False,
        "value": None,
        "error": reason,
        "stdout": _truncate(out),
        "stderr": _truncate(err),
        "seconds": seconds,
    }
    if reason is None:
        verdict = _exit_verdict(status, cpu, res, lim)
        if verdict is None:
            return message, bytes(res)
        message.update(verdict)
    return message, b""


class Supervisor:
    """The worker's pipe from the host while a run is in flight, and the run's watch.

    A request that arrives while a run is being cancelled is kept for the worker's loop
    (``next_frame``); a host that is gone ends the worker (``leave``)."""

    def __init__(self, limits: dict, reaper: Reaper, rfd: int, wfd: int, leave):
        self.limits, self.reaper, self.rfd, self.wfd, self.leave = limits, reaper, rfd, wfd, leave
        self.queued: list[tuple] = []  # requests read while a run was being cancelled

    def next_frame(self):
        """The host's next frame (a request kept from the last run first), or None at EOF."""
        return self.queued.pop(0) if self.queued else read_frame(self.rfd)

    def watch(self, child: RunningChild, start: float, run_id: int, calls: bool = False):
        """Collect the child's output (and pass its model calls on) until it exits or breaks a
        limit; then kill what is left. Returns (why it was killed or None, its exit status,
        its CPU seconds, [stdout, stderr, result])."""
        lim, fds, pid = self.limits, child.outputs, child.pid
        cap = lim["output_cap_mb"] << 20
        outputs = [_Capture(lim["output_kb"] * 512), _Capture(lim["output_kb"] * 512), bytearray()]
        poller = select.poll()
        for fd in (*fds, self.rfd, child.pidfd):
            poller.register(fd, select.POLLIN)
        reason, status, cpu, killed, deadline = None, None, 0.0, False, start + lim["wall_s"]
        open_fds = set(fds)
        channel = (
            CallChannel(child.call_r, child.answer_w, run_id, self.wfd, lim["output_cap_mb"])
            if calls
            else None
        )
        listening = False  # whether the call pipe is polled

        def listen(on: bool) -> None:
            nonlocal listening
            if on != listening:
                if on:
                    poller.register(channel.fd, select.POLLIN)
                else:
                    poller.unregister(channel.fd)
                listening = on

        def kill(why: str) -> None:
            nonlocal reason, killed
            reason = reason or why
            if not killed:
                killed = True
                self.reaper.kill_all(pid)
            if channel is not None:
                channel.open = False
                listen(False)

        if channel is not None:
            listen(True)

        while status is None or open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                if status is not None:
                    break  # something we could not kill still holds a pipe open
                kill(f"timeout after {float(lim['wall_s'])} s (killed)")
                left, deadline = DRAIN_S, time.monotonic() + DRAIN_S
            for fd, _ in poller.poll(left * 1000):
                if fd == child.pidfd:
                    poller.unregister(fd)
                    _, status, usage = os.wait4(pid, 0)
                    cpu = usage.ru_utime + usage.ru_stime
                    self.reaper.sweep(pid)
                    deadline = min(deadline, time.monotonic() + DRAIN_S)
                elif fd == self.rfd:
                    frame = read_frame(self.rfd)
                    if frame is None:  # the parent is gone: clean up and leave
                        self.leave()
                    if frame[0] in (RUN, RUN_CALLS):  # the next request, sent after cancelling this one
                        self.queued.append(frame)
                    elif frame[0] == CANCEL and frame[1] == run_id:
                        kill("cancelled")
                    elif (
                        frame[0] in (ANSWER, FINAL)
                        and frame[1] == run_id
                        and channel is not None
                        and channel.open
                    ):
                        if why := channel.answer(frame[2], frame[0] == FINAL):
                            kill(why)
                        elif channel.pending < MAX_PENDING:
                            listen(True)
                elif channel is not None and fd == channel.fd:
                    if not listening:  # stopped earlier in this batch of events
                        continue
                    if why := channel.readable():
                        kill(why)
                    elif not channel.open or channel.pending >= MAX_PENDING:
                        listen(False)  # at EOF; or wait for answers before reading more calls
                else:
                    data = os.read(fd, CHUNK)
                    if not data:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    outputs[fds.index(fd)] += data
                    if fd == fds[2] and len(outputs[2]) > cap:
                        kill(f"result too large (> {lim['output_cap_mb']} MB)")
                    elif outputs[0].total + outputs[1].total > cap:
                        kill(f"output limit ({lim['output_cap_mb']} MB)")
        return reason, status, cpu, outputs
