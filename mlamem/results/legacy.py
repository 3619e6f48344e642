"""What older result files wrote differently, shared by the migrate steps and mlamem.runtime.environment
(a module of its own, importing nothing, so neither loads pydantic or the other to read it)."""

# Files written before an environment's `kernels`: their per-kernel version fields, each read
# as kernels.<name>.
LEGACY_KERNEL_FIELDS = {"flash_mla": "flashmla", "triton": "triton"}
# Baselines written before `--kernel` was recorded: the kernel they ran (its default then).
KERNEL_BEFORE_FLAG = "flashmla"
