"""OpenAI's Responses API (/v1/responses) on the chat-completions route's serving path, with stored replies."""
