"""``python -m stream_dedup.service.prefetch``: the sketch worker process (see
:func:`stream_dedup.service.prefetch.worker.main`).

A package entry point rather than ``-m ...prefetch.worker``: the package's ``__init__``
imports the worker module, and running a module that is already imported makes Python
warn that it may behave unpredictably.
"""

from stream_dedup.service.prefetch.worker import main

main()
