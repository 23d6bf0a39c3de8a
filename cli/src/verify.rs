//! `vsnap verify NAME`: would a restore on this host accept this artifact?
//! Every check runs that can, and every problem is named.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::Serialize;
use vsnap_artifact::layout::check_layout;
use vsnap_artifact::{clocks, compat, content, Clocks, HostIdentity, Manifest};

use crate::store::{self, MacStatus};
use crate::table::{row, table};
use crate::units::size_and_bytes;
use crate::{classify, emit, emit_json, Ctx, LoadFailure, Outcome, FAILED, OK};

/// At most this many problems per check are listed.
const MAX_PROBLEMS: usize = 20;

#[derive(Serialize)]
struct Check {
    check: &'static str,
    /// `ok`, `failed` or `skipped`.
    status: &'static str,
    /// What was found (when ok) or why it was skipped.
    detail: String,
    problems: Vec<String>,
}

impl Check {
    fn ok(check: &'static str, detail: impl Into<String>) -> Self {
        Check {
            check,
            status: "ok",
            detail: detail.into(),
            problems: Vec::new(),
        }
    }

    fn failed(check: &'static str, problems: Vec<String>) -> Self {
        Check {
            check,
            status: "failed",
            detail: String::new(),
            problems,
        }
    }

    fn skipped(check: &'static str, why: &str) -> Self {
        Check {
            check,
            status: "skipped",
            detail: why.to_string(),
            problems: Vec::new(),
        }
    }
}

#[derive(Serialize)]
struct Report<'a> {
    name: &'a str,
    path: String,
    valid: bool,
    checks: Vec<Check>,
}

pub fn run(ctx: &Ctx, name: &str, quick: bool, json: bool) -> Outcome {
    store::check_name(name)?;
    let root = &ctx.root;
    let dir = root.join(name);
    let mut checks = Vec::new();

    // The folder and manifest file: what a restore checks first.
    match check_layout(root, name) {
        Ok(_) => checks.push(Check::ok(
            "layout",
            "safe path, folder 0700, manifest 0600, images/ and control/ present",
        )),
        Err(e) => match classify(root, name, e) {
            LoadFailure::Error(e) => return Err(e),
            LoadFailure::Invalid(e) => checks.push(Check::failed("layout", vec![e])),
        },
    }
    checks.push(check_files(&dir));

    let manifest = if checks[0].status == "ok" {
        match Manifest::load_unverified(root, name) {
            Ok(m) => {
                checks.push(Check::ok(
                    "manifest",
                    format!(
                        "schema {}, names {name}, capture {}",
                        m.schema_version, m.capture_id
                    ),
                ));
                Some(m)
            }
            Err(e) => match classify(root, name, e) {
                LoadFailure::Error(e) => return Err(e),
                LoadFailure::Invalid(e) => {
                    checks.push(Check::failed("manifest", vec![e]));
                    None
                }
            },
        }
    } else {
        checks.push(Check::skipped(
            "manifest",
            "not read: the layout check failed",
        ));
        None
    };

    match &manifest {
        Some(m) => {
            checks.push(check_mac(root, m));
            checks.push(check_contents(root, &dir, m, quick));
            checks.push(check_host(ctx, m));
            checks.push(check_clocks(m));
        }
        None => {
            for c in ["mac", "contents", "host", "clocks"] {
                checks.push(Check::skipped(c, "no readable manifest"));
            }
        }
    }

    let valid = checks.iter().all(|c| c.status == "ok");
    let report = Report {
        name,
        path: dir.display().to_string(),
        valid,
        checks,
    };
    if json {
        emit_json(&report);
    } else {
        emit(&human(&report));
    }
    Ok(if valid { OK } else { FAILED })
}

fn human(r: &Report) -> String {
    let mut rows = vec![row(&["CHECK", "RESULT"])];
    for c in &r.checks {
        match c.status {
            "ok" => rows.push(row(&[c.check.to_string(), format!("ok: {}", c.detail)])),
            "skipped" => rows.push(row(&[
                c.check.to_string(),
                format!("skipped: {}", c.detail),
            ])),
            _ => {
                let mut problems = c.problems.iter();
                let first = problems.next().map(String::as_str).unwrap_or("");
                rows.push(row(&[c.check.to_string(), format!("FAILED: {first}")]));
                for p in problems {
                    rows.push(row(&["", &format!("        {p}")]));
                }
            }
        }
    }
    let mut out = table(&rows);
    let failed = r.checks.iter().filter(|c| c.status == "failed").count();
    if r.valid {
        out.push_str(&format!("{}: valid\n", r.name));
    } else {
        out.push_str(&format!(
            "{}: INVALID ({failed} check{} failed)\n",
            r.name,
            if failed == 1 { "" } else { "s" }
        ));
    }
    out
}

/// Every entry under the artifact: a folder or regular file, root-owned, not
/// group/world-writable, no symlink. The MAC covers the manifest only, so
/// the images are as trustworthy as who can write them.
fn check_files(dir: &Path) -> Check {
    let mut problems = Vec::new();
    let mut count = 0usize;
    if fs::symlink_metadata(dir)
        .map(|m| m.is_dir())
        .unwrap_or(false)
    {
        walk(dir, &mut problems, &mut count);
    } else {
        return Check::skipped("files", "the artifact is not a folder");
    }
    if problems.is_empty() {
        return Check::ok(
            "files",
            format!("{count} entries, root-owned, not group/world-writable, no symlinks"),
        );
    }
    if problems.len() > MAX_PROBLEMS {
        let more = problems.len() - MAX_PROBLEMS;
        problems.truncate(MAX_PROBLEMS);
        problems.push(format!("... and {more} more"));
    }
    Check::failed("files", problems)
}

fn walk(dir: &Path, problems: &mut Vec<String>, count: &mut usize) {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            problems.push(format!("read {}: {e}", dir.display()));
            return;
        }
    };
    for e in entries {
        let path = match e {
            Ok(e) => e.path(),
            Err(e) => {
                problems.push(format!("read {}: {e}", dir.display()));
                continue;
            }
        };
        *count += 1;
        let md = match fs::symlink_metadata(&path) {
            Ok(md) => md,
            Err(e) => {
                problems.push(format!("stat {}: {e}", path.display()));
                continue;
            }
        };
        let ft = md.file_type();
        if ft.is_symlink() {
            problems.push(format!("{} is a symlink", path.display()));
            continue;
        }
        if !ft.is_dir() && !ft.is_file() {
            problems.push(format!(
                "{} is neither a folder nor a regular file",
                path.display()
            ));
        }
        if md.uid() != 0 {
            problems.push(format!(
                "{} is owned by uid {}, not root",
                path.display(),
                md.uid()
            ));
        }
        if md.mode() & 0o022 != 0 {
            problems.push(format!(
                "{} is group/world-writable (mode {:04o})",
                path.display(),
                md.mode() & 0o7777
            ));
        }
        if ft.is_dir() {
            walk(&path, problems, count);
        }
    }
}

fn check_mac(root: &Path, m: &Manifest) -> Check {
    match MacStatus::of(root, m) {
        MacStatus::Verified => Check::ok("mac", "verifies with this host's key"),
        status => Check::failed("mac", vec![status.describe(root)]),
    }
}

/// Every file a restore reads (images/, control/, dev-shm/) is there, of
/// its recorded size and, unless `quick`, matches its content digests
/// chunk by chunk (the pages files sealed at rest opened with this host's
/// key under `root`); nothing else is there. What a restore checks too.
fn check_contents(root: &Path, dir: &Path, m: &Manifest, quick: bool) -> Check {
    let files = m.contents.len();
    let bytes: u64 = m.contents.values().map(|f| f.size).sum();
    let checked = if quick {
        content::verify_sizes(dir, &m.contents).map(drop)
    } else {
        let opener = m
            .sealed
            .as_ref()
            .map(|s| vsnap_artifact::HostKey::load(root).and_then(|k| s.opener(&k)));
        opener
            .transpose()
            .and_then(|o| content::verify_opened(dir, &m.contents, 2, o.as_ref()))
    };
    match checked {
        Err(e) => Check::failed("contents", vec![e.to_string()]),
        Ok(()) if quick => Check::ok(
            "contents",
            format!(
                "{files} files, {}, sizes as the manifest says (--quick: digests not checked)",
                size_and_bytes(bytes)
            ),
        ),
        Ok(()) => Check::ok(
            "contents",
            format!(
                "{files} files, {}, every chunk matches its digest",
                size_and_bytes(bytes)
            ),
        ),
    }
}

/// This host's clocks against the capture's, as a restore's preflight
/// holds them (vsnap_artifact::clocks): behind on a kernel without time
/// namespaces, the restored engine's timers would wait.
fn check_clocks(m: &Manifest) -> Check {
    let Some(captured) = &m.clocks else {
        return Check::ok(
            "clocks",
            "not recorded (captured by an older vsnap): not checked",
        );
    };
    match clocks::check_restore(captured, &Clocks::now(), clocks::has_time_namespaces()) {
        Ok(None) => Check::ok("clocks", "this host's clocks are ahead of the capture's"),
        Ok(Some(note)) => Check::ok("clocks", note),
        Err(e) => Check::failed("clocks", vec![e]),
    }
}

/// The host fingerprint now, with the runtime config's runc, CRIU and CUDA
/// plugin, against the one captured, by the compatibility rules a restore
/// applies (vsnap_artifact::compat): what may differ is listed, not failed.
/// (The workload is compared at restore, against the new container's spec;
/// there is none here.)
fn check_host(ctx: &Ctx, m: &Manifest) -> Check {
    let live = HostIdentity::probe(&ctx.tools(), env!("CARGO_PKG_VERSION"));
    let found = compat::compare(&m.host, &live);
    if !found.incompatible.is_empty() {
        return Check::failed("host", found.incompatible);
    }
    let mut detail =
        "compatible: kernel series, CPU, runc, CRIU, CUDA tools and shim as a restore requires"
            .to_string();
    if !found.tolerated.is_empty() {
        detail.push_str(&format!(
            " (allowed to differ: {})",
            found.tolerated.join("; ")
        ));
    }
    Check::ok("host", detail)
}
