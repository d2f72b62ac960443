"""A run: the spec (:mod:`.spec`), the simulation that wires a cluster from it and
replays the workload through the scheduler (:mod:`.simulation`), the streaming
metrics (:mod:`.metrics`) and the Chrome/Perfetto trace (:mod:`.trace`)."""
