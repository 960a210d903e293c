import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# Property tests draw a fixed example set in CI (derandomize), so a red build always reproduces;
# `pytest --hypothesis-profile=explore` searches fresh examples locally.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("ci")


def pytest_configure(config):
    # pytest-xdist registers this marker itself; registered here too so a run without xdist (a single
    # file, `-p no:xdist`) does not warn about the modules that group their tests on one worker
    config.addinivalue_line("markers", "xdist_group(name): under `--dist loadgroup`, run on one worker")
