"""Sampling: logits of a batch -> one token per sequence, plus logprobs when asked.

Each sequence samples from its own row with its own `torch.Generator`, so a seeded request draws the
same tokens whatever else shares its batch. The whole batch waits for the device once: every row's
token is the argmax of one score matrix, read back with the rows' validity in one copy. A greedy row's
scores are its (penalised) logits; a sampled row's are its probabilities divided by exponential noise
from its generator, which is what torch.multinomial does for one sample, less multinomial's own two
waits on the device (its checks), so the tokens are the ones per-row multinomial draws, bit for bit.
On the CPU the sampled rows take the same tokens another way, faster and side by side on the CPU's
threads (engine/sampling_draws.py).
Penalties, temperature and the filters still run row by row: a launch per row costs no wait, and each
row keeps the very ops on the very shapes it always had, so its bits. Batched over the rows, softmax,
sort and cumsum may reduce in another order on a GPU (the kernel is chosen by the shape), and a
near-tie at a top-p boundary would then keep another token. On the CPU, rows whose only parameter is a
temperature share one division and one softmax: torch's CPU softmax computes each row of a batch as
it computes the row alone, and two ops a row (with a copy of the logits for an argmax no row read) cost
1.2 ms more of a 42 ms 32-row decode step.

Order per row: a response_format's grammar mask first (engine/grammar.py; forbidden tokens at -inf,
so they are never drawn), then the min_tokens mask (EOS and stop tokens), then penalties on the
logits; greedy takes the argmax; otherwise temperature, then
top-k, top-p and min-p filters, then a draw. Logprobs describe the distribution the token was drawn
from: after penalties and temperature (a greedy row: after penalties), before the top-k/top-p/min-p
cut-offs, so that every candidate keeps a finite value (docs/PROTOCOL.md, "Logprobs"). The confidence
floor (stop_below_prob) reads the model's own probability instead, before any of that but the masks.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import torch

from engine.kernels.host_copy import device_tensor
from engine.grammar import Constraint
from engine.sampling_draws import multinomial_draws
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the N most likely tokens and their logprobs
    model_logprob: float  # the token's logprob under the raw logits, for the confidence floor


@dataclass(frozen=True)
class SampleRequest:
    """One row of the batch: the parameters, the history penalties look at, and the row's generator."""
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator
    constraint: Constraint | None = None  # the response_format's grammar state, if the request has one
    suppressed: tuple[int, ...] = ()  # token ids this row may not draw now (min_tokens not reached)
    history: PenaltyHistory | None = None  # the request's, kept across its steps (None: rebuilt for this step)


def sample(logits: torch.Tensor, rows: list[SampleRequest]) -> tuple[list[int], list[TokenLogprob | None]]:
    """logits: [B, V]. Returns the B chosen token ids and, per row, its logprob record (None unless the
    row asks for logprobs or a confidence floor)."""
    if len(rows) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sequences")
    logits = _masked(logits.float(), rows)
    if all(r.params.greedy and not r.params.has_penalties for r in rows):
        tokens = _row_argmax(logits).tolist()
    else:
        tokens = _draw(logits, rows)
    records = _logprob_records(logits, rows, tokens)
    return tokens, records


def _row_argmax(scores: torch.Tensor) -> torch.Tensor:
    """Each row's index of its first largest value (a NaN counts as the largest), as torch's argmax gives it;
    on the CPU through numpy's, which is about 9x faster over a [B, V] float matrix (0.25 against 2.2 ms
    for 32 x 49152 at one thread: a greedy 32-stream decode step spent 7% of its time in torch's)."""
    if scores.device.type == "cpu":
        return torch.from_numpy(scores.detach().numpy().argmax(axis=-1))
    return scores.argmax(dim=-1)


def _draw(logits: torch.Tensor, rows: list[SampleRequest]) -> list[int]:
    """Every row's token, with one wait for the device (none more unless a row needs float64)."""
    on_cpu = logits.device.type == "cpu"
    # [B, V]: each greedy row's token is the argmax of its row (on the CPU only greedy rows read it)
    scores = logits.clone() if not on_cpu or any(row.params.greedy for row in rows) else None
    sampled, totals = _distributions(logits, rows, scores)
    # Kept so that a row found invalid below draws again as if this draw had never happened.
    states = [rows[index].generator.get_state() for index, _ in sampled]
    try:
        valids = [(total > 0) & (total < math.inf) for total in totals]
        drawn = []
        if on_cpu:  # the same tokens, faster than the argmax over probs / noise
            drawn = multinomial_draws([probs for _, probs in sampled], [rows[index].generator for index, _ in sampled])
        else:
            assert scores is not None
            for index, probs in sampled:
                scores[index] = probs / torch.empty_like(probs).exponential_(1, generator=rows[index].generator)
        chosen = _row_argmax(scores) if scores is not None else torch.zeros(len(rows), dtype=torch.long)
        if sampled:
            chosen = torch.cat([chosen, torch.stack(valids).long()])
        host = chosen.tolist()  # the step's one wait for the device
        tokens = host[: len(rows)]
        for (index, _), token in zip(sampled, drawn):
            tokens[index] = token
        for (index, _), state, valid in zip(sampled, states, host[len(rows):]):
            if not valid:
                rows[index].generator.set_state(state)
                tokens[index] = _sample_exactly(logits[index], rows[index])
    except Exception:
        # The step fails and the engine runs its rows again one by one (engine/step_recovery.py): every
        # generator as before it, so a seeded row draws there what it would have drawn here.
        for (index, _), state in zip(sampled, states):
            rows[index].generator.set_state(state)
        raise
    return tokens


def _distributions(logits: torch.Tensor, rows: list[SampleRequest], scores: torch.Tensor | None,
                   ) -> tuple[list[tuple[int, torch.Tensor]], list[torch.Tensor]]:
    """The sampled rows' draw distributions in row order (rows may share a generator), each with its
    total (a row whose total is not finite and positive is invalid). A greedy row with penalties gets
    its penalised logits in `scores` instead."""
    on_cpu = logits.device.type == "cpu"
    sampled: list[tuple[int, torch.Tensor]] = []  # (row, its draw distribution)
    plain: list[int] = []  # CPU rows whose only parameter is a temperature
    for index, row in enumerate(rows):
        params = row.params
        if params.greedy and not params.has_penalties:
            continue
        values = logits[index]
        if params.has_penalties:
            values = apply_penalties(values, params, row.prompt_ids, row.output_ids, row.history)
        if params.greedy:
            assert scores is not None
            scores[index] = values
        elif on_cpu and _temperature_only(params):
            plain.append(index)
        else:
            sampled.append((index, _probabilities(values, params)))
    totals = [probs.sum() for _, probs in sampled]
    if plain:
        probs = _temperature_probabilities(logits, plain, rows)
        sampled += [(index, probs[k]) for k, index in enumerate(plain)]
        totals += list(probs.sum(dim=-1))
        order = sorted(range(len(sampled)), key=lambda k: sampled[k][0])
        sampled, totals = [sampled[k] for k in order], [totals[k] for k in order]
    return sampled, totals


def _temperature_only(params: SamplingParams) -> bool:
    """A sampled row with no penalty and no cut-off: its distribution is softmax(logits / temperature)."""
    return not params.greedy and not params.has_penalties and not params.top_k and params.top_p >= 1.0 \
        and params.min_p <= 0.0


def _temperature_probabilities(logits: torch.Tensor, indexes: list[int], rows: list[SampleRequest]) -> torch.Tensor:
    """[len(indexes), V]: the draw distributions of CPU rows whose only parameter is a temperature, in one
    division and one softmax over the rows (on the CPU's threads) instead of two ops a row: each row of
    torch's CPU softmax over the last dimension is computed as the row alone is, so the bits are
    `_probabilities`' (tests/engine/test_sampler.py checks it)."""
    # A decode step usually samples every row: then no gather (a copy of the logits), and at temperature 1,
    # the APIs' default, no division (x / 1 is x, bit for bit). Together 1.4 of a 32-row step's 6.4 ms.
    chosen = logits if indexes == list(range(logits.shape[0])) else logits[indexes]
    temperatures = [rows[i].params.temperature for i in indexes]
    if all(t == 1.0 for t in temperatures):
        return torch.softmax(chosen, dim=-1)
    return torch.softmax(chosen / torch.tensor(temperatures, dtype=logits.dtype)[:, None], dim=-1)


def _probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One row's draw distribution: temperature, then the top-k, top-p and min-p cut-offs."""
    logits = logits / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs


def _sample_exactly(raw: torch.Tensor, row: SampleRequest) -> int:
    """A sampled row whose float32 probabilities are not a distribution. Extreme but valid parameters
    (repetition_penalty 1e-300) overflow float32 logits to inf and the softmax to NaN: the row again in
    float64, where they stay finite. NaN logits (a numerical fault) stay NaN there, and multinomial
    fails the step, as it must."""
    logits = raw.double()
    if row.params.has_penalties:
        logits = apply_penalties(logits, row.params, row.prompt_ids, row.output_ids, row.history)
    return int(torch.multinomial(_probabilities(logits, row.params), 1, generator=row.generator))


def _masked(logits: torch.Tensor, rows: list[SampleRequest]) -> torch.Tensor:
    """The logits with each row's forbidden tokens at -inf, before anything else looks at them: a
    constrained row's grammar mask (so the EOS is allowed only where the grammar accepts), then the
    tokens it may not draw yet (min_tokens). Rows without either keep their values bit for bit: a mask
    is the only difference a masked neighbour makes. One copy: the runner's tensor is not ours to write."""
    masked = [index for index, row in enumerate(rows) if row.constraint is not None or row.suppressed]
    if not masked:
        return logits
    logits = logits.clone()
    for index in masked:
        row = rows[index]
        if row.constraint is not None:
            logits[index] = row.constraint.apply(logits[index])
        if row.suppressed:
            logits[index, device_tensor(row.suppressed, logits.device)] = float("-inf")
    return logits


def _wants_logprob(params: SamplingParams) -> bool:
    return params.logprobs is not None or params.stop_below_prob is not None


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (always at least one)."""
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop = mass_before >= top_p
    drop[0] = False  # a top_p below float32's smallest number compares as 0 >= 0: the first always stays
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(0, order, sorted_probs)


class PenaltyHistory:
    """One request's tokens as its penalties read them, kept from step to step: the ids it has seen (prompt
    and output, each once) and each output token's count, as tensors on the logits' device. A sequence's
    output only grows (it appends), so a step folds in the tokens added since the last one. Rebuilt from
    the lists every step instead (a set, a sort and a host-to-device copy of the whole history per row),
    a row with a 2,000-token prompt cost about 0.4 ms more, half of a 32-row step's sampling
    (bench/penalties.py times both).
    It serves the lists it was first given only: other lists (another request's, by mistake) or fewer
    output tokens than it has folded in start it afresh rather than mix the two."""

    def __init__(self) -> None:
        self._reset(None)

    def _reset(self, source: tuple[list[int], list[int], torch.device] | None) -> None:
        self._source = source
        self._seen: set[int] = set()
        self._seen_ids: torch.Tensor | None = None  # [len(_seen)] in no particular order (they index once each)
        self._seen_folded = 0                       # output tokens in _seen
        self._counts: torch.Tensor | None = None    # [V] float32: how often each token was output
        self._counted = 0                           # output tokens in _counts

    def _follow(self, prompt_ids: list[int], output_ids: list[int], device: torch.device) -> None:
        source = self._source
        same = source is not None and source[0] is prompt_ids and source[1] is output_ids and source[2] == device
        if not same or len(output_ids) < max(self._seen_folded, self._counted):
            self._reset((prompt_ids, output_ids, device))

    def seen_ids(self, prompt_ids: list[int], output_ids: list[int], device: torch.device) -> torch.Tensor:
        """Every token id in the prompt or the output, once each."""
        self._follow(prompt_ids, output_ids, device)
        if self._seen_ids is None:
            self._seen = set(prompt_ids)
            self._seen_ids = device_tensor(sorted(self._seen), device)
        new = [t for t in dict.fromkeys(output_ids[self._seen_folded:]) if t not in self._seen]
        if new:
            self._seen.update(new)
            self._seen_ids = torch.cat([self._seen_ids, device_tensor(new, device)])
        self._seen_folded = len(output_ids)
        return self._seen_ids

    def counts(self, prompt_ids: list[int], output_ids: list[int], vocab: int, device: torch.device) -> torch.Tensor:
        """[vocab] float32: each token's count in the output."""
        self._follow(prompt_ids, output_ids, device)
        if self._counts is None or self._counts.numel() != vocab:
            self._counts, self._counted = torch.zeros(vocab, dtype=torch.float32, device=device), 0
        if len(output_ids) > self._counted:
            # Counted by index_add_: bincount on a GPU reads the largest id back to size its output.
            ids = device_tensor(output_ids[self._counted:], device)
            self._counts.index_add_(0, ids, torch.ones(ids.shape, dtype=torch.float32, device=device))
            self._counted = len(output_ids)
        return self._counts


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int],
                    output_ids: list[int], history: PenaltyHistory | None = None) -> torch.Tensor:
    """The logits after the request's repetition, frequency and presence penalties (a new tensor).
    `history`: the request's PenaltyHistory, kept across its steps (None: one built for this call)."""
    history = PenaltyHistory() if history is None else history
    logits = logits.clone()
    if params.repetition_penalty != 1.0:
        seen = history.seen_ids(prompt_ids, output_ids, logits.device)
        if seen.numel():
            values = logits[seen]
            # HF's rule: shrink positive logits, push negative ones further down.
            logits[seen] = torch.where(values > 0, values / params.repetition_penalty,
                                       values * params.repetition_penalty)
    if output_ids and (params.frequency_penalty or params.presence_penalty):
        counts = history.counts(prompt_ids, output_ids, logits.numel(), logits.device)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return logits


def processed_logits(logits: torch.Tensor, row: SampleRequest) -> torch.Tensor:
    """One row's logits as the draw sees them before its cut-offs: penalties, then temperature (none
    for a greedy row, whose temperature would divide by ~0)."""
    params = row.params
    if params.has_penalties:
        logits = apply_penalties(logits, params, row.prompt_ids, row.output_ids, row.history)
    return logits if params.greedy else logits / params.temperature


def _logprob_records(logits: torch.Tensor, rows: list[SampleRequest], tokens: list[int]) -> list[TokenLogprob | None]:
    """The records of the rows that want one, in one batched log-softmax and one top-k, read back in one
    wait for the device: per row, as was first written, they cost more than the step's forward on a
    small model (bench/logprobs_cost.py)."""
    wanted = [i for i, row in enumerate(rows) if _wants_logprob(row.params)]
    records: list[TokenLogprob | None] = [None] * len(rows)
    if not wanted:
        return records
    raw = torch.log_softmax(logits[wanted], dim=-1)  # [W, V]
    processed = [processed_logits(logits[i], rows[i]) if rows[i].params.logprobs is not None else None
                 for i in wanted]
    reported = raw
    if any(p is not None for p in processed):
        reported = torch.log_softmax(torch.stack([raw[k] if p is None else p for k, p in enumerate(processed)]), -1)
    most = max(rows[i].params.logprobs or 0 for i in wanted)
    values, ids, overflowed = _read_records(reported, raw, device_tensor([tokens[i] for i in wanted], logits.device),
                                            most)
    for k in [k for k, bad in enumerate(overflowed) if bad]:
        # Extreme but valid penalties overflow float32 logits to inf (as the draw knows): that row in float64.
        again = torch.log_softmax(processed_logits(logits[wanted[k]].double(), rows[wanted[k]]), -1).float()
        [values[k]], [ids[k]], _ = _read_records(again[None], raw[k: k + 1],
                                                 device_tensor([tokens[wanted[k]]], logits.device), most)
    for k, i in enumerate(wanted):
        n = rows[i].params.logprobs or 0
        records[i] = TokenLogprob(token_id=tokens[i], logprob=values[k][0], top=tuple(zip(ids[k][:n], values[k][2:2 + n])),
                                  model_logprob=values[k][1])
    return records


def _read_records(reported: torch.Tensor, raw: torch.Tensor, chosen: torch.Tensor,
                  most: int) -> tuple[list[list[float]], list[list[int]], list[bool]]:
    """Per row: [its chosen token's reported and model logprobs, then the `most` top values], the top ids,
    and whether its reported row holds a NaN; one read back (ids travel as float32, exact below 2**24)."""
    assert reported.shape[-1] <= 1 << 24, "token ids above 2**24 are not exact in float32"
    top_values, top_ids = torch.topk(reported, most) if most else (reported[:, :0], reported[:, :0].long())
    chosen = chosen.unsqueeze(1)
    packed = torch.cat([reported.gather(1, chosen), raw.gather(1, chosen), top_values, top_ids.float(),
                        torch.isnan(reported).any(dim=-1, keepdim=True).float()], dim=1).tolist()
    return ([row[: 2 + most] for row in packed], [[int(i) for i in row[2 + most: 2 + 2 * most]] for row in packed],
            [row[-1] != 0.0 for row in packed])
