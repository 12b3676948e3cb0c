"""A ``stream-dedup run`` process configured the way the container is.

The service starts from the Dockerfile's ``CMD`` (the project's config file) with the
Dockerfile's ``ENV`` and the Compose service's ``environment``, pointed at the test broker
(the session broker of the integration tests) and fresh topics, and is fed by the Compose
``load-sample`` command. A typo in any of those files fails here, not in a deployment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_dedup.tools.broker import free_port
from tests.integration.conftest import bootstrap
from tests.integration.support import Topics

from .support import (
    ROOT,
    dockerfile_env,
    dockerfile_instructions,
    exec_form,
    exported_families,
    load_compose,
)

__all__ = ["RunningService", "bootstrap", "service"]

#: librdkafka settings that make a one-broker test group settle in seconds.
_TEST_KAFKA = {
    "STREAM_DEDUP_KAFKA__SESSION_TIMEOUT_MS": "6000",
    "STREAM_DEDUP_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
    "STREAM_DEDUP_KAFKA__STATISTICS_INTERVAL_MS": "500",
}


def _http_get(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode("utf-8", "replace")


def _sample_sum(exposition: str, name: str) -> float:
    """Sum of every sample called ``name`` (all label sets)."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class RunningService:
    """The service process, its HTTP endpoint, and the Compose sample loader."""

    def __init__(self, bootstrap: str, topics: Topics, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.port, self.check_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "service.log"
        self.produced = 0
        self.env = self._environment(workdir / "index")
        instructions = dockerfile_instructions()
        entrypoint = exec_form(next(a for kw, a in instructions if kw == "ENTRYPOINT"))
        cmd = exec_form(next(a for kw, a in instructions if kw == "CMD"))
        assert entrypoint[0] == "stream-dedup"
        args = [a.replace("/etc/stream-dedup/", f"{ROOT / 'config'}/") for a in cmd]
        self.argv = [sys.executable, "-m", "stream_dedup.cli", *entrypoint[1:], *args]
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir
        )

    def _environment(self, index: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DEDUP_")}
        compose_env = load_compose()["services"]["stream-dedup"].get("environment", {})
        for source in (dockerfile_env(dockerfile_instructions()), compose_env):
            env.update({k: str(v) for k, v in source.items() if k.startswith("STREAM_DEDUP_")})
        # the same settings, pointed at the test broker, topics, index and a free port
        assert env["STREAM_DEDUP_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
        env["STREAM_DEDUP_KAFKA__BOOTSTRAP_SERVERS"] = self.bootstrap
        assert env["STREAM_DEDUP_INPUT__TOPICS"] == "news"
        env["STREAM_DEDUP_INPUT__TOPICS"] = self.topics.input
        assert env["STREAM_DEDUP_INDEX__PATH"].startswith("/var/lib/stream-dedup/")
        env["STREAM_DEDUP_INDEX__PATH"] = str(index)
        env["STREAM_DEDUP_HTTP__HOST"] = "127.0.0.1"
        env["STREAM_DEDUP_HTTP__PORT"] = str(self.port)
        env["STREAM_DEDUP_HTTP__CHECK_PORT"] = str(self.check_port)
        env["STREAM_DEDUP_KAFKA__GROUP_ID"] = self.topics.group
        env.update(_TEST_KAFKA)
        # `stream-dedup` on PATH, as in the image
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def get(self, path: str) -> tuple[int, str]:
        return _http_get(self.url + path)

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200, body
        return body

    def families(self) -> dict[str, str]:
        return exported_families(self.metrics())

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until ``/readyz`` answers 200: the index is open and partitions are assigned."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"service exited {self.proc.returncode}:\n{self.log()}")
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.2)
        raise AssertionError(f"service not ready after {timeout_s}s:\n{self.log()}")

    def load_sample(self, documents: int) -> None:
        """Run the Compose ``load-sample`` command against the test broker and topic.

        The generator is deterministic: a larger sample starts with the smaller one, so a
        second, larger load replays the first documents (as a re-run loader would) and
        adds new ones."""
        entrypoint = load_compose()["services"]["load-sample"]["entrypoint"]
        assert entrypoint[:2] == ["sh", "-c"], entrypoint
        command = entrypoint[2]
        for old, new in (
            ("-n 5000", f"-n {documents}"),
            ("--topic news", f"--topic {self.topics.input}"),
            ("--bootstrap-servers kafka:9092", f"--bootstrap-servers {self.bootstrap}"),
        ):
            assert old in command, f"load-sample command changed: {command}"
            command = command.replace(old, new)
        done = subprocess.run(
            ["sh", "-c", command], env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-4000:]
        self.produced += documents

    def wait_processed(self, timeout_s: float = 60.0) -> str:
        """Until every produced document has a verdict and its batch is checkpointed."""
        deadline = time.monotonic() + timeout_s
        decided = 0.0
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"service exited:\n{self.log()}"
            text = self.metrics()
            decided = _sample_sum(text, "stream_dedup_verdicts_total")
            decided += _sample_sum(text, "stream_dedup_dead_letters_total")
            if decided >= self.produced and _sample_sum(text, "stream_dedup_commits_total") > 0:
                return text
            time.sleep(0.2)
        raise AssertionError(f"{decided} of {self.produced} decided:\n{self.log()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, as ``docker stop`` sends it; the exit code."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"no exit {timeout_s}s after SIGTERM:\n{self.log()}") from None
        finally:
            self._log.close()


@pytest.fixture(scope="session")
def service(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    """The service, running, after it decided a first sample of documents."""
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=2)
    svc = RunningService(bootstrap, topics, tmp_path_factory.mktemp("deploy-service"))
    try:
        svc.wait_ready()
        svc.load_sample(documents=300)
        svc.wait_processed()
        yield svc
    finally:
        code = svc.stop()
    assert code == 0, f"service exited {code} after SIGTERM:\n{svc.log()}"
