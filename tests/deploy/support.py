"""Reading the deployment files: Compose, Dockerfile, Prometheus config, Grafana dashboard.

Also the two halves of the metric-name check: the ``stream_dedup_*`` identifiers a PromQL
expression names, and the metric families a service's ``/metrics`` page declares.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_CONFIG = DOCKER / "prometheus" / "prometheus.yml"
GRAFANA = DOCKER / "grafana"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yaml"
DASHBOARD_PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "dashboards.yaml"
DASHBOARD = GRAFANA / "dashboards" / "stream-dedup.json"

_NAME = re.compile(r"(?<![A-Za-z0-9_:])stream_dedup_[A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([^,)]+?)\s*(?:,\s*(\w+)\s*)?\)\s*$")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_compose() -> dict[str, Any]:
    compose: dict[str, Any] = load_yaml(COMPOSE)
    return compose


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return dashboard


def project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    assert match, "pyproject.toml has no version"
    return match.group(1)


# --- Dockerfile ------------------------------------------------------------------------


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form instruction (ENTRYPOINT, CMD, HEALTHCHECK CMD)."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def healthcheck_command(args: str) -> list[str]:
    """The command of ``HEALTHCHECK [--options] CMD [...]``."""
    _, sep, command = args.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {args}"
    return exec_form(command.strip())


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """Variables set by ``ENV key=value ...`` in the last stage."""
    last_from = max(i for i, (kw, _) in enumerate(instructions) if kw == "FROM")
    env: dict[str, str] = {}
    for kw, args in instructions[last_from:]:
        if kw == "ENV":
            for item in shlex.split(args):
                key, sep, value = item.partition("=")
                assert sep, f"use ENV key=value: {args}"
                env[key] = value
    return env


def is_pinned(image: str) -> bool:
    """``name:tag`` with a version-like tag (a digit in it, not ``latest``) or a digest."""
    if "@sha256:" in image:
        return True
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag or not name:
        return False
    return tag != "latest" and any(c.isdigit() for c in tag)


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether Docker's build context leaves ``path`` out (last matching pattern wins;
    a pattern that matches a directory matches everything in it)."""
    candidates = [str(PurePosixPath(path))]
    candidates += [str(p) for p in PurePosixPath(path).parents if str(p) != "."]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip().rstrip("/")
        alternatives = {pattern}
        if pattern.startswith("**/"):
            alternatives.add(pattern[3:])
        if any(fnmatch.fnmatchcase(c, a) for c in candidates for a in alternatives):
            excluded = not negate
    return excluded


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# --- PromQL ----------------------------------------------------------------------------


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(where, expression)`` for every panel target and every query variable."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            text = query.get("query", "") if isinstance(query, dict) else query
            out.append((f"variable {var['name']!r}", text))
    return out


def rule_queries(config_path: Path = PROMETHEUS_CONFIG) -> list[tuple[str, str]]:
    """``(where, expression)`` for every recording and alerting rule the config loads."""
    config = load_yaml(config_path)
    out: list[tuple[str, str]] = []
    for pattern in config.get("rule_files") or []:
        for rules_path in sorted(config_path.parent.glob(pattern)):
            for group in load_yaml(rules_path).get("groups", []):
                for rule in group.get("rules", []):
                    name = rule.get("alert") or rule.get("record")
                    out.append((f"rule {name!r} in {rules_path.name}", rule["expr"]))
    return out


def metric_names(expression: str) -> set[str]:
    """The ``stream_dedup_*`` identifiers an expression names."""
    return set(_NAME.findall(expression))


def instant_query(expression: str, rate_interval: str) -> str:
    """A dashboard expression as Prometheus itself would receive it from Grafana.

    Grafana's interval variables become ``rate_interval``, a multi-value variable its
    "All" value, and a ``label_values(metric, label)`` variable query the metric selector.
    """
    match = _LABEL_VALUES.match(expression)
    if match:
        return match.group(1)
    query = expression.replace("$__rate_interval", rate_interval)
    query = query.replace("$__interval", rate_interval).replace("$__range", "1h")
    query = re.sub(r"\$\{?instance\}?", ".*", query)
    assert "$" not in query, f"a Grafana variable the test does not know: {expression}"
    return query


# --- /metrics --------------------------------------------------------------------------


def exported_families(exposition: str) -> dict[str, str]:
    """``{family: type}`` from the ``# TYPE`` lines of a Prometheus text exposition."""
    families: dict[str, str] = {}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = kind.strip()
    return families


def family_of(name: str, families: dict[str, str]) -> str | None:
    """The exported family a PromQL identifier belongs to, or None.

    ``_bucket`` belongs to a histogram, ``_sum``/``_count`` to a histogram or summary,
    ``_total`` to a counter (the exposition may declare the counter with or without it).
    """
    if name in families:
        return name
    for suffix, kinds in (
        ("_bucket", {"histogram"}),
        ("_sum", {"histogram", "summary"}),
        ("_count", {"histogram", "summary"}),
        ("_total", {"counter"}),
    ):
        base = name.removesuffix(suffix)
        if base != name and families.get(base) in kinds:
            return base
    return None


def unknown_names(queries: list[tuple[str, str]], families: dict[str, str]) -> list[str]:
    """``where: name`` for every identifier that names no exported family."""
    return [
        f"{where}: {name}"
        for where, expr in queries
        for name in sorted(metric_names(expr))
        if family_of(name, families) is None
    ]
