"""IncrementalDetokenizer on the demo (byte-level BPE) tokenizer: split characters and stop strings.

Every expectation is derived from the tokenizer's own full decode of the same ids, and each test checks
that its case really exercises what it claims (a character split across tokens, a stop string spread
over several tokens, a held-back tail).
"""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken

from engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from engine.loading.sentencepiece_vocab import sentencepiece_backend
from engine.loading.tokenizer import Tokenizer

MIXED_TEXT = "Hello 😀 world, 你好世界, café naïve 🎉! Ünïcödé ends here"
STORY = "The quick brown fox says STOP here and then more, 你好世界 again 😀 done"


@pytest.fixture(scope="module")
def tokenizer(demo_dir) -> Tokenizer:
    return Tokenizer.from_dir(demo_dir)


def encode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text, "the demo tokenizer must round-trip the test text"
    return ids


def stream(tokenizer, ids, stop=(), final_at_end=False):
    """Feeds ids one token at a time. Returns a list of (delta, stop_hit) per step, and the detokenizer."""
    detok = IncrementalDetokenizer(tokenizer, tuple(stop))
    steps = []
    for n in range(1, len(ids) + 1):
        final = final_at_end and n == len(ids)
        steps.append(detok.update(ids[:n], final))
        if steps[-1][1]:
            break
    return steps, detok


def test_split_characters_stream_whole(tokenizer):
    ids = encode(tokenizer, MIXED_TEXT)
    steps, detok = stream(tokenizer, ids)
    deltas = [delta for delta, _ in steps]
    assert "".join(deltas) == MIXED_TEXT
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)
    assert not any(hit for _, hit in steps)
    sent = ""
    held_for_incomplete_char = 0
    for n, delta in enumerate(deltas, start=1):
        sent += delta
        assert MIXED_TEXT.startswith(sent)
        if tokenizer.decode(ids[:n]).endswith(REPLACEMENT_CHAR):
            # The prefix ends inside a character: the half character must not be sent.
            assert len(sent) < len(tokenizer.decode(ids[:n]))
            held_for_incomplete_char += delta == ""
    # The text really splits characters across tokens, and some step sent nothing because of it.
    assert held_for_incomplete_char >= 1
    assert detok.text == MIXED_TEXT and detok.sent_chars == len(MIXED_TEXT)
    # A final call with nothing new sends nothing more.
    assert detok.update(ids, final=True) == ("", False)


@pytest.mark.parametrize("text", ["ab😀", "x 你好", "naïve 🎉🎉"])
def test_final_flushes_an_incomplete_trailing_character(tokenizer, text):
    ids = encode(tokenizer, text)
    cut = ids[:-1]
    cut_text = tokenizer.decode(cut)
    assert cut_text.endswith(REPLACEMENT_CHAR), "cutting the last token must leave a broken character"
    detok = IncrementalDetokenizer(tokenizer, ())
    deltas = [detok.update(cut[:n], final=False)[0] for n in range(1, len(cut))]
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)
    final_delta, hit = detok.update(cut, final=True)
    assert not hit
    assert final_delta.endswith(REPLACEMENT_CHAR)
    assert "".join(deltas) + final_delta == cut_text


def test_text_without_final_holds_back_the_incomplete_character(tokenizer):
    ids = encode(tokenizer, "ab😀")
    detok = IncrementalDetokenizer(tokenizer, ())
    for n in range(1, len(ids)):
        delta, _ = detok.update(ids[:n], final=False)
        assert REPLACEMENT_CHAR not in delta and REPLACEMENT_CHAR not in detok.text
    assert detok.update(ids, final=False)[0].endswith("😀")


def spans_several_tokens(tokenizer, ids, stop):
    return not any(stop in tokenizer.decode([token]) for token in ids)


@pytest.mark.parametrize("text, stop", [
    (STORY, "STOP"),
    (STORY, " brown fox"),
    (STORY, "你好世界"),
    (STORY, "again 😀"),
    (MIXED_TEXT, "café naïve"),
    (MIXED_TEXT, "ld, 你"),
])
def test_stop_string_over_several_tokens(tokenizer, text, stop):
    ids = encode(tokenizer, text)
    assert spans_several_tokens(tokenizer, ids, stop)
    position = text.index(stop)
    # The step whose token completes the first occurrence.
    completes = next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n]))
    assert completes < len(ids), "the test text must go on after the stop string"
    steps, detok = stream(tokenizer, ids, stop=(stop,))
    hits = [hit for _, hit in steps]
    assert len(steps) == completes and hits[-1] and not any(hits[:-1])
    sent = ""
    for delta, _ in steps:
        sent += delta
        assert len(sent) <= position, "a character of the stop string was sent"
    assert sent == text[:position]
    assert detok.sent_chars == position


@pytest.mark.parametrize("stops", [
    ("then", "fox", "says"),
    ("says", "then", "fox"),
    ("fox says", "says"),   # both complete on the same token: the earlier occurrence wins
    ("says", "fox says"),
    ("界 again", "你好"),
])
def test_several_stop_strings_the_earliest_occurrence_wins(tokenizer, stops):
    ids = encode(tokenizer, STORY)
    first = min(STORY.index(s) for s in stops)
    steps, _ = stream(tokenizer, ids, stop=stops)
    assert steps[-1][1]
    assert "".join(delta for delta, _ in steps) == STORY[:first]
    # All at once (several tokens in one update): the same cut.
    assert IncrementalDetokenizer(tokenizer, stops).update(ids, final=False) == (STORY[:first], True)


@pytest.mark.parametrize("text, stop", [
    (STORY, "STOPPED"),          # "STOP" is held back until " here" rules the stop string out
    (STORY, "then less"),        # "then" is held back until " more" arrives
    (STORY, "again 😀 don't"),   # held through the split emoji, released at "done"
    (STORY, "你好世界!"),         # CJK characters held back, then released at " again"
    (MIXED_TEXT, "world peace"),
])
def test_a_diverging_stop_prefix_is_released(tokenizer, text, stop):
    assert stop not in text
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, (stop,))
    sent = ""
    held_steps = 0
    for n in range(1, len(ids) + 1):
        delta, hit = detok.update(ids[:n], final=n == len(ids))
        assert not hit
        sent += delta
        full = tokenizer.decode(ids[:n]).rstrip(REPLACEMENT_CHAR)
        assert full.startswith(sent)
        unsent = full[len(sent):]
        if unsent:
            # Only a tail that can still become the stop string may be held back.
            assert stop.startswith(unsent), (n, unsent)
            held_steps += 1
    assert sent == text
    assert held_steps >= 1, "the test text must make the detokenizer hold something back"


def test_held_prefix_of_stop_is_released_once_it_cannot_match(tokenizer):
    text = "The quick brown fox says STOP here"
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, ("STOPPED",))
    for n in range(1, len(ids) + 1):
        detok.update(ids[:n], final=False)
        decoded = tokenizer.decode(ids[:n])
        if decoded.endswith("STOP"):
            assert detok.sent_chars == len(decoded) - len("STOP"), "STOP could still become STOPPED"
    # Not final, yet everything was sent: " here" ruled the stop string out.
    assert detok.sent_chars == len(text)


def test_final_releases_a_trailing_stop_prefix(tokenizer):
    text = "The quick brown fox says ST"
    ids = encode(tokenizer, text)
    steps, detok = stream(tokenizer, ids, stop=("STOP",))
    assert "".join(d for d, _ in steps) == text[: text.index("ST")]
    delta, hit = detok.update(ids, final=True)
    assert (delta, hit) == ("ST", False)
    assert detok.sent_chars == len(text)


@pytest.mark.parametrize("text, stop", [
    ("hello world", "wor"),
    ("Hello 😀 world", "ell"),
    (STORY, "ick"),
    (STORY, "Th"),     # at the very first token
])
def test_stop_string_inside_one_token(tokenizer, text, stop):
    ids = encode(tokenizer, text)
    holders = [n for n, token in enumerate(ids) if stop in tokenizer.decode([token])]
    assert holders, "the stop string must lie inside a single token"
    steps, detok = stream(tokenizer, ids, stop=(stop,))
    assert len(steps) == holders[0] + 1
    assert steps[-1][1] and not any(hit for _, hit in steps[:-1])
    assert "".join(d for d, _ in steps) == text[: text.index(stop)]
    assert stop in detok.text


@pytest.mark.parametrize("tokens_per_update", [1, 2, 3])
@pytest.mark.parametrize("text", [MIXED_TEXT, STORY, "😀😀😀 a🎉b 你好 ok"])
def test_the_text_at_every_step_is_the_whole_outputs_decode(tokenizer, text, tokens_per_update):
    """Each update decodes only a window of the newest tokens; what it has read must still be exactly the
    whole output's decode, its incomplete last character held back, whether tokens come one at a time or
    several at once (a burst)."""
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, ())
    cut_inside_a_character = 0
    for n in list(range(tokens_per_update, len(ids), tokens_per_update)) + [len(ids)]:
        detok.update(ids[:n], final=False)
        whole = tokenizer.decode(ids[:n])
        cut_inside_a_character += whole.endswith(REPLACEMENT_CHAR)
        assert detok.text == whole.rstrip(REPLACEMENT_CHAR), f"after {n} tokens"
    assert detok.text == text and cut_inside_a_character >= 1, "liveness: some step ended inside a character"


# A SentencePiece-style vocabulary (Llama 2, Mistral, Gemma): spaces spelled "▁", a space prefixed on
# encode and stripped on decode, and every character outside the vocabulary spelled as its UTF-8 bytes,
# one <0xNN> token each, so an emoji takes four tokens and a CJK character three.
SP_PIECES = (["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
             + [SPACE_PIECE := "\u2581"] + list("abcdefghijklmnopqrstuvwxyzSTOP,")
             + ["he", "\u2581t", "\u2581th", "\u2581the", "\u2581f", "\u2581fo", "\u2581fox", "\u2581S", "\u2581ST",
                "\u2581STO", "\u2581STOP", "ys", "\u2581s", "\u2581sa", "\u2581says"])


@pytest.fixture(scope="module")
def sp_tokenizer() -> Tokenizer:
    scores = [-float(i) for i in range(len(SP_PIECES))]
    backend = sentencepiece_backend(SP_PIECES, scores, gemma=False, add_space_prefix=True, unknown="<unk>")
    backend.add_special_tokens([AddedToken("</s>", special=True)])
    return Tokenizer(backend, {"unk_token": "<unk>", "eos_token": "</s>"}, None)


FRAGMENTS = ["The", " quick", " fox", " says", " STOP", " here", " 😀", "🎉", " 你好", "世界", " café", " naïve",
             ",", "!", " a", "b", " the", " Ünï", "cödé"]


def whole_output_visible(tokenizer, ids, stops, final):
    """What a client may have seen after `ids`, by the rules in engine/detokenizer.py applied to a decode
    of the whole output: the reference the window decode must equal."""
    text = tokenizer.decode(ids)
    if not final:
        text = text.rstrip(REPLACEMENT_CHAR)
    found = [text.find(s) for s in stops if s in text]
    if found:
        return text[:min(found)], True
    if final:
        return text, False
    held = max((k for k in range(1, len(text) + 1) for s in stops if len(s) > k and s.startswith(text[-k:])),
               default=0)
    return text[:len(text) - held], False


@pytest.mark.parametrize("which", ["byte-level", "sentencepiece"])
@pytest.mark.parametrize("seed", range(12))
def test_random_streams_equal_the_whole_output_rules(tokenizer, sp_tokenizer, which, seed):
    """Random texts of mixed scripts, tokens arriving 1-4 at a time, stop strings cut from the text (so
    they span tokens and split characters) or absent: after every update, what was sent and whether a
    stop string hit equal the whole-output reference."""
    tok = tokenizer if which == "byte-level" else sp_tokenizer
    rng = random.Random(seed)
    text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(8, 30)))
    ids = encode(tok, text)
    stops = ["never in the text"]
    for _ in range(rng.randint(0, 3)):
        start = rng.randrange(len(text) // 3, len(text))  # late enough that some steps come before it
        stops.append(text[start: start + rng.randint(1, 8)])
    if rng.random() < 0.3:
        stops = stops[:1]  # no stop string matches: the stream runs to the end, final flushes
    detok = IncrementalDetokenizer(tok, tuple(stops))
    sent, n, compared = "", 0, 0
    while n < len(ids):
        n = min(len(ids), n + rng.randint(1, 4))
        final = n == len(ids)
        delta, hit = detok.update(ids[:n], final)
        sent += delta
        # A byte-fallback decode of a whole output that ends inside a character also breaks the complete
        # character before it (ByteFallback replaces a whole run of byte tokens that is not valid UTF-8),
        # so the reference is only exact where the output ends on a whole character.
        if final or not tok.decode(ids[:n]).endswith(REPLACEMENT_CHAR):
            assert (sent, hit) == whole_output_visible(tok, ids[:n], stops, final), f"after {n} tokens"
            compared += 1
        if hit:
            break
    assert compared >= 2


@pytest.mark.parametrize("text", ["The fox says 😀🎉 你好世界", "😀 the STOP, naïve 世界 fox"])
def test_sentencepiece_byte_tokens_stream_whole_characters(sp_tokenizer, text):
    """Byte-fallback tokens split every emoji and CJK character over several tokens; the decoder strips
    the prefixed space from the start of a decode, which a window starting mid-output must not lose."""
    ids = encode(sp_tokenizer, text)
    assert sum(SP_PIECES[i].startswith("<0x") for i in ids) >= 6, "liveness: characters come as byte tokens"
    steps, detok = stream(sp_tokenizer, ids)
    deltas = [delta for delta, _ in steps]
    assert "".join(deltas) == text and not any(REPLACEMENT_CHAR in d for d in deltas)
    assert detok.text == text


@pytest.mark.parametrize("make", ["byte-level", "sentencepiece"])
def test_a_skipped_special_token_mid_output_keeps_the_next_space(tokenizer, sp_tokenizer, make):
    """A special token decodes to nothing (it is skipped), so a window must not start at it: a decode
    that starts there strips the space of the next token (SentencePiece's decoder does), which the whole
    output's decode keeps."""
    tok = tokenizer if make == "byte-level" else sp_tokenizer
    eos = tok.token_id(tok.eos_token)
    # SentencePiece encodes each piece with its space in front (and decodes it without).
    pieces = ["The fox", "says the", "fox 😀"] if make == "sentencepiece" else ["The fox", " says the", " fox 😀"]
    ids = encode(tok, pieces[0]) + [eos] + encode(tok, pieces[1]) + [eos, eos] + encode(tok, pieces[2])
    expected = tok.decode(ids)
    for tokens_per_update in (1, 2, 3):
        detok = IncrementalDetokenizer(tok, ())
        sent = "".join(detok.update(ids[:n], final=False)[0]
                       for n in list(range(tokens_per_update, len(ids), tokens_per_update)) + [len(ids)])
        assert sent == expected == "The fox says the fox 😀"
