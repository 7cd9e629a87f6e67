"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) on the OpenAI routes' serving path."""
