"""The hand-written public types against the proto they mirror: a proto enum value or a chunking
field with no Python counterpart fails here, before a caller meets a KeyError."""

from __future__ import annotations

import dataclasses
import re

from lathe_client import types
from lathe_client._proto.lathe.v1 import lathe_pb2

# Proto values the client deliberately leaves out: the zero value of DocumentFormat, which the
# server treats as plain text.
NOT_MIRRORED = {"DOCUMENT_FORMAT_UNSPECIFIED"}


def enum_prefix(name: str) -> str:
    """`ChunkStrategy` → `CHUNK_STRATEGY_`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper() + "_"


def test_every_proto_enum_and_value_has_a_python_counterpart() -> None:
    missing = []
    for name, descriptor in lathe_pb2.DESCRIPTOR.enum_types_by_name.items():
        python_enum = getattr(types, name, None)
        if python_enum is None:
            missing.append(name)
            continue
        for value in descriptor.values:
            if value.name in NOT_MIRRORED:
                continue
            member = value.name.removeprefix(enum_prefix(name))
            if member not in python_enum.__members__:
                missing.append(f"{name}.{member}")
    assert not missing, f"proto enums or values without a Python counterpart: {missing}"


def test_every_chunking_option_is_a_field_of_chunking() -> None:
    proto_fields = set(lathe_pb2.ChunkingOptions.DESCRIPTOR.fields_by_name)
    python_fields = {field.name for field in dataclasses.fields(types.Chunking)}
    assert proto_fields <= python_fields, proto_fields - python_fields


def test_every_operation_and_write_response_field_has_a_python_counterpart() -> None:
    for message, dataclass in [
        (lathe_pb2.Operation, types.Operation),
        (lathe_pb2.WriteResponse, types.WriteResult),
    ]:
        proto_fields = set(message.DESCRIPTOR.fields_by_name)
        python_fields = {field.name for field in dataclasses.fields(dataclass)}
        assert proto_fields <= python_fields, (dataclass.__name__, proto_fields - python_fields)


def test_every_rpc_of_the_service_is_called_by_the_client() -> None:
    from pathlib import Path

    import lathe_client.aio
    import lathe_client.client

    service = lathe_pb2.DESCRIPTOR.services_by_name["Lathe"]
    for module in (lathe_client.client, lathe_client.aio):
        source = Path(module.__file__).read_text()
        uncalled = [m.name for m in service.methods if f"self._stub.{m.name}" not in source]
        assert not uncalled, f"RPCs without a {module.__name__} method: {uncalled}"



def test_chunking_options_survive_the_trip_through_the_proto() -> None:
    from lathe_client.client import _chunking_from_proto, _chunking_to_proto

    for chunking in [
        types.Chunking(),
        types.Chunking(strategy=types.ChunkStrategy.CODE, max_tokens=200, overlap_tokens=20),
        types.Chunking(
            strategy=types.ChunkStrategy.SEMANTIC,
            semantic_threshold=types.SemanticThreshold.INTERQUARTILE,
            semantic_amount=1.5,
        ),
        types.Chunking(
            strategy=types.ChunkStrategy.FIXED, unit=types.ChunkUnit.WORDS, separators=("\n",)
        ),
    ]:
        assert _chunking_from_proto(_chunking_to_proto(chunking)) == chunking
