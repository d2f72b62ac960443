"""The network: the topology graph (:mod:`.topology`) read from its two file forms
(:mod:`.topofile`, :mod:`.explicit`, over the shared definitions of
:mod:`.topodef`), its description (:mod:`.report`), flows sharing links
max-min fairly in time (:mod:`.flows`), and the flows that move KV between
two instances' GPUs, shard by shard (:mod:`.shards`)."""
