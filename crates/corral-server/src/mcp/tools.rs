//! The tools' arguments and what they do: `run_code` through the same
//! typed functions as `POST /v1/executions`, the file tools on the
//! session's workspace.

use std::sync::atomic::Ordering;
use std::time::Instant;

use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::schemars::JsonSchema;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde::{Deserialize, Serialize};

use super::http::session_ended;
use super::session::run_in_workspace;
use super::CorralMcp;
use crate::base64;
use crate::error::{ApiError, ErrorCode};
use crate::exec::{self, CancelOnDrop, Encoding, ExecutionResponse, Job, Language, RunOutcome};
use crate::workspace::{check_path, EntryKind, FileLimits, WorkspaceError, DEFAULT_RESERVED};

/// Largest file `write_file` writes and `read_file` returns.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Largest total of regular files in a session workspace that `write_file`
/// still adds to (what the code wrote counts too).
pub const MAX_WORKSPACE_BYTES: u64 = 64 << 20;
/// Most entries `list_files` returns.
pub const MAX_LIST_ENTRIES: usize = 1000;
/// Bytes of each output stream `run_code` returns unless asked otherwise:
/// both streams, even base64-encoded, and the summary stay under 256 KiB.
pub const DEFAULT_RESULT_STREAM_BYTES: u64 = 64 << 10;
/// Most bytes of each output stream `run_code` returns: both streams,
/// even base64-encoded, stay under the 1 MiB that the SDKs' SSE readers
/// take (and far under the 10 MiB of their stdio line buffers).
pub const MAX_RESULT_STREAM_BYTES: u64 = 256 << 10;
/// Fewest bytes of each output stream `run_code` returns: the output
/// limit's own minimum (room for the elision marker).
pub const MIN_RESULT_STREAM_BYTES: u64 = corral_policy::RunLimit::Output.minimum();
/// Output (both streams together) up to this size is repeated whole in
/// the text content; above it the text shows a preview.
const SMALL_OUTPUT: usize = 4 << 10;
/// Bytes of each stream the text content previews.
const PREVIEW_BYTES: usize = 512;

/// Arguments of `run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RunCodeArgs {
    /// The interpreter: python, node or bash.
    pub language: Language,
    /// The program text.
    pub code: String,
    /// Wall-clock limit in milliseconds (rounded up to whole seconds; at
    /// most the profile's ceiling).
    pub timeout_ms: Option<u64>,
    /// Bytes returned of each output stream (stdout, stderr); more output
    /// is cut to its head and tail and marked `stdout_truncated`. Default
    /// 65536, at most 262144.
    pub max_output_bytes: Option<u64>,
}

/// How `write_file`'s content is encoded: `utf8` (default) or `base64`.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(rename_all = "lowercase")]
pub enum ContentEncoding {
    /// The content is the text itself.
    #[default]
    Utf8,
    /// The content is base64 (binary files).
    Base64,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct WriteFileArgs {
    /// Path relative to the workspace, e.g. `data/input.csv`.
    pub path: String,
    /// The file's content.
    pub content: String,
    /// How `content` is encoded: utf8 (default) or base64.
    pub encoding: Option<ContentEncoding>,
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReadFileArgs {
    /// Path relative to the workspace.
    pub path: String,
    /// Bytes of the file to skip (default 0): read a large file in pieces,
    /// from the `next_offset` of the previous answer.
    pub offset: Option<u64>,
    /// Bytes returned from `offset` (default 65536, at most 262144); the
    /// answer says `truncated` and gives `next_offset` when more follow.
    pub max_bytes: Option<u64>,
}

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ListFilesArgs {
    /// Directory relative to the workspace (default: the workspace itself).
    pub path: Option<String>,
}

/// `write_file`'s structured answer.
#[derive(Serialize)]
struct Written<'a> {
    path: &'a str,
    size_bytes: u64,
}

/// `read_file`'s structured answer: one window of the file, the only copy
/// of its bytes in the answer.
#[derive(Serialize)]
struct FileRead<'a> {
    path: &'a str,
    encoding: Encoding,
    content: &'a str,
    /// The whole file's size.
    size_bytes: u64,
    /// Where the window starts.
    offset: u64,
    /// The window's size (before any base64).
    returned_bytes: u64,
    /// Whether bytes follow the window.
    truncated: bool,
    /// Where the next window starts, when bytes follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_offset: Option<u64>,
}

/// `list_files`' structured answer.
#[derive(Serialize)]
struct Listed<'a> {
    path: &'a str,
    entries: Vec<ListedEntry>,
    truncated: bool,
}

/// One entry of `list_files`.
#[derive(Serialize)]
struct ListedEntry {
    name: String,
    kind: &'static str,
    size_bytes: u64,
}

/// A place in a session's queue, given back when the call leaves it.
struct Queued<'a>(&'a std::sync::atomic::AtomicU32);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A successful tool answer: `text` for people, `value` as structured
/// content (serialised here, at the protocol's edge).
fn answer(text: String, value: &impl Serialize) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = serde_json::to_value(value).ok();
    r
}

/// Runs blocking file work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("file task failed: {e}")))
}

impl CorralMcp {
    /// `run_code`: validates, takes the session's, the tenant's and a
    /// global slot without waiting, runs in the session's workspace.
    pub(super) async fn run_code_inner(
        &self,
        args: RunCodeArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ApiError> {
        let st = &self.shared.state;
        let t = self.tenant(&ctx)?;
        let refused = |e: ApiError| {
            st.metrics.refused.fetch_add(1, Ordering::Relaxed);
            e
        };
        if !st.config.server.code_mode {
            return Err(refused(ApiError::new(
                ErrorCode::CodeModeDisabled,
                "code mode is off on this server",
            )));
        }
        if let Some(n) = args.max_output_bytes {
            if n < MIN_RESULT_STREAM_BYTES {
                return Err(refused(ApiError::new(
                    ErrorCode::LimitsInvalid,
                    format!("max_output_bytes = {n} is below {MIN_RESULT_STREAM_BYTES}"),
                )));
            }
            if n > MAX_RESULT_STREAM_BYTES {
                return Err(refused(ApiError::new(
                    ErrorCode::LimitsAboveCeiling,
                    format!(
                        "max_output_bytes = {n} is above run_code's ceiling of {MAX_RESULT_STREAM_BYTES}"
                    ),
                )));
            }
        }
        // The validation of `POST /v1/executions`, on the typed arguments;
        // the launcher keeps only the head and tail of what is returned.
        let prepared = exec::prepare_code(
            st,
            &t.tenant.profiles,
            args.language,
            args.code,
            args.timeout_ms,
            args.max_output_bytes,
            DEFAULT_RESULT_STREAM_BYTES,
        )
        .map_err(refused)?;
        let ws = self.workspace(t)?;
        let id = exec::new_id()?;
        let busy = |what: &str| {
            st.metrics.busy.fetch_add(1, Ordering::Relaxed);
            ApiError::busy(format!("{what}; retry in a moment"))
        };
        let accepted = Instant::now();
        let session_slot = self.session_slot(&ctx, busy).await?;
        let tenant_slot = t
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy("all of this tenant's execution slots are in use"))?;
        let global_slot = st
            .global
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy("all execution slots are in use"))?;
        let sandbox = st.sandbox_permit().await?;
        st.metrics.started.fetch_add(1, Ordering::Relaxed);
        st.metrics.queue_wait("mcp", accepted.elapsed());
        let job = Job::new(id, t.tenant.name.clone(), prepared);
        let cancel = st.cancel_flag();
        let mut guard = CancelOnDrop::new(cancel.clone());
        let state = st.clone();
        let flag = cancel.clone();
        let mut task = tokio::task::spawn_blocking(move || {
            let result = run_in_workspace(&state, &job, &ws, flag);
            state.metrics.finished.fetch_add(1, Ordering::Relaxed);
            drop((tenant_slot, global_slot, sandbox));
            result
        });
        let joined = tokio::select! {
            r = &mut task => r,
            () = ctx.ct.cancelled() => {
                // The client cancelled the call: kill the sandbox, then
                // wait for it to be gone.
                cancel.store(true, Ordering::Relaxed);
                task.await
            }
            () = session_ended(&ctx) => {
                // Its session ended (a DELETE): nobody will read the answer.
                cancel.store(true, Ordering::Relaxed);
                task.await
            }
        };
        guard.disarm();
        drop(session_slot);
        let response =
            joined.map_err(|e| ApiError::internal(format!("execution task failed: {e}")))??;
        Ok(run_result(&response))
    }

    /// The session's execution slot: at once when it is free, else after
    /// the calls ahead, waiting in a queue of `server.mcp_session_queue`
    /// (full: `busy`). A call cancelled while it waits leaves the queue at
    /// once.
    async fn session_slot(
        &self,
        ctx: &RequestContext<RoleServer>,
        busy: impl Fn(&str) -> ApiError,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, ApiError> {
        if let Ok(slot) = self.session.running.try_lock() {
            return Ok(slot);
        }
        let depth = self.shared.state.config.server.mcp_session_queue;
        let queued = &self.session.queued;
        let place = queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < depth).then_some(n + 1)
        });
        if place.is_err() {
            return Err(busy(&format!(
                "this session is running code and {depth} more calls are waiting (server.mcp_session_queue)"
            )));
        }
        let _place = Queued(queued);
        tokio::select! {
            slot = self.session.running.lock() => Ok(slot),
            () = ctx.ct.cancelled() => Err(ApiError::new(
                ErrorCode::Cancelled,
                "the call was cancelled while it waited for the session's running code",
            )),
            () = session_ended(ctx) => Err(ApiError::new(
                ErrorCode::Cancelled,
                "the session ended while the call waited for its running code",
            )),
        }
    }

    /// `write_file`: create or replace a file in the session's workspace.
    pub(super) async fn write_file_inner(
        &self,
        args: WriteFileArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ApiError> {
        let t = self.tenant(&ctx)?;
        let data = match args.encoding.unwrap_or_default() {
            ContentEncoding::Utf8 => args.content.into_bytes(),
            ContentEncoding::Base64 => base64::decode(&args.content).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::FilesEncoding,
                    format!("{:?}: content is not valid base64", args.path),
                )
            })?,
        };
        // Refused before anything touches the disk (the workspace checks
        // again, and the kernel is what keeps the host safe).
        check_path(&args.path, DEFAULT_RESERVED)?;
        let len = data.len() as u64;
        if len > MAX_FILE_BYTES {
            return Err(WorkspaceError::TooLarge {
                path: args.path,
                limit_bytes: MAX_FILE_BYTES,
            }
            .into());
        }
        let ws = self.workspace(t)?;
        let _one_writer = self.session.writes.lock().await;
        let path = args.path.clone();
        blocking(move || {
            let limits = FileLimits {
                max_file_bytes: MAX_FILE_BYTES,
                max_workspace_bytes: MAX_WORKSPACE_BYTES,
                reserved: DEFAULT_RESERVED,
            };
            ws.write_file(&path, &data, &limits)
        })
        .await??;
        Ok(answer(
            format!("wrote {len} bytes to {}", args.path),
            &Written {
                path: &args.path,
                size_bytes: len,
            },
        ))
    }

    /// `read_file`: a regular file of the session's workspace.
    pub(super) async fn read_file_inner(
        &self,
        args: ReadFileArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ApiError> {
        let t = self.tenant(&ctx)?;
        // corral's own files (the code file under `.corral/`) are not the
        // caller's to read either.
        check_path(&args.path, DEFAULT_RESERVED)?;
        let ws = self.workspace(t)?;
        let path = args.path.clone();
        let max = args.max_bytes.unwrap_or(DEFAULT_RESULT_STREAM_BYTES);
        if !(1..=MAX_RESULT_STREAM_BYTES).contains(&max) {
            return Err(ApiError::new(
                ErrorCode::LimitsInvalid,
                format!("max_bytes = {max} is outside 1 to {MAX_RESULT_STREAM_BYTES}"),
            ));
        }
        let data = blocking(move || ws.read_file(&path, MAX_FILE_BYTES)).await??;
        Ok(file_window(
            &args.path,
            &data,
            args.offset.unwrap_or(0),
            max,
        ))
    }

    /// `list_files`: a directory of the session's workspace, corral's own
    /// names left out.
    pub(super) async fn list_files_inner(
        &self,
        args: ListFilesArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ApiError> {
        let t = self.tenant(&ctx)?;
        let path = args.path.unwrap_or_default();
        // A reserved first component is refused like a read of it.
        if let Some(first) = path.split('/').find(|c| !c.is_empty() && *c != ".") {
            check_path(first, DEFAULT_RESERVED)?;
        }
        let top = path.split('/').all(|c| c.is_empty() || c == ".");
        let ws = self.workspace(t)?;
        let rel = path.clone();
        let listing = blocking(move || ws.list(&rel, MAX_LIST_ENTRIES)).await??;
        let reserved = |name: &str| top && check_path(name, DEFAULT_RESERVED).is_err();
        let entries: Vec<ListedEntry> = listing
            .entries
            .iter()
            .filter_map(|e| {
                let name = e.name.to_string_lossy();
                if reserved(&name) {
                    return None;
                }
                let kind = match e.kind {
                    EntryKind::File => "file",
                    EntryKind::Dir => "dir",
                    EntryKind::Symlink => "symlink",
                    EntryKind::Other => "other",
                };
                Some(ListedEntry {
                    name: name.into_owned(),
                    kind,
                    size_bytes: e.size_bytes,
                })
            })
            .collect();
        let text = if entries.is_empty() {
            "(empty)".to_string()
        } else {
            entries
                .iter()
                .map(|e| {
                    let suffix = match e.kind {
                        "dir" => "/",
                        "symlink" => "@",
                        _ => "",
                    };
                    format!("{}{suffix}\t{}", e.name, e.size_bytes)
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let value = Listed {
            path: &path,
            entries,
            truncated: listing.truncated,
        };
        Ok(answer(text, &value))
    }
}

/// `run_code`'s answer: the result object (as `POST /v1/executions`,
/// each stream at most `limits.output_bytes` plus the elision marker) as
/// structured content, the only full copy of the output; a stream that
/// JSON escaping would make larger than base64 (control bytes) is
/// `stdout_base64` instead of `stdout`. The text content is a summary,
/// with the streams whole only when they are small.
fn run_result(response: &ExecutionResponse) -> CallToolResult {
    let mut value = serde_json::to_value(response).unwrap_or_default();
    let mut streams = Vec::new();
    if let RunOutcome::Ran(r) = &response.outcome {
        let cap = usize::try_from(response.limits.output_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(64);
        for (name, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
            // Invalid UTF-8 became U+FFFD (3 bytes) in the launcher: cut
            // again so that even that stays within the budget.
            let text = cut(text, cap);
            let binary = escaped_len(&text) > base64_len(text.len());
            if let Some(obj) = value.as_object_mut() {
                obj.remove(name);
                let (key, v) = if binary {
                    (format!("{name}_base64"), base64::encode(text.as_bytes()))
                } else {
                    (name.to_string(), text.clone())
                };
                obj.insert(key, serde_json::Value::String(v));
            }
            streams.push(Stream { name, text, binary });
        }
    }
    let mut r = CallToolResult::success(vec![ContentBlock::text(summary(response, &streams))]);
    r.structured_content = Some(value);
    r
}

/// `read_file`'s answer: at most `max` bytes of `data` from `offset`, once,
/// as structured content (text when it is UTF-8 that JSON escaping leaves
/// no larger than base64, else base64; a window that ends inside a
/// character ends before it). The text content is the window itself only
/// when it is small text, else a summary with a preview.
fn file_window(path: &str, data: &[u8], offset: u64, max: u64) -> CallToolResult {
    let size = data.len();
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(size);
    let mut end = start
        .saturating_add(usize::try_from(max).unwrap_or(usize::MAX))
        .min(size);
    let text = match std::str::from_utf8(&data[start..end]) {
        Ok(t) => Some(t),
        // Cut inside a character at the end: stop before it.
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => {
            end = start + e.valid_up_to();
            std::str::from_utf8(&data[start..end]).ok()
        }
        Err(_) => None,
    };
    let window = &data[start..end];
    let text = text.filter(|t| escaped_len(t) <= base64_len(t.len()));
    let (encoding, content) = match text {
        Some(t) => (Encoding::Utf8, t.to_owned()),
        None => (Encoding::Base64, base64::encode(window)),
    };
    let truncated = end < size;
    let value = FileRead {
        path,
        encoding,
        content: &content,
        size_bytes: size as u64,
        offset: start as u64,
        returned_bytes: window.len() as u64,
        truncated,
        next_offset: truncated.then_some(end as u64),
    };
    let summary = match text {
        Some(t) if !truncated && start == 0 && t.len() <= SMALL_OUTPUT => t.to_owned(),
        _ => {
            let mut s = format!(
                "{path}: bytes {start} to {end} of {size}{}",
                if truncated {
                    format!(" (truncated; continue with offset {end})")
                } else {
                    String::new()
                }
            );
            match text {
                Some(t) => {
                    let mut cut = PREVIEW_BYTES.min(t.len());
                    while !t.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    s.push_str(&format!(
                        "; all in structured content as `content`, first {cut} bytes:\n{}",
                        &t[..cut]
                    ));
                }
                None => s.push_str("; in structured content as base64 `content`"),
            }
            s
        }
    };
    answer(summary, &value)
}

/// One stream as returned.
struct Stream<'a> {
    name: &'a str,
    text: String,
    binary: bool,
}

/// `text` if it has at most `max` bytes, else its head and tail around the
/// launcher's elision marker, cut on character boundaries.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let half = max / 2;
    let mut head = half;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - half;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    let elided = (tail - head) as u64;
    format!(
        "{}{}{}",
        &text[..head],
        corral_launcher::elision_marker(elided),
        &text[tail..]
    )
}

/// Bytes of `text` as a JSON string's content (serde_json's escapes).
fn escaped_len(text: &str) -> usize {
    text.chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum()
}

/// Bytes of `n` bytes in base64.
fn base64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Exit code, flags and each stream's size for people; the streams
/// themselves when small, else a preview of each.
fn summary(response: &ExecutionResponse, streams: &[Stream<'_>]) -> String {
    let mut head = format!("exit_code: {}", response.exit_code());
    let RunOutcome::Ran(r) = &response.outcome else {
        return head;
    };
    if let Some(sig) = r.signal {
        head.push_str(&format!(", signal: {sig}"));
    }
    let flags = [
        ("timed_out", r.timed_out),
        ("oom_killed", r.oom_killed),
        ("output_limit_exceeded", r.output_limit_exceeded),
        ("cancelled", response.cancelled),
    ];
    for (flag, set) in flags {
        if set {
            head.push_str(&format!(", {flag}"));
        }
    }
    let small = streams.iter().all(|s| !s.binary)
        && streams.iter().map(|s| s.text.len()).sum::<usize>() <= SMALL_OUTPUT;
    for s in streams {
        let (total, truncated) = match s.name {
            "stdout" => (r.stdout_bytes, r.stdout_truncated),
            _ => (r.stderr_bytes, r.stderr_truncated),
        };
        let mut title = format!("--- {}", s.name);
        if truncated {
            title.push_str(&format!(
                " (truncated: {total} bytes written, head and tail returned)"
            ));
        }
        if s.binary {
            title.push_str(&format!(
                " (control bytes: {} bytes in structured content as {}_base64)",
                s.text.len(),
                s.name
            ));
            head.push_str(&format!("\n{title} ---"));
        } else if small {
            head.push_str(&format!("\n{title} ---\n{}", s.text));
        } else {
            let mut end = PREVIEW_BYTES.min(s.text.len());
            while !s.text.is_char_boundary(end) {
                end -= 1;
            }
            if end < s.text.len() {
                title.push_str(&format!(
                    " (first {end} of {} bytes; all in structured content)",
                    s.text.len()
                ));
            }
            head.push_str(&format!("\n{title} ---\n{}", &s.text[..end]));
        }
    }
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_len_is_what_serde_json_writes() {
        for s in [
            "plain",
            "a\"b\\c\nd\te\r",
            "\u{0}\u{1}\u{1b}\u{8}\u{c}\u{7f}",
            "é€😀\u{fffd}",
        ] {
            let json = serde_json::to_string(s).unwrap();
            assert_eq!(escaped_len(s), json.len() - 2, "{s:?}");
        }
    }

    #[test]
    fn cut_keeps_head_and_tail_on_char_boundaries_within_the_cap() {
        assert_eq!(cut("short", 10), "short");
        let s = "é".repeat(1000);
        let c = cut(&s, 101);
        assert!(
            c.starts_with(&"é".repeat(25)) && c.ends_with(&"é".repeat(25)),
            "{c}"
        );
        assert!(c.contains("[corral: "), "{c}");
        assert!(c.len() <= 101 + corral_launcher::elision_marker(2000).len());
    }
}
