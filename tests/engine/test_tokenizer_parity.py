"""Our tokenizer against HF transformers on the same files: encode, decode and chat templates.

The reference is `transformers.AutoTokenizer` loaded from the same directory; every expected value
comes from it, never from a hard-coded list. Besides the shipped demo tokenizer (byte-level BPE, ChatML
template), a second directory built here carries a template that uses bos_token/eos_token, loop
variables, `tojson` and `raise_exception`, so the Jinja environment itself is compared, not just
string concatenation.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engine.loading.model_files import load_tokenizer
from engine.loading.tokenizer import ChatTemplateError, Tokenizer, TokenizerError

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n\tif x:\n\t\treturn x  # tabbed\n\n\n    pass\r\n",
    "a    b     c\n\n\n\n   \n d  ",
    "  leading and trailing spaces  ",
    "Crème brûlée, naïve façade, Ångström, œuvre, São Paulo",
    "日本語のテキストと中文字符，以及한국어",
    "مرحبا بالعالم — שלום עולם (RTL) 123",
    "e\u0301 n\u0303 a\u030a\u0323 Z\u0351\u0352\u0353 decomposed accents",
    "👨\u200d👩\u200d👧\u200d👦 family, 🏳️\u200d🌈 flag, 🇯🇵🇫🇷 flags, 👍🏽 👋🏿 skin tones",
    "<|im_start|>user\nhello<|im_end|>\n",
    "text with <|endoftext|> inside and <|im_end|>at the end<|im_end|>",
    "almost special: <|im_start <im_start|> <|IM_END|>",
    "Hello , world ! It 's fine . Don 't ? I 'm sure they 're here",
    "control \x00 \x1b[31m red \u200b zero-width \ufeff bom",
    "",
    "a" * 2000,
    "=" * 1000 + "\n" * 50,
]
SPECIAL_TEXT = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
FAMILY_EMOJI = "👨\u200d👩\u200d👧\u200d👦"

CONVERSATIONS = {
    "system+user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
    "multi-turn": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?\nThanks."},
    ],
    "unicode": [
        {"role": "user", "content": "Grüße! 你好 👋🏽 مرحبا \"quoted\" and a\ttab"},
        {"role": "assistant", "content": "👨\u200d👩\u200d👧\u200d👦 🇯🇵"},
    ],
    "empty content": [
        {"role": "user", "content": ""},
    ],
}

# A template that exercises the HF Jinja environment: bos/eos tokens, loop variables, filters,
# tojson (with indent, non-ASCII kept as is) and raise_exception for a role it does not accept.
CUSTOM_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}\n"
    "  {% if message['role'] not in ['system', 'user', 'assistant'] %}\n"
    "    {{ raise_exception('Unsupported role: ' + message['role']) }}\n"
    "  {% endif %}\n"
    "  [{{ loop.index }}/{{ messages | length }}] {{ message['role'] | upper }}: "
    "{{ message['content'] | tojson }}\n"
    "  {{ message | tojson(indent=2) }}{% if loop.last %}{{ eos_token }}{% endif %}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


# Jinja features real chat templates use, each rendered by ours and by HF on one conversation.
TEMPLATE_FEATURES = [
    pytest.param("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.content }}|"
                 "{% endfor %}", id="break"),
    pytest.param("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                 "{{ loop.index0 }}{{ m.role }}{% endfor %}", id="continue"),
    pytest.param("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}"
                 "{% endfor %}{{ ns.n }}", id="namespace"),
    pytest.param("{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
                 "{% set rest = messages[1:] %}{% else %}{% set sys = '' %}{% set rest = messages %}{% endif %}"
                 "<<{{ sys | trim }}>>{% for m in rest %}{{ m['role'][0] }}:{{ m['content'] }}{% endfor %}",
                 id="system-slice"),
    pytest.param("{% for m in messages %}{{ m.content.strip().split(' ') | join('_') }}"
                 "{{ m.role.startswith('sys') }}{% endfor %}", id="string-methods"),
    pytest.param("{%- for m in messages -%}\n    {{- m.role }}\n\n  {% if not loop.last %},{% endif %}\n"
                 "{%- endfor -%}\n", id="whitespace-control"),
    pytest.param("{{ messages[0] | tojson(sort_keys=True) }}", id="tojson-sort_keys"),
    pytest.param("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                 "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
                 id="generation-tag"),
    pytest.param("{{ tools is none }}{% if tools is not none %}TOOLS{% endif %}", id="tools-is-none"),
    pytest.param("{{ pad_token }}", id="pad_token"),
]


def hf_chat_ids(hf, messages, add_generation_prompt: bool) -> list[int]:
    out = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                 return_dict=True)
    return list(out["input_ids"])


def tokenizer_dir(root: Path, demo_dir: Path, config: dict, jinja: str | None = None) -> Path:
    """A directory with the demo tokenizer.json and the given tokenizer_config.json (and template file)."""
    root.mkdir()
    shutil.copy(demo_dir / "tokenizer.json", root / "tokenizer.json")
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if jinja is not None:
        (root / "chat_template.jinja").write_text(jinja, encoding="utf-8")
    return root


@pytest.fixture(scope="module", params=["demo", "demo.gguf", pytest.param("smollm2", marks=pytest.mark.smollm2)])
def pair(request, demo_dir):
    """(ours, HF's) for the demo directory, the demo written as GGUF (our tokenizer built from GGUF
    metadata against transformers' own GGUF reading), and the real SmolLM2 GGUF."""
    if request.param == "demo":
        return Tokenizer.from_dir(demo_dir), AutoTokenizer.from_pretrained(demo_dir)
    from tests.hf_gguf import hf_tokenizer  # imports gguf, which the GPU machine's python lacks

    path = request.getfixturevalue("demo_gguf" if request.param == "demo.gguf" else "smollm2_gguf")
    return load_tokenizer(path), hf_tokenizer(path)


@pytest.fixture(scope="module")
def custom_pair(demo_dir, tmp_path_factory):
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # The AddedToken spelling HF writes; ours must read its "content".
        "bos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": True},
        "eos_token": "<|im_end|>",
        "chat_template": CUSTOM_TEMPLATE,
    }
    path = tokenizer_dir(tmp_path_factory.mktemp("custom") / "tok", demo_dir, config)
    return Tokenizer.from_dir(path), AutoTokenizer.from_pretrained(path)


# --- encode / decode -------------------------------------------------------------------------------

@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_hf(pair, text):
    ours, hf = pair
    assert ours.encode(text) == hf(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)


def test_a_long_text_is_encoded_as_hf_encodes_it(pair):
    """Texts past GIL_FREE_ENCODE_CHARS go through the backend's batch call (which lets other threads run):
    the same ids, special tokens or not, a multi-byte character straddling nothing in particular."""
    from engine.loading.tokenizer import GIL_FREE_ENCODE_CHARS

    ours, hf = pair
    text = " ".join(TEXTS) * (GIL_FREE_ENCODE_CHARS // len(" ".join(TEXTS)) + 2) + " café ✓"
    assert len(text) >= GIL_FREE_ENCODE_CHARS, "liveness: the long path is taken"
    assert ours.encode(text) == hf(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [True, False])
def test_decode_matches_hf(pair, text, skip):
    ours, hf = pair
    ids = hf(text)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(pair, text):
    ours, _ = pair
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
    if not any(special in text for special in SPECIAL_TEXT):
        assert ours.decode(ours.encode(text)) == text


def test_special_token_text_is_one_token_and_skippable(pair):
    ours, hf = pair
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>")
    specials = {ours.token_id(token) for token in ("<|im_start|>", "<|im_end|>")}
    assert ids[0] in specials and ids[-1] in specials
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_decode_random_ids_matches_hf(pair):
    """Arbitrary id sequences, including specials and byte tokens that form no valid UTF-8."""
    ours, hf = pair
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 60))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_emoji_really_splits_and_prefixes_decode_like_hf(pair):
    """Liveness: a ZWJ emoji spans several byte-level tokens, so a prefix of its ids is not the text."""
    ours, hf = pair
    ids = ours.encode(FAMILY_EMOJI)
    assert len(ids) > 1
    for cut in range(1, len(ids)):
        prefix = ours.decode(ids[:cut])
        assert prefix != FAMILY_EMOJI
        assert prefix == hf.decode(ids[:cut])
    assert ours.decode(ids) == FAMILY_EMOJI


# --- chat template (demo) --------------------------------------------------------------------------

@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_hf(pair, name, add_generation_prompt):
    ours, hf = pair
    messages = CONVERSATIONS[name]
    rendered = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert rendered == hf.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=add_generation_prompt)
    expected_ids = hf_chat_ids(hf, messages, add_generation_prompt)
    assert ours.encode(rendered, add_special_tokens=False) == expected_ids
    assert ours.encode(rendered) == expected_ids


def test_generation_prompt_changes_the_render(pair):
    ours, _ = pair
    messages = CONVERSATIONS["system+user"]
    with_prompt = ours.apply_chat_template(messages, add_generation_prompt=True)
    without = ours.apply_chat_template(messages, add_generation_prompt=False)
    assert with_prompt != without and with_prompt.startswith(without)


@pytest.mark.parametrize("messages, fragment", [
    ("hello", "non-empty list"),
    ({"role": "user", "content": "hi"}, "non-empty list"),
    ([], "non-empty list"),
    (["hello"], "messages[0]"),
    ([{"content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": "hi"}, {"role": "", "content": "x"}], "messages[1].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]"),
    ([{"role": "user", "content": 42}], "messages[0].content"),
])
def test_bad_messages_raise_tokenizer_error(pair, messages, fragment):
    ours, _ = pair
    with pytest.raises(TokenizerError, match=re.escape(fragment)):
        ours.apply_chat_template(messages)


def test_openai_text_parts_and_a_tool_only_assistant_render_as_their_text(pair):
    """What OpenAI clients send: content as text parts (joined with newlines), and an assistant message
    with null content; each renders as the plain-string conversation HF renders."""
    ours, theirs = pair
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "a list?"}]},
             {"role": "assistant", "content": None}, {"role": "user", "content": "go on"}]
    plain = [{"role": "user", "content": "What is\na list?"}, {"role": "assistant", "content": ""},
             {"role": "user", "content": "go on"}]
    assert ours.apply_chat_template(parts) == theirs.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)


# --- chat template (custom Jinja) ------------------------------------------------------------------

@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_custom_template_matches_hf(custom_pair, name, add_generation_prompt):
    ours, hf = custom_pair
    messages = CONVERSATIONS[name]
    rendered = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert rendered == hf.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=add_generation_prompt)
    assert rendered.startswith("<|endoftext|>")  # bos_token reached the template
    assert ours.encode(rendered, add_special_tokens=False) == hf_chat_ids(hf, messages, add_generation_prompt)


def test_custom_template_rejects_role_with_its_message(custom_pair):
    ours, hf = custom_pair
    messages = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]
    with pytest.raises(Exception) as hf_error:
        hf.apply_chat_template(messages, tokenize=False)
    with pytest.raises(ChatTemplateError) as our_error:
        ours.apply_chat_template(messages)
    assert str(our_error.value) == str(hf_error.value) == "Unsupported role: tool"


@pytest.mark.parametrize("template", TEMPLATE_FEATURES)
def test_template_feature_matches_hf(demo_dir, tmp_path, template):
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "chat_template": template}
    path = tokenizer_dir(tmp_path / "tok", demo_dir, config)
    ours, hf = Tokenizer.from_dir(path), AutoTokenizer.from_pretrained(path)
    messages = [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "hi there é"},
                {"role": "assistant", "content": "ok"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=False) == hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False)


@pytest.mark.parametrize("template, fragment", [
    pytest.param("{% for %}", "does not parse", id="syntax"),
    pytest.param("{{ nothing.attr }}", "'nothing' is undefined", id="undefined"),
    pytest.param("{{ messages[0]['content'] + 1 }}", "concatenate", id="python-error"),
])
def test_broken_template_raises_chat_template_error(demo_dir, tmp_path, template, fragment):
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
    ours = Tokenizer.from_dir(tokenizer_dir(tmp_path / "tok", demo_dir, config))
    with pytest.raises(ChatTemplateError, match=re.escape(fragment)):
        ours.apply_chat_template([{"role": "user", "content": "hi"}])


def test_cleanup_flag_on_bpe_decodes_like_hf(demo_dir, tmp_path):
    """Llama 3's tokenizer_config.json sets clean_up_tokenization_spaces=True on a BPE tokenizer."""
    config = {**json.loads((demo_dir / "tokenizer_config.json").read_text()), "clean_up_tokenization_spaces": True}
    path = tokenizer_dir(tmp_path / "tok", demo_dir, config)
    ours, hf = Tokenizer.from_dir(path), AutoTokenizer.from_pretrained(path)
    ids = hf("Hello , world ! It 's fine .")["input_ids"]
    assert ours.decode(ids) == hf.decode(ids)


def test_template_from_jinja_file(demo_dir, tmp_path):
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}
    path = tokenizer_dir(tmp_path / "tok", demo_dir, config, jinja=CUSTOM_TEMPLATE)
    ours, hf = Tokenizer.from_dir(path), AutoTokenizer.from_pretrained(path)
    assert ours.chat_template == CUSTOM_TEMPLATE
    messages = CONVERSATIONS["multi-turn"]
    assert ours.apply_chat_template(messages) == hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def test_chat_ids_carry_one_bos_when_the_tokenizer_adds_bos_too(demo_dir, tmp_path):
    """Llama 3 style: the post-processor adds BOS and the template writes it as well. HF tokenizes a
    rendered chat without special tokens; so must we, or the model sees two BOS tokens."""
    from tokenizers import Tokenizer as Backend, processors

    backend = Backend.from_file(str(demo_dir / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", backend.token_to_id("<|endoftext|>"))])
    root = tmp_path / "bos"
    root.mkdir()
    backend.save(str(root / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "chat_template": template}))
    ours, hf = Tokenizer.from_dir(root), AutoTokenizer.from_pretrained(root)
    messages = [{"role": "user", "content": "hi there"}]
    bos = backend.token_to_id("<|endoftext|>")
    assert ours.encode("hi")[0] == bos  # liveness: plain encode really adds BOS with this tokenizer
    ids = ours.encode_chat(messages, add_generation_prompt=False)
    assert ids == hf_chat_ids(hf, messages, add_generation_prompt=False)
    assert ids.count(bos) == 1
