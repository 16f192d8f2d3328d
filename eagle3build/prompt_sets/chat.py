"""Set ``chat``: the first user turn (with the system turn before it, if any) of each eval-split conversation, written
by prepare_data to ``results/R/data/prompts.jsonl``; ids are the conversations' record ids. The split goes by record
id (``prepare_data.is_eval``), so no chat prompt comes from a trained sample."""

from __future__ import annotations

from pathlib import Path

from . import PromptSet, PromptSetError, Sources, read_prompts, register


@register
class Chat(PromptSet):
    name = "chat"
    summary = "chat (held-out first user turns of the eval split)"
    needs = "eval"

    def load(self, sources: Sources) -> list[dict]:
        """The prompts of ``sources.eval_prompts``.

        Raises:
            PromptSetError: the file is not given, or holds no prompt (no eval-split conversation?).
        """
        if sources.eval_prompts is None:
            raise PromptSetError(f"benchmark set {self.name!r} needs prepare_data's prompts.jsonl")
        p = Path(sources.eval_prompts)
        prompts = read_prompts(p) if p.exists() and p.read_text().strip() else []
        if not prompts:
            raise PromptSetError(f"{p}: benchmark set {self.name!r} is empty (no eval-split conversation?)")
        return prompts
