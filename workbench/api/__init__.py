"""The API app: per-user API tokens, the websocket API (/ws/v1/generate) and the OpenAI-compatible HTTP API."""
