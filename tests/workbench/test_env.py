"""The settings' one environment reader (workbench/env.py), each kind with good and bad values, and the
secret-key rule: DEBUG off unless asked for, the development key refused at a production start."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from engine.engine_config import CPU_KV_CACHE_MB, CPU_PREFILL_BESIDE_DECODES, DEFAULT_TOKEN_BUDGET
from tests.cluster import ROOT
from workbench.env import env_bool, env_float, env_int, env_list, env_str
from workbench.secret_key import DEVELOPMENT_KEY, local_key

NAME = "WORKBENCH_TEST_SETTING"


@pytest.fixture
def setting(monkeypatch):
    """Sets NAME to a value for one call."""
    def set_to(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(NAME, raising=False)
        else:
            monkeypatch.setenv(NAME, value)
    return set_to


def refused(read, expected: str, value: str) -> None:
    with pytest.raises(ImproperlyConfigured) as caught:
        read()
    assert str(caught.value) == f"{NAME} must be {expected}, not {value!r}"


@pytest.mark.parametrize("value,read", [(None, 7), ("12", 12), (" 3 ", 3), ("-0", 0)])
def test_int_reads_whole_numbers(setting, value, read):
    setting(value)
    assert env_int(NAME, 7, minimum=0) == read


@pytest.mark.parametrize("value", ["", "four", "1.5", "1e3", "0x10", "10000", "-1"])
def test_int_refuses_what_is_not_a_whole_number_in_range(setting, value):
    setting(value)
    refused(lambda: env_int(NAME, 1, minimum=0, maximum=9999, unit="tokens"),
            "a whole number of tokens from 0 to 9999", value)


@pytest.mark.parametrize("value,read", [(None, 1.0), ("0.25", 0.25), ("2", 2.0)])
def test_float_reads_decimal_numbers(setting, value, read):
    setting(value)
    assert env_float(NAME, 1.0, positive=True) == read


@pytest.mark.parametrize("value", ["0", "0.0", "-1", "", "nan", "inf", "1e3", "2s", "1" * 400 + ".0"])
def test_a_positive_float_refuses_zero_and_what_is_not_a_finite_number(setting, value):
    setting(value)
    refused(lambda: env_float(NAME, 1.0, positive=True, unit="seconds"), "a number of seconds > 0", value)


def test_float_bounds_are_inclusive(setting):
    for value in ("0", "10000"):
        setting(value)
        assert env_float(NAME, 5.0, minimum=0, maximum=10000) == float(value)
    setting("10000.5")
    refused(lambda: env_float(NAME, 5.0, minimum=0, maximum=10000), "a number from 0 to 10000", "10000.5")
    setting("-0.5")
    refused(lambda: env_float(NAME, 5.0, minimum=0), "a number >= 0", "-0.5")


@pytest.mark.parametrize("value,read", [(None, False), ("1", True), ("TRUE", True), (" on ", True), ("0", False),
                                        ("no", False), ("Off", False)])
def test_bool_reads_the_usual_words(setting, value, read):
    setting(value)
    assert env_bool(NAME, False) is read


@pytest.mark.parametrize("value", ["", "2", "maybe", "enabled"])
def test_bool_refuses_any_other_word(setting, value):
    setting(value)
    refused(lambda: env_bool(NAME, False), "a boolean (1/true/yes/on or 0/false/no/off)", value)


@pytest.mark.parametrize("value,read", [(None, ["a", "b"]), ("x", ["x"]), (" x , y,,", ["x", "y"]), ("", [])])
def test_list_splits_on_commas(setting, value, read):
    setting(value)
    assert env_list(NAME, ["a", "b"]) == read


def test_str_checks_choices_and_patterns_and_takes_empty_for_unset(setting):
    setting("celery")
    assert env_str(NAME, "inprocess", choices=("inprocess", "celery")) == "celery"
    setting("")
    assert env_str(NAME, "inprocess", choices=("inprocess", "celery")) == "inprocess"
    assert env_str(NAME) == ""
    setting("carrier-pigeon")
    refused(lambda: env_str(NAME, "inprocess", choices=("inprocess", "celery")), "one of inprocess, celery",
            "carrier-pigeon")
    setting("has space")
    refused(lambda: env_str(NAME, "x", pattern=r"[a-z]+", expected="lower-case letters"), "lower-case letters",
            "has space")


def start(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with the settings chosen, DEBUG and the key unset unless given."""
    clean = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_DEBUG", "WORKBENCH_SECRET_KEY")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**clean, "DJANGO_SETTINGS_MODULE": "workbench.settings", **env})


def started(*runs: tuple[str, dict[str, str]]) -> list[subprocess.CompletedProcess]:
    """Several `start(code, **env)` side by side: each interpreter spends its seconds importing torch and Django."""
    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda run: start(run[0], **run[1]), runs))


@pytest.mark.parametrize("name,value", [("WORKBENCH_HEARTBEAT_S", "0"), ("WORKBENCH_WORKER_LOST_S", "-4"),
                                        ("WORKBENCH_DRAIN_S", "soon"), ("WORKBENCH_WORKER_CAPACITY", "2.5"),
                                        ("WORKBENCH_MAX_FRAME_BYTES", "0"), ("WORKBENCH_DEBUG", "maybe"),
                                        ("WORKBENCH_TRANSPORT", "kafka"), ("WORKBENCH_DTYPE", "float64"),
                                        ("WORKBENCH_WEIGHTS", "int4"), ("WORKBENCH_QUEUE_PREFIX", "a b"),
                                        ("WORKBENCH_MAX_NUM_BATCHED_TOKENS", "0"),
                                        ("WORKBENCH_MAX_PREFILL_BESIDE_DECODES", "-1"), ("WORKBENCH_SIGNUP", "maybe"),
                                        ("WORKBENCH_KV_CACHE_MB", "lots"),
                                        ("WORKBENCH_HSTS_SECONDS", "1y"), ("WORKBENCH_PROXY_SSL_HEADER", "X: y")])
def test_a_bad_setting_stops_the_start_naming_variable_and_value(name, value):
    result = start("import workbench.settings", **{name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and f"{name} must be" in result.stderr
    assert f"not {value!r}" in result.stderr


def test_the_served_engine_takes_its_step_token_budgets_and_kv_pool_from_the_settings():
    """Both transports build their engine's config in one place (workbench/serving/engine_settings.py)."""
    read = ("import django; django.setup(); from workbench.serving.engine_settings import served_engine_config; "
            "config = served_engine_config(); print(config.token_budget, config.prefill_budget_beside_decodes, "
            "config.kv_pool_bytes(None) // 2**20)")
    unset = [str(DEFAULT_TOKEN_BUDGET), str(CPU_PREFILL_BESIDE_DECODES), str(CPU_KV_CACHE_MB)]
    default, chosen = started((read, {}), (read, {"WORKBENCH_MAX_NUM_BATCHED_TOKENS": "96",
                                                  "WORKBENCH_MAX_PREFILL_BESIDE_DECODES": "12",
                                                  "WORKBENCH_KV_CACHE_MB": "640"}))
    assert default.stdout.split() == unset, "unset: the engine's defaults for the CPU"
    assert chosen.stdout.split() == ["96", "12", "640"]


def test_the_tls_settings_come_from_the_environment():
    """Behind a TLS proxy (docs/OPERATIONS.md): a request the proxy marks https is secure, gets HSTS, and
    the cookies are sent over HTTPS only; unset, none of it (a plain-HTTP `make run` must keep working)."""
    read = ("import django; django.setup(); from django.conf import settings; from django.test import Client; "
            "from django.test.utils import setup_test_environment; setup_test_environment(); "
            "answer = Client().get('/login', HTTP_X_FORWARDED_PROTO='https'); "
            "print(answer.headers.get('Strict-Transport-Security'), bool(answer.cookies['csrftoken']['secure']), "
            "settings.SESSION_COOKIE_SECURE, settings.CSRF_TRUSTED_ORIGINS)")
    plain, behind = started((read, {}), (read, {
        "WORKBENCH_SECURE_COOKIES": "1", "WORKBENCH_PROXY_SSL_HEADER": "X-Forwarded-Proto",
        "WORKBENCH_HSTS_SECONDS": "31536000", "WORKBENCH_CSRF_TRUSTED_ORIGINS": "https://chat.example.org"}))
    assert plain.stdout.split() == ["None", "False", "False", "[]"]
    assert behind.stdout.split() == ["max-age=31536000", "True", "True", "['https://chat.example.org']"], behind.stderr


def test_the_content_security_policy_comes_from_the_environment():
    """Sent on every response by default (the pages pass it in Chromium: tests/e2e/test_content_security.py);
    WORKBENCH_CSP replaces it, "off" sends none (for a proxy that sets its own), a second line is refused."""
    read = ("import django; django.setup(); from django.test import Client; "
            "from django.test.utils import setup_test_environment; setup_test_environment(); "
            "print(Client().get('/login').headers.get('Content-Security-Policy'))")
    default, replaced, off, refused = started((read, {}), (read, {"WORKBENCH_CSP": "default-src 'none'"}),
                                              (read, {"WORKBENCH_CSP": "off"}),
                                              (read, {"WORKBENCH_CSP": "default-src 'self'\nX-Injected: 1"}))
    assert default.stdout.strip().startswith("default-src 'self'; script-src 'self'")
    assert replaced.stdout.strip() == "default-src 'none'"
    assert off.stdout.strip() == "None"
    assert refused.returncode != 0 and "WORKBENCH_CSP must be" in refused.stderr


def test_debug_is_off_unless_asked_for():
    read = "import workbench.settings as s; print(s.DEBUG)"
    assert start(read).stdout.strip() == "False"
    assert start(read, WORKBENCH_DEBUG="1").stdout.strip() == "True"


def test_the_web_application_refuses_the_development_key_with_debug_off():
    result = start("import workbench.asgi")
    assert result.returncode != 0 and "ImproperlyConfigured" in result.stderr
    assert "Set WORKBENCH_SECRET_KEY" in result.stderr and "make run" in result.stderr
    assert start("import workbench.asgi", WORKBENCH_SECRET_KEY=DEVELOPMENT_KEY).returncode != 0, "named outright too"


@pytest.mark.parametrize("env", [{"WORKBENCH_SECRET_KEY": "a-deployment-key"}, {"WORKBENCH_DEBUG": "1"}],
                         ids=["own key", "debug"])
def test_the_web_application_starts_with_a_key_of_its_own_or_in_debug(env):
    result = start("import workbench.asgi; print('loaded')", **env)
    assert result.stdout.strip() == "loaded", result.stderr[-2000:]


@pytest.mark.parametrize("hosts", ["workbench.example.com", "*", "localhost,10.0.0.5"])
def test_the_web_application_refuses_debug_where_more_than_this_machine_reaches_it(hosts):
    load = "import workbench.asgi; print('loaded')"
    result, loopback, deployed = started(
        (load, {"WORKBENCH_DEBUG": "1", "WORKBENCH_ALLOWED_HOSTS": hosts}),
        (load, {"WORKBENCH_DEBUG": "1", "WORKBENCH_ALLOWED_HOSTS": "localhost,127.0.0.1,[::1]"}),
        (load, {"WORKBENCH_SECRET_KEY": "a-deployment-key", "WORKBENCH_ALLOWED_HOSTS": hosts}))
    assert result.returncode != 0 and "ImproperlyConfigured" in result.stderr, result.stderr[-2000:]
    assert "WORKBENCH_DEBUG is on" in result.stderr and hosts.split(",")[-1] in result.stderr
    assert loopback.stdout.strip() == "loaded", loopback.stderr[-2000:]
    assert deployed.stdout.strip() == "loaded", "DEBUG off answers any host: " + deployed.stderr[-2000:]


def test_management_commands_run_with_the_development_key(tmp_path):
    """Only the web application signs what browsers hold: migrating needs no key."""
    result = start("import sys; from django.core.management import execute_from_command_line; "
                   "execute_from_command_line(['manage.py', 'migrate', '-v0'])",
                   WORKBENCH_DB_PATH=str(tmp_path / "db.sqlite3"))
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_local_key_is_made_once_random_and_private(tmp_path):
    path = tmp_path / ".secret-key"
    key = local_key(path)
    assert len(key) >= 50 and key != DEVELOPMENT_KEY
    assert local_key(path) == key, "the same key at every start"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert local_key(tmp_path / "another") != key
    assert sorted(p.name for p in tmp_path.iterdir()) == [".secret-key", "another"], "no draft left behind"


def test_a_deployment_hashes_passwords_with_djangos_default_and_only_the_tests_speed_it_up():
    """tests/settings.py puts MD5 first for the suite's hundreds of sign-ups; a deployment's settings must
    leave Django's list (PBKDF2 first) alone."""
    import workbench.settings as deployed

    assert "PASSWORD_HASHERS" not in vars(deployed)
    assert settings.PASSWORD_HASHERS[0] == "django.contrib.auth.hashers.MD5PasswordHasher", "liveness: the tests' own"
