"""How long a forward pass takes: LLM shapes (:mod:`.llm`), the GPU catalog
(:mod:`.gpus`), the iteration-time interface (:mod:`.iteration`) and its models
(:mod:`.roofline`, the measured :mod:`.tables`), the ``perf:`` spec section
(:mod:`.build`), and the checks against measured profiles (:mod:`.validate`,
:mod:`.calibrate`)."""
