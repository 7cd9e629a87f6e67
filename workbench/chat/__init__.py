"""The chat app: conversations and messages, private to their owner, and the pages people use."""
