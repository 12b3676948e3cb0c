"""Arrays through a shared region: exact round trips, growth, and private copies."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys

import numpy as np

from stream_dedup.service.prefetch.shared_memory import SharedRegion, create_region_fd


def test_round_trip_keeps_arrays_and_plain_values() -> None:
    sender = SharedRegion(create_region_fd())
    receiver = SharedRegion(os.dup(sender.fd))
    sets = np.arange(1000, dtype="<u4")
    sigs = np.arange(256, dtype="<u4").reshape(2, 128)
    envelope = sender.put((3, [0, 2], sets, sigs, [b"key" * 100_000]))
    spans, total = envelope
    assert len(pickle.dumps(envelope)) < 200  # all that goes through the pipe
    assert len(spans) == 3  # the two arrays out of band, then the rest's pickle
    assert spans[0] == (0, sets.nbytes) and spans[1] == (sets.nbytes, sigs.nbytes)
    assert total == sets.nbytes + sigs.nbytes + spans[2][1] > 300_000
    n, live, got_sets, got_sigs, keys = receiver.take(envelope)
    assert (n, live, keys) == (3, [0, 2], [b"key" * 100_000])
    np.testing.assert_array_equal(got_sets, sets)
    np.testing.assert_array_equal(got_sigs, sigs)
    assert got_sigs.shape == (2, 128)
    sender.close()
    receiver.close()


def test_payload_larger_than_the_region_grows_it() -> None:
    sender = SharedRegion(create_region_fd())
    receiver = SharedRegion(os.dup(sender.fd))
    small = np.ones(10, dtype="<u8")
    np.testing.assert_array_equal(receiver.take(sender.put(small)), small)
    big = np.arange(5_000_000, dtype="<u8")  # 40 MB, over the initial 16 MiB
    np.testing.assert_array_equal(receiver.take(sender.put(big)), big)
    sender.close()
    receiver.close()


def test_taken_value_is_a_private_copy() -> None:
    sender = SharedRegion(create_region_fd())
    receiver = SharedRegion(os.dup(sender.fd))
    first = receiver.take(sender.put(np.full(100, 7, dtype="<u4")))
    sender.put(np.full(100, 9, dtype="<u4"))  # the next payload overwrites the region
    assert first.tolist() == [7] * 100
    sender.close()
    receiver.close()


def test_a_child_process_maps_the_inherited_region() -> None:
    region = SharedRegion(create_region_fd())
    code = (
        "import sys, numpy as np;"
        "from stream_dedup.service.prefetch.shared_memory import SharedRegion;"
        "r = SharedRegion(int(sys.argv[1]));"
        "print(repr(r.put(np.arange(5, dtype='<u2'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(region.fd)],
        pass_fds=(region.fd,),
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    envelope = ast.literal_eval(out)
    assert region.take(envelope).tolist() == [0, 1, 2, 3, 4]
    region.close()
