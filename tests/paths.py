"""Where the tests find the repository's files, independent of how deep a test module sits."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
