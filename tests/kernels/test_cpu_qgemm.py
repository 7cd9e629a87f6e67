"""The native CPU kernels (engine/kernels/cpu): ggml Q4_0/Q4_1/Q8_0 weights, and the K-quants in the
transcoder's rows (Q4_K, Q5_K, Q6_K), times int8-quantized activations.

Against a float64 reference of the same quantized arithmetic (gguf's dequantizer for the ggml weights,
engine.model.quantized.dequantize_rows for the transcoded ones, itself held to gguf's in test_transcode; the op's
own int8 and scales for the activations), and bit for bit against themselves: a row alone or in any
batch, one thread or two, the scalar path or a SIMD one. Skipped as a whole where the library cannot be
built (no compiler or ninja; engine/kernels/cpu/build.py gives the reason).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="gguf (the ggml block formats) is not installed")

from engine.kernels import cpu  # noqa: E402

pytestmark = pytest.mark.usefixtures("native_cpu_kernels", "path_on_this_cpu")

from engine.model.quantized import dequantize_rows  # noqa: E402

Q = gguf.GGMLQuantizationType
QTYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
BLOCK = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q8_0: 34, Q.Q4_K: 24, Q.Q5_K: 40, Q.Q6_K: 36}
K_QUANTS = {Q.Q4_K, Q.Q5_K, Q.Q6_K}
# The types with an offset m (w = d * q + m): where it sits in a block, and how wide it is.
OFFSET = {Q.Q4_1: (2, np.float16), Q.Q4_K: (4, np.float32), Q.Q5_K: (4, np.float32)}
QUANT_BYTES = {Q.Q4_0: 16, Q.Q4_1: 16, Q.Q8_0: 32, Q.Q4_K: 16, Q.Q5_K: 32, Q.Q6_K: 32}
# Each type's largest quant magnitude as a byte: nibbles of 15, Q8_0's -128, Q5_K's 31, Q6_K's -32.
EXTREME = {Q.Q4_0: 0xFF, Q.Q4_1: 0xFF, Q.Q8_0: 0x80, Q.Q4_K: 0xFF, Q.Q5_K: 31, Q.Q6_K: 0xE0}
SIMD = ["avx2", "avx512", "amx"]  # by name: only the built library knows which this CPU runs (path_on_this_cpu)


def random_blocks(qtype: Q, n: int, k: int, seed: int) -> np.ndarray:
    """Rows uint8 [n, k/32 * block bytes] built byte by byte: every nibble and int8 value (Q8_0's -128, Q5_K's
    0..31, Q6_K's -32..31 and sub-scales of every int8 value), with scales and offsets of both signs over a
    few octaves, fp16 or fp32 as the type keeps them."""
    rs = np.random.RandomState(seed)
    blocks = rs.randint(0, 256, size=(n, k // 32, BLOCK[qtype]), dtype=np.uint8)
    wide = np.float32 if qtype in (Q.Q4_K, Q.Q5_K) else np.float16
    scales = (rs.uniform(0.5, 2.0, (n, k // 32, 2)) * rs.choice([-1, 1], (n, k // 32, 2))
              * 2.0 ** rs.randint(-10, -4, (n, k // 32, 2))).astype(wide)
    size = np.dtype(wide).itemsize
    blocks[..., 0:size] = np.ascontiguousarray(scales[..., 0:1]).view(np.uint8)
    if qtype in OFFSET:
        blocks[..., size:2 * size] = np.ascontiguousarray(scales[..., 1:2]).view(np.uint8)
    if qtype == Q.Q5_K:
        blocks[..., 8:] %= 32
    if qtype == Q.Q6_K:
        blocks[..., 4:] = (blocks[..., 4:] % 64).astype(np.int16) - 32
    return blocks.reshape(n, -1)


def dequantized(raw: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 [n, k]: the weights' exact values."""
    if qtype in K_QUANTS:
        return dequantize_rows(torch.from_numpy(np.ascontiguousarray(raw)), qtype, raw.shape[1] // BLOCK[qtype] * 32).numpy()
    return gguf.quants.dequantize(raw, qtype)


def activations(m: int, k: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, 1, generator=g))  # rows of unlike scale
    return x.to(dtype)


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def reference(raw: np.ndarray, qtype: Q, q: torch.Tensor, d: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(y, bound) float64 [M, N]: y = a @ w.T with a = q * d and w = gguf's dequantization; bound the
    rounding the kernel may add: 2^-24 for each of its fp32 roundings (a product and an fma per term,
    Q4_1's two terms a block) times the sum of the terms' magnitudes, plus gguf's own fp32 rounding of
    each Q4_1 weight d * q + m."""
    m, k = q.shape
    n, nb = raw.shape[0], k // 32
    w = dequantized(raw, qtype).astype(np.float64).reshape(n, nb, 32)                   # [N, nb, 32]
    a = (q.double().view(m, nb, 32) * d.double()[..., None]).numpy()                   # [M, nb, 32]
    y = np.einsum("mbk,nbk->mn", a, w)
    if qtype in OFFSET:
        at, wide = OFFSET[qtype]
        size = np.dtype(wide).itemsize
        offset = raw.reshape(n, nb, BLOCK[qtype])[..., at:at + size].copy().view(wide).astype(np.float64)
        scaled = np.abs(np.einsum("mbk,nbk->mnb", a, w - offset))
        terms = scaled + np.abs(np.einsum("mb,nb->mnb", a.sum(-1), offset[..., 0]))
        roundings = 4 * nb
    else:
        terms = np.abs(np.einsum("mbk,nbk->mnb", a, w))
        roundings = 2 * nb
    bound = 2.0**-24 * (roundings * terms.sum(-1) + np.einsum("mbk,nbk->mn", np.abs(a), np.abs(w)))
    return y, bound


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path", ["scalar", *SIMD])
@pytest.mark.parametrize("n,k", [(64, 64), (200, 576), (576, 160)])
def test_matches_float64_reference_of_the_quantized_arithmetic(qtype: Q, path: str, n: int, k: int) -> None:
    raw = random_blocks(qtype, n, k, seed=n + k)
    x = activations(9, k, seed=k)
    q, d, s = cpu.quantize_q8_1(x, path=path)
    y = cpu.qgemm(q, d, s, cpu.pack(raw, qtype, k), qtype, n, path=path)
    ref, bound = reference(raw, qtype, q, d)
    err = np.abs(y.double().numpy() - ref)
    assert y.dtype == torch.float32 and y.shape == (9, n)
    assert (err <= bound).all(), f"worst error {(err / bound).max():.2f}x the fp32 rounding bound"
    # The bfloat16 output is the fp32 result rounded once.
    y16 = cpu.qgemm(q, d, s, cpu.pack(raw, qtype, k), qtype, n, torch.bfloat16, path=path)
    assert torch.equal(y16, y.to(torch.bfloat16))


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_extreme_blocks_do_not_saturate(qtype: Q) -> None:
    """The largest products the int16 steps see: Q8_0's -128 times activations of +-127, nibbles of 15; and
    the largest Q6_K sum, -32 times its sub-scale -128 on every element (16.6 million, under 2^24)."""
    n, k = 16, 64
    raw = random_blocks(qtype, n, k, seed=1).reshape(n, k // 32, BLOCK[qtype])
    raw[..., -QUANT_BYTES[qtype]:] = EXTREME[qtype]
    if qtype == Q.Q6_K:
        raw[..., 2:4] = 0x80
    raw = raw.reshape(n, -1)
    x = torch.tensor([[1.0] * k, [-1.0] * k, [1.0, -1.0] * (k // 2)])
    q, d, s = cpu.quantize_q8_1(x)
    assert q.abs().max() == 127
    ref, bound = reference(raw, qtype, q, d)
    for path in cpu.cpu_paths():
        y = cpu.qgemm(q, d, s, cpu.pack(raw, qtype, k), qtype, n, path=path)
        assert (np.abs(y.double().numpy() - ref) <= bound).all(), path


@pytest.mark.parametrize("qtype", [t for t in QTYPES if t not in OFFSET or OFFSET[t][1] == np.float16],
                         ids=lambda t: t.name)
def test_fp16_scales_of_every_kind_widen_exactly(qtype: Q) -> None:
    """The packed layout keeps the file's fp16 scales; the scalar path widens them in software, the SIMD
    paths with F16C. Subnormal, zero, negative zero, the largest and the smallest normal scales give the
    reference's products, the same bits on every path."""
    n, k = 16, 64
    raw = random_blocks(qtype, n, k, seed=9).reshape(n, k // 32, BLOCK[qtype])
    kinds = np.array([2.0**-24, 3 * 2.0**-20, 2.0**-14 - 2.0**-24, 0.0, -0.0, 65504.0, 2.0**-14, -2.0**-17],
                     dtype=np.float16)  # subnormals, zeros, extremes
    scales = np.resize(kinds, (n, k // 32, 1)).astype(np.float16)
    raw[..., 0:2] = scales.view(np.uint8)
    if qtype == Q.Q4_1:
        raw[..., 2:4] = scales[::-1].copy().view(np.uint8)
    raw = raw.reshape(n, -1)
    x = activations(3, k, seed=10)
    q, d, s = cpu.quantize_q8_1(x)
    ref, bound = reference(raw, qtype, q, d)
    outputs = [cpu.qgemm(q, d, s, cpu.pack(raw, qtype, k), qtype, n, path=path) for path in cpu.cpu_paths()]
    assert (np.abs(outputs[0].double().numpy() - ref) <= bound).all()
    assert all(torch.equal(outputs[0], other) for other in outputs[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantizer_per_block_scale_rounding_and_sum(dtype: torch.dtype) -> None:
    x = activations(5, 128, seed=3, dtype=dtype)
    x[1, 32:64] = 0  # an all-zero block: scale 0, quants 0
    x[2, :4] = torch.tensor([0.5, 1.5, -2.5, 127.0])  # halves round to even; 127 sets the scale to 1
    x[2, 4:32] = 0
    for path in cpu.cpu_paths():
        q, d, s = cpu.quantize_q8_1(x, path=path)
        blocks = x.float().view(5, 4, 32)
        expect_d = blocks.abs().amax(-1) / 127
        assert torch.equal(d, expect_d), path
        inv = torch.where(expect_d != 0, 1 / expect_d, torch.zeros(()))
        expect_q = torch.round(blocks * inv[..., None]).clamp(-127, 127).to(torch.int8).view(5, 128)
        assert torch.equal(q, expect_q), path
        assert torch.equal(s, q.view(5, 4, 32).sum(-1, dtype=torch.int32)), path
        assert q[2, :4].tolist() == [0, 2, -2, 127] and d[1, 1] == 0 and (q[1, 32:64] == 0).all()


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path", ["auto", "scalar"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_a_row_is_the_same_bits_alone_or_in_any_batch(qtype: Q, path: str, out_dtype: torch.dtype) -> None:
    n, k = 200, 192  # 25 groups of 8 columns: 7 tiles, split over the threads
    packed = cpu.pack(random_blocks(qtype, n, k, seed=7), qtype, k)
    x = activations(64, k, seed=11, dtype=torch.bfloat16)
    alone = torch.cat([cpu.qlinear(x[i:i + 1], packed, qtype, n, out_dtype, path) for i in range(64)])
    rs = np.random.RandomState(5)
    for m in (8, 64, int(rs.randint(2, 64)), int(rs.randint(2, 64))):
        rows = torch.from_numpy(rs.permutation(64)[:m])
        batch = cpu.qlinear(x[rows], packed, qtype, n, out_dtype, path)
        assert torch.equal(batch, alone[rows]), f"rows differ in a batch of {m}"


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("m", [1, 3, 4, 7, 8, 13, 16, 35, 64])  # AMX: 16-row tiles and the rows after
# The last group has 4 columns: after an even number of groups (100 columns), and as the second of a pair
# of groups (108: AVX-512 takes two groups a vector from 12 rows, at any thread count).
@pytest.mark.parametrize("n", [100, 108])
def test_simd_path_is_the_same_bits_as_the_scalar_path(qtype: Q, path: str, m: int, n: int) -> None:
    k = 320
    packed = cpu.pack(random_blocks(qtype, n, k, seed=m), qtype, k)
    x = activations(m, k, seed=m)
    qs = cpu.quantize_q8_1(x, path="scalar")
    qv = cpu.quantize_q8_1(x, path=path)
    assert all(torch.equal(a, b) for a, b in zip(qs, qv)), "the quantizers differ"
    for out_dtype in (torch.float32, torch.bfloat16):
        want = cpu.qgemm(*qs, packed, qtype, n, out_dtype, path="scalar")
        assert torch.equal(cpu.qgemm(*qs, packed, qtype, n, out_dtype, path=path), want)


def test_the_paths_this_cpu_runs_are_listed_in_order_and_auto_gives_their_bits() -> None:
    """The listed paths are a prefix of scalar, AVX2, AVX-512 VNNI, AMX-INT8, and "auto" (what a server runs)
    gives the best one's bits, which the tests above compared with the scalar path's."""
    best = cpu.cpu_paths()[-1]
    packed = cpu.pack(random_blocks(Q.Q8_0, 64, 64, seed=5), Q.Q8_0, 64)
    qs = cpu.quantize_q8_1(activations(3, 64, seed=5), path="scalar")
    assert cpu.cpu_paths() == ["scalar", "avx2", "avx512", "amx"][:len(cpu.cpu_paths())]
    assert torch.equal(cpu.qgemm(*qs, packed, Q.Q8_0, 64), cpu.qgemm(*qs, packed, Q.Q8_0, 64, path=best))


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path", ["auto", "scalar"])
def test_one_thread_or_two_give_the_same_bits(qtype: Q, path: str, threads: None) -> None:
    n, k = 576, 128  # 72 groups of 8 columns: 18 tiles, split in two at two threads
    packed = cpu.pack(random_blocks(qtype, n, k, seed=3), qtype, k)
    x = activations(7, k, seed=3)
    out = {}
    for count in (1, 2):
        torch.set_num_threads(count)
        out[count] = [cpu.qlinear(x, packed, qtype, n, path=path), cpu.qlinear(x[:1], packed, qtype, n, path=path)]
    assert torch.equal(out[1][0], out[2][0]) and torch.equal(out[1][1], out[2][1])


def test_bad_input_raises_a_clear_error() -> None:
    raw = random_blocks(Q.Q4_0, 16, 64, seed=0)
    packed = cpu.pack(raw, Q.Q4_0, 64)
    x = torch.randn(2, 64)
    for bad_k in (torch.randn(2, 48), torch.randn(2, 0)):
        with pytest.raises(ValueError, match="multiple of 32"):
            cpu.quantize_q8_1(bad_k)
        with pytest.raises(ValueError, match="multiple of 32"):
            cpu.qlinear(bad_k, packed, Q.Q4_0, 16)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        cpu.qlinear(x.double(), packed, Q.Q4_0, 16)
    with pytest.raises(ValueError, match="2-D"):
        cpu.qlinear(x.view(1, 2, 64), packed, Q.Q4_0, 16)
    with pytest.raises(ValueError, match="packed weights"):
        cpu.qlinear(x, packed, Q.Q4_0, 24)  # 24 columns need 3 groups, the weight has 2
    with pytest.raises(ValueError, match="packed weights"):
        cpu.qlinear(torch.randn(2, 96), packed, Q.Q4_0, 16)  # K of another weight
    with pytest.raises(ValueError, match="qtype"):
        cpu.qlinear(x, packed, 7, 16)
    with pytest.raises(TypeError, match="out_dtype"):
        cpu.qlinear(x, packed, Q.Q4_0, 16, torch.float16)
    q, d, s = cpu.quantize_q8_1(x)
    with pytest.raises(TypeError, match="activations"):
        cpu.qgemm(q.float(), d, s, packed, Q.Q4_0, 16)
    with pytest.raises(ValueError, match="K/32"):
        cpu.qgemm(q, d[:1], s[:1], packed, Q.Q4_0, 16)
    with pytest.raises(ValueError, match="unknown CPU kernel path"):
        cpu.qlinear(x, packed, Q.Q4_0, 16, path="sse9")
    with pytest.raises(ValueError, match="uint8"):
        cpu.pack(raw[:, :-1], Q.Q4_0, 64)
    with pytest.raises(ValueError, match="Q4_0, Q4_1, Q8_0, Q4_K"):
        cpu.pack(raw, Q.Q5_0, 64)
    if "avx512" not in cpu.cpu_paths():
        with pytest.raises(ValueError, match="no AVX-512"):
            cpu.qlinear(x, packed, Q.Q4_0, 16, path="avx512")
    assert cpu.qlinear(x, packed, Q.Q4_0, 16).shape == (2, 16)  # and the library still works


def test_fake_kernels_give_shapes_and_dtypes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    k, n = 64, 24
    packed = cpu.pack(random_blocks(Q.Q4_1, n, k, seed=0), Q.Q4_1, k)
    x = torch.randn(5, k, dtype=torch.bfloat16)
    q, d, s = cpu.quantize_q8_1(x)
    ops = torch.ops.workbench
    torch.library.opcheck(ops.quantize_q8_1.default, (x, -1))
    torch.library.opcheck(ops.qgemm.default, (q, d, s, packed, int(Q.Q4_1), n, None, -1))
    torch.library.opcheck(ops.qlinear.default, (x, packed, int(Q.Q4_1), n, torch.bfloat16, -1))
    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(packed)
        fq, fd, fs = ops.quantize_q8_1(fx)
        assert (fq.shape, fq.dtype, fd.shape, fd.dtype, fs.dtype) == ((5, k), torch.int8, (5, 2), torch.float32,
                                                                       torch.int32)
        y = ops.qlinear(fx, fw, int(Q.Q4_1), n, torch.bfloat16)
        assert (y.shape, y.dtype) == ((5, n), torch.bfloat16)
        assert ops.qgemm(fq, fd, fs, fw, int(Q.Q4_1), n).dtype == torch.float32
