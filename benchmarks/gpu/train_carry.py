"""The one-call carry of benchmarks/train_throughput.py (benchmarks/gpu/train-carry.txt; docs/card-time.md).

    python benchmarks/gpu/train_carry.py download .whl-train     # here, with network: the pinned wheels
    # on the card, in one call (.whl-train carried; the repository paths are in the working tree):
    python3 benchmarks/gpu/train_carry.py unpack .whl-train /tmp/site && export PYTHONPATH=/tmp/site:$PWD
    python3 benchmarks/train_throughput.py --device cuda ...
    # on this CPU, the rehearsal (tests/test_train_carry.py):
    python benchmarks/gpu/train_carry.py check -- benchmarks/train_throughput.py ARGS...

``check`` runs a Python script with only the standard library, the working directory's packages, the image (torch,
transformers, the ``image:`` lines, and each one's requirements, read from the installed distributions' metadata) and
the carried wheels importable (``card_site``): any other module is missing, as on the card.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
import zipfile
from pathlib import Path

CARRY = Path(__file__).with_name("train-carry.txt")
IMAGE_BASE = ("torch", "transformers")  # the lent image's Python holds these (docs/card-time.md)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def read_carry(path: Path = CARRY) -> dict[str, list[str]]:
    """``{"paths": [...], "image": [...], "wheels": ["name==version", ...]}`` of a carry file (its header says the
    three kinds of line).

    Raises:
        ValueError: a line of none of those kinds (the message names the file and the line).
    """
    out: dict[str, list[str]] = {"paths": [], "image": [], "wheels": []}
    for i, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("path:"):
            out["paths"].append(line[5:].strip())
        elif line.startswith("image:"):
            out["image"].append(line[6:].strip())
        elif "==" in line and " " not in line:
            out["wheels"].append(line)
        else:
            raise ValueError(f"{path}:{i}: {raw!r} is not 'path: P', 'image: NAME' or 'NAME==VERSION'")
    return out


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def requirement_closure(roots) -> set[str]:
    """The installed distributions ``roots`` and, recursively, those they require (no extras; markers evaluated
    here), canonical names; a requirement not installed here is left out."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [_canon(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_canon(req.name))
    return seen


def card_site(dest: Path, carry: dict[str, list[str]]) -> list[str]:
    """Make ``dest`` a folder that holds, as links into this Python's installed packages, exactly the card's
    distributions: the image's (``IMAGE_BASE`` and the ``image:`` lines, with their requirements) and the carried
    wheels, each with its modules and its ``.dist-info`` (``importlib.metadata`` finds their versions, as
    transformers asks for them). Returns the distributions linked, canonical names.

    Raises:
        importlib.metadata.PackageNotFoundError: a carried wheel is not installed here (the check needs it here).
    """
    dists = requirement_closure([*IMAGE_BASE, *carry["image"]])
    for w in carry["wheels"]:
        name = w.split("==")[0]
        md.distribution(name)  # raises where it is not installed here
        dists.add(_canon(name))
    dest.mkdir(parents=True, exist_ok=True)
    for name in sorted(dists):
        dist = md.distribution(name)
        for f in dist.files or []:
            top = f.parts[0]
            if top == ".." or top.endswith(".pth") or top == "__pycache__":
                continue
            src, link = Path(dist.locate_file(top)), dest / top
            if src.exists() and not link.exists():
                link.symlink_to(src)
    return sorted(dists)


def check(script: str, args: list[str], carry: dict[str, list[str]] | None = None) -> int:
    """Run ``script`` with ``args`` in a child Python that imports only the standard library, the working directory's
    packages (the repository's, as the card's ``PYTHONPATH=$PWD``) and the card's distributions (``card_site``):
    ``python -S``, its ``PYTHONPATH`` the script's folder, the working directory and that site. A module that is
    neither in the image nor carried is missing there as on the card. Returns the child's exit status."""
    import os
    import tempfile

    carry = carry or read_carry()
    with tempfile.TemporaryDirectory(prefix="card-site-") as site:
        card_site(Path(site), carry)
        path = os.pathsep.join([str(Path(script).resolve().parent), str(Path.cwd()), site])
        env = {**os.environ, "PYTHONPATH": path, "PYTHONNOUSERSITE": "1"}
        return subprocess.run([sys.executable, "-S", script, *args], env=env).returncode


def download(dest: str, carry: dict[str, list[str]] | None = None) -> None:
    """``pip download`` each carried wheel into ``dest``: no dependencies, binary only, for CPython 3.12 on
    manylinux x86_64 (the lent image's Python).

    Raises:
        subprocess.CalledProcessError: pip failed (it names the wheel).
    """
    carry = carry or read_carry()
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *plat, "-d", dest, *carry["wheels"]], check=True)


def unpack(wheels: str, dest: str) -> list[str]:
    """Unzip every ``*.whl`` in ``wheels`` into ``dest`` (a folder for ``PYTHONPATH``); returns their names."""
    done = []
    for w in sorted(Path(wheels).glob("*.whl")):
        with zipfile.ZipFile(w) as z:
            z.extractall(dest)
        done.append(w.name)
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("download").add_argument("dest")
    u = sub.add_parser("unpack")
    u.add_argument("wheels")
    u.add_argument("dest")
    c = sub.add_parser("check")
    c.add_argument("script")
    c.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.cmd == "download":
        download(a.dest)
    elif a.cmd == "unpack":
        print("\n".join(unpack(a.wheels, a.dest)))
    else:
        sys.exit(check(a.script, [x for x in a.args if x != "--"]))


if __name__ == "__main__":
    main()
