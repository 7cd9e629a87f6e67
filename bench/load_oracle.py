"""The leak oracle of bench/load.py: every request run alone, and each served answer judged against it.

A completed answer must equal its solo run (token ids on the websocket API, text on the OpenAI API); a
canceled or dropped one must be a prefix of it. The one thing forgiven is a near-tie: a greedy answer
whose FIRST differing token is one the solo run logged as tied with the token it chose, within
`eps` nats of logprob (for a greedy row that is the logit gap). A batched or replayed forward may round
differently from a lone eager one, and where two logits are that close the argmax may flip; everything
after such a flip is a different continuation, so the answer is judged only up to it. Nothing else is
forgiven: a difference at a position the solo run did not log, a served token that is not the logged
rival, a length difference, or any difference in a seeded (sampled) answer (its draw is not in the
logprobs, so a near-tie cannot be shown there).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bench.load_clients import Result, Spec
from engine import Engine, EngineConfig, SamplingParams

NEAR_TIE_EPS = 1e-3  # nats: float32 rounding between batch shapes is ~1e-6 on these logits
TOP = 5  # rivals read per position: a near-tie's rival is the runner-up, well within these


@dataclass
class Solo:
    """One request run alone: its tokens, text, where each token's text starts, and its near-ties."""
    token_ids: list[int]
    text: str
    offsets: list[int]  # offsets[i]: where token i's text starts in `text` (clamped to its length)
    ties: dict[int, dict[int, float]] = field(default_factory=dict)  # position -> {rival id: gap}
    rival_texts: dict[int, str] = field(default_factory=dict)  # rival id -> its text


def solo(all_specs: list[Spec], eps: float = NEAR_TIE_EPS, engine: Engine | None = None) -> dict[int, Solo]:
    """Each request alone on an engine of this process (device loop and graphs off: the eager reference);
    greedy ones with their top logprobs, to log their near-ties."""
    engine = engine or Engine(EngineConfig(model="demo"))
    tokenizer = engine.tokenizer
    answers = {}
    for spec in all_specs:
        params = dict(spec.params)
        if spec.greedy:
            params["logprobs"] = TOP
        out = engine.generate([spec.prompt], SamplingParams(**{**params, "stop": tuple(params.get("stop", ()))}))[0]
        ids = list(out.token_ids)
        offsets = [min(len(tokenizer.decode(ids[:i])), len(out.text)) for i in range(len(ids))]
        answer = Solo(ids, out.text, offsets)
        for position, record in enumerate(out.logprobs or []):
            rivals = {rival: record.logprob - logprob for rival, logprob in record.top
                      if rival != record.token_id and record.logprob - logprob < eps}
            if rivals:
                answer.ties[position] = rivals
                answer.rival_texts.update({rival: tokenizer.decode([rival]) for rival in rivals})
        answers[spec.number] = answer
    return answers


def first_difference(got: list | str, want: list | str) -> int | None:
    """The first index where both have an element and they differ; None if one is a prefix of the other."""
    for index, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return index
    return None


def near_tie(result: Result, want: Solo) -> tuple[int, float] | None:
    """(token position, gap) if `result` first differs from `want` at a logged near-tie with the logged
    rival; None otherwise."""
    if not result.spec.greedy:
        return None
    if result.spec.api == "ws":
        position = first_difference(result.token_ids, want.token_ids)
        if position is None or result.token_ids[position] not in want.ties.get(position, {}):
            return None
        return position, want.ties[position][result.token_ids[position]]
    char = first_difference(result.text, want.text)
    if char is None:
        return None
    position = max(i for i, start in enumerate(want.offsets) if start <= char) if want.offsets else None
    if position is None:
        return None
    served = result.text[want.offsets[position]:]
    for rival, gap in want.ties.get(position, {}).items():
        text = want.rival_texts[rival]
        if text and (served.startswith(text) or text.startswith(served)):
            return position, gap
    return None


def judge(results: list[Result], answers: dict[int, Solo]) -> dict:
    """The oracle: per request, what it got against what it gets alone. `mismatches` fail the run;
    `forgiven` (number, position, gap) are the near-ties, counted apart."""
    mismatches, forgiven, endings = [], [], Counter(r.ending for r in results)
    for r in results:
        want = answers[r.spec.number]
        got, expected = (r.token_ids, want.token_ids) if r.spec.api == "ws" else (r.text, want.text)
        if r.ending == "done":
            wrong = got != expected
        elif r.ending in ("canceled", "dropped"):
            wrong = expected[:len(got)] != got
        else:
            continue
        if wrong:
            tie = near_tie(r, want)
            if tie is None:
                mismatches.append(r.spec.number)
            else:
                forgiven.append({"request": r.spec.number, "position": tie[0], "gap": tie[1]})
    ttfts = sorted(r.ttft for r in results if r.ttft is not None)
    itls = sorted(i for r in results for i in r.itls)
    return {"requests": len(results), "tokens": sum(len(r.token_ids) for r in results), "endings": dict(endings),
            "error_messages": dict(Counter(f"{r.ending}: {r.message}" for r in results
                                           if r.ending.startswith(("error", "unanswered")))),
            "mismatches": mismatches, "forgiven_near_ties": forgiven,
            "near_ties_logged": sum(len(a.ties) for a in answers.values()),
            "offset_gaps": sum(r.gaps for r in results),
            "unanswered": sum(n for e, n in endings.items() if e.startswith("unanswered")),
            "ttft_ms": {q: round(1000 * pct(ttfts, q), 1) for q in (50, 90, 99)},
            "itl_ms": {q: round(1000 * pct(itls, q), 1) for q in (50, 90, 99)}}


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q / 100))] if values else float("nan")
