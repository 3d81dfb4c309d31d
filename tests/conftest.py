import os
import pathlib

# Eight fake CPU devices so sharding bugs show on a laptop; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent XLA compilation cache for the whole suite: both pytest-xdist workers and every
# subprocess a test starts (trainers, servers) reuse what another test already compiled for the
# same program and devices. Most tests build the same tiny models, so most of their compile time
# (eager ops included) was spent many times over. Results are unchanged: the cache is keyed by
# the program, the devices, the flags and the jax version.
_CACHE = pathlib.Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))  # LRU beyond 2 GiB

import pytest

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


# The files that take about a minute or more, longest first (seconds with a warm compile
# cache, load 5-7, 2026-12-05: each test's setup + call + teardown). `make test` runs `-n 2
# --dist loadfile`: a worker takes one whole file at a time, and xdist's default order (most
# tests first) left these few-test files to the end, where the rehearsal (~9 min) and the demo
# test (~6.5 min) ran on after everything else. Begun first, they overlap the rest of the
# suite. The other files follow, most tests first.
LONGEST_FILES = (
    "test_train_rehearsal.py",       # ~540
    "test_train_demo.py",            # 395
    "test_train_multiprocess.py",    # 265
    "test_train_resume.py",          # 165
    "test_train_retry_counters.py",  # 150
    "test_eval_e2e.py",              # 130
    "test_envs_tau2.py",             # 120
    "test_rollout_engine.py",        # 115
    "test_train_loop.py",            # 85
    "test_tools_domain_worker.py",   # 70
    "test_doc_commands.py",          # 70
    "test_rollout_scoring.py",       # 60
    "test_tools_search.py",          # 60
    "test_eval_subagent.py",         # 55
    "test_rollout_real_clients.py",  # 55
    "test_agent_orchestrator8b.py",  # 55
    "test_agent_embedded.py",        # 55
    "test_train_sglang.py",          # 50
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):   # pytest-xdist: keep the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """LONGEST_FILES first, in that order; then the other files, most tests first (a stable
    sort: tests keep their order within a file). Every xdist worker sorts alike."""
    count: dict[str, int] = {}
    for item in items:
        count[item.path.name] = count.get(item.path.name, 0) + 1
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -count[item.path.name],
                                 item.path.name))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each test file, drop jax's in-memory caches of compiled programs. A pytest-xdist
    worker runs dozens of files in one process, and every XLA:CPU executable it keeps holds
    memory mappings of its own: three engine test files left 26k mappings, a worker near the
    suite's end 46k, and past vm.max_map_count (65530 by default) the next compile or cache
    load dies in mmap (seen as an abort in serialize and a segfault in deserialize). The next
    file loads what it needs again from the persistent cache above."""
    yield
    import gc

    import jax
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """`../shared/data` next to the repo; tests that need it skip with a clear reason when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def readable_tmp():
    """`readable_tmp("prefix")`: a fresh directory under /tmp that a sandbox's own uid can read
    (pytest's tmp_path is private to root), removed at the end of the session. Call
    `readable_tmp.open_up(path)` after writing into it: every directory 0o755, file 0o644."""
    import shutil
    import tempfile

    made: list[pathlib.Path] = []

    def open_up(root: pathlib.Path) -> pathlib.Path:
        for p in (root, *root.rglob("*")):
            p.chmod(0o755 if p.is_dir() else 0o644)
        return root

    def new(prefix: str) -> pathlib.Path:
        root = pathlib.Path(tempfile.mkdtemp(prefix=f"orchestrax-{prefix}-", dir="/tmp"))
        made.append(root)
        return open_up(root)

    new.open_up = open_up
    yield new
    for root in made:
        shutil.rmtree(root, ignore_errors=True)
