"""The serving bridge: the only way the web side reaches the engine (GUIDE section 2)."""
