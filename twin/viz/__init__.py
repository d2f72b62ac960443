"""Pictures: plots of runs, sweeps and traces (:mod:`.plots`) and topology drawings
(:mod:`.topology`). matplotlib is imported here and nowhere else."""
