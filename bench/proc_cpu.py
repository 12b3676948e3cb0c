"""CPU time of the processes a benchmark run involves, from ``/proc`` (Linux).

A run's rate moves by +-20% with whatever else the host does; the CPU each part of the
pipeline spends per document moves far less, so the benchmarks report both. Everything
here returns ``None`` where ``/proc`` cannot tell (another OS, a process gone).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu_s(path: Path) -> float | None:
    """utime + stime of a ``/proc/.../stat`` file, in seconds."""
    try:
        fields = path.read_text(encoding="ascii").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) a process has used so far, all its threads."""
    return None if pid is None else _stat_cpu_s(Path(f"/proc/{pid}/stat"))


def main_thread_cpu_s(pid: int | None) -> float | None:
    """CPU seconds of a process's main thread alone (its thread id is its pid)."""
    return None if pid is None else _stat_cpu_s(Path(f"/proc/{pid}/task/{pid}/stat"))


def children(pid: int) -> list[int]:
    """The pids of a process's children (the service's sketch worker)."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far of the service's main thread and whole process, its sketch
    worker, the broker and this process."""

    loop: float | None
    service: float | None
    worker: float | None
    broker: float | None
    bench: float

    @classmethod
    def take(cls, service_pid: int | None, broker_pid: int | None) -> CpuSample:
        kids = children(service_pid) if service_pid is not None else []
        worker = sum(filter(None, map(process_cpu_s, kids))) if kids else None
        return cls(
            main_thread_cpu_s(service_pid),
            process_cpu_s(service_pid),
            worker,
            process_cpu_s(broker_pid),
            process_cpu_s(os.getpid()) or 0.0,
        )


def per_document_us(before: CpuSample, after: CpuSample, documents: int) -> dict[str, float | None]:
    """Microseconds of CPU per document of each part between two samples."""

    def delta(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (b - a) * 1e6 / documents

    loop = delta(before.loop, after.loop)
    service = delta(before.service, after.service)
    return {
        "service_loop": loop,
        "service_other_threads": None if loop is None or service is None else service - loop,
        "sketch_worker": delta(before.worker, after.worker),
        "broker": delta(before.broker, after.broker),
        "benchmark": delta(before.bench, after.bench),
    }


def render(parts: dict[str, float | None]) -> str:
    """One line: each part's us per document."""
    names = {
        "service_loop": "service loop",
        "service_other_threads": "its other threads",
        "sketch_worker": "sketch worker",
        "broker": "broker",
        "benchmark": "this benchmark",
    }
    shown = [f"{label} {parts[k]:.0f}" for k, label in names.items() if parts[k] is not None]
    return "CPU per document (us): " + ", ".join(shown)
