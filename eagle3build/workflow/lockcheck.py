"""Check that an environment holds exactly the pins of a lock file (pip constraints format).

``python -m eagle3build.workflow.lockcheck constraints-gpu.txt`` exits 1 listing every pinned package
that is missing or installed at another version. install-gpu.sh runs it after installing, so
the CUDA venv and the container image built from it are the lock, not an approximation.
Versions compare as pip compares them (PEP 440 via ``packaging``): ``2.14.0+cu130`` satisfies
``==2.14.0``.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def read_pins(path: str | Path) -> dict[str, str]:
    """``name -> version`` of every ``name==version`` line (comments and blank lines skipped).

    Raises:
        ValueError: a non-comment line is not an exact pin (names the file and line number).
    """
    pins = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if not m:
            raise ValueError(f"{path}:{n}: not an exact pin (name==version): {line!r}")
        pins[normalise(m.group(1))] = m.group(2)
    return pins


def normalise(name: str) -> str:
    """PEP 503 name normalisation (``Torch_C-dlpack.ext`` -> ``torch-c-dlpack-ext``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def mismatches(pins: dict[str, str], installed=None) -> list[str]:
    """Pins the environment does not satisfy: ``"name: want V, installed W"`` (or ``missing``).

    ``installed``: ``name -> version`` lookup (default: this interpreter's distributions).
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    def have(name):
        if installed is not None:
            return installed.get(name)
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    out = []
    for name, want in sorted(pins.items()):
        got = have(name)
        if got is None:
            out.append(f"{name}: want {want}, missing")
        elif Version(got) not in SpecifierSet(f"=={want}"):
            out.append(f"{name}: want {want}, installed {got}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.exit("usage: python -m eagle3build.workflow.lockcheck LOCKFILE")
    bad = mismatches(read_pins(argv[1]))
    for b in bad:
        print(f"lockcheck: {b}", file=sys.stderr)
    print(f"lockcheck: {argv[1]}: {'%d mismatches' % len(bad) if bad else 'every pin installed'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
