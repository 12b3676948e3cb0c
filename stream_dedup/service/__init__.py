"""The Kafka service: consume a batch, decide it, emit its events, checkpoint.

One batch's path: :mod:`.batches` (cut a batch from the consumer) -> :mod:`.inputs`
(messages -> documents) -> :mod:`.prefetch` (sketch the next batch ahead, in a worker) ->
:mod:`.decide` (verdicts -> events and dead letters, via :mod:`stream_dedup.dedup`) ->
:mod:`.checkpoint` (events confirmed, then index and offsets in one write). :mod:`.loop`
runs the turns; :mod:`.rebalance`, :mod:`.kafka`, :mod:`.metrics` and :mod:`.http` serve
it; :mod:`.config` is its configuration file.

This package's ``__init__`` imports nothing, so that reading the configuration (``config
check``, the CLI) does not load the Kafka client.
"""
