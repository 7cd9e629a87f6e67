"""The serving bridge: the only way the web side reaches the engine (tests/test_layout.py holds the rest of
workbench/ to it)."""
