"""Structured output with the real default model: 20 seeded sampled requests under json_object and 20
under a json_schema, all in one batch each, every output parses (and validates against the schema),
each ended by the EOS the grammar allowed. SmolLM2's tokenizer is the one rebuilt from its GGUF
(engine/gguf_tokenizer.py), so this is also the grammar engine's tokenizer bridge on a GGUF."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine import Engine, EngineConfig, SamplingParams

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet"],
          "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0,
                                                                                "maximum": 120},
                         "pet": {"enum": ["cat", "dog", "none"]}}}
FORMATS = {"json_object": {"type": "json_object"},
           "json_schema": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}


@pytest.fixture(scope="module")
def engine(smollm2_gguf):
    return Engine(EngineConfig(model=str(smollm2_gguf), max_model_len=512))


@pytest.mark.parametrize("kind", FORMATS)
def test_twenty_seeded_sampled_requests_parse_and_validate(engine, kind):
    # Told the shape, the model ends its object in time; without a schema nothing else bounds its length.
    prompt = engine.tokenizer.encode_chat([
        {"role": "system", "content": 'You answer with one short JSON object, like {"name": "Ann", "age": 30, "pet": "cat"}.'},
        {"role": "user", "content": "Invent a person: name, age and pet."}])
    params = [SamplingParams(max_tokens=64, temperature=0.6, top_p=0.9, seed=seed, response_format=FORMATS[kind])
              for seed in range(20)]
    results = engine.generate([prompt] * 20, params)
    values = [json.loads(r.text) for r in results]
    assert all(isinstance(v, dict) for v in values) and {r.finish_reason for r in results} == {"stop"}
    if kind == "json_schema":
        for value in values:
            jsonschema.validate(value, SCHEMA)
    assert len({r.text for r in results}) > 5, "liveness: seeded sampling still varies within the grammar"
