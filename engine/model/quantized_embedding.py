"""The token embedding looked up in its GGUF rows (Q4_0, Q4_1, Q8_0), kept quantized.

A float copy of the whole table costs vocabulary x hidden x 2 bytes in bf16 (Gemma 3's 262,144 pieces:
335 MB) for the few rows a step looks up; llama.cpp reads the rows of the quantized table instead. Here
each looked-up row is dequantized with gguf's formulas (engine/model/quantized.py) and cast to the
activation dtype: the same values, bit for bit, as a lookup in the dequantized table. Where the head is
tied to the embedding and served quantized, both read one copy of the rows.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.quantized import QuantizedLinear, dequantize_rows


class QuantizedEmbedding(nn.Module):
    def __init__(self, table: QuantizedLinear, dtype: torch.dtype) -> None:
        """`table`: the embedding's rows as a QuantizedLinear ([vocab, hidden]); shared, not copied."""
        super().__init__()
        self.table = table
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.table.raw[input_ids]                                     # [..., row_bytes]
        return dequantize_rows(rows, self.table.qtype, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.table.qtype.name}, dtype={self.dtype}"
