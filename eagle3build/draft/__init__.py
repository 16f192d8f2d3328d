"""The draft head, over ``formats`` and the target loader: the draft-method and draft-layer registries
(``methods``), the MLA layer and its format, the head model speculators trains, the exported head's format, the
vocab map (d2t/t2d), what the serving vLLM reads of a head (``servable``) and a draft step's cost
(``step_costs``)."""
