"""ModelLoadError, in a module of its own so that every model source (HF directories, GGUF files,
packaged models) raises the same type without importing the loader that dispatches to them."""


class ModelLoadError(RuntimeError):
    """A model that cannot be loaded, with the reason."""
