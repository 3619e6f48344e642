"""compare's result on the CPU: a saved result keeps mlamem.compare/1's shape and key order."""

import json

from mlamem import render
from mlamem.results.compare import CompareFile
from mlamem.runtime import environment


def test_a_compare_result_writes_its_files_keys_in_their_order():
    """The file's keys, in the order compare has always written them, and it reads back."""
    result = CompareFile(schema="mlamem.compare/1", command="mlamem compare", op="sparse-decode",
                         scenario="glm5-fp8-tp8", kernels=[], kv_tokens=8192, rows=[],
                         environment=environment.capture(), created=environment.now_utc(),
                         notes=[])
    saved = json.loads(render.compare_json(result))
    assert list(saved) == ["command", "op", "scenario", "kernels", "kv_tokens", "rows",
                           "environment", "created", "schema", "notes"]
    assert CompareFile.parse(saved) == result and result.measured and result.all_equal
