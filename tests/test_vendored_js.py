"""The vendored browser libraries are the versions scripts/vendor_js.py pins, each with its license, and
the pages load them from the app (no CDN): a version bumped in the script without running it, a file
deleted, or a template pointing elsewhere fails here, offline, in milliseconds."""

from __future__ import annotations

import re

from scripts.vendor_js import PACKAGES, ROOT, VERSIONS

# What each library's own header says of its version, as its build writes it.
HEADERS = {"marked": "marked v{}", "dompurify": "DOMPurify {}", "@highlightjs/cdn-assets": "Highlight.js v{}",
           "axe-core": "axe v{}"}


def test_every_pinned_package_is_vendored_at_its_version_with_its_license():
    recorded = VERSIONS.read_text().splitlines()
    for package in PACKAGES:
        folder = ROOT / package.destination
        assert "LICENSE" in package.files.values() and (folder / "LICENSE").stat().st_size > 500, package.name
        [script] = [name for name in package.files.values() if name.endswith(".js")]
        header = (folder / script).read_text(encoding="utf-8")[:400]
        assert HEADERS[package.name].format(package.version) in header, (package.name, header[:120])
        assert any(line.startswith(f"{package.name}@{package.version} sha512-") for line in recorded), package.name


def test_the_chat_page_loads_the_libraries_from_the_app():
    page = (ROOT / "templates/chat/conversation.html").read_text()
    sources = re.findall(r"<script src=\"([^\"]+)\"", page)
    assert not [s for s in sources if "//" in s], "no CDN: every script is the app's own"
    for package in PACKAGES:
        if package.destination.parts[0] == "static":
            [script] = [name for name in package.files.values() if name.endswith(".js")]
            vendored = package.destination.relative_to("static") / script
            assert f"{{% static '{vendored}' %}}" in sources, vendored
