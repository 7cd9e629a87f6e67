"""The OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, their parameters, usage,
logprobs and tool calls, and the OpenAPI document that describes them."""
