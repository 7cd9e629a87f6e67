"""Launches per decode step (Engine.step) in each mode: eager, captured graphs, graphs + the device loop,
counted with torch.profiler over a run of decode steps.

    PYTHONPATH=. python bench/decode_launches.py [--layers 16] [--batch 1] [--steps 16] [--device cpu]
        [--decode-backend torch|triton]

On CUDA a launch is what the host submits to the GPU as the profiler's CUDA runtime events record it:
kernel launches, graph launches, copies and memsets. On the CPU each aten op that does work stands in
for a kernel launch: a leaf op (one that calls no other op) that is neither a view nor an allocation,
as those launch nothing on a GPU (the native CPU kernels' ops count alike: run with
WORKBENCH_CPU_KERNEL=off for the torch path, the one CUDA runs but for its Triton attention). The CPU's
graphs replay the eager ops over static buffers, so there
they launch as many; on CUDA one graph launch replaces a step's kernels. The model is Llama-3.2-1B's
shape with random weights (bench/gpu_decode.py); a layer adds the same ops, so `--layers 2` keeps a CPU
run small and the count grows by one layer's ops per layer. bench/gpu_decode.py prints the CUDA count
beside each mode's speed. With `--decode-backend triton` on the CPU the decode step takes the Triton
kernels CUDA takes (paged attention, RoPE + cache write, add + RMSNorm) under Triton's interpreter, each
kernel run counted as one launch: the CPU's stand-in for CUDA's eager count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from engine import Engine, EngineConfig, SamplingParams

# Leaf aten ops that only make views, allocate or read metadata: no kernel on a GPU.
NO_LAUNCH = frozenset(f"aten::{name}" for name in (
    "view", "reshape", "_reshape_alias", "_unsafe_view", "as_strided", "slice", "select", "narrow", "unsqueeze",
    "squeeze", "transpose", "permute", "expand", "expand_as", "t", "alias", "detach", "view_as", "split",
    "split_with_sizes", "chunk", "unbind", "unflatten", "flatten", "movedim", "view_as_real", "view_as_complex",
    "empty", "empty_like", "empty_strided", "resize_", "lift_fresh", "resolve_conj", "resolve_neg", "is_nonzero",
    "size", "stride", "dim", "numel", "result_type", "to", "set_", "contiguous"))
# What the CUDA runtime and driver calls that submit work have in their names.
CUDA_LAUNCHES = ("LaunchKernel", "GraphLaunch", "Memcpy", "Memset")
# The profiler range each Triton kernel run under the interpreter is wrapped in (count_interpreted_triton):
# one launch, whatever torch ops the interpreter runs inside it.
TRITON_RANGE = "triton::"

MODES = {"eager": dict(graphs=False, device_loop=False),
         "graphs": dict(graphs=True, capture_stream=True, device_loop=False),
         "graphs+loop": dict(graphs=True, capture_stream=True, device_loop=True)}


def launches(prof: profile, device: str) -> Counter[str]:
    """The profiled launches by name: CUDA runtime calls on CUDA; on the CPU the ops that do work
    themselves, those none of whose callees does (a composite such as aten::linear is counted in its
    aten::mm, an allocation or a view not at all)."""
    counts: Counter[str] = Counter()
    if device == "cuda":
        for event in prof.events():  # the API calls (cudaLaunchKernel, cuLaunchKernel), not the device's own records
            if event.name.startswith("cu") and any(kind in event.name for kind in CUDA_LAUNCHES):
                counts[event.name] += 1
        return counts
    works: dict[int, bool] = {}

    def below(event) -> bool:  # does any callee of `event` do work?
        return any(does_work(child) or below(child) for child in event.cpu_children)

    def in_triton(event) -> bool:
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith(TRITON_RANGE):
            parent = parent.cpu_parent
        return parent is not None

    def does_work(event) -> bool:
        if id(event) not in works:
            if event.name.startswith(TRITON_RANGE):
                works[id(event)] = True
            else:
                works[id(event)] = "::" in event.name and event.name not in NO_LAUNCH and not below(event) \
                    and not in_triton(event)
        return works[id(event)]

    for event in prof.events():
        if does_work(event):
            counts[event.name] += 1
    return counts


def count_interpreted_triton() -> None:
    """Under Triton's interpreter (the CPU), wrap each kernel run in a profiler range named for the kernel,
    which `launches` counts as one launch (on CUDA the runtime's launch calls are counted instead)."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        with record_function(TRITON_RANGE + self.fn.__name__):
            return run(self, *args, **kwargs)

    InterpretedFunction.run = counted  # type: ignore[method-assign]


def launches_per_step(engine: Engine, prompts: list[list[int]], steps: int) -> tuple[float, Counter[str]]:
    """(launches per decode step, the launches by name over all `steps`) for a batch of `prompts` decoding:
    prefilled and warmed up first, profiled for `steps` steps (a multiple of the burst length averages the
    device loop's bursts fairly), then aborted, leaving the engine idle."""
    params = SamplingParams(max_tokens=steps + 16, temperature=0, ignore_eos=True)
    ids = [f"launches-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    produced = Counter[str]()
    for _ in range(8):  # the prefill, then decode steps until every sequence has two tokens
        for output in engine.step():
            produced[output.request_id] += len(output.token_ids)
        if all(produced[rid] >= 2 for rid in ids):
            break
    device = engine.loaded.device.type
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        if device == "cuda":
            torch.cuda.synchronize()
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished_requests():
        engine.step()
    counts = launches(prof, device)
    return sum(counts.values()) / steps, counts


def main() -> int:
    from bench.gpu_decode import LLAMA_3_2_1B, write_random_model  # it imports this module: not at the top

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=LLAMA_3_2_1B["num_hidden_layers"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--top", type=int, default=0, help="also print each mode's most frequent launches")
    parser.add_argument("--decode-backend", choices=("torch", "triton"),
                        help="every layer's decode attention (default: the engine's choice); triton on the CPU "
                             "runs under Triton's interpreter, each kernel run counted as one launch")
    args = parser.parse_args()
    if args.decode_backend == "triton" and args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
        count_interpreted_triton()
    folder = Path(tempfile.mkdtemp(prefix="bench-launches-"))
    parameters = write_random_model(folder, device=args.device, num_hidden_layers=args.layers)
    print(f"random Llama-3.2-1B-shaped model with {args.layers} layers: {parameters / 1e9:.2f}B parameters, bf16, "
          f"{args.device}; batch {args.batch}, {args.steps} decode steps profiled", flush=True)
    prompts = [torch.randint(0, 4096, (args.prompt_tokens,)).tolist() for _ in range(args.batch)]
    print(f"{'mode':>12} {'launches/step':>14}")
    for name, flags in MODES.items():
        engine = Engine(EngineConfig.from_env(model=str(folder), device=args.device, dtype="bfloat16",
                                              max_model_len=args.prompt_tokens + args.steps + 32, **flags))
        if args.decode_backend:
            engine.loaded.model.set_decode_attention(args.decode_backend)
        per_step, counts = launches_per_step(engine, prompts, args.steps)
        print(f"{name:>12} {per_step:>14.1f}", flush=True)
        for op, count in counts.most_common(args.top):
            print(f"{'':>12} {count / args.steps:>14.1f}  {op}")
        del engine
    shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
