"""Server reflection from Python: grpcio-reflection speaks v1alpha only, so this is what the
server's v1alpha service (beside v1) is for."""

from __future__ import annotations

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from google.protobuf.descriptor_pool import DescriptorPool


def test_pythons_reflection_client_lists_and_describes_the_api(server) -> None:
    with grpc.insecure_channel(server.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert "lathe.v1.Lathe" in services, services
        assert "grpc.health.v1.Health" in services, services
        pool = DescriptorPool(database)
        lathe = pool.FindServiceByName("lathe.v1.Lathe")
        methods = {method.name for method in lathe.methods}
        assert {"Retrieve", "UpsertDocuments", "CreateCollection"} <= methods, methods
        retrieve = pool.FindMessageTypeByName("lathe.v1.RetrieveRequest")
        assert "token_budget" in retrieve.fields_by_name
