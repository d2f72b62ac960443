"""Studies built on runs: sweeps and their executors (:mod:`.sweep`), goodput
search (:mod:`.goodput`), policies side by side (:mod:`.compare`), DistServe's
planner (:mod:`.planner`), Splitwise's iso-power provisioning (:mod:`.provision`),
the idle-network hand-off estimate (:mod:`.handoff`) and the speed benchmark
(:mod:`.bench`)."""
