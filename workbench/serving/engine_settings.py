"""The served engine's EngineConfig, from the Django settings: one place for both transports.

The in-process transport (bridge.py) and a Celery GPU worker (worker.py) build their engine from the
same WORKBENCH_* settings (docs/OPERATIONS.md); the engine's own ARC_* flags come from the
environment through `EngineConfig.from_env`.
"""

from __future__ import annotations

from django.conf import settings

from engine import EngineConfig


def served_engine_config() -> EngineConfig:
    return EngineConfig.from_env(model=settings.WORKBENCH_MODEL, device=settings.WORKBENCH_DEVICE,
                                 dtype=settings.WORKBENCH_DTYPE, weights=settings.WORKBENCH_WEIGHTS,
                                 prefix_cache_scope=settings.WORKBENCH_PREFIX_CACHE_SCOPE,
                                 max_num_batched_tokens=settings.WORKBENCH_MAX_NUM_BATCHED_TOKENS,
                                 max_prefill_beside_decodes=settings.WORKBENCH_MAX_PREFILL_BESIDE_DECODES,
                                 kv_cache_mb=settings.WORKBENCH_KV_CACHE_MB)
