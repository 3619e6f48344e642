"""The runtime layer: the allocator model, the memory backends, NVML, non-torch memory, the paths,
attribution and the one measure function."""
