//! What an execution answers: the launcher's [`RunResult`] (or its
//! refusal) plus the service's own fields, typed, and serialised only when
//! it is answered or audited.

use corral_launcher::{ErrorInfo, Refusal, RunResult};
use corral_policy::{AuditEvent, ByteSize, Profile};
use serde::Serialize;

use crate::base64;
use crate::workspace::{Workspace, WorkspaceError};

/// Where programs write files the caller gets back.
pub const OUTPUT_DIR: &str = "output";
/// Most output files returned.
pub const MAX_OUTPUT_FILES: usize = 64;
/// Total bytes of output files returned.
pub const MAX_OUTPUT_BYTES: u64 = 8 << 20;

/// The answer to an execution, and its audit record's `result`: the
/// `corral run --json` result (or the runtime's refusal) with the
/// service's fields around it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ExecutionResponse {
    /// The execution id.
    pub id: String,
    /// The tenant that ran it.
    pub tenant: String,
    /// The profile it ran under.
    pub profile: String,
    /// The limits in force, after the request's own were applied.
    pub limits: Ceilings,
    /// The client went away and the execution was killed.
    pub cancelled: bool,
    /// What happened.
    #[serde(flatten)]
    pub outcome: RunOutcome,
    /// The files collected from `output/` (HTTP executions only).
    #[serde(flatten)]
    pub outputs: Option<Outputs>,
}

impl ExecutionResponse {
    /// The refusal's code, when the runtime refused the execution.
    pub fn refusal_code(&self) -> Option<&str> {
        match &self.outcome {
            RunOutcome::Refused(r) => Some(&r.error.code),
            RunOutcome::Ran(_) => None,
        }
    }

    /// The refusal's message, when the runtime refused the execution.
    pub fn refusal_message(&self) -> Option<&str> {
        match &self.outcome {
            RunOutcome::Refused(r) => Some(&r.error.message),
            RunOutcome::Ran(_) => None,
        }
    }

    /// The exit status: the program's, or the refusal's (125, 127).
    pub fn exit_code(&self) -> i32 {
        match &self.outcome {
            RunOutcome::Ran(r) => r.exit_code,
            RunOutcome::Refused(r) => r.exit_code,
        }
    }

    /// One word for logs and metrics: `refused`, `cancelled`, `timed_out`,
    /// `oom_killed`, `output_limit`, `failed` (corral's own error after the
    /// launch), `exited` (the program ended by itself, any status) or
    /// `killed` (by a signal).
    pub fn outcome_label(&self) -> &'static str {
        let r = match &self.outcome {
            RunOutcome::Refused(_) => return "refused",
            RunOutcome::Ran(r) => r,
        };
        if self.cancelled {
            "cancelled"
        } else if r.timed_out {
            "timed_out"
        } else if r.oom_killed {
            "oom_killed"
        } else if r.output_limit_exceeded {
            "output_limit"
        } else if r.error.is_some() {
            "failed"
        } else if r.signal.is_some() {
            "killed"
        } else {
            "exited"
        }
    }
}

/// How an execution ended: it ran, or the runtime refused it first.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum RunOutcome {
    /// The sandbox ran: the result object of `corral run --json`.
    Ran(Box<RunResult>),
    /// The runtime refused the request before starting the sandbox.
    Refused(RefusalBody),
}

/// A runtime refusal as it is answered and recorded.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RefusalBody {
    /// 125, or 127 for a command that is not installed.
    pub exit_code: i32,
    /// The refusal's stable code and message.
    pub error: ErrorInfo,
    /// Security events up to the refusal.
    pub events: Vec<AuditEvent>,
}

/// `anyOf` rather than the `oneOf` a derive would give: a run that failed
/// has an `error` object too, so it also fits [`RefusalBody`].
impl utoipa::PartialSchema for RunOutcome {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AnyOfBuilder, Ref};
        use utoipa::ToSchema;
        AnyOfBuilder::new()
            .item(Ref::from_schema_name(RunResult::name()))
            .item(Ref::from_schema_name(RefusalBody::name()))
            .description(Some(
                "The sandbox ran (the result object of `corral run --json`), or the runtime refused the request first (its `error`, `exit_code` 125 or 127, and `events`).",
            ))
            .into()
    }
}

impl utoipa::ToSchema for RunOutcome {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema;
        schemas.push((RunResult::name().into(), RunResult::schema()));
        <RunResult as utoipa::ToSchema>::schemas(schemas);
        schemas.push((RefusalBody::name().into(), RefusalBody::schema()));
        <RefusalBody as utoipa::ToSchema>::schemas(schemas);
    }
}

impl From<Refusal> for RefusalBody {
    fn from(r: Refusal) -> RefusalBody {
        RefusalBody {
            exit_code: r.exit_code,
            error: ErrorInfo {
                code: r.code,
                message: r.message,
            },
            events: r.events,
        }
    }
}

impl From<Refusal> for RunOutcome {
    fn from(r: Refusal) -> RunOutcome {
        RunOutcome::Refused(r.into())
    }
}

/// A profile's limits in the API's units (null: the profile sets none):
/// the ceilings of `GET /v1/limits`, and the limits in force in a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Ceilings {
    /// Wall-clock limit.
    pub timeout_ms: Option<u64>,
    /// Memory, swap included.
    pub memory_bytes: Option<u64>,
    /// Bytes kept of each output stream.
    pub output_bytes: u64,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// CPU time per process.
    pub cpu_time_ms: Option<u64>,
}

impl Ceilings {
    /// The limits of `profile`.
    pub fn of(p: &Profile) -> Ceilings {
        let l = &p.limits;
        Ceilings {
            timeout_ms: l.timeout_secs.map(|s| s.saturating_mul(1000)),
            memory_bytes: l.memory_bytes.map(ByteSize::bytes),
            output_bytes: l.output_bytes.bytes(),
            pids: l.pids,
            cpu_time_ms: l.cpu_time_secs.map(|s| s.saturating_mul(1000)),
        }
    }
}

/// The files a program left under `output/`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Outputs {
    /// The regular files, depth-first, in name order.
    pub outputs: Vec<OutputFile>,
    /// Whether collection was complete, or why it failed.
    #[serde(flatten)]
    pub status: OutputsStatus,
}

/// `outputs_truncated`, or `outputs_error` when `output/` could not be
/// collected at all.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub enum OutputsStatus {
    /// Collected; `true` when collection stopped at a cap.
    #[serde(rename = "outputs_truncated")]
    Collected(bool),
    /// `output/` exists but is not a directory one can collect (a symlink,
    /// a file).
    #[serde(rename = "outputs_error")]
    Failed(String),
}

/// One collected file.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct OutputFile {
    /// The path relative to `output/`.
    pub path: String,
    /// How `content` is encoded.
    pub encoding: Encoding,
    /// The content.
    pub content: String,
}

/// `utf8` or `base64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The content is the text itself.
    Utf8,
    /// The content is standard base64.
    Base64,
}

impl Encoding {
    /// Text as it is when it is UTF-8, else base64: (encoding, content).
    pub fn encode(data: Vec<u8>) -> (Encoding, String) {
        match String::from_utf8(data) {
            Ok(text) => (Encoding::Utf8, text),
            Err(e) => (Encoding::Base64, base64::encode(e.as_bytes())),
        }
    }
}

impl Outputs {
    /// The regular files under the workspace's `output/`. A program that
    /// made no `output/` simply has none; an `output/` that cannot be
    /// collected (a symlink, not a directory, …) is reported.
    pub fn collect(ws: &Workspace) -> Outputs {
        match ws.collect(OUTPUT_DIR, MAX_OUTPUT_FILES, MAX_OUTPUT_BYTES) {
            Ok(c) => {
                if c.skipped_anything() {
                    tracing::debug!(
                        files = c.files.len(),
                        skipped = c.skipped,
                        truncated = c.truncated,
                        "output collection left entries out"
                    );
                }
                Outputs {
                    outputs: c
                        .files
                        .into_iter()
                        .map(|f| {
                            let (encoding, content) = Encoding::encode(f.data);
                            OutputFile {
                                path: f.path.to_string_lossy().into_owned(),
                                encoding,
                                content,
                            }
                        })
                        .collect(),
                    status: OutputsStatus::Collected(c.truncated),
                }
            }
            Err(WorkspaceError::NotFound { .. }) => Outputs {
                outputs: Vec::new(),
                status: OutputsStatus::Collected(false),
            },
            Err(e) => Outputs {
                outputs: Vec::new(),
                status: OutputsStatus::Failed(e.to_string()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> ExecutionResponse {
        ExecutionResponse {
            id: "ab".repeat(12),
            tenant: "anonymous".into(),
            profile: "code".into(),
            limits: Ceilings::of(&corral_policy::builtin::code()),
            cancelled: false,
            outcome: Refusal {
                exit_code: 125,
                code: "command.not_allowed".into(),
                message: "command `perl` is not allowed".into(),
                events: Vec::new(),
                unused: None,
            }
            .into(),
            outputs: Some(Outputs {
                outputs: Vec::new(),
                status: OutputsStatus::Collected(false),
            }),
        }
    }

    #[test]
    fn a_refusal_serialises_as_the_record_with_its_error() {
        let v = serde_json::to_value(refused()).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "cancelled",
                "error",
                "events",
                "exit_code",
                "id",
                "limits",
                "outputs",
                "outputs_truncated",
                "profile",
                "tenant"
            ]
        );
        assert_eq!(v["error"]["code"], "command.not_allowed");
        assert_eq!(v["exit_code"], 125);
        assert_eq!(v["limits"]["timeout_ms"], 300_000);
        assert_eq!(refused().outcome_label(), "refused");
    }

    #[test]
    fn a_refused_answer_is_its_record_with_status_422() {
        use axum::response::IntoResponse;
        let record = refused();
        let text = serde_json::to_string(&record).unwrap();
        let e = crate::error::ApiError::Refused(Box::new(record));
        assert_eq!(
            (e.status().as_u16(), e.code()),
            (422, "command.not_allowed")
        );
        assert_eq!(e.to_string(), "command `perl` is not allowed");
        assert_eq!(serde_json::to_string(&e.body()).unwrap(), text);
        let resp = e.into_response();
        assert_eq!(resp.status().as_u16(), 422);
        assert!(resp.headers().get("retry-after").is_none());
    }

    #[test]
    fn outputs_say_truncated_or_error_never_both() {
        let mut r = refused();
        r.outputs = Some(Outputs {
            outputs: vec![OutputFile {
                path: "a".into(),
                encoding: Encoding::Base64,
                content: "AA==".into(),
            }],
            status: OutputsStatus::Failed("\"output\": a symbolic link".into()),
        });
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["outputs_error"], "\"output\": a symbolic link");
        assert!(v.get("outputs_truncated").is_none(), "{v}");
        assert_eq!(v["outputs"][0]["encoding"], "base64");
        r.outputs = None;
        let v = serde_json::to_value(&r).unwrap();
        assert!(v.get("outputs").is_none() && v.get("outputs_error").is_none());
    }

    #[test]
    fn text_stays_text_and_bytes_become_base64() {
        assert_eq!(
            Encoding::encode(b"hi".to_vec()),
            (Encoding::Utf8, "hi".to_string())
        );
        assert_eq!(
            Encoding::encode(vec![0xff, 0]),
            (Encoding::Base64, "/wA=".to_string())
        );
    }
}
