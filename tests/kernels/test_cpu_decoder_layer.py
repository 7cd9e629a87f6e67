"""The native fused decoder layer (engine/kernels/cpu/decoder_layer.cpp): a Llama-family block of a serving
step in one call, the residual stream in fp32.

Against a float64 reference of the block (gguf's dequantized weights, the activations quantized where the
op quantizes them), and bit for bit against itself: a token alone or beside other sequences' tokens, a
prompt whole or in chunks, one thread or two, the scalar path or a SIMD one. Skipped as a whole where
the library cannot be built.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="gguf (the ggml block formats) is not installed")

from engine.kernels import cpu  # noqa: E402
from engine.model.quantized import dequantize_rows  # noqa: E402  (held to gguf's: test_quantized_linear, test_transcode)

pytestmark = pytest.mark.usefixtures("native_cpu_kernels", "path_on_this_cpu")

Q = gguf.GGMLQuantizationType
BLOCK_BYTES = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q8_0: 34, Q.Q4_K: 24, Q.Q5_K: 40, Q.Q6_K: 36}
SIMD = ["avx2", "avx512", "amx"]  # by name: only the built library knows which this CPU runs (path_on_this_cpu)
D, H, HKV, HD, INTER = 64, 4, 2, 16, 96
BLOCK, NUM_BLOCKS = 4, 32
EPS = 1e-5
# Of the largest |output - input| (what the block adds to the residual). Seen: up to 3.5e-7, fp32 rounding
# only. The op quantizes four activations to int8 where the reference does too, from values that differ
# in the last fp32 bits: an int8 landing one step apart would cost up to about 1e-3 of one product, and
# at these seeds none does.
TOLERANCE = 1e-5


def random_blocks(qtype: Q, n: int, k: int, rs: np.random.RandomState) -> np.ndarray:
    """ggml rows, or for the K-quants the transcoder's rows (engine/loading/transcode.py), with weights of
    about the same size whatever the type."""
    blocks = rs.randint(0, 256, size=(n, k // 32, BLOCK_BYTES[qtype]), dtype=np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K):
        affine = (rs.uniform(0.5, 2.0, (n, k // 32, 2)) * rs.choice([-1, 1], (n, k // 32, 2)) * 2.0**-7)
        blocks[..., 0:8] = np.ascontiguousarray(affine.astype(np.float32)).view(np.uint8)
        if qtype == Q.Q5_K:
            blocks[..., 8:] %= 32
        return blocks.reshape(n, -1)
    if qtype == Q.Q6_K:
        d = (rs.uniform(0.5, 2.0, (n, k // 32, 1)) * rs.choice([-1, 1], (n, k // 32, 1)) * 2.0**-12).astype(np.float16)
        blocks[..., 0:2] = d.view(np.uint8)
        blocks[..., 4:] = (blocks[..., 4:] % 64).astype(np.int16) - 32
        return blocks.reshape(n, -1)
    scales = (rs.uniform(0.5, 2.0, (n, k // 32, 2)) * rs.choice([-1, 1], (n, k // 32, 2)) * 2.0**-6).astype(np.float16)
    blocks[..., 0:2] = np.ascontiguousarray(scales[..., 0:1]).view(np.uint8)
    if qtype == Q.Q4_1:
        blocks[..., 2:4] = np.ascontiguousarray(scales[..., 1:2] * np.float16(0.1)).view(np.uint8)
    return blocks.reshape(n, -1)


@dataclass
class Layer:
    """A layer's weights twice: as the op takes them and dequantized in float64 for the reference."""
    weights: cpu.LayerWeights
    dense: dict[str, torch.Tensor]  # float64: attn_norm, qkv, bias, q_norm, k_norm, o, ffn_norm, gate_up, down


def make_layer(seed: int, bias: bool = False, qk_norm: bool = False,
               qtypes: tuple[Q, Q, Q, Q] = (Q.Q4_0, Q.Q8_0, Q.Q4_1, Q.Q8_0), gemma: bool = False) -> Layer:
    """gemma: Gemma 3's block (norms after attention and MLP too, GeGLU) instead of Llama's."""
    rs = np.random.RandomState(seed)
    g = torch.Generator().manual_seed(seed)
    shapes = {"qkv": ((H + 2 * HKV) * HD, D), "o": (D, H * HD), "gate_up": (2 * INTER, D), "down": (D, INTER)}
    packed, dense = {}, {}
    for (name, (n, k)), qtype in zip(shapes.items(), qtypes):
        raw = random_blocks(qtype, n, k, rs)
        packed[name] = cpu.pack(raw, int(qtype), k)
        dense[name] = dequantize_rows(torch.from_numpy(raw), qtype, k).double()
    for name, size in (("attn_norm", D), ("ffn_norm", D), ("q_norm", HD), ("k_norm", HD), ("post_attn_norm", D),
                       ("post_ffn_norm", D)):
        dense[name] = (1 + 0.3 * torch.randn(size, generator=g)).float().double()
    dense["bias"] = (0.5 * torch.randn((H + 2 * HKV) * HD, generator=g)).float().double()
    empty = torch.empty(0)

    def f32(name: str, used: bool = True) -> torch.Tensor:
        return dense[name].float() if used else empty

    weights = cpu.LayerWeights(
        tensors=(f32("attn_norm"), packed["qkv"], f32("bias", bias), f32("q_norm", qk_norm), f32("k_norm", qk_norm),
                 packed["o"], f32("ffn_norm"), packed["gate_up"], packed["down"], f32("post_attn_norm", gemma),
                 f32("post_ffn_norm", gemma)),
        qtypes=tuple(int(t) for t in qtypes),  # type: ignore[arg-type]
        shape=(H, HKV, HD, INTER), activation=cpu.ACTIVATIONS["gelu_pytorch_tanh" if gemma else "silu"])
    if not bias:
        dense["bias"] = torch.zeros_like(dense["bias"])
    if not qk_norm:
        del dense["q_norm"], dense["k_norm"]
    if not gemma:
        del dense["post_attn_norm"], dense["post_ffn_norm"]
    return Layer(weights, dense)


@dataclass
class Step:
    """One step's tokens: sequence b feeds tokens at positions starts[b] .. starts[b] + counts[b] - 1."""
    x: torch.Tensor             # [N, D] float32
    positions: torch.Tensor     # [N]
    sequence: torch.Tensor      # [N]
    slots: torch.Tensor         # [N]
    tables: torch.Tensor        # [B, width]


def make_step(tables: list[list[int]], starts: list[int], counts: list[int], x: torch.Tensor) -> Step:
    positions = [p for s, c in zip(starts, counts) for p in range(s, s + c)]
    sequence = [b for b, c in enumerate(counts) for _ in range(c)]
    slots = [tables[b][p // BLOCK] * BLOCK + p % BLOCK for b, p in zip(sequence, positions)]
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + t[-1:] * (width - len(t)) for t in tables])
    return Step(x.clone(), torch.tensor(positions), torch.tensor(sequence), torch.tensor(slots), padded)


def make_cache(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS * BLOCK, HKV, HD)
    return (torch.randn(shape, generator=g) * 2).to(dtype), torch.randn(shape, generator=g).to(dtype)


def inv_freq() -> torch.Tensor:
    return 1.0 / (10000.0 ** (torch.arange(0, HD, 2).float() / HD))


def run(layer: Layer, step: Step, cache: tuple[torch.Tensor, torch.Tensor], window: int | None = None,
        path: str | None = None) -> torch.Tensor:
    """The op on a copy of step.x (returned); the caches are written in place."""
    x = step.x.clone()
    cos, sin = cpu.rope_tables(step.positions, inv_freq())
    cpu.decoder_layer(x, layer.weights, cos, sin, cache[0], cache[1], step.slots, step.tables, step.sequence,
                      step.positions, BLOCK, window, HD**-0.5, EPS, path=path)
    return x


def reference(layer: Layer, step: Step, cache: tuple[torch.Tensor, torch.Tensor], window: int | None) -> torch.Tensor:
    """The block in float64, the caches written as the op writes them (rounded to their dtype)."""
    w = layer.dense

    def norm(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + EPS) * weight

    def project(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        q, d, _ = cpu.quantize_q8_1(v.float().contiguous())  # quantized where the op quantizes
        return (q.double().view(len(v), -1, 32) * d.double()[..., None]).view(len(v), -1) @ weight.T

    x = step.x.double()
    qkv = (project(norm(x, w["attn_norm"]), w["qkv"]) + w["bias"]).view(len(x), H + 2 * HKV, HD)
    qk = qkv[:, : H + HKV]
    if "q_norm" in w:
        qk = torch.cat([norm(qk[:, :H], w["q_norm"]), norm(qk[:, H:], w["k_norm"])], dim=1)
    angle = (step.positions.float()[:, None] * inv_freq()).double()     # [N, HD/2]
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    a, b = qk[..., : HD // 2], qk[..., HD // 2:]
    qk = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    dtype = cache[0].dtype
    cache[0][step.slots] = qk[:, H:].to(dtype)
    cache[1][step.slots] = qkv[:, H + HKV:].to(dtype)
    q = qk[:, :H].to(dtype).double()
    out = torch.empty(len(x), H, HD, dtype=torch.float64)
    for t in range(len(x)):
        p, table = int(step.positions[t]), step.tables[step.sequence[t]]
        lo = max(0, p - window + 1) if window else 0
        slots = torch.tensor([int(table[j // BLOCK]) * BLOCK + j % BLOCK for j in range(lo, p + 1)])
        keys, values = cache[0][slots].double(), cache[1][slots].double()       # [L, HKV, HD]
        for h in range(H):
            g = h // (H // HKV)
            weights = torch.softmax(keys[:, g] @ q[t, h] * HD**-0.5, dim=0)
            out[t, h] = weights @ values[:, g]
    def post(y: torch.Tensor, name: str) -> torch.Tensor:  # Gemma's norm after attention and after the MLP
        return norm(y, w[name]) if name in w else y

    x = x + post(project(out.to(dtype).view(len(x), -1), w["o"]), "post_attn_norm")
    gate, up = project(norm(x, w["ffn_norm"]), w["gate_up"]).split(INTER, dim=-1)
    act = (torch.nn.functional.gelu(gate, approximate="tanh") if "post_attn_norm" in w
           else torch.nn.functional.silu(gate))
    return x + post(project(act * up, w["down"]), "post_ffn_norm")


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


TABLES = [[5, 9, 2], [7, 0, 11, 3], [1, 4]]  # blocks in no order, never shared


def mixed_step(seed: int) -> Step:
    """A prompt chunk at positions 3-8 (0-2 cached), a decode at 12, a whole prompt of 5."""
    x = torch.randn(12, D, generator=torch.Generator().manual_seed(seed)) * 3
    return make_step(TABLES, [3, 12, 0], [6, 1, 5], x)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("bias,qk_norm,window,qtypes,gemma", [
    (False, False, None, (Q.Q4_0, Q.Q8_0, Q.Q4_1, Q.Q8_0), False),
    (True, False, None, (Q.Q4_0, Q.Q8_0, Q.Q4_1, Q.Q8_0), False),
    (False, True, 4, (Q.Q4_0, Q.Q8_0, Q.Q4_1, Q.Q8_0), False),
    (False, False, None, (Q.Q4_K, Q.Q6_K, Q.Q5_K, Q.Q6_K), False),  # a Q4_K_M file's kinds
    (False, True, 4, (Q.Q8_0, Q.Q4_K, Q.Q8_0, Q.Q6_K), True),  # Gemma 3's block and kinds
], ids=["llama", "qwen2", "qwen3-window", "llama-k-quants", "gemma3-window"])
@pytest.mark.parametrize("path", ["scalar", *SIMD])
def test_matches_a_float64_reference(cache_dtype: torch.dtype, bias: bool, qk_norm: bool, window: int | None,
                                     qtypes: tuple[Q, Q, Q, Q], gemma: bool, path: str) -> None:
    layer = make_layer(1, bias=bias, qk_norm=qk_norm, qtypes=qtypes, gemma=gemma)
    step = mixed_step(2)
    ours, theirs = make_cache(cache_dtype, 3), make_cache(cache_dtype, 3)
    out = run(layer, step, ours, window, path)
    expected = reference(layer, step, theirs, window)
    scale = (expected - step.x.double()).abs().max()
    assert (out.double() - expected).abs().max() <= TOLERANCE * scale
    for mine, want in zip(ours, theirs):  # the step's keys and values, written where the reference wrote them
        assert (mine.double() - want.double()).abs().max() <= TOLERANCE * want.double().abs().max()
        untouched = torch.ones(len(mine), dtype=torch.bool)
        untouched[step.slots] = False
        assert torch.equal(mine[untouched], want[untouched])


@pytest.mark.parametrize("path", ["scalar", *SIMD])
@pytest.mark.parametrize("gemma", [False, True], ids=["llama", "gemma3"])
def test_a_token_is_the_same_bits_alone_or_beside_other_sequences(path: str, gemma: bool) -> None:
    layer = make_layer(4, bias=True, gemma=gemma)
    together = mixed_step(5)
    cache = make_cache(torch.bfloat16, 6)
    out = run(layer, together, cache, path=path)
    for b, (start, count) in enumerate([(3, 6), (12, 1), (0, 5)]):
        rows = (together.sequence == b).nonzero().flatten()
        alone = make_step([TABLES[b]], [start], [count], together.x[rows])
        cache_alone = make_cache(torch.bfloat16, 6)
        assert torch.equal(run(layer, alone, cache_alone, path=path), out[rows]), f"sequence {b}"
        assert torch.equal(cache_alone[0][alone.slots], cache[0][alone.slots])


@pytest.mark.parametrize("window", [None, 3])
def test_a_prompt_whole_or_in_chunks_gives_the_same_bits(window: int | None) -> None:
    layer = make_layer(7, qk_norm=True)
    x = torch.randn(11, D, generator=torch.Generator().manual_seed(8))
    table = [[6, 2, 9]]
    whole_cache = make_cache(torch.bfloat16, 9)
    whole = run(layer, make_step(table, [0], [11], x), whole_cache, window)
    chunked_cache = make_cache(torch.bfloat16, 9)
    parts, start = [], 0
    for count in (4, 1, 5, 1):
        parts.append(run(layer, make_step(table, [start], [count], x[start: start + count]), chunked_cache, window))
        start += count
    assert torch.equal(torch.cat(parts), whole)
    assert all(torch.equal(a, b) for a, b in zip(whole_cache, chunked_cache))


def test_one_thread_or_two_give_the_same_bits(threads: None) -> None:
    layer = make_layer(10, bias=True, qk_norm=True)
    step = make_step(TABLES, [0, 0, 0], [9, 13, 7], torch.randn(29, D, generator=torch.Generator().manual_seed(11)))
    outs = []
    for count in (1, 2):
        torch.set_num_threads(count)
        outs.append(run(layer, step, make_cache(torch.bfloat16, 12)))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("rows", [12, 29])  # 29: the AMX path's one full 16-row tile and the rows after it
def test_simd_path_is_the_same_bits_as_the_scalar_path(path: str, rows: int) -> None:
    layer = make_layer(13, bias=True)
    step = mixed_step(14) if rows == 12 else make_step(
        TABLES, [0, 0, 0], [9, 13, 7], torch.randn(29, D, generator=torch.Generator().manual_seed(14)))
    assert torch.equal(run(layer, step, make_cache(torch.bfloat16, 15), path=path),
                       run(layer, step, make_cache(torch.bfloat16, 15), path="scalar"))


def test_rms_norm_and_rope_tables_match_float64() -> None:
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(16)) * 4
    weight = torch.rand(D, generator=torch.Generator().manual_seed(17)) + 0.5
    expected = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS) * weight.double()
    assert (cpu.rms_norm(x, weight, EPS).double() - expected).abs().max() <= 1e-6 * expected.abs().max()
    positions = torch.tensor([0, 1, 7, 4095, 131071])
    cos, sin = cpu.rope_tables(positions, inv_freq())
    angle = (positions.float()[:, None] * inv_freq()).double()  # the fp32 product, as HF computes it
    assert torch.equal(cos, angle.cos().float()) and torch.equal(sin, angle.sin().float())


def test_bad_input_raises_a_clear_error() -> None:
    layer = make_layer(18)
    step = mixed_step(19)
    cache = make_cache(torch.bfloat16, 20)
    cos, sin = cpu.rope_tables(step.positions, inv_freq())

    def call(weights: cpu.LayerWeights = layer.weights, x: torch.Tensor = step.x, slots: torch.Tensor = step.slots,
             value_cache: torch.Tensor = cache[1]) -> None:
        cpu.decoder_layer(x.clone(), weights, cos, sin, cache[0], value_cache, slots, step.tables, step.sequence,
                          step.positions, BLOCK, None, 0.25, EPS)

    tensors = layer.weights.tensors
    with pytest.raises(ValueError, match="takes 11 weights"):
        call(cpu.LayerWeights(tensors[:8], layer.weights.qtypes, layer.weights.shape))
    with pytest.raises(ValueError, match="come together"):
        call(cpu.LayerWeights(tensors[:9] + (tensors[0], torch.empty(0)), layer.weights.qtypes, layer.weights.shape))
    with pytest.raises(ValueError, match="activation must be 0"):
        call(cpu.LayerWeights(tensors, layer.weights.qtypes, layer.weights.shape, activation=2))
    with pytest.raises(ValueError, match="qkv's qtype must be 2"):
        call(cpu.LayerWeights(tensors, (7, *layer.weights.qtypes[1:]), layer.weights.shape))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"gate_up \[192, 64\] packed must be"):
        call(cpu.LayerWeights(tensors[:7] + (tensors[7][:-1],) + tensors[8:], layer.weights.qtypes, layer.weights.shape))
    with pytest.raises(ValueError, match="must be multiples of 32"):
        call(cpu.LayerWeights(tensors, layer.weights.qtypes, (H, HKV, HD, 100)))
    with pytest.raises(TypeError, match="x must be float32"):
        call(x=step.x.bfloat16())
    with pytest.raises(ValueError, match="token 3's slot 128 is not one of the cache's 128"):
        call(slots=torch.cat([step.slots[:3], torch.tensor([NUM_BLOCKS * BLOCK]), step.slots[4:]]))
    with pytest.raises(TypeError, match="both bfloat16 or both float32"):
        call(value_cache=cache[1].float())


def test_fake_kernels_trace_the_ops() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, D)
        positions = torch.zeros(3, dtype=torch.long)
        cos, sin = cpu.rope_tables(positions, torch.empty(HD // 2))
        assert cos.shape == (3, HD // 2) and sin.dtype == torch.float32
        assert cpu.rms_norm(x, torch.empty(D), EPS).shape == (3, D)
