"""The code of docs/architecture.md's walkthroughs, as files: each ```python block whose first
line is a comment naming a file (`# toy_q/agent.py`) is that file's text. The tests that plug
a toy algorithm and a toy replay kind in from outside the package write these blocks out and
run them, so the page cannot drift from code that works."""

import re
import sys
import tempfile
from pathlib import Path

ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
_BLOCK = re.compile(r"^```python\n# ([\w/]+\.py)\n(.*?)^```$", re.M | re.S)
_written: dict[str, Path] = {}


def blocks(doc: Path = ARCHITECTURE) -> dict[str, str]:
    """{file name: text} of the named ```python blocks of `doc`.

    Raises:
        ValueError: two blocks name the same file.
    """
    found: dict[str, str] = {}
    for name, text in _BLOCK.findall(doc.read_text()):
        if name in found:
            raise ValueError(f"{doc.name}: two blocks are {name}")
        found[name] = text
    return found


def write(dest: Path, *names: str) -> Path:
    """Writes the blocks `names` under `dest` (folders made); returns `dest`.

    Raises:
        KeyError: the page has no block of that name.
    """
    found = blocks()
    for name in names:
        if name not in found:
            raise KeyError(f"docs/architecture.md has no ```python block # {name}")
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(found[name])
    return dest


def importable(*names: str) -> Path:
    """The blocks `names` written once per process into a folder of their own, which is put on
    `sys.path`; returns the folder (for the PYTHONPATH of the processes a run starts)."""
    key = ",".join(names)
    if key not in _written:
        _written[key] = write(Path(tempfile.mkdtemp(prefix="easyrl-docs-code-")), *names)
        sys.path.insert(0, str(_written[key]))
    return _written[key]
