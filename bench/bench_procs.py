"""The processes answering checks, as ``bench_check.py`` measures them: which they are,
their CPU, and their threads' time on a CPU and on a run queue (``/proc``, Linux)."""

from __future__ import annotations

import threading
from pathlib import Path

from bench_service import Run


def children(pid: int, name: bytes) -> list[int]:
    """The processes whose parent is ``pid`` and whose command line holds ``name``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and name in cmdline:
            out.append(int(stat.parent.name))
    return out


def answering_pid(run: Run, checks: str) -> int:
    """The process answering the checks: the service, or its check process (the child
    running ``stream_dedup.service.check_server``)."""
    assert run.proc is not None
    if checks == "inline":
        return run.proc.pid
    found = children(run.proc.pid, b"check_server")
    if not found:
        raise RuntimeError("no check process found")
    return found[0]


def reader_pids(pid: int) -> list[int]:
    """The check process's readers (children running ``check_reader``; none before them)."""
    return children(pid, b"check_reader")


def sched_ns(pid: int) -> dict[str, tuple[int, int]]:
    """Per thread of ``pid``: nanoseconds it ran on a CPU and waited on a run queue for
    one (the kernel's ``schedstat``)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # the thread ended
        out[task.name] = (int(fields[0]), int(fields[1]))
    return out


class SchedSampler:
    """The threads of ``pid``: time on a CPU and waiting for one over a phase, summed.

    Each kept-alive connection has its thread in the answering process, started with the
    phase's first check on it and ended when the phase's client threads let their
    connections go, before the phase's last look: so the threads are looked at every
    ``every_s`` meanwhile, each counted from its first look (0 for one started since the
    phase began) to its last (a thread's last ``every_s`` before it ended is lost).
    """

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        self._pid, self._every_s = pid, every_s
        self._first: dict[str, tuple[int, int]] = {}
        self._last: dict[str, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SchedSampler:
        self._first = sched_ns(self._pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            for tid, value in sched_ns(self._pid).items():
                self._last[tid] = value
                self._first.setdefault(tid, (0, 0))

    def totals(self) -> tuple[int, int]:
        """Nanoseconds on a CPU, and waiting on a run queue, over the phase."""
        ran = waited = 0
        for tid, (r, w) in self._last.items():
            r0, w0 = self._first[tid]
            ran, waited = ran + r - r0, waited + w - w0
        return ran, waited
