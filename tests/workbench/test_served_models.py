"""The model a request names, resolved against those served (workbench/serving/served_models.py)."""

from __future__ import annotations

import pytest

from workbench.serving.served_models import UnknownModel, default, resolve


def test_a_named_model_must_be_served_and_a_missing_name_gets_the_default(settings):
    settings.WORKBENCH_MODEL = "demo"
    served = ["/models/tiny", "demo"]
    assert resolve("/models/tiny", served) == "/models/tiny" and resolve("demo", served) == "demo"
    assert resolve(None, served) == resolve("", served) == "demo" == default(served)
    # Workers that all run another model: a request naming none still gets one that is served.
    assert resolve(None, ["/models/tiny"]) == "/models/tiny"
    with pytest.raises(UnknownModel) as unknown:
        resolve("gpt-4o", served)
    assert not unknown.value.not_a_string and "'/models/tiny'" in unknown.value.message and "'demo'" in unknown.value.message
    with pytest.raises(UnknownModel) as not_text:
        resolve(5, served)
    assert not_text.value.not_a_string


def test_the_configured_model_is_never_unknown_only_unavailable(settings):
    """With its workers all away a moment (a restart), a request for WORKBENCH_MODEL goes on to fail as
    unavailable (503, retried by clients), not as a model that does not exist (404)."""
    settings.WORKBENCH_MODEL = "demo"
    assert resolve("demo", []) == "demo" and resolve(None, []) == "demo"
    with pytest.raises(UnknownModel):
        resolve("/models/tiny", [])
