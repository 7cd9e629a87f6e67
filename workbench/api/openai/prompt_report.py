"""What a reply says of its prompt: `echo` on /v1/completions and vLLM's `prompt_logprobs` extension.

- `echo: true` puts the prompt's text ahead of the completion's; with `logprobs: N` the prompt's tokens
  lead the logprobs object too, each with its logprob and top N, the first null (nothing precedes it),
  as vLLM does. `max_tokens: 0` with echo scores the prompt alone: the engine runs with one token
  (sampled from the prefill's logits: no decode step) and the reply leaves it out (completion_tokens
  0). This is what lm-evaluation-harness's `local-completions` sends for loglikelihood tasks.
- `prompt_logprobs: N` (completions and chat, not streamed, as in vLLM): per prompt token a map from
  token id to {logprob, decoded_token} for the token itself and the top N, the first null. Completions
  carry it per choice, chat at the top of the reply, where vLLM puts them. No `rank` (it would cost a
  pass over the vocabulary per position).

The values are the engine's prompt logprobs (SamplingParams.prompt_logprobs,
engine/decode/prompt_logprobs.py): the raw model's, from the same prefill that samples the completion.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.loading.tokenizer import Tokenizer
from engine.sampling_params import MAX_TOP_LOGPROBS, is_integer
from workbench.api.http_api import ApiError


@dataclass(frozen=True)
class PromptReport:
    echo: bool = False
    scoring_only: bool = False  # echo with max_tokens 0: the one token generated is left out
    logprobs: int | None = None  # the completion's `logprobs` N: echoed prompt tokens get the same top N
    prompt_logprobs: int | None = None  # vLLM's field: None when not asked

    @property
    def engine_top(self) -> int | None:
        """SamplingParams.prompt_logprobs: enough alternatives for both uses, None when neither needs any."""
        wanted = [n for n in (self.logprobs if self.echo else None, self.prompt_logprobs) if n is not None]
        return max(wanted) if wanted else None


def of(kind: str, body: dict) -> PromptReport:
    """The body's echo and prompt_logprobs, checked (ApiError naming the field). Chat serves no echo: its
    view refuses one that is not off."""
    echo = body.get("echo") if kind == "completion" else None
    if echo is not None and not isinstance(echo, bool):
        raise ApiError(400, "echo must be true or false", param="echo")
    top = body.get("prompt_logprobs")
    if top is not None and (not is_integer(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise ApiError(400, f"prompt_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]", param="prompt_logprobs")
    if top is not None and body.get("stream"):
        raise ApiError(400, "prompt_logprobs are not sent in a stream (as in vLLM); use stream: false",
                       param="prompt_logprobs")
    logprobs = body.get("logprobs") if kind == "completion" and is_integer(body.get("logprobs")) else None
    return PromptReport(echo=bool(echo), scoring_only=bool(echo) and body.get("max_tokens") == 0,
                        logprobs=logprobs, prompt_logprobs=top)


def engine_values(report: PromptReport, body: dict) -> dict[str, object]:
    """The SamplingParams values the report changes: prompt_logprobs, and one token for scoring alone."""
    values: dict[str, object] = {}
    if report.engine_top is not None:
        values["prompt_logprobs"] = report.engine_top
    if report.scoring_only:
        values["max_tokens"] = 1
    return values


def prompt_text(prompt: str | list[int], tokenizer: Tokenizer) -> str:
    """The text echo puts first: the prompt as sent, or its token ids decoded."""
    return prompt if isinstance(prompt, str) else tokenizer.decode(prompt)


def echoed_records(records: list[list], top: int) -> list[list]:
    """Prompt records (StreamEvent.prompt_logprobs) cut to the completion's top N, for the logprobs object."""
    return [[token, logprob, top_pairs[:top]] for token, logprob, top_pairs in records]


def vllm_prompt_logprobs(tokenizer: Tokenizer, records: list[list], top: int) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: null for the first token, then {token id: {logprob, decoded_token}} for the
    token and its top N."""
    shaped: list[dict | None] = []
    for token, logprob, top_pairs in records:
        if logprob is None:
            shaped.append(None)
            continue
        entries = {token: logprob, **{other: value for other, value in top_pairs[:top] if other != token}}
        shaped.append({str(other): {"logprob": value,
                                    "decoded_token": tokenizer.decode([other], skip_special_tokens=False)}
                       for other, value in entries.items()})
    return shaped
