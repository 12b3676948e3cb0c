"""docker/Dockerfile and .dockerignore, read as text (no Docker engine needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from stream_dedup.tools.broker import free_port

from .conftest import RunningService
from .support import (
    DOCKERFILE,
    ROOT,
    dockerfile_env,
    dockerfile_instructions,
    dockerignore_excludes,
    dockerignore_patterns,
    exec_form,
    healthcheck_command,
    load_compose,
)

_PINNED_PYTHON = re.compile(r"^python:\d+\.\d+\.\d+-slim(-[a-z]+)?$")


def instruction(keyword: str) -> list[str]:
    return [args for kw, args in dockerfile_instructions() if kw == keyword]


def test_two_stages_on_a_pinned_slim_python() -> None:
    froms = instruction("FROM")
    assert len(froms) == 2, froms
    images = [f.split()[0] for f in froms]
    assert images[0] == images[1], "build and run on the same base (the venv is copied)"
    assert _PINNED_PYTHON.match(images[0]), f"pin an exact slim Python: {images[0]}"
    builder = froms[0].split()[-1]
    assert froms[0].split()[1].upper() == "AS"
    assert any(a.startswith(f"--from={builder} ") for a in instruction("COPY"))


def test_builder_builds_a_wheel_into_a_venv() -> None:
    first_stage = dockerfile_instructions()
    first_stage = first_stage[: [kw for kw, _ in first_stage].index("FROM", 1)]
    runs = " ".join(a for kw, a in first_stage if kw == "RUN")
    assert "pip wheel" in runs and "-m venv" in runs and ".whl" in runs


def test_runs_as_a_non_root_user() -> None:
    users = instruction("USER")
    assert users, "no USER instruction: the service would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_index_directory_is_a_volume_and_the_index_lives_in_it() -> None:
    (volume,) = instruction("VOLUME")
    dirs = json.loads(volume)
    env = dockerfile_env(dockerfile_instructions())
    index = env["STREAM_DEDUP_INDEX__PATH"]
    assert any(index == d or index.startswith(d.rstrip("/") + "/") for d in dirs), (index, dirs)
    assert "/var/lib/stream-dedup" in dirs


def test_config_file_entrypoint_and_port() -> None:
    copies = instruction("COPY")
    assert "config/stream-dedup.toml /etc/stream-dedup/stream-dedup.toml" in copies
    assert (ROOT / "config" / "stream-dedup.toml").is_file()
    assert exec_form(instruction("ENTRYPOINT")[-1]) == ["stream-dedup", "run"]
    assert exec_form(instruction("CMD")[-1]) == [
        "--config",
        "/etc/stream-dedup/stream-dedup.toml",
    ]
    assert instruction("EXPOSE") == ["9400 9401"]  # the service's port, the checks' port


def test_healthcheck_probes_healthz_with_python() -> None:
    (check,) = instruction("HEALTHCHECK")
    command = healthcheck_command(check)
    assert command[:2] == ["python", "-c"], "slim images have no curl"
    assert "/healthz" in command[2]
    for option in ("--interval=", "--timeout=", "--retries="):
        assert option in check


def test_build_context_holds_what_the_image_copies_and_nothing_else() -> None:
    patterns = dockerignore_patterns()
    for args in instruction("COPY"):
        if args.startswith("--from="):
            continue
        for source in args.split()[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: no such path"
            assert not dockerignore_excludes(source, patterns), f".dockerignore drops {source}"
    for kept in ("stream_dedup/cli/app.py", "stream_dedup/schemas/event.schema.json", "README.md"):
        assert not dockerignore_excludes(kept, patterns), kept
    for dropped in (".git/HEAD", ".venv/bin/python", "tests/conftest.py", "data/index/CURRENT"):
        assert dockerignore_excludes(dropped, patterns), dropped
    assert dockerignore_excludes("stream_dedup/__pycache__/cli.cpython-311.pyc", patterns)
    assert DOCKERFILE.parent.name == "docker"


def _probe(command: list[str], env: dict[str, str]) -> int:
    assert command[0] == "python"
    done = subprocess.run([sys.executable, *command[1:]], env=env, timeout=30)
    return done.returncode


@pytest.mark.broker
def test_healthchecks_pass_on_a_running_service_and_fail_without_one(
    service: RunningService,
) -> None:
    (check,) = instruction("HEALTHCHECK")
    commands = {
        "Dockerfile": healthcheck_command(check),
        "compose": load_compose()["services"]["stream-dedup"]["healthcheck"]["test"][1:],
    }
    for where, command in commands.items():
        assert _probe(command, service.env) == 0, where
        closed = dict(service.env, STREAM_DEDUP_HTTP__PORT=str(free_port()))
        assert _probe(command, closed) != 0, where
