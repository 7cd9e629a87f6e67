"""Usernames minted per call, for tests on servers that the whole session shares.

A test on a shared Daphne needs users no other test meets (their conversations, limits and per-user
prefix cache are theirs alone). `unique_name("reader")` gives "reader-" and eight random hex digits, so
the name still says which test made it, and no list of taken names has to be kept by hand.
"""

from __future__ import annotations

import uuid


def unique_name(role: str) -> str:
    """A fresh username for `role`, unique in this and any other session (Django's username rules)."""
    return f"{role}-{uuid.uuid4().hex[:8]}"
