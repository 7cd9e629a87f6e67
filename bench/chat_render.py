"""What rendering a streaming reply costs the chat page, in a real headless Chromium (Debian's).

    .venv/bin/python -m bench.chat_render [--sizes 2000 8000 32000] [--chunk 4]

Builds a reply of each size from paragraphs, lists, a table and Python code blocks, feeds it to
static/chat/markdown.js `--chunk` characters at a time (about a token each) and renders after every
chunk, two ways side by side in one page: incremental (the page's way: one target, only the blocks from
the first changed one rendered again) and whole (a fresh target each time: lex, parse, sanitize and
highlight everything). Prints, per size, the median and the worst milliseconds of one render at the
end of the reply (the most expensive point), and the lexing alone. A painted frame is ~16 ms; the page
renders at most once per frame, so a render under a few ms at the sizes replies reach costs nothing
a reader sees.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["static/vendor/marked/marked.umd.js", "static/vendor/dompurify/purify.min.js",
           "static/vendor/highlight.js/highlight.min.js", "static/chat/markdown.js"]
SECTION = """Some prose about **lists** and `code`, long enough to wrap on a phone's screen and to be a
paragraph of its own, with a [link](https://example.com) in it.

- an item
- another item with *emphasis*

| name | value |
|------|------:|
| a | 1 |
| b | 2 |

```python
def total(values: list[int]) -> int:
    # add them up
    return sum(v for v in values if v > 0)
```

"""

MEASURE = """([text, chunk]) => {
    const ends = [];
    for (let end = chunk; end < text.length; end += chunk) ends.push(end);
    ends.push(text.length);
    const tail = ends.slice(-20);  // the last renders: the reply at (nearly) its full size
    const time = (fn) => { const t0 = performance.now(); fn(); return performance.now() - t0; };
    const incremental = document.createElement("div");
    document.body.appendChild(incremental);
    const inc = ends.map((end) => time(() => renderMarkdown(incremental, text.slice(0, end))));
    const whole = tail.map((end) => {
        const target = document.createElement("div");
        document.body.appendChild(target);
        const ms = time(() => renderMarkdown(target, text.slice(0, end)));
        target.remove();
        return ms;
    });
    const lex = tail.map((end) => time(() => markdownParser.lexer(text.slice(0, end))));
    const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    return {renders: ends.length, incremental_median: median(inc.slice(-20)), incremental_max: Math.max(...inc.slice(-20)),
            incremental_total: inc.reduce((a, b) => a + b, 0),
            whole_median: median(whole), whole_max: Math.max(...whole), lex_median: median(lex)};
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000, 32000])
    parser.add_argument("--chunk", type=int, default=4)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("needs Debian's chromium (make chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.set_content("<!doctype html><html><body></body></html>")
        for script in SCRIPTS:
            page.add_script_tag(path=str(ROOT / script))
        print(f"{'chars':>7} {'renders':>8} {'incr. median':>13} {'incr. max':>10} {'incr. total':>12} "
              f"{'whole median':>13} {'whole max':>10} {'lex median':>11}  (ms)")
        for size in args.sizes:
            text = (SECTION * (size // len(SECTION) + 1))[:size]
            r = page.evaluate(MEASURE, [text, args.chunk])
            print(f"{size:>7} {r['renders']:>8} {r['incremental_median']:>13.2f} {r['incremental_max']:>10.2f} "
                  f"{r['incremental_total']:>12.0f} {r['whole_median']:>13.2f} {r['whole_max']:>10.2f} "
                  f"{r['lex_median']:>11.2f}")
        browser.close()


if __name__ == "__main__":
    main()
