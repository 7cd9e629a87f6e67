"""The model families the engine runs, one module per family, each a `Family` entry (family.py) that says
how its HF config.json and its GGUF metadata read and how its block differs from Llama's; registry.py
collects them."""
