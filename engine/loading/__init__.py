"""Loading a model: HF directories and GGUF files (weights, tokenizer, chat template), the packaged models
a name like `smollm2` resolves to, and the errors a file that cannot be served raises."""
