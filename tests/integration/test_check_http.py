"""``POST /check`` and ``/check/batch`` through a real running service (broker, RocksDB):
the offline detector's answers, 4xx with the reason, and checks while it ingests; each
answered by the check process (on its own port, from a RocksDB secondary instance) and
by the deciding process (``http.check_process = false``). The check process killed and
started again; retention epochs opened while it follows."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stream_dedup import Detector
from stream_dedup.dedup.check import check_texts

from .support import ServiceThread, Topics, http_get, kijiji_documents, make_config, produce_json

pytestmark = pytest.mark.broker

DOCS = kijiji_documents()


def post(port: int, path: str, body: bytes | Any, timeout: float = 10) -> tuple[int, Any]:
    """Status and JSON body of a POST (``body``: bytes as they are, else JSON-encoded)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def offline_answers(docs: list[dict[str, str]], asked: list[str], k: int) -> list[Any]:
    """What the Python API answers over an index of ``docs`` decided in order."""
    with Detector() as detector:
        detector.add_many([(d["id"], d["title"]) for d in docs])
        return [[m.to_json() for m in a] for a in detector.check_many(asked, k)]


def start(config: Any) -> ServiceThread:
    """A running service whose checks are answered (the check process serving, if on)."""
    svc = ServiceThread(config).start()
    checks = svc.service.checks
    deadline = time.monotonic() + 120
    while checks is not None and checks.state != "serving" and time.monotonic() < deadline:
        time.sleep(0.05)
    return svc


@pytest.fixture(params=["process", "inline"])
def service(bootstrap: str, topics: Topics, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    http = {"check_max_bytes": 100_000, "check_process": request.param == "process"}
    svc = start(make_config(bootstrap, topics, tmp_path / "index", http=http))
    yield svc
    svc.stop()


def check_port(svc: ServiceThread) -> int:
    """Where checks are answered: the check process's port, else the service's."""
    checks, http = svc.service.checks, svc.service.http
    assert http is not None
    return checks.port if checks is not None else http.port


def wait_followed(svc: ServiceThread, documents: int, timeout_s: float = 60) -> None:
    """Until checks are answered from an index of ``documents`` documents: the check
    process follows the commits a catch-up behind (its /readyz says how many it sees)."""
    if svc.service.checks is None:
        return
    deadline = time.monotonic() + timeout_s
    seen = -1
    while time.monotonic() < deadline:
        _, ready = http_get(check_port(svc), "/readyz")
        seen = json.loads(ready).get("documents", -1)
        if seen >= documents:
            return
        time.sleep(0.05)
    raise AssertionError(f"the check process sees {seen} documents, not {documents}")


def check_metric(svc: ServiceThread, name: str, labels: dict[str, str] | None = None) -> float:
    """A check metric from where checks are counted: the check process's /metrics, or
    the service's registry."""
    if svc.service.checks is None:
        return svc.metric(name, labels)
    from prometheus_client.parser import text_string_to_metric_families

    _, text = http_get(check_port(svc), "/metrics")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and (labels or {}) == {
                k: v for k, v in sample.labels.items() if k in (labels or {})
            }:
                return float(sample.value)
    raise AssertionError(f"{name} {labels} not found")


def test_checks_answer_as_the_python_api_and_add_nothing(
    bootstrap: str, topics: Topics, service: ServiceThread
) -> None:
    first = DOCS[:1500]
    produce_json(bootstrap, topics.input, first)
    service.wait_for("stream_dedup_messages_consumed_total", len(first))
    service.wait_for("stream_dedup_commits_total", 1)
    port = check_port(service)
    index = service.service.index
    deadline = time.monotonic() + 60
    while index.counter("documents") < len(first) and time.monotonic() < deadline:
        time.sleep(0.05)  # consumed is counted before the batch is committed
    wait_followed(service, len(first))
    asked = [{"id": f"q{i}", "title": d["title"].upper()} for i, d in enumerate(first[:60])]
    expected = offline_answers(first, [a["title"] for a in asked], k=3)
    code, body = post(port, "/check/batch?k=3", asked)
    assert code == 200
    assert [a["id"] for a in body["answers"]] == [a["id"] for a in asked]
    assert [a["matches"] for a in body["answers"]] == expected
    assert sum(len(m) > 1 for m in expected) > 3  # some have near-duplicates besides
    code, one = post(port, "/check?k=3", asked[7])
    assert code == 200 and one == body["answers"][7]
    assert one["matches"][0]["similarity"] == 1.0  # the ad itself (upper case: normalised)
    code, new = post(port, "/check", {"id": "new", "title": "zebra crossing tuba 42"})
    assert (code, new) == (200, {"id": "new", "matches": []})
    assert index.counter("documents") == len(first)  # checks added nothing
    assert check_metric(service, "stream_dedup_check_requests_total", {"outcome": "ok"}) == 3
    assert check_metric(service, "stream_dedup_check_duration_seconds_count") == 3


#: Bad requests, the status and the error each gets.
BAD = [
    ("/check", b"{not json", 400, "invalid_json"),
    ("/check", {"title": "no id here"}, 400, "missing_id"),
    ("/check", {"id": "x"}, 400, "missing_content"),
    ("/check", [{"id": "x", "title": "a list"}], 400, "not_an_object"),
    ("/check?k=0", {"id": "x", "title": "t"}, 400, "bad_k"),
    ("/check?k=101", {"id": "x", "title": "t"}, 400, "bad_k"),
    ("/check?k=two", {"id": "x", "title": "t"}, 400, "bad_k"),
    ("/check/batch", {"id": "x", "title": "t"}, 400, "not_a_list"),
    ("/check/batch", [{"id": str(i), "title": "t"} for i in range(101)], 400,
     "too_many_documents"),
    ("/check/batch", [{"id": "1", "title": "t"}, {"id": ["2"], "title": "t"}], 400, "invalid_id"),
    ("/check", {"id": "x", "title": "t" * 150_000}, 413, "body_too_large"),
    ("/nowhere", {"id": "x", "title": "t"}, 404, "not_found"),
]  # fmt: skip


def test_bad_requests_get_a_4xx_with_the_reason(service: ServiceThread) -> None:
    port = check_port(service)
    for path, body, code, error in BAD:
        got, answer = post(port, path, body)
        assert (got, answer["error"]) == (code, error), (path, answer)
        assert answer["detail"]
    counted = {
        outcome: check_metric(service, "stream_dedup_check_requests_total", {"outcome": outcome})
        for outcome in ("bad_request", "too_large", "ok")
    }
    assert counted == {"bad_request": 10, "too_large": 1, "ok": 0}
    _, answer = post(port, "/check?k=0", {"id": "x", "title": "t"})
    assert "from 1 to 100 (http.check_max_k)" in answer["detail"]


def test_a_get_on_check_says_to_post(service: ServiceThread) -> None:
    code, body = http_get(check_port(service), "/check")
    assert code == 405 and json.loads(body)["detail"] == "use POST"


def test_checks_while_the_service_ingests(
    bootstrap: str, topics: Topics, service: ServiceThread
) -> None:
    """Checks answered from the committed index while batches are decided and committed:
    every one a 200, each a committed state (a document it finds is one the index holds)."""
    port = check_port(service)
    produce_json(bootstrap, topics.input, DOCS[:200])
    service.wait_for("stream_dedup_messages_consumed_total", 200)
    target = DOCS[-1]
    per_thread: list[list[tuple[int, Any]]] = [[], []]
    done = threading.Event()

    def ask(mine: list[tuple[int, Any]]) -> None:
        while not done.is_set():
            mine.append(post(port, "/check/batch?k=2", [target, DOCS[5]]))

    askers = [threading.Thread(target=ask, args=(mine,)) for mine in per_thread]
    for t in askers:
        t.start()
    try:
        produce_json(bootstrap, topics.input, DOCS[200:])
        # Every document committed (waiting for "one more commit" after all were consumed
        # missed a last commit made within one poll of the consumption count).
        service.wait_for("stream_dedup_index_documents", len(DOCS))
        wait_followed(service, len(DOCS))
    finally:
        done.set()
        for t in askers:
            t.join(30)
    replies = per_thread[0] + per_thread[1]
    assert len(replies) > 10 and all(code == 200 for code, _ in replies)
    for mine in per_thread:  # in the order each thread asked (the two interleave)
        seen = [bool(body["answers"][0]["matches"]) for _, body in mine]
        assert seen == sorted(seen)  # once committed, found by every later check
    assert all(b["answers"][1]["matches"][0] == {**b["answers"][1]["matches"][0], "id": "6",
               "similarity": 1.0} for _, b in replies)  # fmt: skip
    code, last = post(port, "/check?k=1", target)
    assert code == 200 and last["matches"][0]["similarity"] == 1.0
    assert (
        check_metric(service, "stream_dedup_check_requests_total", {"outcome": "ok"})
        == len(replies) + 1
    )
    assert check_metric(service, "stream_dedup_check_requests_total", {"outcome": "failed"}) == 0


@pytest.fixture
def process_service(bootstrap: str, topics: Topics, tmp_path: Path) -> Any:
    """A service whose checks the check process answers, its index keeping 400 documents
    (retention opens epochs and lets them go as it ingests)."""
    config = make_config(
        bootstrap,
        topics,
        tmp_path / "index",
        http={"check_process": True, "check_restarts": 2, "check_readers": True},
    )
    svc = start(replace(config, index=replace(config.index, max_documents=400)))
    yield svc
    svc.stop()


def test_the_services_port_names_the_check_port(process_service: ServiceThread) -> None:
    svc = process_service
    assert svc.service.http is not None and svc.service.checks is not None
    code, body = post(svc.service.http.port, "/check", {"id": "x", "title": "t"})
    assert code == 421 and body["error"] == "misdirected"
    assert f"port {svc.service.checks.port} (http.check_port)" in body["detail"]
    _, ready = http_get(svc.service.http.port, "/readyz")
    assert json.loads(ready)["checks"] == "serving"
    _, own = http_get(svc.service.checks.port, "/readyz")
    assert json.loads(own)["role"] == "checks"
    assert json.loads(own)["readers"] >= 1  # a RocksDB index: read by reader processes


def reader_pids(front: int) -> list[int]:
    """The check process's readers: its children (``/proc``: each started by a thread)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == front:
            out.append(int(stat.parent.name))
    return out


def test_a_killed_reader_leaves_checks_answered_while_the_service_ingests(
    bootstrap: str, topics: Topics, process_service: ServiceThread
) -> None:
    """One of the check process's two readers killed (SIGKILL) while the service ingests
    and checks are asked: every check answered, by the other reader; the reader started
    again; the check process itself never restarted."""
    svc = process_service
    checks = svc.service.checks
    assert checks is not None and checks.pid is not None
    front, port = checks.pid, checks.port
    deadline = time.monotonic() + 60
    while len(reader_pids(front)) < 2 or json.loads(http_get(port, "/readyz")[1])["readers"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    produce_json(bootstrap, topics.input, DOCS[:200])
    svc.wait_for("stream_dedup_index_documents", 200)
    wait_followed(svc, 200)
    replies: list[tuple[int, Any]] = []
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            replies.append(post(port, "/check?k=1", DOCS[150]))

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        victim = reader_pids(front)[0]
        os.kill(victim, signal.SIGKILL)
        produce_json(bootstrap, topics.input, DOCS[200:400])  # retention keeps 400
        svc.wait_for("stream_dedup_index_documents", 400)
        wait_followed(svc, 400)
        while json.loads(http_get(port, "/readyz")[1])["readers"] < 2:
            assert time.monotonic() < deadline + 60
            time.sleep(0.05)
    finally:
        done.set()
        asker.join(30)
    assert len(replies) > 10 and all(code == 200 for code, _ in replies)
    first = replies[0][1]["matches"]
    assert first and all(b["matches"] == first for _, b in replies)  # one answer throughout
    assert checks.pid == front and victim not in reader_pids(front)
    assert svc.metric("stream_dedup_check_process_restarts_total") == 0
    assert check_metric(svc, "stream_dedup_check_reader_restarts_total") == 1
    assert check_metric(svc, "stream_dedup_check_readers") == 2


def test_a_killed_check_process_is_started_again_and_follows_new_epochs(
    bootstrap: str, topics: Topics, process_service: ServiceThread
) -> None:
    """Killed (SIGKILL) while the service ingests, the check process is started again on
    the same port, says so in the log and metrics, and answers from the index as
    committed since: the newest documents found, those retention let go not, through
    epochs created after it opened."""
    svc = process_service
    checks = svc.service.checks
    assert checks is not None
    port = checks.port
    produce_json(bootstrap, topics.input, DOCS[:300])
    svc.wait_for("stream_dedup_index_documents", 300)
    wait_followed(svc, 300)
    code, body = post(port, "/check?k=1", DOCS[5])
    assert code == 200 and body["matches"][0]["id"] == "6"
    first_pid = checks.pid
    assert first_pid is not None and svc.metric("stream_dedup_check_process_up") == 1
    os.kill(first_pid, signal.SIGKILL)
    produce_json(bootstrap, topics.input, DOCS[300:1500])
    deadline = time.monotonic() + 120
    while (checks.pid in (None, first_pid) or checks.state != "serving") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert checks.state == "serving" and checks.pid != first_pid
    assert svc.metric("stream_dedup_check_process_restarts_total") == 1
    assert svc.metric("stream_dedup_check_process_up") == 1
    svc.wait_for("stream_dedup_index_documents", 1500)
    wait_followed(svc, 1500)
    epochs = svc.service.index.timeline.numbers()
    assert epochs[0] > 0  # the first epochs were let go while the process followed
    code, body = post(port, "/check/batch?k=1", [DOCS[1490], DOCS[5]])
    assert code == 200
    newest, expired = body["answers"]
    assert newest["matches"][0] == {**newest["matches"][0], "id": "1491", "similarity": 1.0}
    assert all(m["id"] != "6" for m in expired["matches"])  # expired
    index, dedup = svc.service.index, svc.service.dedup
    texts = [DOCS[1490]["title"], DOCS[5]["title"]]
    expected = check_texts(index, dedup.config, dedup.plan, texts, 1)  # nothing ingests now
    assert [a["matches"] for a in body["answers"]] == [[m.to_json() for m in e] for e in expected]
    assert check_metric(svc, "stream_dedup_check_requests_total", {"outcome": "ok"}) == 1


def test_without_readers_the_check_process_follows_itself(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """``http.check_readers = false``: no reader process; the check process catches up
    itself and answers as with readers."""
    http = {"check_process": True, "check_readers": False}
    svc = start(make_config(bootstrap, topics, tmp_path / "index", http=http))
    try:
        checks = svc.service.checks
        assert checks is not None and checks.pid is not None
        produce_json(bootstrap, topics.input, DOCS[:50])
        svc.wait_for("stream_dedup_index_documents", 50)
        wait_followed(svc, 50)
        code, body = post(checks.port, "/check?k=1", DOCS[5])
        assert code == 200 and body["matches"][0]["id"] == "6"
        assert reader_pids(checks.pid) == []
        assert check_metric(svc, "stream_dedup_check_follow_seconds_count") >= 1
    finally:
        svc.stop()
