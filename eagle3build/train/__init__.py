"""The draft head: stages ``build_vocab_map`` (d2t/t2d) and ``train_draft`` (the head's checkpoint),
with train_draft's private modules ``trainer``, ``train_state``, ``train_data``, ``train_metrics``
and ``ddp``, the step compiled as few large graphs by ``compiled`` (speculators' fused loss as one op of them:
``fused_loss``), and for online training (the target's states made beside the trainer) ``online_data`` and
``online_states``."""
