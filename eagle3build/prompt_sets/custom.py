"""Set ``custom``: the JSONL file named by ``data.prompts_file``: each line ``{"prompt": str}`` or ``{"messages":
[...]}`` ending on a user turn, optional ``"id"`` (``read_prompts``; OpenAI content parts joined, ``developer`` read as
``system``, as for training data). The file is an input of the benchmark only (editing it reruns just the benchmark)."""

from __future__ import annotations

from . import PromptSet, PromptSetError, Sources, read_prompts, register


@register
class Custom(PromptSet):
    name = "custom"
    summary = "custom (data.prompts_file)"
    needs = "file"
    default = False

    def load(self, sources: Sources) -> list[dict]:
        """The prompts of ``sources.user_prompts``.

        Raises:
            PromptSetError: no file given, or what ``read_prompts`` raises.
        """
        if not sources.user_prompts:
            raise PromptSetError(f"benchmark set {self.name!r} needs data.prompts_file (a JSONL of prompts)")
        return read_prompts(sources.user_prompts)
