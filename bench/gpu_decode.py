"""Decode throughput of a random-weight ~1.2B Llama (Llama-3.2-1B's shape) on a GPU, in bf16.

    python bench/gpu_decode.py [--batches 1,16] [--new-tokens 128]

Modes, side by side in one run: eager decode, captured CUDA graphs, graphs + the device loop. For
each: tokens/s and the fraction of the HBM-bandwidth roofline (every decode step must read all weights
and every sequence's KV history once; `--hbm-tbps` is the memory bandwidth, 4.8 TB/s for an H200).
The model directory is written to a temporary folder (random weights; nothing comes from a network).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine import Engine, EngineConfig, SamplingParams
from engine.loader import DEMO_MODEL_DIR
from engine.model import LlamaForCausalLM, ModelConfig

LLAMA_3_2_1B = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                    max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def write_random_model(folder: Path) -> int:
    config = ModelConfig.from_hf_dict(LLAMA_3_2_1B)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02) if param.dim() == 2 else param.fill_(1.0)
    state = {k: v.cpu().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({**LLAMA_3_2_1B, "architectures": ["LlamaForCausalLM"]}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_MODEL_DIR / name, folder / name)
    return sum(p.numel() for p in model.parameters())


def roofline_tokens_per_s(parameters: int, batch: int, context: int, hbm_bytes_per_s: float) -> float:
    c = LLAMA_3_2_1B
    kv_bytes = batch * context * c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * 2
    return batch / ((parameters * 2 + kv_bytes) / hbm_bytes_per_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hbm-tbps", type=float, default=4.8)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-1b-"))
    parameters = write_random_model(folder)
    print(f"random Llama-3.2-1B-shaped model: {parameters / 1e9:.2f}B parameters, bf16, "
          f"{torch.cuda.get_device_name()}", flush=True)
    modes = {"eager": dict(graphs=False, device_loop=False),
             "graphs": dict(graphs=True, capture_stream=True, device_loop=False),
             "graphs+loop": dict(graphs=True, capture_stream=True, device_loop=True)}
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
    print(f"{'batch':>5} {'mode':>12} {'tok/s':>9} {'roofline':>9} {'vs eager':>9}")
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = [torch.randint(0, 4096, (args.prompt_tokens,)).tolist() for _ in range(batch)]
        context = args.prompt_tokens + args.new_tokens // 2
        roof = roofline_tokens_per_s(parameters, batch, context, args.hbm_tbps * 1e12)
        base = None
        for name, flags in modes.items():
            engine = Engine(EngineConfig(model=str(folder), device="cuda", dtype="bfloat16", kv_cache_mb=4096, **flags))
            engine.generate(prompts, params)  # warm-up: captures graphs, settles the allocator
            times = []
            for _ in range(args.repeats):
                torch.cuda.synchronize()
                start = time.perf_counter()
                engine.generate(prompts, params)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            rate = batch * args.new_tokens / statistics.median(times)
            base = base or rate
            print(f"{batch:>5} {name:>12} {rate:>9.1f} {rate / roof:>8.1%} {rate / base:>8.2f}x", flush=True)
            del engine
            torch.cuda.empty_cache()
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
