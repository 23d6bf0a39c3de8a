//! What a failed runc invocation says: the last error line of its JSON log
//! (far more than an exit code), else its stderr, else its exit status.

use std::path::Path;

use crate::error::Error;

/// The error of `runc <verb>` (for `phase`) that exited with `code`:
/// runc's own last error line (`detail`, from its log) without its
/// `runc <verb> failed: ` prefix, on one line; else its stderr; else the
/// status.
pub(super) fn failure(
    phase: &str,
    verb: &'static str,
    detail: Option<String>,
    stderr: &[u8],
    code: i32,
) -> Error {
    let prefix = format!("runc {verb} failed: ");
    let detail = detail
        .map(|d| d.strip_prefix(&prefix).map(str::to_string).unwrap_or(d))
        // One line: runc's messages can span several.
        .map(|d| d.trim().replace('\n', "; "))
        .or_else(|| {
            let s = String::from_utf8_lossy(stderr).trim().to_string();
            (!s.is_empty()).then_some(s)
        })
        .unwrap_or_else(|| format!("exit status {code}"));
    Error::Runc {
        phase: phase.to_string(),
        verb,
        detail,
    }
}

/// The message of the last error-level entry of runc's JSON log.
pub(super) fn last_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        (v.get("level")?.as_str()? == "error")
            .then(|| v.get("msg")?.as_str().map(str::to_string))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_line_picks_the_last_error_entry() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.json");
        std::fs::write(
            &log,
            concat!(
                "{\"level\":\"error\",\"msg\":\"first\"}\n",
                "{\"level\":\"warning\",\"msg\":\"noise\"}\n",
                "{\"level\":\"error\",\"msg\":\"container with id exists\"}\n",
                "not json\n"
            ),
        )
        .unwrap();
        assert_eq!(
            last_error_line(&log).as_deref(),
            Some("container with id exists")
        );
    }

    #[test]
    fn last_error_line_of_a_missing_log_is_none() {
        assert_eq!(last_error_line(Path::new("/nonexistent/log.json")), None);
    }

    #[test]
    fn a_failed_create_says_it_as_runc_v2_does_and_other_verbs_name_their_phase() {
        let line = Some(
            "runc create failed: unable to start container process: exec: \"/x\": not found"
                .to_string(),
        );
        assert_eq!(
            failure("create", "create", line, b"", 1).to_string(),
            "OCI runtime create failed: runc create failed: unable to start container process: exec: \"/x\": not found"
        );
        assert_eq!(
            failure(
                "restore",
                "restore",
                Some("runc restore failed: criu".into()),
                b"",
                1
            )
            .to_string(),
            "restore: runc restore failed: criu"
        );
    }

    #[test]
    fn a_failure_says_runcs_line_else_its_stderr_else_the_status() {
        let detail = |e: Error| match e {
            Error::Runc {
                phase,
                verb,
                detail,
            } => format!("{phase}/{verb}: {detail}"),
            other => panic!("not a runc error: {other:?}"),
        };
        let line = Some("runc create failed: unable to start\ncontainer init".to_string());
        assert_eq!(
            detail(failure("create", "create", line, b"ignored", 1)),
            "create/create: unable to start; container init"
        );
        assert_eq!(
            detail(failure("pids", "ps", None, b" no such container\n", 1)),
            "pids/ps: no such container"
        );
        assert_eq!(
            detail(failure("start", "start", None, b"  ", 2)),
            "start/start: exit status 2"
        );
    }
}
