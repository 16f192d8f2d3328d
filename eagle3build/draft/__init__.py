"""The draft head, over ``formats`` and the target loader: one module per draft method (``eagle3``, ``peagle``,
``dflash``: a ``method.DraftMethod`` each) and per draft layer (``layer``: llama; ``mla``, with its format
``mla_format`` and its torch module ``mla_layer``), the registry listing them (``methods``), the run's draft as one
value (``choice.Draft``, resolved at planning), a head folder read once (``head_format.Head``), the head model
speculators trains (``head_model``), the vocab map (``vocab_map``: d2t/t2d), what the serving vLLM reads of a head
(``servable``), a draft step's cost (``step_costs``) and a head the user brings (``given_head``: config ``draft.head``,
``train.init_from``)."""
