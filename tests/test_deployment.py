"""The deployment files: docker-compose.yml is accepted by Docker's own compose where a compose client
exists, describes the four roles from one image with a GPU for the worker, and refuses to start without
the secrets; every environment variable the code reads is documented in docs/OPERATIONS.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {"WORKBENCH_SECRET_KEY": "a-test-secret", "WORKBENCH_ADMIN_PASSWORD": "a-test-password"}


def compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


needs_compose = pytest.mark.skipif(compose_command() is None, reason="no docker compose client on this machine")


def compose_config(env: dict) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run([*compose_command(), "config"], cwd=ROOT, env={**clean, **env}, capture_output=True,
                          text=True)


@needs_compose
def test_compose_accepts_the_file_and_it_describes_the_deployment():
    result = compose_config(SECRETS)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    # Compose v2 leaves a profiled service out of `config`; Debian's docker-compose 1.29 lists it with
    # its `profiles`.
    unprofiled = {name for name, service in services.items() if not service.get("profiles")}
    assert unprofiled == {"redis", "postgres", "web", "worker"}, "prometheus only with its profile"
    assert services["web"]["image"] == services["worker"]["image"], "one shared image"
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    for role in ("web", "worker"):
        env = services[role]["environment"]
        assert env["WORKBENCH_TRANSPORT"] == "celery" and env["REDIS_URL"].startswith("redis://redis:")
        assert env["DATABASE_URL"].startswith("postgres://") and env["WORKBENCH_SECRET_KEY"] == "a-test-secret"
    assert "--pool" in services["worker"]["command"] and "solo" in services["worker"]["command"]


@needs_compose
@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_run_without_the_secrets(missing):
    result = compose_config({k: v for k, v in SECRETS.items() if k != missing})
    assert result.returncode != 0 and missing in result.stderr


@needs_compose
def test_compose_hands_the_metrics_token_to_the_web_process_and_the_scrape():
    result = subprocess.run([*compose_command(), "--profile", "monitoring", "config"], cwd=ROOT,
                            env={**os.environ, **SECRETS, "WORKBENCH_METRICS_TOKEN": "a-scrape-token"},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert services["web"]["environment"]["WORKBENCH_METRICS_TOKEN"] == "a-scrape-token"
    assert services["prometheus"]["environment"]["WORKBENCH_METRICS_TOKEN"] == "a-scrape-token"


def test_the_prometheus_scrape_sends_the_metrics_token_that_compose_gives_it():
    """Read as files (no compose client needed): Prometheus reads no environment in its configuration,
    so its entrypoint writes the token to the file its scrape sends as the bearer token, and the web
    process answers to the host name the scrape uses."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    prometheus, web = compose["services"]["prometheus"], compose["services"]["web"]
    assert prometheus["profiles"] == ["monitoring"], "started only when asked for"
    assert prometheus["environment"]["WORKBENCH_METRICS_TOKEN"] == "${WORKBENCH_METRICS_TOKEN:-}"
    assert web["environment"]["WORKBENCH_METRICS_TOKEN"] == "${WORKBENCH_METRICS_TOKEN:-}", "unset: both open"
    [mounted] = [v.split(":")[0] for v in prometheus["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro")]
    scrape = yaml.safe_load((ROOT / mounted).read_text())["scrape_configs"]
    [job] = [job for job in scrape if job["metrics_path"] == "/metrics"]
    assert job["static_configs"][0]["targets"] == ["web:8000"]
    assert "web" in web["environment"]["WORKBENCH_ALLOWED_HOSTS"].rstrip("}").split("-", 1)[1].split(",")
    assert job["authorization"]["type"] == "Bearer"
    token_file = job["authorization"]["credentials_file"]
    assert f'"$$WORKBENCH_METRICS_TOKEN" > {token_file} && exec /bin/prometheus' in prometheus["entrypoint"][-1]


def environment_variables_read() -> set[str]:
    names = set()
    for path in [*ROOT.glob("workbench/**/*.py"), ROOT / "scripts" / "stack.py"]:
        text = path.read_text()
        names |= set(re.findall(r"""os\.environ(?:\.get|\.setdefault)?\(\s*["']([A-Z_]+)["']""", text))
        names |= set(re.findall(r"""os\.environ\[\s*["']([A-Z_]+)["']\s*\]""", text))
        names |= set(re.findall(r"""env_(?:str|int|float|bool|list)\(\s*["']([A-Z_]+)["']""", text))
        names |= set(re.findall(r"""env(?:\.setdefault|\.get)\(\s*["']([A-Z_]+)["']""", text))
    return names - {"DJANGO_SETTINGS_MODULE"}


def test_every_environment_variable_is_documented():
    names = environment_variables_read()
    assert {"REDIS_URL", "DATABASE_URL", "WORKBENCH_TRANSPORT", "WORKBENCH_MODEL"} <= names, "liveness: the scan finds them"
    documented = (ROOT / "docs" / "OPERATIONS.md").read_text()
    assert sorted(n for n in names if f"`{n}`" not in documented) == []
