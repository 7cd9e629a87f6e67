"""The engine's KV pool as its config sizes it, and the sequence length that pool allows.

Sized once, when an engine starts: from the config's set size, else a fraction of the GPU memory free
then, else the CPU default (EngineConfig.kv_blocks_for); the log line says which and how big.
"""

from __future__ import annotations

import logging

import torch

from engine.engine_config import EngineConfig
from engine.loading.loader import LoadedModel
from engine.scheduler.kv_cache import KVShape, PagedKVCache

log = logging.getLogger(__name__)


def sized_kv_pool(config: EngineConfig, loaded: LoadedModel, max_model_len: int) -> tuple[PagedKVCache, int]:
    """The pool, logged with why that size, and the length limit it allows a sequence."""
    device = loaded.device
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    num_blocks = config.kv_blocks_for(loaded.config, max_model_len, free)
    # A prompt bigger than the pool is refused (FinishedIgnored); a sequence that grows to fill the
    # whole pool ends with "length", as at the model's length, instead of preempting itself forever.
    # The last token of a sequence is never fed, so the pool's slots hold sequences one token longer.
    length_limit = min(max_model_len, num_blocks * config.block_size + 1)
    kv_cache = PagedKVCache(KVShape.of(loaded.config), num_blocks, config.block_size, loaded.dtype, device)
    if config.kv_cache_mb is not None or config.num_kv_blocks is not None:
        sized_by = "as configured"
    elif free is not None:
        sized_by = f"{config.kv_memory_fraction:.0%} of the {free / 2**30:.1f} GB free on {device}"
    else:
        sized_by = "the CPU default"
    log.info("KV pool: %d blocks of %d tokens, %.0f MB (%s)", num_blocks, config.block_size,
             2 * kv_cache.keys.nbytes / 2**20, sized_by)
    return kv_cache, length_limit
