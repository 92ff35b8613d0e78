//! Lathe's gRPC API, `lathe.v1`, generated from `proto/lathe/v1/lathe.proto`: the messages, the
//! `lathe_client` and `lathe_server` stubs, the proto3 JSON mapping of every message (serde, by
//! `pbjson`), and the encoded descriptors the server's reflection service serves and the HTTP
//! API's OpenAPI document is derived from. Nothing here is written by hand; the server's edge (`lathe::api`) converts
//! these types to its own, and the tools (`lathe-tools`) speak only these.

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("lathe.v1");
// serde's Serialize and Deserialize for every message and enum, in the proto3 JSON mapping
// (lowerCamelCase names written, both spellings read; 64-bit integers as strings; enums by name).
include!(concat!(env!("OUT_DIR"), "/lathe.v1.serde.rs"));

/// Encoded descriptors of `lathe.v1`, served by the reflection service.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("lathe_descriptor");
