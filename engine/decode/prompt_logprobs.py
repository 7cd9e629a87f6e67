"""Prompt logprobs: each prompt token's logprob under the model, from the logits of the prefill that fed it.

A forward's hidden states cover every token it feeds; the sampler needs only each row's last, so the
runner computes the head at those alone. A row whose request asks for prompt logprobs
(SamplingParams.prompt_logprobs) also gets the head at its own fed positions here: the logits at
position p give the logprob of prompt token p + 1. Other rows cost nothing more.

A chunked prefill feeds the prompt over several steps; each chunk yields the records of the tokens
after its positions, and the sequence collects them in order (Sequence.prompt_logprobs). A prefill
that runs again (a preemption by recompute) yields only records not yet collected, so none repeats.

The values are the raw model's (a log-softmax of the logits in float32, before any penalty,
temperature or mask), as vLLM reports prompt logprobs. Each row's head runs on its own rows in
slices of a fixed size: the head kernel gives a row the same bits at every row count
(engine/model/llama.py: logits), so a request's values do not depend on what shares its batch,
how its prompt was chunked, or whether its blocks were cached before.
"""

from __future__ import annotations

from typing import Callable

import torch

from engine.sampler import TokenLogprob
from engine.sequence import Sequence

SLICE = 256  # positions per head call: bounds the [positions, vocabulary] logits a long prompt holds at once


def wanted_positions(seq: Sequence, fed: int) -> range:
    """The positions of this forward's chunk (it feeds `fed` tokens from `seq.num_cached`) whose logits
    give a prompt token's logprob not yet collected."""
    if not seq.wants_prompt_logits:
        return range(0)
    start = max(seq.num_cached, len(seq.prompt_logprobs))  # records so far cover tokens 1..len
    end = min(seq.num_cached + fed, len(seq.prompt_ids) - 1)  # the last prompt position predicts an output
    return range(start, max(start, end))


def records(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, seq: Sequence,
            positions: range, top: int) -> tuple[TokenLogprob, ...]:
    """The records of prompt tokens positions.start+1 .. positions.stop: `hidden` [fed, D] is this
    row's part of the forward, its first row at position seq.num_cached; `head` turns hidden states
    into logits [M, V]."""
    out: list[TokenLogprob] = []
    first = positions.start - seq.num_cached
    for begin in range(0, len(positions), SLICE):
        rows = hidden[first + begin: first + min(begin + SLICE, len(positions))]
        logprobs = torch.log_softmax(head(rows).float(), dim=-1)  # [M, V]
        at = positions.start + begin
        targets = torch.tensor(seq.prompt_ids[at + 1: at + 1 + rows.shape[0]], device=logprobs.device)
        picked = logprobs.gather(1, targets.unsqueeze(1)).flatten().tolist()
        if top:
            values, ids = torch.topk(logprobs, min(top, logprobs.shape[-1]))
            tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
        else:
            tops = [()] * len(picked)
        out += [TokenLogprob(token_id=token, logprob=value, top=pairs, model_logprob=value)
                for token, value, pairs in zip(targets.tolist(), picked, tops)]
    return tuple(out)
