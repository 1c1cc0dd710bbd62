//! `GET /openapi.json`: a compact OpenAPI 3 description of the API.

use serde_json::{json, Value};

/// A compact OpenAPI 3 description of the API.
pub fn openapi_document() -> Value {
    let error = json!({"$ref": "#/components/schemas/Error"});
    json!({
        "openapi": "3.0.3",
        "info": {"title": "corral execution service", "version": env!("CARGO_PKG_VERSION")},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
                "ExecutionRequest": {"type": "object", "additionalProperties": false, "properties": {
                    "profile": {"type": "string"},
                    "command": {"type": "array", "items": {"type": "string"}},
                    "language": {"type": "string", "enum": ["python", "node", "bash"]},
                    "code": {"type": "string"},
                    "stdin": {"type": "string"},
                    "files": {"type": "array", "items": {"type": "object", "required": ["path", "content"], "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "encoding": {"type": "string", "enum": ["utf8", "base64"]}}}},
                    "limits": {"type": "object", "additionalProperties": false, "properties": {"timeout_ms": {"type": "integer"}, "memory_bytes": {"type": "integer"}, "output_bytes": {"type": "integer"}, "pids": {"type": "integer"}, "cpu_time_ms": {"type": "integer"}}},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}}
                }}
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {"security": [], "responses": {"200": {"description": "alive"}}}},
            "/metrics": {"get": {"security": [], "responses": {"200": {"description": "Prometheus text"}}}},
            "/v1/limits": {"get": {"responses": {"200": {"description": "the caller's profiles and ceilings"}, "401": {"description": "unauthenticated", "content": {"application/json": {"schema": error}}}}}},
            "/v1/executions": {
                "post": {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecutionRequest"}}}},
                         "responses": {"200": {"description": "the result object (as `corral run --json`) plus id, tenant, profile, limits, outputs"},
                                       "400": {"description": "malformed request", "content": {"application/json": {"schema": error}}},
                                       "401": {"description": "unauthenticated", "content": {"application/json": {"schema": error}}},
                                       "403": {"description": "profile or code mode not available", "content": {"application/json": {"schema": error}}},
                                       "413": {"description": "body too large (body_too_large)", "content": {"application/json": {"schema": error}}},
                                       "422": {"description": "limits outside the minimums or ceilings, or a refused command (then the body is the stored record, with its id)", "content": {"application/json": {"schema": error}}},
                                       "429": {"description": "busy; see Retry-After", "content": {"application/json": {"schema": error}}}}},
                "get": {"parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer"}}, {"name": "offset", "in": "query", "schema": {"type": "integer"}}, {"name": "profile", "in": "query", "schema": {"type": "string"}}],
                        "responses": {"200": {"description": "the caller's executions, newest first"}}}
            },
            "/v1/executions/stream": {"post": {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecutionRequest"}}}},
                                               "responses": {"200": {"description": "text/event-stream: start, stdout, stderr, heartbeat, then exactly one result (the non-streaming answer)"},
                                                             "429": {"description": "busy; see Retry-After", "content": {"application/json": {"schema": error}}}}}},
            "/v1/executions/{id}": {"get": {"parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                                            "responses": {"200": {"description": "the stored result"}, "404": {"description": "not found (or another tenant's)", "content": {"application/json": {"schema": error}}}}}}
        }
    })
}
