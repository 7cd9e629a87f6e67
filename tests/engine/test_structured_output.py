"""Structured output in the engine (engine/grammar.py): response_format as a per-row token mask.

On a tiny random model, which left alone writes anything: seeded sampled requests under a JSON schema
or a regex give output that parses and validates; the EOS is masked until the grammar accepts; a bad
response_format is refused naming the field; constrained rows never take a device-loop burst while
their unconstrained neighbours still do; and every row of a mixed batch, constrained or not, gets the
tokens it gets alone (the batch-invariance oracle of test_batch_invariance.py).
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import Engine, EngineConfig, InvalidSamplingParams, SamplingParams
from engine.grammar import GrammarTokenizer
from engine.step_data import TokenSource

SEED_21 = {"model_type": "llama", "seed": 21}
pytestmark = pytest.mark.checkpoint(**SEED_21)
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "color": {"enum": ["red", "green", "blue"]}}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
REGEX = {"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"}


@pytest.fixture(scope="module")
def engine(built_checkpoints):
    """One engine for the module, on the same weights as `checkpoint`."""
    return Engine(EngineConfig(model=str(built_checkpoints(**SEED_21)), device_loop=False, graphs=False,
                               num_kv_blocks=64))


def sampled(seed: int, response_format: dict | None, max_tokens: int = 48) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, response_format=response_format)


def test_seeded_sampled_outputs_parse_and_validate(engine):
    free = engine.generate(["{"] * 4, [sampled(seed, None, max_tokens=8) for seed in range(4)])
    assert not any(r.text.startswith('"') for r in free), "liveness: unconstrained, the random model writes no JSON"
    results = engine.generate(["{"] * 6, [sampled(seed, JSON_SCHEMA) for seed in range(6)])
    for result in results:
        jsonschema.validate(json.loads(result.text), SCHEMA)
        assert result.finish_reason == "stop"  # ended by the EOS the grammar allowed, not by max_tokens
    assert len({r.text for r in results}) > 1, "liveness: sampling still chooses within the grammar"
    for result in engine.generate(["x"] * 4, [sampled(seed, REGEX) for seed in range(4)]):
        assert re.fullmatch(REGEX["regex"], result.text), result.text


def test_eos_is_allowed_only_where_the_grammar_accepts(engine):
    grammar = SamplingParams(response_format=JSON_SCHEMA).grammar
    assert grammar is not None
    constraint = GrammarTokenizer(engine.tokenizer, engine.loaded.config.vocab_size,
                                  engine.loaded.eos_token_ids).constraint(grammar)
    [eos] = engine.loaded.eos_token_ids
    assert not constraint.allowed()[eos]
    for token in engine.tokenizer.encode('{"ok":true,"n":7,"color":"red"}', add_special_tokens=False):
        assert constraint.allowed()[token]
        constraint.advance(token)
    assert constraint.allowed()[eos] and int(constraint.allowed().sum()) == 1
    constraint.advance(eos)
    assert constraint.finished and constraint.error is None


def test_a_one_of_schema_is_constrained_as_any_of(engine):
    """Agents' tool schemas use oneOf (Qwen Code's, with branches that cannot overlap): served, not refused."""
    schema = {"type": "object", "additionalProperties": False, "required": ["turns"],
              "properties": {"turns": {"oneOf": [{"type": "string", "enum": ["all"]},
                                                 {"type": "string", "pattern": "^[1-9][0-9]?$"}]}}}
    one_of = {"type": "json_schema", "json_schema": {"name": "fork", "schema": schema}}
    results = engine.generate(["{"] * 6, [sampled(seed, one_of) for seed in range(6)])
    for result in results:
        jsonschema.validate(json.loads(result.text), schema)
    assert len({r.text for r in results}) > 1, "liveness: sampling still chooses within the grammar"


@pytest.mark.parametrize("response_format, says", [
    ({"type": "xml"}, "type must be one of"),
    ({"type": "json_schema", "json_schema": {"schema": []}}, "schema must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "thing"}}}, "does not compile"),
    ({"type": "regex", "regex": "(["}, "does not compile"),
    # llguidance cannot serialize an integer beyond 64 bits (a fuzzed tool schema found it): a 400, not a 500
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object", "x": [-2**84]}}}, "cannot be used"),
    ({"type": "json_object", "schema": {}}, "unknown field 'schema'"),
    ("json", "must be an object"),
])
def test_a_bad_response_format_is_refused_by_name(response_format, says):
    with pytest.raises(InvalidSamplingParams) as refused:
        SamplingParams(response_format=response_format)
    assert refused.value.parameter == "response_format" and says in str(refused.value)


def test_a_format_that_fails_to_compile_is_compiled_once_however_often_it_comes(monkeypatch):
    """A client resending a schema that does not compile must not cost a compile each time (the web
    process checks every request's format)."""
    from engine import response_format

    compiles = []
    real = response_format._grammar
    monkeypatch.setattr(response_format, "_grammar", lambda key: compiles.append(key) or real(key))
    bad = {"type": "regex", "regex": "([" + "x" * 17}  # a key no other test compiles
    for _ in range(3):
        with pytest.raises(InvalidSamplingParams, match="does not compile"):
            SamplingParams(response_format=bad)
    assert len(compiles) == 1, compiles


def test_text_is_no_constraint():
    assert SamplingParams(response_format={"type": "text"}).grammar is None
    assert not SamplingParams(response_format={"type": "text"}).constrained


def test_constrained_and_free_rows_in_one_batch_get_their_solo_tokens(checkpoint, engine):
    """Greedy free rows (which the device loop bursts), seeded free rows and constrained rows of both
    kinds, added together: each row's tokens are the ones it gets alone, and no constrained row's token
    ever came from a burst or a parked slot."""
    prompts = ["def main():", [7, 99, 4, 300], "The quick brown fox", "{", [12, 13], "x = "]
    # The seeded rows end first (a short free one, a short regex): then the greedy rows, free and
    # constrained, would all be burst candidates, and only the constrained one must stay on the host.
    params = [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), sampled(3, REGEX),
              sampled(4, None, max_tokens=4), SamplingParams(max_tokens=40, temperature=0, response_format=JSON_SCHEMA),
              SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), sampled(5, REGEX)]
    solo = [engine.generate([prompt], p)[0].token_ids for prompt, p in zip(prompts, params)]

    mixed = Engine(EngineConfig(model=str(checkpoint), device_loop=True, graphs=False, num_kv_blocks=64))
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        mixed.add_request(f"r{i}", prompt, p)
    constrained = {seq.seq_id for seq in mixed.live_sequences() if seq.params.constrained}
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    sources = []
    while mixed.has_unfinished_requests():
        for output in mixed.step():
            got[output.request_id] += output.token_ids
        sources += [row.source for row in mixed.last_step.rows if row.seq_id in constrained]
    assert [got[f"r{i}"] for i in range(len(prompts))] == solo
    assert len(constrained) == 3 and sources and set(sources) == {TokenSource.HOST}
    assert mixed.device_loop.bursts > 0, "liveness: the free greedy rows still burst once alone"


def test_a_finished_grammar_ends_the_request_even_with_ignore_eos(engine):
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=9, ignore_eos=True, response_format=REGEX)
    [result] = engine.generate(["x"], params)
    assert result.finish_reason == "stop" and re.fullmatch(REGEX["regex"], result.text), result
    assert len(result.token_ids) < 40, "liveness: it ended on the grammar, not on max_tokens"
