//! From a request to what runs: the profile with the request's limits, the
//! command (or the code file and its interpreter), the input files.

use std::collections::BTreeMap;

use corral_policy::{ByteSize, Profile, RunLimit};
use rmcp::schemars::JsonSchema;
use serde::Deserialize;

use crate::base64;
use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;

/// The body of `POST /v1/executions`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRequest {
    /// Profile (default: the tenant's first).
    pub profile: Option<String>,
    /// A command from the profile's allowlist, with arguments.
    pub command: Option<Vec<String>>,
    /// `python`, `node` or `bash` (code mode only). Text, so that another
    /// language is answered `language.unknown` rather than as malformed.
    #[schema(example = "python")]
    pub language: Option<String>,
    /// The code to run (code mode only).
    pub code: Option<String>,
    /// Standard input.
    pub stdin: Option<String>,
    /// Files written into the workspace first.
    pub files: Option<Vec<InputFile>>,
    /// Limits, at most the profile's.
    pub limits: Option<RequestLimits>,
    /// Environment variables (the blocklist applies).
    pub env: Option<BTreeMap<String, String>>,
}

/// An input file.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    /// Path relative to the workspace.
    pub path: String,
    /// Content.
    pub content: String,
    /// `utf8` (default) or `base64`.
    #[schema(example = "utf8")]
    pub encoding: Option<String>,
}

/// Requested limits; units in the names.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestLimits {
    /// Wall-clock limit (rounded up to whole seconds).
    pub timeout_ms: Option<u64>,
    /// Memory, swap included.
    pub memory_bytes: Option<u64>,
    /// Bytes kept per output stream.
    pub output_bytes: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// CPU time (rounded up to whole seconds).
    pub cpu_time_ms: Option<u64>,
}

/// The languages of code mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// python3
    Python,
    /// node
    Node,
    /// bash
    Bash,
}

impl Language {
    /// The language a request names, if corral knows it.
    pub fn from_name(name: &str) -> Option<Language> {
        match name {
            "python" => Some(Language::Python),
            "node" => Some(Language::Node),
            "bash" => Some(Language::Bash),
            _ => None,
        }
    }

    /// The interpreter and the code file's name under `.corral/`.
    fn program(self) -> (&'static str, &'static str) {
        match self {
            Language::Python => ("python3", "main.py"),
            Language::Node => ("node", "main.js"),
            Language::Bash => ("bash", "main.sh"),
        }
    }
}

/// A request turned into what runs.
#[derive(Debug)]
pub struct Prepared {
    /// The profile with the request's limits applied.
    pub profile: Profile,
    /// argv.
    pub argv: Vec<String>,
    /// The caller's files to write first (path, bytes).
    pub files: Vec<(String, Vec<u8>)>,
    /// The code file corral writes under the reserved `.corral/` (code mode).
    pub code_file: Option<(String, Vec<u8>)>,
    /// Standard input.
    pub stdin: Option<Vec<u8>>,
    /// Environment to set.
    pub env: Vec<(String, String)>,
    /// What the audit record hashes (and stores when configured).
    pub code: String,
}

/// The input files' count and total size, checked before anything is
/// written: the workspace is new, so what corral writes is all it holds,
/// and no write has to measure it again (which made many small files
/// quadratic).
fn check_input_totals(files: &[(String, Vec<u8>)]) -> Result<(), ApiError> {
    use super::{MAX_INPUT_BYTES, MAX_INPUT_FILES};
    if files.len() > MAX_INPUT_FILES {
        return Err(ApiError::new(
            ErrorCode::RequestInvalid,
            format!(
                "{} input files: at most {MAX_INPUT_FILES} per request; pack them (a tar or zip file) and unpack them in the sandbox",
                files.len()
            ),
        ));
    }
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    if total > MAX_INPUT_BYTES {
        return Err(ApiError::new(
            ErrorCode::RequestInvalid,
            format!("the input files hold {total} bytes together: at most {MAX_INPUT_BYTES}"),
        ));
    }
    Ok(())
}

/// Validates a request for a tenant that may use `tenant_profiles`. The
/// checks run in a fixed order, so a request with several faults always
/// gets the same code: profile, limits, file encodings, then the shape
/// (`command`, or `language` and `code`).
pub fn prepare(
    state: &AppState,
    tenant_profiles: &[String],
    req: ExecutionRequest,
) -> Result<Prepared, ApiError> {
    let mut profile = choose_profile(state, tenant_profiles, req.profile.as_deref())?;
    apply_limits(&mut profile, req.limits.unwrap_or_default())?;
    let files = req
        .files
        .unwrap_or_default()
        .into_iter()
        .map(decode_file)
        .collect::<Result<Vec<_>, _>>()?;
    check_input_totals(&files)?;
    let Program {
        argv,
        code_file,
        code,
    } = match (req.command, req.language, req.code) {
        (Some(cmd), None, None) => {
            if cmd.is_empty() {
                return Err(ApiError::new(
                    ErrorCode::RequestInvalid,
                    "`command` is empty",
                ));
            }
            Program {
                code: command_text(&cmd),
                argv: cmd,
                code_file: None,
            }
        }
        (None, Some(lang), Some(code)) => {
            check_code_mode(state)?;
            let language = Language::from_name(&lang).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::LanguageUnknown,
                    format!("unknown language `{lang}` (python, node or bash)"),
                )
            })?;
            code_program(language, code)
        }
        _ => {
            return Err(ApiError::new(
                ErrorCode::RequestInvalid,
                "send either `command` (an array) or `language` and `code`",
            ))
        }
    };
    Ok(Prepared {
        profile,
        argv,
        files,
        code_file,
        stdin: req.stdin.map(String::into_bytes),
        env: req.env.unwrap_or_default().into_iter().collect(),
        code,
    })
}

/// Validates code to run (MCP's `run_code`): the same checks as
/// [`prepare`] for a `language`/`code` request under the tenant's first
/// profile, with only a timeout and the bytes kept per output stream
/// (`None`: `default_output_bytes`, or the profile's ceiling if lower).
pub fn prepare_code(
    state: &AppState,
    tenant_profiles: &[String],
    language: Language,
    code: String,
    timeout_ms: Option<u64>,
    output_bytes: Option<u64>,
    default_output_bytes: u64,
) -> Result<Prepared, ApiError> {
    let mut profile = choose_profile(state, tenant_profiles, None)?;
    let output_bytes = output_bytes
        .unwrap_or_else(|| default_output_bytes.min(profile.limits.output_bytes.bytes()));
    apply_limits(
        &mut profile,
        RequestLimits {
            timeout_ms,
            output_bytes: Some(output_bytes),
            ..RequestLimits::default()
        },
    )?;
    check_code_mode(state)?;
    let Program {
        argv,
        code_file,
        code,
    } = code_program(language, code);
    Ok(Prepared {
        profile,
        argv,
        files: Vec::new(),
        code_file,
        stdin: None,
        env: Vec::new(),
        code,
    })
}

/// The profile a request names (default: the tenant's first), if the
/// tenant may use it.
fn choose_profile(
    state: &AppState,
    tenant_profiles: &[String],
    asked: Option<&str>,
) -> Result<Profile, ApiError> {
    let name = asked
        .or_else(|| tenant_profiles.first().map(String::as_str))
        .unwrap_or(corral_policy::builtin::DEFAULT_PROFILE);
    if !tenant_profiles.iter().any(|p| p == name) {
        return Err(ApiError::new(
            ErrorCode::ProfileForbidden,
            format!(
                "profile `{name}` is not available to this tenant (available: {})",
                tenant_profiles.join(", ")
            ),
        ));
    }
    state
        .config
        .profile(name)
        .cloned()
        .map_err(|e| ApiError::new(ErrorCode::ProfileUnknown, e.to_string()))
}

fn check_code_mode(state: &AppState) -> Result<(), ApiError> {
    if state.config.server.code_mode {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::CodeModeDisabled,
            "code mode is off on this server: send a `command`, or enable [server] code_mode",
        ))
    }
}

/// What runs: argv, the file corral writes first (code mode) and the text
/// the audit record hashes.
struct Program {
    argv: Vec<String>,
    code_file: Option<(String, Vec<u8>)>,
    code: String,
}

/// The program of code mode: the interpreter on `.corral/main.*`.
fn code_program(language: Language, code: String) -> Program {
    let (interpreter, file) = language.program();
    let path = format!(".corral/{file}");
    Program {
        code_file: Some((path.clone(), code.clone().into_bytes())),
        argv: vec![interpreter.to_string(), path],
        code,
    }
}

/// An input file's bytes, decoded as its `encoding` says.
fn decode_file(f: InputFile) -> Result<(String, Vec<u8>), ApiError> {
    let data = match f.encoding.as_deref().unwrap_or("utf8") {
        "utf8" => f.content.into_bytes(),
        "base64" => base64::decode(&f.content).ok_or_else(|| {
            ApiError::new(
                ErrorCode::FilesEncoding,
                format!("{}: content is not valid base64", f.path),
            )
        })?,
        other => {
            return Err(ApiError::new(
                ErrorCode::FilesEncoding,
                format!("{}: unknown encoding `{other}` (utf8 or base64)", f.path),
            ))
        }
    };
    Ok((f.path, data))
}

/// What the audit record hashes (`code_sha256`) and stores (`code`) for a
/// `command` request: the command as a compact JSON array, as serde_json
/// writes it (`["sh","-c","echo hi"]`). Unlike the arguments joined with
/// spaces it is unambiguous: `["a b"]` and `["a","b"]` differ.
pub fn command_text(argv: &[String]) -> String {
    serde_json::to_string(argv).unwrap_or_default()
}

/// Applies requested limits: each in the range `corral run` and config
/// files accept for the same limit ([`RunLimit::check`], else 422
/// `limits.invalid`) and at most the profile's ceiling (else 422
/// `limits.above_ceiling`). Times in milliseconds are rounded up to whole
/// seconds first.
pub(crate) fn apply_limits(p: &mut Profile, req: RequestLimits) -> Result<(), ApiError> {
    let l = &mut p.limits;
    // `value` and `ceiling` are in the request's unit; `in_limit_unit` is
    // the value in the unit `RunLimit` counts in (seconds for `_ms`).
    let check = |field: &str,
                 limit: RunLimit,
                 value: u64,
                 in_limit_unit: u64,
                 ceiling: Option<u64>|
     -> Result<u64, ApiError> {
        limit.check(in_limit_unit).map_err(|e| {
            // `e` shows the value in the limit's unit: say what was asked
            // when that differs (milliseconds rounded up to seconds).
            let asked = if value == in_limit_unit {
                String::new()
            } else {
                format!(" = {value}")
            };
            ApiError::new(
                ErrorCode::LimitsInvalid,
                format!("limits.{field}{asked}: {e}"),
            )
        })?;
        match ceiling {
            Some(c) if value > c => Err(ApiError::new(
                ErrorCode::LimitsAboveCeiling,
                format!("limits.{field} = {value} is above this profile's ceiling of {c}; see GET /v1/limits"),
            )),
            _ => Ok(value),
        }
    };
    if let Some(ms) = req.timeout_ms {
        let ceiling = l.timeout_secs.map(|s| s.saturating_mul(1000));
        let v = check(
            "timeout_ms",
            RunLimit::Timeout,
            ms,
            ms.div_ceil(1000),
            ceiling,
        )?;
        l.timeout_secs = Some(v.div_ceil(1000));
    }
    if let Some(b) = req.memory_bytes {
        let ceiling = l.memory_bytes.map(ByteSize::bytes);
        l.memory_bytes = Some(ByteSize(check(
            "memory_bytes",
            RunLimit::Memory,
            b,
            b,
            ceiling,
        )?));
    }
    if let Some(b) = req.output_bytes {
        let ceiling = Some(l.output_bytes.bytes());
        l.output_bytes = ByteSize(check("output_bytes", RunLimit::Output, b, b, ceiling)?);
    }
    if let Some(n) = req.pids {
        l.pids = Some(check("pids", RunLimit::Pids, n, n, l.pids)?);
    }
    if let Some(ms) = req.cpu_time_ms {
        let ceiling = l.cpu_time_secs.map(|s| s.saturating_mul(1000));
        let v = check(
            "cpu_time_ms",
            RunLimit::CpuTime,
            ms,
            ms.div_ceil(1000),
            ceiling,
        )?;
        l.cpu_time_secs = Some(v.div_ceil(1000));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_above_the_ceiling_name_the_field() {
        let mut p = corral_policy::builtin::code();
        let e = apply_limits(
            &mut p,
            RequestLimits {
                memory_bytes: Some(64 << 30),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.code(), "limits.above_ceiling");
        assert!(e.to_string().contains("limits.memory_bytes"), "{e}");
        apply_limits(
            &mut p,
            RequestLimits {
                timeout_ms: Some(1500),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.limits.timeout_secs, Some(2));
    }

    #[test]
    fn limits_below_the_cli_minimums_name_the_field() {
        let cases = [
            (
                RequestLimits {
                    memory_bytes: Some((1 << 20) - 1),
                    ..Default::default()
                },
                "limits.memory_bytes",
            ),
            (
                RequestLimits {
                    output_bytes: Some(63),
                    ..Default::default()
                },
                "limits.output_bytes",
            ),
            (
                RequestLimits {
                    timeout_ms: Some(0),
                    ..Default::default()
                },
                "limits.timeout_ms",
            ),
            (
                RequestLimits {
                    pids: Some(2),
                    ..Default::default()
                },
                "limits.pids",
            ),
            // Above the maxima: a timeout that would overflow the deadline.
            (
                RequestLimits {
                    timeout_ms: Some(u64::MAX),
                    ..Default::default()
                },
                "limits.timeout_ms",
            ),
        ];
        for (req, field) in cases {
            let mut p = corral_policy::builtin::code();
            let e = apply_limits(&mut p, req).unwrap_err();
            assert_eq!((e.status().as_u16(), e.code()), (422, "limits.invalid"));
            assert!(e.to_string().contains(field), "{e}");
        }
        let mut p = corral_policy::builtin::code();
        apply_limits(
            &mut p,
            RequestLimits {
                memory_bytes: Some(1 << 20),
                output_bytes: Some(64),
                timeout_ms: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.limits.timeout_secs, Some(1));
    }

    #[test]
    fn the_command_text_is_unambiguous() {
        let text =
            |argv: &[&str]| command_text(&argv.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        assert_ne!(text(&["a b"]), text(&["a", "b"]));
        assert_eq!(
            text(&["sh", "-c", "echo \"hi\"\n"]),
            r#"["sh","-c","echo \"hi\"\n"]"#
        );
    }

    #[test]
    fn languages_map_to_their_interpreter_and_code_file() {
        assert_eq!(Language::from_name("node"), Some(Language::Node));
        assert_eq!(Language::from_name("ruby"), None);
        let p = code_program(Language::Python, "print(1)".into());
        assert_eq!(p.argv, ["python3", ".corral/main.py"]);
        assert_eq!(
            p.code_file,
            Some((".corral/main.py".to_string(), b"print(1)".to_vec()))
        );
        assert_eq!(p.code, "print(1)");
    }
}
