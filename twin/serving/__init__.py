"""Serving: one instance's engine (:mod:`.engine`, with the closed-form jump over
quiet decode stretches), its paged KV blocks and prefix cache (:mod:`.kvcache`),
the per-node host KV pools (:mod:`.kvpool`), the prefill -> decode KV hand-off
over the network (:mod:`.handoff`), and the instances' placement and read-only
views (:mod:`.cluster`)."""
