"""Refresh the vendored browser libraries from the npm registry, at the pinned versions below.

    .venv/bin/python -m scripts.vendor_js            # re-fetch and copy every package
    .venv/bin/python -m scripts.vendor_js --check    # exit 1 if the committed files differ from the registry's

The app serves these files itself (static/vendor/; no CDN, so the chat works offline), and the browser
tests inject axe-core from tests/e2e/vendor/. Each package is fetched with `npm pack NAME@VERSION` into a
temporary directory (npm checks the tarball's integrity against the registry), unpacked, and only the
built files and the license files are copied. static/vendor/VERSIONS.txt records what was copied, with
npm's integrity hash, so a refresh shows up in review as a version change. To upgrade: change a
version here, run the script, run the browser tests, commit the lot.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    destination: Path  # relative to ROOT
    files: dict[str, str]  # path inside the tarball's package/ -> name in destination


PACKAGES = [
    # CommonMark + GFM parser; its UMD build defines window.marked.
    Package("marked", "18.2.1", Path("static/vendor/marked"),
            {"lib/marked.umd.js": "marked.umd.js", "LICENSE": "LICENSE"}),
    # The sanitizer between marked's HTML and the page; dual-licensed, both texts kept.
    Package("dompurify", "3.5.0", Path("static/vendor/dompurify"),
            {"dist/purify.min.js": "purify.min.js", "LICENSE": "LICENSE", "LICENSE-MPL": "LICENSE-MPL"}),
    # highlight.js's own prebuilt browser bundle (its "common" languages). Its themes are not taken:
    # style.css colours the tokens for light and dark from one set of rules (light-dark()).
    Package("@highlightjs/cdn-assets", "11.12.0", Path("static/vendor/highlight.js"),
            {"highlight.min.js": "highlight.min.js", "LICENSE": "LICENSE"}),
    # Accessibility checks in the browser tests only; the app never serves it.
    Package("axe-core", "4.14.1", Path("tests/e2e/vendor/axe-core"),
            {"axe.min.js": "axe.min.js", "LICENSE": "LICENSE"}),
]
VERSIONS = ROOT / "static/vendor/VERSIONS.txt"


def pack(package: Package, into: Path) -> tuple[Path, str]:
    """`npm pack` the package into `into`; returns the unpacked package/ directory and npm's integrity."""
    spec = f"{package.name}@{package.version}"
    done = subprocess.run(["npm", "pack", spec, "--json", "--pack-destination", str(into)], cwd=into,
                          check=True, capture_output=True, text=True)
    [info] = json.loads(done.stdout)
    if info["version"] != package.version:
        raise SystemExit(f"npm answered {info['version']} for {spec}")
    unpacked = into / package.name.replace("/", "+")
    with tarfile.open(into / info["filename"]) as tar:
        tar.extractall(unpacked, filter="data")
    return unpacked / "package", info["integrity"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, copy nothing")
    args = parser.parse_args()
    if shutil.which("npm") is None:
        raise SystemExit("needs npm (Debian: apt-get install npm)")
    lines = ["# Written by scripts/vendor_js.py; npm's integrity hash of each tarball.",
             "# Licenses: marked MIT; DOMPurify Apache-2.0 or MPL-2.0; highlight.js BSD-3-Clause;",
             "# axe-core MPL-2.0 (tests only, tests/e2e/vendor/)."]
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for package in PACKAGES:
            source, integrity = pack(package, Path(tmp))
            lines.append(f"{package.name}@{package.version} {integrity} -> {package.destination}")
            target = ROOT / package.destination
            for inside, name in package.files.items():
                if args.check:
                    if not (target / name).exists() or not filecmp.cmp(source / inside, target / name, shallow=False):
                        stale.append(str(package.destination / name))
                    continue
                target.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / inside, target / name)
    text = "\n".join(lines) + "\n"
    if args.check:
        if not VERSIONS.exists() or VERSIONS.read_text() != text:
            stale.append(str(VERSIONS.relative_to(ROOT)))
        for path in stale:
            print(f"differs from the registry's: {path}", file=sys.stderr)
        return 1 if stale else 0
    VERSIONS.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
