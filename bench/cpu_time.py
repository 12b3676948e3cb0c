"""CPU time from Linux's ``/proc`` and from Redis, for the benches that say where a run's
CPU went: a process's, a process tree's, the whole machine's and the Redis servers'."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds of ``pids`` (one that ended counts 0)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds used so far by processes ``pids`` and their descendants (an instance
    and its sketch worker), from Linux's ``/proc``; 0 where it cannot be read."""
    tick = os.sysconf("SC_CLK_TCK")
    total, stack, seen = 0.0, list(pids), set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in Path(f"/proc/{pid}/task").iterdir():
                stack.extend(int(k) for k in (task / "children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def host_cpu_s() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine so far, every process's, from
    ``/proc/stat``: how contended the CPUs were during a run."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - values[3] - values[4]) / tick, sum(values) / tick


def redis_cpu_s(url: str) -> float:
    """CPU seconds the Redis server(s) at ``url`` have used (every node of a cluster)."""
    import redis
    from redis.cluster import RedisCluster

    probe = redis.Redis.from_url(url)
    try:
        if not probe.info("cluster").get("cluster_enabled"):
            info = probe.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    finally:
        probe.close()
    cluster = RedisCluster.from_url(url)
    try:
        nodes = cluster.info("cpu", target_nodes=RedisCluster.PRIMARIES)
        return sum(float(n["used_cpu_user"]) + float(n["used_cpu_sys"]) for n in nodes.values())
    finally:
        cluster.close()
