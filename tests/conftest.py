import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# Property tests draw a fixed example set in CI (derandomize), so a red build always reproduces;
# `pytest --hypothesis-profile=explore` searches fresh examples locally.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("ci")
