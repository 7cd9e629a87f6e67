"""Both transports are the Transport of workbench/serving/transport.py, member for member.

The type checker is the real proof (bridge.transport() returns each as a Transport); this holds the
same line at run time, signatures included, so a transport that drifts fails here too."""

from __future__ import annotations

import inspect

import pytest

from engine import Engine, EngineConfig
from workbench.serving.celery.link_settings import LinkSettings
from workbench.serving.celery.transport import CeleryTransport
from workbench.serving.engine_host import EngineHost
from workbench.serving.inprocess import InProcessTransport
from workbench.serving.transport import Transport

MEMBERS = sorted(name for name, value in vars(Transport).items()
                 if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)))


@pytest.fixture(scope="module")
def inprocess():
    transport = InProcessTransport(EngineHost(lambda: Engine(EngineConfig(model="demo"))), "demo")
    transport.start()
    yield transport
    transport.stop()


def test_the_protocol_names_what_the_web_side_calls():
    assert MEMBERS == ["answering", "audit_as_operator", "cancel", "cancel_as_operator", "change_flag", "flags_in_force",
                       "metrics_by_worker", "models", "running_request_ids", "start", "stop", "submit", "tokenizer",
                       "tokenizer_for", "watch_state", "workers_view"]


@pytest.mark.parametrize("kind", [InProcessTransport, CeleryTransport])
def test_each_transport_has_every_member_with_its_signature(kind):
    for name in MEMBERS:
        wanted = vars(Transport)[name]
        if isinstance(wanted, property):
            continue  # an attribute (CeleryTransport.tokenizer) or a property: the instance checks below
        got = getattr(kind, name)
        assert inspect.signature(got) == inspect.signature(wanted), f"{kind.__name__}.{name}"
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(wanted), f"{kind.__name__}.{name}"


def test_both_transports_are_transports(inprocess):
    assert isinstance(inprocess, Transport)
    assert isinstance(CeleryTransport(LinkSettings.from_django()), Transport), "unstarted: it opens no connection until start()"
    assert inprocess.tokenizer is inprocess.host.engine.tokenizer
    assert not isinstance(inprocess.host, Transport), "the engine host is not a transport (the worker uses it)"
