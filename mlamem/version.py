"""The installed mlamem's version, in a module of its own so that reading it imports nothing else."""

__version__ = "0.1.0"

# What `mlamem --version` reports beside mlamem: torch and the kernel libraries, by distribution.
REPORTED = (("torch", "torch"), ("sgl-flash-mla", "sgl-flash-mla"), ("vllm", "vllm"),
            ("flashinfer", "flashinfer-python"))


def installed_versions() -> list[tuple[str, str | None]]:
    """(name, version) of torch and each kernel library, None where not installed: read from
    the distributions' metadata, importing none of them."""
    import importlib.metadata

    found = []
    for name, distribution in REPORTED:
        try:
            found.append((name, importlib.metadata.version(distribution)))
        except importlib.metadata.PackageNotFoundError:
            found.append((name, None))
    return found


def version_text() -> str:
    """`mlamem --version`: 'mlamem 0.1.0', then one line per library, e.g. 'torch 2.13.0+cpu',
    'vllm not installed'."""
    lines = [f"mlamem {__version__}"] + [f"{name} {version or 'not installed'}"
                                         for name, version in installed_versions()]
    return "\n".join(lines)
