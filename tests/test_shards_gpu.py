"""Sharded sweeps on the GPU: measured shards merge to the measured unsharded sweep, and a measured
gate runs shard by shard."""

import json

import pytest

from mlamem.cli import main
from mlamem.commands.shards import merge, normalised
from mlamem.testing import needs_flashmla

pytestmark = [needs_flashmla, pytest.mark.gpu]
SWEEP = ["-s", "glm5-fp8-tp8", "--tokens", "1024,8192,16384,32768"]


def _without_nvml(value):
    """`value` with every NVML reading dropped: they are device-wide and vary from run to run."""
    if isinstance(value, dict):
        return {k: _without_nvml(v) for k, v in value.items() if not k.startswith("nvml_")}
    if isinstance(value, list):
        return [_without_nvml(v) for v in value]
    return value


def test_measured_shards_merge_to_the_unsharded_sweep(tmp_path):
    """`profile --shard 1/2` and `2/2`, measured and merged, equal the measured unsharded sweep
    in every field but the per-run ones (shards.PER_RUN) and NVML's."""
    def profile(name: str, *shard: str) -> dict:
        path = tmp_path / name
        assert main(["profile", *SWEEP, *shard, "--format", "json", "--output", str(path)]) == 0
        return json.loads(path.read_text())

    whole = profile("whole.json")
    parts = [(f"s{i}.json", profile(f"s{i}.json", "--shard", f"{i}/2")) for i in (1, 2)]
    assert whole["measured"] and all(part["measured"] for _, part in parts)
    assert _without_nvml(normalised(merge(parts))) == _without_nvml(normalised(whole))


def test_measured_gate_shards_pass_against_a_measured_baseline(tmp_path):
    """A measured baseline (`gate --update`), then each of two gate shards, measured: exit 0."""
    baseline = str(tmp_path / "baseline.json")
    assert main(["gate", "--baseline", baseline, "--update", *SWEEP]) == 0
    for shard in ("1/2", "2/2"):
        assert main(["gate", "--baseline", baseline, "--shard", shard]) == 0
