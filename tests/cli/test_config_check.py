"""`stream-dedup config check`: validation naming the key, effective values, masked secrets."""

from __future__ import annotations

import logging
import socket
import tomllib
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest

from stream_dedup.cli.app import main

REPO = Path(__file__).resolve().parents[2]


def _check(path: Path) -> tuple[int, str]:
    out = StringIO()
    return main(["config", "check", str(path)], out=out), out.getvalue()


def test_secrets_are_masked_and_other_values_shown(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[kafka]\n"bootstrap.servers" = "broker-1:9093"\n"security.protocol" = "SASL_SSL"\n'
        '"sasl.mechanism" = "SCRAM-SHA-512"\n"sasl.username" = "svc"\n"sasl.password" = "hunter2"\n'
        '"ssl.key.password" = "pw"\n'
        "[batch]\nmax_messages = 123\n"
    )
    code, text = _check(cfg)
    assert code == 0
    assert "hunter2" not in text and '"pw"' not in text
    assert '"sasl.password" = "***"' in text and '"ssl.key.password" = "***"' in text
    assert '"bootstrap.servers" = "broker-1:9093"' in text
    assert '"sasl.username" = "svc"' in text
    assert "max_messages = 123" in text
    effective = tomllib.loads(text)
    assert effective["batch"]["max_messages"] == 123


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[batch]\nmax_messages = 123\n")
    monkeypatch.setenv("STREAM_DEDUP_BATCH__MAX_MESSAGES", "77")
    code, text = _check(cfg)
    assert code == 0 and tomllib.loads(text)["batch"]["max_messages"] == 77


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("[batch]\nmax_mesages = 1\n", "batch.max_mesages"),
        ('[batch]\nmax_messages = "many"\n', "batch.max_messages"),
        ("[nosuch]\nx = 1\n", "nosuch"),
    ],
)
def test_unknown_keys_and_wrong_types_name_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, named: str
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    code, _ = _check(cfg)
    assert code == 2
    assert named in capsys.readouterr().err


def test_the_shipped_configuration_file_is_valid_and_matches_the_defaults() -> None:
    code, text = _check(REPO / "config" / "stream-dedup.toml")
    assert code == 0
    assert tomllib.loads(text)["dedup"]["threshold"] == 0.8


@pytest.mark.parametrize(
    ("body", "named", "fix"),
    [
        ('[batch]\nmax_messages = "2000"\n', "batch.max_messages", "max_messages = 2000"),
        ("[http]\nport = 99999\n", "http.port", "0-65535"),
        ('[http]\nenabled = "yes"\n', "http.enabled", "enabled = true"),
        ('[input]\ntopics = "news"\n', "input.topics", 'topics = ["news"]'),
        ('[kafka]\n"sesion.timeout.ms" = "6000"\n', "kafka.sesion.timeout.ms", "no such setting"),
        ('[kafka]\n"session.timeout.ms" = "soon"\n', "kafka.session.timeout.ms", "Invalid value"),
    ],
)
def test_wrong_types_ranges_and_kafka_keys_fail_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, named: str, fix: str
) -> None:
    """Exit code 2 and one line naming the key and the fix; never a traceback."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    code, out = _check(cfg)
    err = capsys.readouterr().err
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert f"'{named}'" in err and fix in err
    assert "Traceback" not in err


def test_run_refuses_a_misspelt_kafka_key_before_opening_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `config check` rejects, `run` rejects the same way, at start (no index made)."""
    index = tmp_path / "index"
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        f'[index]\npath = "{index}"\n[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n'
        '"enable.auto.comit" = "false"\n'
    )
    code = main(["run", "--config", str(cfg)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "'kafka.enable.auto.comit'" in err
    assert not index.exists()


@pytest.fixture
def package_logger_restored() -> Iterator[None]:
    """``run`` sets up the package's logging (its own handler, no propagation): undone after."""
    logger = logging.getLogger("stream_dedup")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.mark.usefixtures("package_logger_restored")
def test_run_on_a_busy_http_port_names_it_and_creates_no_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = tmp_path / "index"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        flags = ["--index", str(index), "--http-port", str(port), "--set", "http.host=127.0.0.1"]
        code = main(["run", *flags, "--bootstrap-servers", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: configuration key 'http.port': ")
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose a free port" in err
    assert "Traceback" not in err
    assert not index.exists()


def test_the_redis_password_is_masked_in_the_url_and_the_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[index]\nbackend = "redis"\n[index.redis]\n'
        'url = "rediss://dedup:s3cret@cache:6380/0"\npassword = "other"\n'
    )
    code, text = _check(cfg)
    assert code == 0
    assert "s3cret" not in text and "other" not in text
    effective = tomllib.loads(text)
    assert effective["index"]["redis"]["url"] == "rediss://dedup:***@cache:6380/0"
    assert effective["index"]["redis"]["password"] == "***"
    assert effective["index"]["backend"] == "redis"
