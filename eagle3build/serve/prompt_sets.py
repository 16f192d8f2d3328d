"""The benchmark's prompt sets now live on the shared floor (``eagle3build.prompt_sets``): prepare_data
checks every prompt against the target's chat template before any GPU stage. Kept importable here."""

from ..prompt_sets import *  # noqa: F401,F403
from ..prompt_sets import (  # noqa: F401
    HUMANEVAL_FILE,
    HUMANEVAL_INSTRUCTION,
    HUMANEVAL_PACKAGE,
    SETS,
    PromptSetError,
    drop_refused,
    drop_too_long,
    humaneval_path,
    humaneval_prompts,
    humaneval_request,
    load_sets,
    read_prompts,
)
