//! The OpenAPI 3 document of the HTTP/JSON API, derived at start from the API's descriptor set
//! (`lathe_proto::FILE_DESCRIPTOR_SET`, the same that reflection serves) and the route table:
//! a path per route, a schema per message and enum in the proto3 JSON mapping (lowerCamelCase
//! names, 64-bit integers as strings, enums by name), and the proto's comments as descriptions.

use std::collections::HashMap;

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
use serde_json::{json, Map, Value};

use super::routes::{self, Body, Reply, ROUTES};
use crate::error::{LatheError, Result};

/// Where the document is served.
pub const OPENAPI_PATH: &str = "/v1/openapi.json";

/// Where `lathe.v1.Lathe`'s health is served (the health service's Check, over HTTP).
pub const HEALTH_PATH: &str = "/v1/health";

const PACKAGE: &str = "lathe.v1";

/// The document, as the bytes served.
pub fn document() -> Result<Vec<u8>> {
    let set = prost_types::FileDescriptorSet::decode(super::proto::FILE_DESCRIPTOR_SET)
        .map_err(|e| LatheError::internal(format!("decoding the API's descriptors: {e}")))?;
    let file = set
        .file
        .iter()
        .find(|file| file.package() == PACKAGE)
        .ok_or_else(|| LatheError::internal("the descriptor set holds no lathe.v1"))?;
    Ok(build(file)?.to_string().into_bytes())
}

fn build(file: &FileDescriptorProto) -> Result<Value> {
    let comments = Comments::of(file);
    let messages: HashMap<&str, (usize, &DescriptorProto)> = file
        .message_type
        .iter()
        .enumerate()
        .map(|(index, message)| (message.name(), (index, message)))
        .collect();
    let mut schemas = Map::new();
    for (index, message) in file.message_type.iter().enumerate() {
        schemas.insert(
            message.name().to_string(),
            message_schema(message, index, &comments),
        );
    }
    for (index, enumeration) in file.enum_type.iter().enumerate() {
        let names: Vec<&str> = enumeration.value.iter().map(|value| value.name()).collect();
        let mut schema = json!({"type": "string", "enum": names});
        comments.describe(&mut schema, &[5, index as i32]);
        schemas.insert(enumeration.name().to_string(), schema);
    }
    schemas.insert("Status".to_string(), status_schema());
    let service = file
        .service
        .iter()
        .position(|service| service.name() == "Lathe")
        .ok_or_else(|| LatheError::internal("the descriptor set holds no service Lathe"))?;
    let mut paths = Map::new();
    for route in ROUTES {
        let (method_index, method) = file.service[service]
            .method
            .iter()
            .enumerate()
            .find(|(_, method)| method.name() == route.rpc.name())
            .ok_or_else(|| LatheError::internal(format!("no rpc {}", route.rpc.name())))?;
        let input = local_name(method.input_type());
        let output = local_name(method.output_type());
        let (_, request) = messages
            .get(input)
            .ok_or_else(|| LatheError::internal(format!("no message {input}")))?;
        let mut operation = operation(route, request, input, output);
        comments.describe(&mut operation, &[6, service as i32, 2, method_index as i32]);
        let item = paths
            .entry(route.path.to_string())
            .or_insert_with(|| json!({}));
        item[route.method.as_str().to_ascii_lowercase()] = operation;
    }
    paths.insert(HEALTH_PATH.to_string(), health_path());
    Ok(json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Lathe HTTP/JSON API",
            "version": "v1",
            "description": "Every RPC of lathe.v1.Lathe in the proto3 JSON mapping (a snapshot \
                file's download and restore as application/octet-stream), derived from \
                proto/lathe/v1/lathe.proto. Errors are google.rpc.Status in JSON with the HTTP \
                code of their gRPC code. A client's deadline: `grpc-timeout` or \
                `x-lathe-timeout-ms`.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"apiKey": []}],
    }))
}

/// One route's operation: path (and, without a body, query) parameters, the request body, the
/// reply and the error.
fn operation(route: &routes::Route, request: &DescriptorProto, input: &str, output: &str) -> Value {
    let path_fields: Vec<&str> = route
        .path
        .split('/')
        .filter_map(routes::parameter_of)
        .map(|(name, _)| name)
        .collect();
    let mut parameters = Vec::new();
    for field in &request.field {
        let in_path = path_fields.contains(&field.name());
        if !in_path && route.body != Body::None {
            continue;
        }
        parameters.push(json!({
            "name": if in_path { field.name() } else { field.json_name() },
            "in": if in_path { "path" } else { "query" },
            "required": in_path,
            "schema": field_schema(field),
        }));
    }
    let reference = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    let file =
        json!({"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}});
    let answer = match route.reply {
        Reply::Message => json!({"application/json": {"schema": reference(output)}}),
        Reply::File => file.clone(),
    };
    let mut operation = json!({
        "operationId": route.rpc.name(),
        "parameters": parameters,
        "responses": {
            "200": {"description": "OK", "content": answer},
            "default": {"description": "An error", "content": {"application/json": {"schema": reference("Status")}}},
        },
    });
    match route.body {
        Body::None => {}
        Body::Message => {
            operation["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": reference(input)}}});
        }
        Body::Lines => {
            operation["requestBody"] = json!({
                "required": true,
                "description": "newline-delimited JSON: one message per line, each a write of its own",
                "content": {"application/x-ndjson": {"schema": reference(input)}},
            });
        }
        Body::File => {
            let mut content = file;
            content["application/json"] = json!({"schema": reference(input)});
            operation["requestBody"] = json!({
                "required": true,
                "description": "the snapshot file's bytes, or as JSON the snapshot this server keeps",
                "content": content,
            });
        }
    }
    operation
}

fn message_schema(message: &DescriptorProto, index: usize, comments: &Comments) -> Value {
    let mut properties = Map::new();
    for (field_index, field) in message.field.iter().enumerate() {
        let mut schema = field_schema_in(field, message);
        comments.describe(&mut schema, &[4, index as i32, 2, field_index as i32]);
        properties.insert(field.json_name().to_string(), schema);
    }
    let mut schema = json!({"type": "object", "properties": properties});
    comments.describe(&mut schema, &[4, index as i32]);
    schema
}

/// A field's schema; a map field (a repeated nested `…Entry` message) is an object.
fn field_schema_in(field: &FieldDescriptorProto, message: &DescriptorProto) -> Value {
    let entry = message.nested_type.iter().find(|nested| {
        nested
            .options
            .as_ref()
            .is_some_and(|options| options.map_entry())
            && field.type_name().ends_with(&format!(".{}", nested.name()))
    });
    match entry.and_then(|entry| entry.field.get(1)) {
        Some(value) => json!({"type": "object", "additionalProperties": single_schema(value)}),
        None => field_schema(field),
    }
}

fn field_schema(field: &FieldDescriptorProto) -> Value {
    if field.label() == Label::Repeated {
        json!({"type": "array", "items": single_schema(field)})
    } else {
        single_schema(field)
    }
}

fn single_schema(field: &FieldDescriptorProto) -> Value {
    match field.r#type() {
        Type::String => json!({"type": "string"}),
        Type::Bool => json!({"type": "boolean"}),
        Type::Bytes => json!({"type": "string", "format": "byte"}),
        Type::Int32 | Type::Sint32 | Type::Sfixed32 => {
            json!({"type": "integer", "format": "int32"})
        }
        Type::Uint32 | Type::Fixed32 => json!({"type": "integer", "format": "int64", "minimum": 0}),
        // The proto3 JSON mapping writes 64-bit integers as strings (and reads either).
        Type::Int64 | Type::Sint64 | Type::Sfixed64 => json!({"type": "string", "format": "int64"}),
        Type::Uint64 | Type::Fixed64 => json!({"type": "string", "format": "uint64"}),
        Type::Double => json!({"type": "number", "format": "double"}),
        Type::Float => json!({"type": "number", "format": "float"}),
        Type::Message | Type::Enum | Type::Group => {
            json!({"$ref": format!("#/components/schemas/{}", local_name(field.type_name()))})
        }
    }
}

/// `.lathe.v1.RetrieveRequest` → `RetrieveRequest`.
fn local_name(type_name: &str) -> &str {
    type_name.rsplit('.').next().unwrap_or(type_name)
}

/// `/v1/health`: open, 200 when serving, 503 otherwise.
fn health_path() -> Value {
    let answer = json!({"application/json": {"schema": {
        "type": "object",
        "properties": {"status": {"type": "string", "enum": ["SERVING", "NOT_SERVING", "UNKNOWN", "SERVICE_UNKNOWN"]}},
    }}});
    json!({"get": {
        "operationId": "Health",
        "description": "lathe.v1.Lathe's health as grpc.health.v1.Health's Check answers it; no API key",
        "security": [],
        "responses": {
            "200": {"description": "SERVING", "content": answer},
            "503": {"description": "not serving: loading, draining, or a replica behind", "content": answer},
        },
    }})
}

/// google.rpc.Status as the HTTP port writes it.
fn status_schema() -> Value {
    json!({
        "type": "object",
        "description": "google.rpc.Status: the gRPC code, its message, and ErrorInfo or RetryInfo details with their @type",
        "properties": {
            "code": {"type": "integer", "format": "int32"},
            "message": {"type": "string"},
            "details": {"type": "array", "items": {"type": "object", "additionalProperties": true}},
        },
    })
}

/// The proto's leading comments by their location path.
struct Comments(HashMap<Vec<i32>, String>);

impl Comments {
    fn of(file: &FileDescriptorProto) -> Self {
        let locations = file
            .source_code_info
            .iter()
            .flat_map(|info| &info.location)
            .filter(|location| !location.leading_comments().trim().is_empty())
            .map(|location| {
                let text: Vec<&str> = location.leading_comments().lines().map(str::trim).collect();
                (location.path.clone(), text.join(" ").trim().to_string())
            });
        Self(locations.collect())
    }

    fn describe(&self, schema: &mut Value, path: &[i32]) {
        if let (Some(text), Some(object)) = (self.0.get(path), schema.as_object_mut()) {
            object.insert("description".to_string(), Value::String(text.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_has_every_route_and_every_message() {
        let document: Value = serde_json::from_slice(&document().unwrap()).unwrap();
        for route in ROUTES {
            let operation =
                &document["paths"][route.path][route.method.as_str().to_ascii_lowercase()];
            assert_eq!(operation["operationId"], route.rpc.name(), "{}", route.path);
        }
        let schemas = &document["components"]["schemas"];
        let retrieve = &schemas["RetrieveRequest"]["properties"];
        assert_eq!(retrieve["tokenBudget"]["type"], "integer");
        assert_eq!(retrieve["consistencyToken"]["type"], "string");
        assert!(schemas["ChunkStrategy"]["enum"][0].is_string());
        assert_eq!(
            schemas["Document"]["properties"]["metadata"]["type"],
            "object"
        );
        let get = &document["paths"]["/v1/collections/{name}"]["get"];
        assert_eq!(get["parameters"][0]["in"], "path");
        let download =
            &document["paths"]["/v1/collections/{collection}/snapshots/{name}:download"]["get"];
        assert!(download["responses"]["200"]["content"]["application/octet-stream"].is_object());
    }

    #[test]
    fn every_rpc_of_the_service_has_a_route() {
        let set = prost_types::FileDescriptorSet::decode(super::super::proto::FILE_DESCRIPTOR_SET)
            .unwrap();
        let service = set
            .file
            .iter()
            .flat_map(|file| &file.service)
            .find(|service| service.name() == "Lathe")
            .unwrap();
        let routed: Vec<&str> = ROUTES.iter().map(|route| route.rpc.name()).collect();
        for method in &service.method {
            assert!(
                routed.contains(&method.name()),
                "{} has no route",
                method.name()
            );
        }
        assert_eq!(routed.len(), service.method.len());
    }
}
