"""Runs llama.cpp's convert_hf_to_gguf.py for several models in one interpreter (tests/llama_cpp_converter.py).

    python tests/llama_cpp_convert_many.py SCRIPT OUTTYPE HF_DIR OUT [HF_DIR OUT ...]

Each conversion is a call of the script's own main() with the sys.argv its command line would give, so
torch, transformers and the converter are imported once rather than once per file. Before each file a
line `MARKER HF_DIR` goes to stderr, so that the caller can show one file's output alone; at the first
file that fails (a non-zero exit or an exception) it stops with exit status 1.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

MARKER = "== llama_cpp_convert_many:"


def load(script: Path):
    """The script as a module, importing what it imports as running it would: its folder first on
    sys.path (where `conversion` is; this file's folder would put tests/kernels where transformers looks
    for the `kernels` package), and the script itself then puts its own gguf-py before site-packages."""
    sys.path[0] = str(script.parent)
    spec = importlib.util.spec_from_file_location(script.stem, script)
    assert spec is not None and spec.loader is not None, script
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module
    spec.loader.exec_module(module)
    return module


def convert(converter, script: Path, hf_dir: str, out: str, outtype: str) -> bool:
    sys.argv = [str(script), hf_dir, "--outfile", out, "--outtype", outtype]
    try:
        converter.main()
    except SystemExit as stop:
        return stop.code in (None, 0)
    except BaseException:
        traceback.print_exc()
        return False
    return True


def main(argv: list[str]) -> int:
    script, outtype, paths = Path(argv[0]), argv[1], argv[2:]
    if not paths or len(paths) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    converter = load(script)
    for hf_dir, out in zip(paths[::2], paths[1::2]):
        print(MARKER, hf_dir, file=sys.stderr, flush=True)
        if not convert(converter, script, hf_dir, out, outtype):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
