"""The container files, checked as far as a machine without Docker allows: Dockerfiles parse,
every COPY source exists, bases are pinned, compose has the Airflow services on Postgres with
the DAGs mounted, loopback ports and no inline secrets. (Docker itself is not usable here, so no
image is built in tests.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.unit

CONTAINERS = REPO / "containers"
DOCKERFILES = sorted(CONTAINERS.glob("*.Dockerfile"))
SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN", "_KEY")


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _base_image(path: Path) -> str:
    steps = _instructions(path)
    args = dict(rest.split("=", 1) for keyword, rest in steps if keyword == "ARG" and "=" in rest)
    (base,) = [rest for keyword, rest in steps if keyword == "FROM"]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)


def test_three_dockerfiles() -> None:
    assert [p.name for p in DOCKERFILES] == [
        "airflow.Dockerfile",
        "proxy.Dockerfile",
        "trainer.Dockerfile",
    ]


def test_bases_are_pinned() -> None:
    bases = {p.name: _base_image(p) for p in DOCKERFILES}
    assert bases == {
        "airflow.Dockerfile": "apache/airflow:3.3.2-python3.11",
        "proxy.Dockerfile": "python:3.11-slim",
        "trainer.Dockerfile": "slimerl/slime:nightly-dev-20260810a-cu129",
    }


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.stem)
def test_every_copy_source_exists_and_nothing_is_fetched_by_add(path: Path) -> None:
    steps = _instructions(path)
    assert not [rest for keyword, rest in steps if keyword == "ADD"]
    copies = [rest for keyword, rest in steps if keyword == "COPY"]
    assert copies
    for rest in copies:
        parts = [p for p in rest.split() if not p.startswith("--")]
        for source in parts[:-1]:
            assert (REPO / source).exists(), f"{path.name}: COPY source {source} is missing"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.stem)
def test_dressage_goes_in_without_its_dependency_pins(path: Path) -> None:
    runs = " ".join(rest for keyword, rest in _instructions(path) if keyword == "RUN")
    assert "pip install --no-cache-dir --no-deps" in runs
    assert "requirements_from_pyproject.py" in runs
    for keyword, rest in _instructions(path):
        if keyword == "ENV":
            assert not any(word in rest.upper() for word in ("PASSWORD", "SECRET", "ADMIN_KEY="))


def test_the_requirements_helper_leaves_torch_out() -> None:
    script = CONTAINERS / "requirements_from_pyproject.py"
    pinned = subprocess.run(
        [sys.executable, str(script), "--exclude", "torch", "transformers"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "pydantic==2.14.4" in pinned and "pandera[polars]==0.35.0" in pinned
    assert not [r for r in pinned if r.startswith(("torch", "transformers"))]
    names = subprocess.run(
        [sys.executable, str(script), "--names-only", "--exclude", "numpy"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "torch" in names and "numpy" not in names and all("==" not in n for n in names)


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((CONTAINERS / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_airflow_on_postgres_with_the_dags_mounted() -> None:
    services = _compose()["services"]
    assert set(services) == {
        "postgres",
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    }
    commands = {name: s.get("command") for name, s in services.items()}
    assert commands["airflow-apiserver"] == "api-server"
    assert commands["airflow-scheduler"] == "scheduler"
    assert commands["airflow-dag-processor"] == "dag-processor"
    assert commands["airflow-triggerer"] == "triggerer"
    assert commands["airflow-init"] == ["db", "migrate"]
    for name, service in services.items():
        if name.startswith("airflow"):
            assert service["build"]["dockerfile"] == "containers/airflow.Dockerfile"
            assert "../dags:/opt/airflow/dags:ro" in service["volumes"]
            assert "../configs:/opt/airflow/configs:ro" in service["volumes"]
            env = service["environment"]
            assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
            assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        if name not in {"postgres", "airflow-init"}:
            assert service["depends_on"]["airflow-init"]["condition"] == (
                "service_completed_successfully"
            )
    assert services["airflow-triggerer"]["pid"] == "service:airflow-scheduler"


def test_compose_binds_loopback_and_keeps_secrets_out() -> None:
    services = _compose()["services"]
    ports = [p for s in services.values() for p in s.get("ports", [])]
    assert ports and all(str(p).startswith("127.0.0.1:") for p in ports)
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            text = str(value)
            if any(word in key.upper() for word in SECRET_WORDS):
                assert re.fullmatch(r"\$\{\w+:\?[^}]*\}", text), f"{name}: {key} is inline"
            if "://" in text and "@" in text:  # a URL with credentials must take them from env
                assert "${POSTGRES_PASSWORD:?" in text, f"{name}: {key} holds a password"
    example = (CONTAINERS / "env.example").read_text()
    assert re.search(r"^POSTGRES_PASSWORD=$", example, re.M)
    assert re.search(r"^AIRFLOW_JWT_SECRET=$", example, re.M)
