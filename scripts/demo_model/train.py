"""Train the shipped demo model on this machine's CPU and write it as an HF-format directory.

    python -m scripts.demo_model.train --out engine/assets/demo --steps 900

Writes config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json
and training_report.json (held-out loss, greedy samples, timings). The model is our own
`LlamaForCausalLM` trained with plain causal attention; the files are the same ones HF transformers
reads, so the directory also loads unchanged there. Seeds are fixed; a rerun on the same torch build
reproduces the weights.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.nn import functional as F

from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from scripts.demo_model.corpus import split
from scripts.demo_model.tokenizer import END_OF_TEXT, IM_END, train_tokenizer, write_tokenizer_files

ARCHITECTURE = dict(
    model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=640, num_hidden_layers=8,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
)
SAMPLE_PROMPTS = ["The list type", "A dictionary is", "This module provides", "Return the number of"]


def token_stream(tokenizer, documents: list[str]) -> torch.Tensor:
    eot = tokenizer.token_to_id(END_OF_TEXT)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(documents):
        ids.extend(encoding.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def batches(stream: torch.Tensor, batch: int, length: int, generator: torch.Generator):
    while True:
        starts = torch.randint(0, len(stream) - length - 1, (batch,), generator=generator)
        window = torch.stack([stream[s : s + length + 1] for s in starts])
        yield window[:, :-1], window[:, 1:]


def loss_on(model, inputs, targets) -> torch.Tensor:
    positions = torch.arange(inputs.shape[1]).expand_as(inputs)
    logits = model.logits(model(inputs, positions))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def held_out_loss(model, stream: torch.Tensor, length: int) -> float:
    model.eval()
    usable = (len(stream) - 1) // length * length
    inputs = stream[:usable].view(-1, length)
    targets = stream[1 : usable + 1].view(-1, length)
    losses = [loss_on(model, inputs[i : i + 8], targets[i : i + 8]).item() * len(inputs[i : i + 8])
              for i in range(0, len(inputs), 8)]
    model.train()
    return sum(losses) / len(inputs)


@torch.no_grad()
def greedy_sample(model, tokenizer, prompt: str, max_tokens: int, stop_ids: set[int]) -> str:
    model.eval()
    ids = tokenizer.encode(prompt).ids
    for _ in range(max_tokens):
        inputs = torch.tensor([ids])
        next_id = int(model.logits(model(inputs, torch.arange(len(ids))[None]))[0, -1].argmax())
        if next_id in stop_ids:
            break
        ids.append(next_id)
    model.train()
    return tokenizer.decode(ids)


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("engine/assets/demo"))
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    train_docs, held_docs = split()
    tokenizer = train_tokenizer(train_docs, ARCHITECTURE["vocab_size"])
    write_tokenizer_files(tokenizer, args.out, ARCHITECTURE["max_position_embeddings"])
    train_stream, held_stream = token_stream(tokenizer, train_docs), token_stream(tokenizer, held_docs)
    print(f"corpus: {len(train_docs)} train docs / {len(train_stream)} tokens, "
          f"{len(held_docs)} held-out docs / {len(held_stream)} tokens", flush=True)

    eot, im_end = tokenizer.token_to_id(END_OF_TEXT), tokenizer.token_to_id(IM_END)
    hf_config = dict(ARCHITECTURE, architectures=["LlamaForCausalLM"], bos_token_id=None,
                     eos_token_id=[eot, im_end], pad_token_id=eot, hidden_act="silu",
                     attention_bias=False, attention_dropout=0.0, mlp_bias=False,
                     initializer_range=0.02, use_cache=True, torch_dtype="float32")
    model = LlamaForCausalLM(ModelConfig.from_hf_dict(hf_config))
    for name, param in model.named_parameters():
        if param.dim() == 2:
            torch.nn.init.normal_(param, std=0.02)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(args.seed)
    data = batches(train_stream, args.batch, args.length, generator)
    tokens_seen, train_start = 0, time.time()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, warmup=50)
        inputs, targets = next(data)
        loss = loss_on(model, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens_seen += inputs.numel()
        if step % 50 == 0 or step == args.steps - 1:
            rate = tokens_seen / (time.time() - train_start)
            print(f"step {step} loss {loss.item():.3f} lr {optimizer.param_groups[0]['lr']:.2e} {rate:.0f} tok/s", flush=True)

    held = held_out_loss(model, held_stream, args.length)
    samples = {p: greedy_sample(model, tokenizer, p, 48, {eot, im_end}) for p in SAMPLE_PROMPTS}
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    (args.out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    generation = {"eos_token_id": [eot, im_end], "pad_token_id": eot, "do_sample": False}
    (args.out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    report = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens": len(train_stream), "held_out_tokens": len(held_stream),
        "steps": args.steps, "batch": args.batch, "length": args.length, "tokens_seen": tokens_seen,
        "held_out_loss": round(held, 4), "held_out_perplexity": round(math.exp(held), 2),
        "final_train_loss": round(loss.item(), 4), "minutes": round((time.time() - started) / 60, 1),
        "torch": torch.__version__, "greedy_samples": samples,
    }
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
