"""A batch of Redis commands packed in C and sent in one write per server.

A batch reads and writes its records in a few hundred ``HMGET``/``HSET`` commands of up
to a thousand fields each (``redis_backend``), and all of it happens inside the shared
index's lease. redis-py's pipeline spends Python work per *argument* on them (a type
check and an encoding step for each of ~40,000 fields), which was a large share of the
lease. Here each command is packed whole by ``hiredis.pack_command`` (C), every command
for one server goes out in one ``sendall``, and the replies are read back in order: the
per-argument Python work is gone, the commands Redis runs are the same.

On a cluster, commands are routed by their key (``args[1]``; an ``EVAL``'s first key,
``args[3]``) with the client's slot table. A reply that says the table is out of date
(``MOVED``, ``ASK``: a resharding or a failover) refreshes it and runs the batch again
through redis-py's pipeline, which follows redirections: every command sent here is a
read or writes a field's full new value, so running one twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import redis
from redis.cluster import RedisCluster

__all__ = ["Command", "Packed", "Wire"]

Command = tuple[Any, ...]


class Packed:
    """A command already packed (``data``, in RESP), routed on a cluster by ``key``;
    ``arguments()`` makes its arguments, for redis-py's pipeline when it must follow a
    redirection (:mod:`.redis_resp` packs the bulk of a write's commands so)."""

    __slots__ = ("arguments", "data", "key")

    def __init__(self, key: bytes, data: bytes, arguments: Callable[[], Command]) -> None:
        self.key, self.data, self.arguments = key, data, arguments


_REDIRECTS = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")


class Wire:
    """Runs batches of commands on one client (a node's or a cluster's)."""

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self._client = client

    def run(self, commands: Sequence[Command | Packed]) -> list[Any]:
        """The replies of ``commands``, in order; an error reply raises."""
        if not commands:
            return []
        try:
            return self._raw(commands)
        except redis.ResponseError as exc:
            cluster = self._client if isinstance(self._client, RedisCluster) else None
            if cluster is None or not str(exc).startswith(_REDIRECTS):
                raise
            cluster.nodes_manager.initialize()
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            name, *args = command.arguments() if isinstance(command, Packed) else command
            # redis-py's cluster pipeline looks its routing policy up by the name as str
            pipe.execute_command(name.decode() if isinstance(name, bytes) else name, *args)
        return list(pipe.execute())

    def _servers(self, commands: Sequence[Command | Packed]) -> list[tuple[redis.Redis, list[int]]]:
        """The commands (positions) for each server."""
        client = self._client
        if not isinstance(client, RedisCluster):
            return [(client, list(range(len(commands))))]
        by_node: dict[str, tuple[redis.Redis, list[int]]] = {}
        for i, command in enumerate(commands):
            if isinstance(command, Packed):
                key = command.key
            else:
                key = command[3] if command[0] == b"EVAL" else command[1]  # EVAL script n key
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            entry = by_node.get(node.name)
            if entry is None:
                if node.redis_connection is None:
                    raise redis.ConnectionError(f"no connection to cluster node {node.name}")
                entry = by_node[node.name] = (node.redis_connection, [])
            entry[1].append(i)
        return list(by_node.values())

    def _raw(self, commands: Sequence[Command | Packed]) -> list[Any]:
        out: list[Any] = [None] * len(commands)
        held: list[tuple[Any, Any, list[int]]] = []
        failed = True
        try:
            for server, positions in self._servers(commands):
                pool = server.connection_pool
                conn = pool.get_connection()
                held.append((pool, conn, positions))
                packed = b"".join([_packed(commands[i]) for i in positions])
                conn.send_packed_command([packed])  # type: ignore[no-untyped-call]
            for _, conn, positions in held:
                for i in positions:
                    out[i] = conn.read_response()
            failed = False
        finally:
            for pool, conn, _ in held:
                if failed:  # replies may be left unread: the connection is not reusable
                    conn.disconnect()
                pool.release(conn)
        return out


def _packed(command: Command | Packed) -> bytes:
    return command.data if isinstance(command, Packed) else hiredis.pack_command(command)
