"""The package's extras: each names the framework its integration imports, and the versions
pinned for the tests (requirements-test.txt) are ones the extras accept."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from packaging.requirements import Requirement

PINS = Path(__file__).resolve().parents[1] / "requirements-test.txt"


def pinned() -> dict[str, str]:
    pins = {}
    for line in PINS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            pins[requirement.name] = str(requirement.specifier).removeprefix("==")
    return pins


def test_the_extras_name_the_frameworks_and_accept_the_pinned_versions() -> None:
    extras: dict[str, list[Requirement]] = {}
    for text in importlib.metadata.requires("lathe-client") or []:
        requirement = Requirement(text)
        for extra in ("langchain", "llama-index"):
            if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
                extras.setdefault(extra, []).append(requirement)
    assert [r.name for r in extras["langchain"]] == ["langchain-core"]
    assert [r.name for r in extras["llama-index"]] == ["llama-index-core"]
    pins = pinned()
    for requirements in extras.values():
        for requirement in requirements:
            assert requirement.specifier.contains(pins[requirement.name]), (requirement, pins)
            installed = importlib.metadata.version(requirement.name)
            assert installed == pins[requirement.name], (requirement.name, installed)


def test_the_integrations_import_and_the_async_client_is_exported() -> None:
    import lathe_client
    import lathe_client.langchain
    import lathe_client.llama_index

    assert "AsyncLathe" in lathe_client.__all__
    assert lathe_client.langchain.LatheRetriever.__module__ == "lathe_client.langchain"
    assert lathe_client.llama_index.LatheRetriever.__module__ == "lathe_client.llama_index"
    keys = lathe_client.langchain.CHUNK_METADATA_KEYS
    assert keys == lathe_client.llama_index.CHUNK_METADATA_KEYS
