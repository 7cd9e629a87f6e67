"""The channels-redis internals workbench/serving/celery/redis_layer.py depends on, pinned.

OneTripChannelLayer reimplements channels-redis's send and a receive over the same keys, so a release
that renames or reshapes what it reads must fail here, before a worker's deltas go astray; and the
installed release must be inside the range pyproject.toml allows (the range these names were checked
for). The storage itself is checked against a plain RedisChannelLayer in test_delivery.py."""

from __future__ import annotations

import inspect
import itertools
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from packaging.requirements import Requirement

from workbench.serving.celery.redis_layer import OneTripChannelLayer, make_layer

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# The methods redis_layer.py calls on itself, with the parameters it passes (and those it relies on).
METHODS = {
    "require_valid_channel_name": ["self", "name", "receive"],
    "non_local_name": ["self", "name"],
    "consistent_hash": ["self", "value"],
    "connection": ["self", "index"],
    "serialize": ["self", "message"],
    "deserialize": ["self", "message"],
    "get_capacity": ["self", "channel"],
    "new_channel": ["self", "prefix"],
    "close_pools": ["self"],
}


def test_the_installed_channels_redis_is_in_the_range_pyproject_allows():
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [pinned] = [Requirement(d) for d in dependencies if Requirement(d).name == "channels-redis"]
    assert pinned.specifier.contains(version("channels-redis")), \
        f"channels-redis {version('channels-redis')} is outside {pinned.specifier}: check redis_layer.py, then the range"
    assert pinned.specifier.contains("4.3.0") and not pinned.specifier.contains("4.4.0"), \
        "the range is the releases redis_layer.py was checked against"


def test_the_methods_it_calls_keep_their_names_and_parameters():
    for name, parameters in METHODS.items():
        method = getattr(RedisChannelLayer, name, None)
        assert method is not None, f"RedisChannelLayer.{name} is gone"
        assert list(inspect.signature(method).parameters) == parameters, f"RedisChannelLayer.{name}'s parameters"
        assert name not in vars(OneTripChannelLayer), f"{name} is channels-redis's, not overridden here"


def test_the_attributes_it_reads_are_there_with_their_meaning():
    layer = RedisChannelLayer(hosts=["redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/1"], prefix="p-",
                              expiry=7)
    assert (layer.prefix, layer.expiry) == ("p-", 7)
    assert isinstance(RedisChannelLayer.brpop_timeout, (int, float))
    # The private cycle of host indexes that a general channel's send takes the next of.
    assert list(itertools.islice(layer._send_index_generator, 3)) == [0, 1, 0]
    channel = "workbench-web.abc!def"
    assert layer.non_local_name(channel) == "workbench-web.abc!", "the key of a process-specific channel"
    assert layer.consistent_hash(channel) in (0, 1)
    message = {"type": "t", "n": 1, "__asgi_channel__": channel}
    assert layer.deserialize(layer.serialize(message)) == message, "the message travels whole, its channel in it"


@pytest.mark.asyncio
async def test_a_blocking_pop_never_times_out_on_the_client_before_the_server():
    """A client timeout that ends a pop Redis has already served loses the popped message."""
    layer = make_layer(settings.REDIS_URL)
    pool = layer.connection(0).connection_pool
    assert pool.connection_kwargs["socket_timeout"] >= 2 * layer.brpop_timeout, pool.connection_kwargs
    assert pool.connection_kwargs["host"] and layer.brpop_timeout > 0  # liveness: the real pool and wait
