//! `GET /openapi.json`: the OpenAPI 3.1 description of the HTTP API,
//! generated from the types the handlers parse and answer (their
//! `ToSchema` derives) and the handlers' `#[utoipa::path]` attributes, so
//! it cannot drift from what is served.
//!
//! The statuses every route can answer from the layers around the
//! handlers (the browser guard's 403 and 415, the body limit's 413, the
//! connection cap's 503, authentication's 401) are added here, once, to
//! every operation they apply to. The MCP endpoints (`/mcp`,
//! `/mcp/servers/{name}`) speak JSON-RPC and are described by the MCP
//! specification, not here.

use serde_json::{json, Map, Value};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::Ref;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, OpenApi as Document, RefOr};
use utoipa::{OpenApi, PartialSchema};

use super::executions;
use crate::error::{ErrorBody, ErrorEnvelope};
use crate::exec::{ExecutionRequest, ExecutionResponse};

/// The operations and the schemas they use.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "corral execution service",
        description = "Run commands and code in corral sandboxes over HTTP. Errors are `{\"error\": {\"code\", \"message\"}}` with a stable code; a refused execution answers 422 with its stored record. The MCP endpoints (`/mcp`, `/mcp/servers/{name}`) are described by the MCP specification. See docs/service.md."
    ),
    paths(
        super::healthz,
        super::metrics,
        super::openapi,
        super::limits,
        super::mcp_servers,
        executions::create,
        executions::stream,
        executions::list,
        executions::get,
    ),
    components(schemas(
        ErrorEnvelope,
        ErrorBody,
        ExecutionRequest,
        ExecutionResponse,
        executions::StreamStart,
        executions::StreamChunk,
    )),
    tags(
        (name = "executions", description = "Run one execution, stream one, read them back"),
        (name = "service", description = "Health, metrics, this document, the caller's limits and MCP servers"),
    )
)]
struct ApiDoc;

/// One server-sent event of `/v1/executions/stream` as an SSE client
/// parses it: the `text/event-stream` framing (`event`, `data`, `id`),
/// which is axum's, not a type the service serialises. In OpenAPI 3.1 the
/// schema of an event-stream response describes each event.
pub(super) struct StreamEvent;

impl utoipa::PartialSchema for StreamEvent {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .description(Some(
                "`start` (data: StreamStart), `stdout` and `stderr` (data: StreamChunk), `heartbeat` (data: `{}`), then exactly one `result` (data: the answer `create_execution` would give, with `status` when that is an error, and `stream_dropped_bytes`)",
            ))
            .property(
                "event",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["start", "stdout", "stderr", "heartbeat", "result"])),
            )
            .required("event")
            .property(
                "data",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .content_media_type("application/json")
                    .description(Some("The event's JSON payload")),
            )
            .required("data")
            .property(
                "id",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("The event's position in the stream (heartbeats have none)")),
            )
            .into()
    }
}

impl utoipa::ToSchema for StreamEvent {}

/// The document as this server serves it: with tenants, every operation
/// but the open ones (`/healthz`, `/metrics`, `/openapi.json`) needs a
/// bearer token and may answer 401; without (loopback-only anonymous
/// mode), none does.
pub fn openapi_document(anonymous: bool) -> Value {
    let mut doc = serde_json::to_value(operations(anonymous)).unwrap_or_default();
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        flatten_all_of(schemas);
        record_schemas(schemas);
    }
    // What `GET /v1/executions/{id}` answers is the stored record.
    if let Some(schema) = doc.pointer_mut(
        "/paths/~1v1~1executions~1{id}/get/responses/200/content/application~1json/schema",
    ) {
        *schema = json!({"$ref": "#/components/schemas/ExecutionRecord"});
    }
    doc
}

/// `ExecutionRecord`, the stored record of an execution: the answer with
/// its outputs reduced as `crate::audit::bounded_result` does (`stdout`
/// and `stderr` present only with `audit_outputs = "full"`, their digests
/// always), and its output files as `RecordedFile`s (`content` only in
/// full mode, `sha256` and `bytes` always).
fn record_schemas(schemas: &mut Map<String, Value>) {
    let (Some(answer), Some(file)) = (
        schemas.get("ExecutionResponse").cloned(),
        schemas.get("OutputFile").cloned(),
    ) else {
        return;
    };
    let digest =
        |what: &str| json!({"type": "string", "description": format!("SHA-256 (hex) of {what}")});
    let cut = |what: &str| json!({"type": "boolean", "description": format!("Whether {what} was cut at `audit_output_max_bytes` (`audit_outputs = \"full\"` only)")});
    let mut record = answer;
    record["description"] =
        json!("The stored record of an execution: its answer, with outputs kept as digests and sizes (text too with `audit_outputs = \"full\"`, cut at a cap)");
    if let Some(props) = record["properties"].as_object_mut() {
        for stream in ["stdout", "stderr"] {
            props.insert(
                format!("{stream}_sha256"),
                digest(&format!("the {stream} text answered")),
            );
            props.insert(
                format!("{stream}_audit_truncated"),
                cut(&format!("`{stream}`")),
            );
        }
        props.insert(
            "outputs".into(),
            json!({"type": "array", "items": {"$ref": "#/components/schemas/RecordedFile"}}),
        );
    }
    let mut recorded = file;
    if let Some(required) = recorded["required"].as_array_mut() {
        required.retain(|r| r != "content");
        required.extend([json!("sha256"), json!("bytes")]);
    }
    if let Some(props) = recorded["properties"].as_object_mut() {
        props.insert(
            "sha256".into(),
            digest("the file's bytes (decoded, for base64)"),
        );
        props.insert(
            "bytes".into(),
            json!({"type": "integer", "format": "int64", "minimum": 0}),
        );
        props.insert("audit_truncated".into(), cut("`content`"));
    }
    schemas.insert("ExecutionRecord".into(), record);
    schemas.insert("RecordedFile".into(), recorded);
}

/// serde's `flatten` of an enum (a result that ran or was refused; output
/// files collected or not) derives as `allOf` over `oneOf`/`anyOf`, which
/// code generators cannot take ("cannot take allOf a non-object"). Each
/// such schema is described as the one object it serialises to: every
/// variant's properties, required only where every variant has them
/// (none of an optional one's).
fn flatten_all_of(schemas: &mut Map<String, Value>) {
    let names: Vec<String> = schemas
        .iter()
        .filter(|(_, s)| s.get("allOf").is_some())
        .map(|(n, _)| n.clone())
        .collect();
    for name in names {
        if let Some(flat) = schemas.get(&name).map(|s| flattened(s, schemas, 0)) {
            schemas.insert(name, flat);
        }
    }
}

/// `schema` as one object schema: (properties, required).
fn object_parts(
    schema: &Value,
    schemas: &Map<String, Value>,
    depth: u8,
) -> (Map<String, Value>, Vec<String>) {
    let schema = resolve(schema, schemas);
    if depth > 8 {
        return (Map::new(), Vec::new());
    }
    if let Some(members) = schema.get("allOf").and_then(Value::as_array) {
        let mut props = Map::new();
        let mut required = Vec::new();
        for m in members {
            let (p, r) = object_parts(m, schemas, depth + 1);
            for (k, v) in p {
                props.entry(k).or_insert(v);
            }
            required.extend(r);
        }
        return (props, required);
    }
    let variants = schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))
        .and_then(Value::as_array);
    if let Some(variants) = variants {
        let mut props = Map::new();
        let mut required: Option<Vec<String>> = None;
        for v in variants {
            if resolve(v, schemas).get("type") == Some(&Value::from("null")) {
                required = Some(Vec::new());
                continue;
            }
            let (p, r) = object_parts(v, schemas, depth + 1);
            for (k, v) in p {
                props.entry(k).or_insert(v);
            }
            required = Some(match required {
                None => r,
                Some(all) => all.into_iter().filter(|k| r.contains(k)).collect(),
            });
        }
        return (props, required.unwrap_or_default());
    }
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (props, required)
}

fn flattened(schema: &Value, schemas: &Map<String, Value>, depth: u8) -> Value {
    let (properties, mut required) = object_parts(schema, schemas, depth);
    required.dedup();
    let mut out = json!({"type": "object", "properties": properties, "required": required});
    if let Some(d) = schema.get("description") {
        out["description"] = d.clone();
    }
    out
}

/// A `$ref` to a component, followed (one level; components are named
/// schemas, never bare references).
fn resolve<'a>(schema: &'a Value, schemas: &'a Map<String, Value>) -> &'a Value {
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
        .and_then(|name| schemas.get(name))
        .unwrap_or(schema)
}

/// The generated document with the layers' answers and this server's
/// security.
fn operations(anonymous: bool) -> Document {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A tenant's token (server.tenant, stored as its SHA-256)",
                ))
                .build(),
        ),
    );
    for (path, item) in doc.paths.paths.iter_mut() {
        let open = matches!(path.as_str(), "/healthz" | "/metrics" | "/openapi.json");
        for (post, op) in [(false, &mut item.get), (true, &mut item.post)] {
            let Some(op) = op else { continue };
            layered(op, post);
            if open {
                op.security = Some(vec![SecurityRequirement::default()]);
            } else if !anonymous {
                op.security = Some(vec![SecurityRequirement::new("bearer", [""; 0])]);
                insert(op, 401, unauthorized());
            }
        }
    }
    doc
}

/// An error answer with the service's error body.
fn error(description: &str) -> ResponseBuilder {
    ResponseBuilder::new()
        .description(description)
        .content("application/json", Content::new(Some(error_ref())))
}

fn error_ref() -> Ref {
    use utoipa::ToSchema;
    Ref::from_schema_name(ErrorEnvelope::name())
}

/// `Retry-After`: whole seconds.
fn retry_after() -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(u64::schema())
        .description(Some("Seconds to wait before retrying"))
        .build()
}

fn unauthorized() -> ResponseBuilder {
    error("No, a malformed or an unknown bearer token (`auth.missing`, `auth.invalid`, `auth.unknown_token`)").header(
        "WWW-Authenticate",
        HeaderBuilder::new()
            .schema(String::schema())
            .description(Some("`Bearer realm=\"corral\"` (RFC 7235)"))
            .build(),
    )
}

/// Adds `response` for `status` unless the handler's attribute has one.
fn insert(op: &mut Operation, status: u16, response: ResponseBuilder) {
    op.responses
        .responses
        .entry(status.to_string())
        .or_insert_with(|| RefOr::T(response.build()));
}

/// The answers of the layers around every handler.
fn layered(op: &mut Operation, json_post: bool) {
    insert(
        op,
        403,
        error("A `Host` this server does not answer to (`request.host_refused`) or a browser `Origin` not in server.allowed_origins (`request.origin_refused`)"),
    );
    insert(
        op,
        503,
        error("The server is at its connection cap (server.max_connections); the connection is closed")
            .header("Retry-After", retry_after()),
    );
    if json_post {
        insert(
            op,
            400,
            error("The body is not JSON of the right shape (`request.malformed`), or a request that makes no sense"),
        );
        insert(
            op,
            413,
            error("The body is over server.max_request_bytes (`body_too_large`)"),
        );
        insert(
            op,
            415,
            error("A POST body not sent as `Content-Type: application/json` (`unsupported_media_type`)"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(anonymous: bool) -> Value {
        openapi_document(anonymous)
    }

    #[test]
    fn every_operation_has_an_id_and_its_error_statuses() {
        let d = doc(false);
        let paths = d["paths"].as_object().map(|p| p.len()).unwrap_or(0);
        assert_eq!(paths, 8, "{d}");
        let mut ids = Vec::new();
        for (path, item) in d["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                let id = op["operationId"].as_str().unwrap_or("");
                assert!(!id.is_empty(), "{method} {path}");
                ids.push(id.to_owned());
                assert!(op["responses"]["200"].is_object(), "{method} {path}");
                assert!(op["responses"]["403"].is_object(), "{method} {path}");
                assert!(
                    op["responses"]["503"]["headers"]["Retry-After"].is_object(),
                    "{method} {path}"
                );
            }
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "operationIds are unique: {ids:?}");
        let create = &d["paths"]["/v1/executions"]["post"];
        assert_eq!(create["requestBody"]["required"], true);
        assert_eq!(
            create["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ExecutionResponse"
        );
        assert!(create["responses"]["429"]["headers"]["Retry-After"].is_object());
        assert!(create["responses"]["401"]["headers"]["WWW-Authenticate"].is_object());
        for status in ["400", "413", "415", "422"] {
            assert!(create["responses"][status].is_object(), "{status}");
        }
        // A GET has no body to refuse.
        let list = &d["paths"]["/v1/executions"]["get"];
        assert!(list["responses"]["415"].is_null(), "{list}");
        let stream = &d["paths"]["/v1/executions/stream"]["post"];
        assert_eq!(
            stream["responses"]["200"]["content"]["text/event-stream"]["schema"]["$ref"],
            "#/components/schemas/StreamEvent"
        );
        assert_eq!(create["security"][0]["bearer"], serde_json::json!([]));
        assert_eq!(
            d["paths"]["/healthz"]["get"]["security"][0],
            serde_json::json!({})
        );
    }

    #[test]
    fn the_browser_guard_knows_every_post_route() {
        let d = doc(false);
        let mut posts: Vec<&str> = d["paths"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, item)| item.get("post").is_some())
            .map(|(path, _)| path.as_str())
            .collect();
        posts.sort_unstable();
        assert_eq!(posts, super::super::browser::POST_PATHS);
    }

    #[test]
    fn anonymous_mode_asks_for_no_token() {
        let d = doc(true);
        let create = &d["paths"]["/v1/executions"]["post"];
        assert!(create["security"].is_null(), "{create}");
        assert!(create["responses"]["401"].is_null());
    }

    #[test]
    fn the_error_schema_admits_nothing_but_the_error() {
        let d = doc(false);
        let e = &d["components"]["schemas"]["Error"];
        assert_eq!(e["additionalProperties"], false, "{e}");
        assert_eq!(e["required"], serde_json::json!(["error"]));
        let r = &d["components"]["schemas"]["RunOutcome"];
        assert!(r["anyOf"].is_array(), "{r}");
    }

    #[test]
    fn a_stored_record_is_described_with_digests_in_place_of_outputs() {
        let d = doc(false);
        let get = &d["paths"]["/v1/executions/{id}"]["get"]["responses"]["200"]["content"]
            ["application/json"]["schema"]["$ref"];
        assert_eq!(get, "#/components/schemas/ExecutionRecord");
        let r = &d["components"]["schemas"]["ExecutionRecord"];
        assert_eq!(r["properties"]["stdout_sha256"]["type"], "string", "{r}");
        let f = &d["components"]["schemas"]["RecordedFile"];
        let required: Vec<&str> = f["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            required.contains(&"sha256") && !required.contains(&"content"),
            "{f}"
        );
    }

    #[test]
    fn a_flattened_result_is_one_object_with_every_variants_fields() {
        let d = doc(false);
        let r = &d["components"]["schemas"]["ExecutionResponse"];
        assert!(r.get("allOf").is_none(), "{r}");
        assert_eq!(r["type"], "object");
        for p in [
            "id",
            "stdout",
            "exit_code",
            "error",
            "events",
            "outputs",
            "outputs_truncated",
            "outputs_error",
            "enforced",
        ] {
            assert!(r["properties"][p].is_object(), "{p}: {r}");
        }
        let mut required: Vec<&str> = r["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        required.sort_unstable();
        // In every variant: a refusal has no stdout; an MCP record no outputs.
        assert_eq!(
            required,
            [
                "cancelled",
                "events",
                "exit_code",
                "id",
                "limits",
                "profile",
                "tenant"
            ]
        );
        let o = &d["components"]["schemas"]["Outputs"];
        assert_eq!(o["required"], json!(["outputs"]), "{o}");
    }
}
