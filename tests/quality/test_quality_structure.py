"""Verdict lines are consistent in both verification modes: matches point backwards and
clusters are named by their first document.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from conftest import GroundTruth, RunOffline


@pytest.mark.parametrize("mode", ["exact", "signature"])
def test_matches_are_earlier_and_clusters_consistent(
    truth: GroundTruth, run_offline: RunOffline, mode: str
) -> None:
    verdicts = run_offline(truth, mode)
    position = {doc_id: n for n, doc_id in enumerate(truth.corpus.ids)}
    wrong = []
    for n, v in enumerate(verdicts):
        if v["verdict"] == "duplicate":
            match = position.get(v["duplicate_of"], len(verdicts))
            if match >= n:
                wrong.append(f"{v['id']}: duplicate_of {v['duplicate_of']} is not earlier")
            elif v["cluster_id"] != verdicts[match]["cluster_id"]:
                wrong.append(f"{v['id']}: cluster {v['cluster_id']} differs from its match's")
            if v["similarity"] is None or v["similarity"] < truth.threshold:
                wrong.append(f"{v['id']}: duplicate with similarity {v['similarity']}")
        else:
            assert v["verdict"] == "unique"
            if (v["duplicate_of"], v["similarity"], v["cluster_id"]) != (None, None, v["id"]):
                wrong.append(f"{v['id']}: unique but {v}")
        if not truth.normalised[n] and (v["verdict"] != "unique" or not v.get("empty")):
            wrong.append(f"{v['id']}: empty content but {v}")
    assert not wrong, f"{truth.name}/{mode}: {len(wrong)} inconsistent verdicts: {wrong[:10]}"
