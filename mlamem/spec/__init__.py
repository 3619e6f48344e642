"""The spec layer: units, errors, files, the scenario, the GPUs, the kernel contract and the
registries, the models and the serve commands; nothing here imports torch at import time."""
