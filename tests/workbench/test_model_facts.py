"""What the web side reads of a served model: a model this process cannot read (a Celery web process
need not hold every file a worker's model has) gives the listings nothing to say rather than an error,
and a readable one its facts."""

from __future__ import annotations

from workbench.serving.model_facts import if_readable, model_card, model_length


def test_an_unreadable_model_is_none_and_a_readable_one_its_facts(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    for missing in (str(tmp_path / "absent.gguf"), str(broken), "no-such-packaged-model"):
        assert if_readable(model_card, missing) is None and if_readable(model_length, missing) is None, missing
    assert if_readable(model_length, "demo") == 512 and if_readable(model_card, "demo").architecture == "llama"
