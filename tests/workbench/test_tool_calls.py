"""workbench/api/openai/tool_calls.py without a server: a forced call from a tiny random model is a valid call,
calls parse out of whole and streamed text alike, messages with tool_calls and tool results render for
a template without tools, a template that reads `tools` renders them itself (and `tool_choice: "none"`
shows them to neither kind), and bad tools are refused naming the field."""

from __future__ import annotations

import dataclasses
import json
import shutil

import jsonschema
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.loading.model_files import DEMO_MODEL_DIR
from engine.loading.tokenizer import Tokenizer
from workbench.api.openai import tool_calls
from workbench.protocol import request_input
from workbench.protocol.request_input import InvalidInput

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                                          "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {},
                                                                            "additionalProperties": False}}}


def test_a_forced_call_from_a_random_model_is_a_valid_call(tiny_checkpoint):
    engine = Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=5)), device_loop=False, graphs=False))
    free = engine.generate(["weather?"], SamplingParams(max_tokens=20, temperature=1.0, seed=1))[0]
    assert tool_calls.OPEN not in free.text, "liveness: left alone, the random model calls nothing"
    for choice in ("required", "get_time"):
        tools = tool_calls.tools_of({"tools": [WEATHER, TIME], "tool_choice": choice if choice == "required" else
                                     {"type": "function", "function": {"name": choice}}})
        params = tools.apply(SamplingParams(max_tokens=60, temperature=1.0, seed=2))
        results = engine.generate(["weather?"] * 2, [params] * 2)
        for result in results:
            content, calls = tool_calls.parse(result.text, tools)
            assert result.finish_reason == "tool_calls" and content is None and len(calls) == 1, result.text
            function = calls[0]["function"]
            assert choice == "required" or function["name"] == choice
            schema = (WEATHER if function["name"] == "get_weather" else TIME)["function"]["parameters"]
            jsonschema.validate(json.loads(function["arguments"]), schema)


def test_calls_parse_the_same_whole_and_streamed_in_any_pieces():
    tools = tool_calls.tools_of({"tools": [WEATHER, TIME]})
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
            '</tool_call>')
    content, calls = tool_calls.parse(text, tools)
    assert content == "Let me check." and [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    for size in (1, 3, 7, len(text)):
        stream = tool_calls.CallStream(tools)
        deltas = [d for at in range(0, len(text), size) for d in stream.deltas(text[at:at + size], final=False)]
        deltas += stream.deltas("", final=True)
        assert "".join(d.get("content", "") for d in deltas) == "Let me check.\n"
        pieces = [t for d in deltas for t in d.get("tool_calls", [])]
        assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["id"].startswith("call_")
        assert "".join(p["function"]["arguments"] for p in pieces) == calls[0]["function"]["arguments"]
    unknown = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert tool_calls.parse(unknown, tools) == (unknown, [])  # not an offered function: stays text
    assert tool_calls.finish_reason("tool_calls", False) == "stop"
    assert tool_calls.parse(text, tool_calls.tools_of({"tools": [WEATHER], "tool_choice": "none"}))[1] == []


def test_history_with_calls_and_results_renders_for_a_template_without_tools():
    tools = tool_calls.tools_of({"tools": [WEATHER]})
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Paris", "days": 1}'}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    rendered, shown = tool_calls.messages_for(messages, tools, template_takes_tools=False)
    assert shown is None and isinstance(rendered, list)
    assert rendered[0]["role"] == "system" and '"name": "get_weather"' in rendered[0]["content"]
    assert rendered[2] == {"role": "assistant", "content": tool_calls.OPEN + '\n{"name": "get_weather", '
                           '"arguments": {"city": "Paris", "days": 1}}\n' + tool_calls.CLOSE}
    assert rendered[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    as_hf, shown = tool_calls.messages_for(messages, tools, template_takes_tools=True)
    assert shown == [WEATHER] and as_hf[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "days": 1}


# A template in HF's convention for tools: it reads the `tools` variable and writes each function itself.
TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>tools\n{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>\n"
                  "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tools_reach_the_prompt_through_a_template_that_reads_them_and_never_with_choice_none(tmp_path):
    shutil.copy(DEMO_MODEL_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TOOLS_TEMPLATE}))
    with_tools, without = Tokenizer.from_dir(tmp_path), Tokenizer.from_dir(DEMO_MODEL_DIR)
    assert with_tools.takes_tools and not without.takes_tools
    ask = [{"role": "user", "content": "Weather?"}]

    def prompt(tokenizer: Tokenizer, choice: str) -> str:
        tools = tool_calls.tools_of({"tools": [WEATHER, TIME], "tool_choice": choice})
        messages, shown = tool_calls.messages_for(ask, tools, tokenizer.takes_tools)
        return tokenizer.decode(request_input.chat_prompt(tokenizer, messages, tools=shown), skip_special_tokens=False)

    assert "tools\nget_weather;get_time;" in prompt(with_tools, "auto")  # written by the template, not by us
    assert tool_calls.OPEN not in prompt(with_tools, "auto"), "the template's own format, not the system block"
    assert '"name": "get_weather"' in prompt(without, "auto")  # the system-prompt block instead
    for tokenizer in (with_tools, without):
        assert "get_weather" not in prompt(tokenizer, "none")


@pytest.mark.parametrize("body, param", [
    ({"tools": {"name": "x"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tools_are_refused_naming_the_field(body, param):
    with pytest.raises(InvalidInput) as refused:
        tool_calls.tools_of(body)
    assert refused.value.param == param


def test_the_websocket_apis_params_take_response_format():
    """The websocket API and the chat socket read params through request_input: response_format is one."""
    from workbench.protocol import request_input

    params = request_input.sampling_params({"response_format": {"type": "json_object"}})
    assert params.constrained
    with pytest.raises(InvalidInput) as refused:
        request_input.sampling_params({"response_format": {"type": "yaml"}})
    assert (refused.value.code, refused.value.param) == ("invalid_params", "response_format")


FORCED_WEATHER = tool_calls.tools_of({"tools": [WEATHER, TIME],
                                      "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
REQUIRED = tool_calls.tools_of({"tools": [WEATHER, TIME], "tool_choice": "required"})
WHOLE_CALL = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","days":2}}\n</tool_call>'


def streamed_cut(text: str, tools: tool_calls.Tools, size: int) -> tuple[str, list[dict], str | None]:
    """(content, tool-call pieces, the chunk's finish_reason) of `text` streamed in pieces of `size`,
    ended by max_tokens, as the SSE endpoint streams it."""
    stream = tool_calls.CallStream(tools)
    deltas = [d for at in range(0, len(text), size) for d in stream.deltas(text[at:at + size], final=False)]
    deltas += stream.deltas("", final=True, finish="length")
    return ("".join(d.get("content", "") for d in deltas), [t for d in deltas for t in d.get("tool_calls", [])],
            tool_calls.finish_reason("length", stream.calls > 0))


def test_a_forced_call_cut_anywhere_comes_back_with_its_arguments_so_far_whole_and_streamed():
    """OpenAI's answer to a forced call max_tokens ended: the call, its arguments as far as they got
    (a JSON string that may not parse), finish_reason `length`; the same streamed in any pieces."""
    arguments_at = WHOLE_CALL.index('"arguments":') + len('"arguments":')
    compact = '{"city":"Oslo","days":2}'
    for end in range(len(WHOLE_CALL)):  # every cut but none (the whole call is a plain tool call)
        text = WHOLE_CALL[:end]
        for tools in (FORCED_WEATHER, REQUIRED):
            call = tool_calls.cut(text, tools)
            # "required" offers get_weather and get_time: the name is told from its first letter on.
            told = tools is FORCED_WEATHER or end > WHOLE_CALL.index('get_weather') + len("get_")
            assert (call is not None) == told, (text, call)
            if call is None:
                continue
            arguments = call["function"]["arguments"]
            assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
            if end < arguments_at + len(compact):
                assert arguments == WHOLE_CALL[arguments_at:end] if end > arguments_at else arguments == "", text
            else:  # written whole, only the call's end missing: as a complete call carries them
                assert json.loads(arguments) == {"city": "Oslo", "days": 2}, text
            for size in (1, 5, len(text) or 1):
                content, pieces, finish = streamed_cut(text, tools, size)
                assert content == "" and finish == "length", (text, size, content)
                assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["function"]["arguments"] == ""
                assert "".join(p["function"]["arguments"] for p in pieces) == arguments, (text, size)
    # Liveness of the cut: the same text ended by its closing tag is an ordinary call, and only a forced
    # call is cut (with tool_choice "auto" the text stays content).
    assert tool_calls.parse(WHOLE_CALL, FORCED_WEATHER)[1][0]["function"]["arguments"] == '{"city": "Oslo", "days": 2}'
    auto = tool_calls.tools_of({"tools": [WEATHER]})
    assert tool_calls.cut(WHOLE_CALL[:40], auto) is None
    assert streamed_cut(WHOLE_CALL[:40], auto, 3)[:2] == (WHOLE_CALL[:40], [])
    assert tool_calls.cut("Sure! " + WHOLE_CALL[:40], FORCED_WEATHER) is None, "no call's start: nothing made up"


def test_a_forced_call_from_a_random_model_cut_by_max_tokens_keeps_what_it_generated(tiny_checkpoint):
    engine = Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=5)), device_loop=False, graphs=False))
    params = FORCED_WEATHER.apply(SamplingParams(max_tokens=80, temperature=1.0, seed=3))
    [whole] = engine.generate(["weather?"], params)
    [call] = tool_calls.parse(whole.text, FORCED_WEATHER)[1]
    assert whole.finish_reason == "tool_calls", "liveness: with room, the seeded call ends whole"
    # Cut inside the closing tag (the arguments whole: as the whole call has them), and inside the arguments.
    for max_tokens, whole_arguments in ((len(whole.token_ids) - 6, True), (len(whole.token_ids) // 2, False)):
        [cut_short] = engine.generate(["weather?"], dataclasses.replace(params, max_tokens=max_tokens))
        assert cut_short.finish_reason == "length" and whole.text.startswith(cut_short.text)
        assert tool_calls.parse(cut_short.text, FORCED_WEATHER)[1] == [], "no whole call in it"
        cut = tool_calls.cut(cut_short.text, FORCED_WEATHER)
        assert cut is not None and cut["function"]["name"] == "get_weather"
        so_far = call["function"]["arguments"] if whole_arguments else cut_short.text.split('"arguments":', 1)[1]
        assert cut["function"]["arguments"] == so_far, cut_short.text
