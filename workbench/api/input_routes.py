"""Which HTTP routes read a large body on the input thread (workbench/serving/input_work.py), as their
views say: `input_route` marks such a view, with whose error shape its refusals take and whether it
takes Anthropic's `x-api-key`, and the HTTP door (workbench/api/http_door.py) guards every path the
URLconf routes to a marked view, before the body is read. A new path to such a view is guarded
without a word in the door; a marked view behind a converter stops the start, since the door matches a
path's end before Django has resolved it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RoutePattern


@dataclass(frozen=True)
class Route:
    errors: str  # whose error shape: "openai", "anthropic" or "ollama"
    api_key_header: bool = False  # takes Anthropic's `x-api-key` as well as the bearer token


View = TypeVar("View", bound=Callable)
MARK = "input_route"  # the attribute that carries a view's Route


def input_route(errors: str, api_key_header: bool = False) -> Callable[[View], View]:
    """Marks a view that reads a large body on the input thread (input_work.prepared): the door guards
    every path the URLconf routes to it."""
    route = Route(errors, api_key_header)

    def mark(view: View) -> View:
        setattr(view, MARK, route)
        return view

    return mark


def routes() -> dict[str, Route]:
    """The input-thread routes, by path: the URLconf's paths to marked views (ImproperlyConfigured for a
    marked view behind a pattern)."""
    return _routes(get_resolver())


@functools.lru_cache(maxsize=4)  # one URLconf in a server; a test may route another
def _routes(resolver: URLResolver) -> dict[str, Route]:
    found: dict[str, Route] = {}

    def walk(entries: Iterable[URLPattern | URLResolver], prefix: str, literal: bool) -> None:
        for entry in entries:
            path = prefix + str(entry.pattern)
            fixed = literal and isinstance(entry.pattern, RoutePattern) and "<" not in str(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, path, fixed)
                continue
            route = getattr(entry.callback, MARK, None)
            if route is None:
                continue
            if not fixed:  # the door matches a path's end, before Django has resolved (or even read) it
                raise ImproperlyConfigured(f"the input-thread view {entry.lookup_str} is routed by a pattern "
                                           f"({path!r}); the HTTP door guards literal paths only")
            found["/" + path] = route

    walk(resolver.url_patterns, "", True)
    return found


def route_of(path: str) -> Route | None:
    """The input-thread route a request's path (without its query) names, or None. By the end of the
    path: a root path a proxy puts in front (Daphne's root_path) changes nothing."""
    for end, route in routes().items():
        if path.endswith(end):
            return route
    return None
