"""The Kafka service: consume a batch, decide it, emit its events, checkpoint.

One batch's path, all of it driven by its owner :mod:`.lifecycle`: :mod:`.batches` (cut a
batch from the consumer, in time order across partitions) -> :mod:`.inputs` (messages ->
documents) -> :mod:`.prefetch` (sketch the next batch ahead, in a worker) ->
:mod:`.checkpoint` (the commit strategy: :mod:`.decide` turns verdicts into events and dead
letters, via :mod:`stream_dedup.dedup`; events are confirmed, then index and offsets
written). :mod:`.loop` starts the clients and runs the turns; :mod:`.kafka`,
:mod:`.metrics` and :mod:`.http` serve it; :mod:`.config` is its configuration file.

This package's ``__init__`` imports nothing, so that reading the configuration (``config
check``, the CLI) does not load the Kafka client.
"""
