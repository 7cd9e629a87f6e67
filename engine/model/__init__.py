"""Model architectures as plain torch modules: the Llama block with each family's declared differences
(engine/model/architectures/, one module per family; engine/model/llama.py), switched by ModelConfig
(engine/model/config.py). Nothing is imported here: the config is read without torch (by the web side,
engine/loading/model_files.py), so its importers name the module they need."""
