//! The HTTP/JSON routes: one per RPC of `lathe.v1.Lathe`, in the style of `google.api.http`
//! (resource paths, custom methods after a colon), matched here rather than by a router so that
//! `{collection}:retrieve` and the OpenAPI document come from this one table. The streaming RPCs
//! take or give HTTP's own streams: the upload newline-delimited JSON, a snapshot file its bytes.

use http::Method;

/// The RPCs of `lathe.v1.Lathe` served over HTTP, each at one route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    CreateCollection,
    ListCollections,
    GetCollection,
    DeleteCollection,
    UpsertDocuments,
    DeleteDocuments,
    UploadDocuments,
    GetOperation,
    ListOperations,
    WaitOperation,
    Retrieve,
    CreateAlias,
    SwitchAlias,
    DeleteAlias,
    ListAliases,
    CreateSnapshot,
    ListSnapshots,
    DeleteSnapshot,
    DownloadSnapshot,
    RestoreSnapshot,
    RecoverLog,
}

impl Rpc {
    /// The method's name in the proto (and in `/lathe.v1.Lathe/<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Rpc::CreateCollection => "CreateCollection",
            Rpc::ListCollections => "ListCollections",
            Rpc::GetCollection => "GetCollection",
            Rpc::DeleteCollection => "DeleteCollection",
            Rpc::UpsertDocuments => "UpsertDocuments",
            Rpc::DeleteDocuments => "DeleteDocuments",
            Rpc::UploadDocuments => "UploadDocuments",
            Rpc::GetOperation => "GetOperation",
            Rpc::ListOperations => "ListOperations",
            Rpc::WaitOperation => "WaitOperation",
            Rpc::Retrieve => "Retrieve",
            Rpc::CreateAlias => "CreateAlias",
            Rpc::SwitchAlias => "SwitchAlias",
            Rpc::DeleteAlias => "DeleteAlias",
            Rpc::ListAliases => "ListAliases",
            Rpc::CreateSnapshot => "CreateSnapshot",
            Rpc::ListSnapshots => "ListSnapshots",
            Rpc::DeleteSnapshot => "DeleteSnapshot",
            Rpc::DownloadSnapshot => "DownloadSnapshot",
            Rpc::RestoreSnapshot => "RestoreSnapshot",
            Rpc::RecoverLog => "RecoverLog",
        }
    }
}

/// Where a route's request message comes from besides its path parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// No body: the remaining fields are query parameters (`?limit=5`).
    None,
    /// The request message as a JSON object.
    Message,
    /// A client-streaming call: newline-delimited JSON, one request message per line.
    Lines,
    /// A snapshot file's bytes (`application/octet-stream`), or, as JSON, the request message
    /// naming a snapshot the server keeps.
    File,
}

/// What a route answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The reply message as a JSON object.
    Message,
    /// A server-streaming call: the bytes of its messages' `data`, as one
    /// `application/octet-stream` body.
    File,
}

/// One RPC's route. A `{field}` segment of `path` (possibly followed by `:verb`) sets that
/// field of the request message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub rpc: Rpc,
    pub method: Method,
    pub path: &'static str,
    pub body: Body,
    pub reply: Reply,
}

/// Every RPC's route, in the proto's order.
pub const ROUTES: &[Route] = &[
    route(
        Rpc::CreateCollection,
        Method::POST,
        "/v1/collections",
        Body::Message,
    ),
    route(
        Rpc::ListCollections,
        Method::GET,
        "/v1/collections",
        Body::None,
    ),
    route(
        Rpc::GetCollection,
        Method::GET,
        "/v1/collections/{name}",
        Body::None,
    ),
    route(
        Rpc::DeleteCollection,
        Method::DELETE,
        "/v1/collections/{name}",
        Body::None,
    ),
    route(
        Rpc::UpsertDocuments,
        Method::POST,
        "/v1/collections/{collection}/documents:upsert",
        Body::Message,
    ),
    route(
        Rpc::DeleteDocuments,
        Method::POST,
        "/v1/collections/{collection}/documents:delete",
        Body::Message,
    ),
    route(
        Rpc::UploadDocuments,
        Method::POST,
        "/v1/collections/{collection}/documents:upload",
        Body::Lines,
    ),
    route(
        Rpc::GetOperation,
        Method::GET,
        "/v1/operations/{id}",
        Body::None,
    ),
    route(
        Rpc::ListOperations,
        Method::GET,
        "/v1/collections/{collection}/operations",
        Body::None,
    ),
    route(
        Rpc::WaitOperation,
        Method::POST,
        "/v1/operations/{id}:wait",
        Body::Message,
    ),
    route(
        Rpc::Retrieve,
        Method::POST,
        "/v1/collections/{collection}:retrieve",
        Body::Message,
    ),
    route(Rpc::CreateAlias, Method::POST, "/v1/aliases", Body::Message),
    route(
        Rpc::SwitchAlias,
        Method::POST,
        "/v1/aliases/{alias}:switch",
        Body::Message,
    ),
    route(
        Rpc::DeleteAlias,
        Method::DELETE,
        "/v1/aliases/{alias}",
        Body::None,
    ),
    route(Rpc::ListAliases, Method::GET, "/v1/aliases", Body::None),
    route(
        Rpc::CreateSnapshot,
        Method::POST,
        "/v1/collections/{collection}/snapshots",
        Body::Message,
    ),
    route(Rpc::ListSnapshots, Method::GET, "/v1/snapshots", Body::None),
    route(
        Rpc::DeleteSnapshot,
        Method::DELETE,
        "/v1/collections/{collection}/snapshots/{name}",
        Body::None,
    ),
    Route {
        rpc: Rpc::DownloadSnapshot,
        method: Method::GET,
        path: "/v1/collections/{collection}/snapshots/{name}:download",
        body: Body::None,
        reply: Reply::File,
    },
    route(
        Rpc::RestoreSnapshot,
        Method::POST,
        "/v1/collections/{collection}:restore",
        Body::File,
    ),
    route(
        Rpc::RecoverLog,
        Method::POST,
        "/v1/log:recover",
        Body::Message,
    ),
];

const fn route(rpc: Rpc, method: Method, path: &'static str, body: Body) -> Route {
    Route {
        rpc,
        method,
        path,
        body,
        reply: Reply::Message,
    }
}

/// What a request's path matched.
#[derive(Debug, PartialEq, Eq)]
pub enum Matched {
    Route(&'static Route, Vec<(&'static str, String)>),
    /// The path is a route's, the method is not: 405 with the methods that are.
    WrongMethod(Vec<Method>),
    NotFound,
}

/// The route of `method` and `path`, with its path parameters (percent-decoded).
pub fn match_route(method: &Method, path: &str) -> Matched {
    let mut allowed = Vec::new();
    for route in ROUTES {
        let Some(parameters) = match_path(route.path, path) else {
            continue;
        };
        if route.method == *method {
            return Matched::Route(route, parameters);
        }
        allowed.push(route.method.clone());
    }
    if allowed.is_empty() {
        Matched::NotFound
    } else {
        Matched::WrongMethod(allowed)
    }
}

/// The parameters of `template` in `path`, or None when it does not match.
fn match_path(template: &'static str, path: &str) -> Option<Vec<(&'static str, String)>> {
    let mut parameters = Vec::new();
    let mut path_segments = path.split('/');
    for template_segment in template.split('/') {
        let segment = path_segments.next()?;
        match parameter_of(template_segment) {
            None if segment == template_segment => {}
            None => return None,
            Some((name, verb)) => {
                let value = segment.strip_suffix(verb)?;
                if value.is_empty() || (verb.is_empty() && value.contains(':')) {
                    return None;
                }
                parameters.push((name, percent_decode(value)?));
            }
        }
    }
    path_segments.next().is_none().then_some(parameters)
}

/// `{name}:verb` → (`name`, `:verb`); a literal segment → None.
pub fn parameter_of(segment: &'static str) -> Option<(&'static str, &'static str)> {
    let rest = segment.strip_prefix('{')?;
    let (name, verb) = rest.split_once('}')?;
    Some((name, verb))
}

/// `%XX` escapes decoded; None when they do not make UTF-8.
fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = value.get(index + 1..index + 3)?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matched(method: Method, path: &str) -> Option<(Rpc, Vec<(&'static str, String)>)> {
        match match_route(&method, path) {
            Matched::Route(route, parameters) => Some((route.rpc, parameters)),
            _ => None,
        }
    }

    #[test]
    fn every_served_rpc_has_one_route_and_paths_match_with_their_parameters() {
        assert_eq!(ROUTES.len(), 21);
        assert_eq!(
            matched(Method::POST, "/v1/log:recover"),
            Some((Rpc::RecoverLog, vec![]))
        );
        assert_eq!(
            matched(
                Method::DELETE,
                "/v1/collections/docs/snapshots/docs-g7-1.snapshot"
            ),
            Some((
                Rpc::DeleteSnapshot,
                vec![
                    ("collection", "docs".to_string()),
                    ("name", "docs-g7-1.snapshot".to_string())
                ]
            ))
        );
        assert_eq!(
            matched(
                Method::GET,
                "/v1/collections/docs/snapshots/docs-g7-1.snapshot:download"
            )
            .map(|m| m.0),
            Some(Rpc::DownloadSnapshot)
        );
        assert_eq!(
            match_route(
                &Method::GET,
                "/v1/collections/docs/snapshots/docs-g7-1.snapshot"
            ),
            Matched::WrongMethod(vec![Method::DELETE])
        );
        assert_eq!(
            matched(Method::POST, "/v1/collections/copy:restore"),
            Some((
                Rpc::RestoreSnapshot,
                vec![("collection", "copy".to_string())]
            ))
        );
        assert_eq!(
            matched(Method::POST, "/v1/aliases/live:switch"),
            Some((Rpc::SwitchAlias, vec![("alias", "live".to_string())]))
        );
        assert_eq!(
            matched(Method::POST, "/v1/collections/docs:retrieve"),
            Some((Rpc::Retrieve, vec![("collection", "docs".to_string())]))
        );
        assert_eq!(
            matched(Method::GET, "/v1/collections/a%2Db"),
            Some((Rpc::GetCollection, vec![("name", "a-b".to_string())]))
        );
        assert_eq!(
            matched(Method::POST, "/v1/operations/7:wait"),
            Some((Rpc::WaitOperation, vec![("id", "7".to_string())]))
        );
        assert_eq!(
            matched(Method::POST, "/v1/collections/c/documents:upload").map(|m| m.0),
            Some(Rpc::UploadDocuments)
        );
        assert_eq!(matched(Method::GET, "/v1/collections/c:retrieve"), None);
        assert_eq!(
            match_route(&Method::PUT, "/v1/collections"),
            Matched::WrongMethod(vec![Method::POST, Method::GET])
        );
        assert_eq!(
            match_route(&Method::POST, "/v1/collections/:retrieve"),
            Matched::NotFound
        );
        assert_eq!(
            match_route(&Method::GET, "/v1/collections/a/b"),
            Matched::NotFound
        );
        assert_eq!(
            match_route(&Method::GET, "/v1/collections/%zz"),
            Matched::NotFound
        );
    }
}
