"""Ollama's native API (/api/chat, /api/generate, /api/tags, /api/show, /api/version) on the OpenAI routes' serving path."""
