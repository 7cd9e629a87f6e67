"""The per-row sampler engine/sampler.py's batched `sample` must equal bit for bit: each row sampled on
its own, with torch.multinomial and its own checks (two waits on the device per row). The masks and
the logprob records are shared with the engine's module, which computes them for the whole batch in
both; what differs is how a token is chosen.
"""

from __future__ import annotations

import math

import torch

from engine.sampler import SampleRequest, TokenLogprob, _logprob_records, _masked, _top_p
from engine.sampling_params import SamplingParams


def sample_per_row(logits: torch.Tensor, rows: list[SampleRequest]) -> tuple[list[int], list[TokenLogprob | None]]:
    if len(rows) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sequences")
    logits = _masked(logits.float(), rows)
    plain_greedy = [r.params.greedy and not r.params.has_penalties for r in rows]
    tokens = logits.argmax(dim=-1).tolist() if any(plain_greedy) else [0] * len(rows)
    for index, row in enumerate(rows):
        if not plain_greedy[index]:
            tokens[index] = _sample_row(logits[index], row)
    return tokens, _logprob_records(logits, rows, tokens)


def _sample_row(logits: torch.Tensor, row: SampleRequest, exact: bool = False) -> int:
    params, raw = row.params, logits
    if params.has_penalties:
        logits = _penalised(logits, params, row.prompt_ids, row.output_ids)
    if params.greedy:
        return int(logits.argmax())
    logits = logits / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    if not exact and not 0 < float(probs.sum()) < math.inf:
        return _sample_row(raw.double(), row, exact=True)
    return int(torch.multinomial(probs, 1, generator=row.generator))


def _penalised(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int],
               output_ids: list[int]) -> torch.Tensor:
    logits = logits.clone()
    vocab = logits.numel()
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long, device=logits.device)
        if seen.numel():
            values = logits[seen]
            logits[seen] = torch.where(values > 0, values / params.repetition_penalty,
                                       values * params.repetition_penalty)
    if output_ids and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(output_ids, device=logits.device), minlength=vocab)[:vocab].float()
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return logits
