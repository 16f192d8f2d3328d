"""Training data: stages ``regenerate_responses`` (answers from the target itself) and
``prepare_data`` (tokens with the assistant-only loss mask), with ``chat_masking`` (chat-template
tokenization), private to prepare_data, and ``generators`` (transformers' answers), private to
regenerate_responses."""
