"""The repository's folders, for tests that read files beside the code (the README, tools, test data): one place
that knows where tests/ sits, whichever subfolder a test module is in."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
