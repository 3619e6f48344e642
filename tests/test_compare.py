"""compare's result on the CPU: the out-of-memory that stopped a sweep is the result's
`failure`, a Failure, and a saved result keeps mlamem.compare/1's shape."""

import dataclasses

from mlamem import environment
from mlamem.compare import CompareResult
from mlamem.measure import Failure


def test_the_failure_rides_on_the_result_and_is_not_saved():
    result = CompareResult(command="mlamem compare", op="sparse-decode", scenario="glm5-fp8-tp8",
                           kernels=[], kv_tokens=8192, rows=[],
                           environment=environment.capture(), created=environment.now_utc())
    stopped = dataclasses.replace(result, failure=Failure(oom=True, text="RuntimeError: x",
                                                          requested_bytes=1 << 30))
    assert stopped.failure.oom and stopped.failure.requested_bytes == 1 << 30
    assert stopped.to_dict() == result.to_dict() and "failure" not in result.to_dict()
    assert CompareResult.from_dict(stopped.to_dict()).failure is None
