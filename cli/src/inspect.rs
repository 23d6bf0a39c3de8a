//! `vsnap inspect NAME`: what an artifact is, read from its manifest without
//! the MAC having to verify (the MAC status is reported beside it) and
//! without running anything from it. `--quarantined`: the copy of NAME an
//! `auto` start set aside, why, and its manifest when it can be read.

use serde::Serialize;
use serde_json::Value;
use vsnap_artifact::clocks::seconds;
use vsnap_artifact::layout::bytes_under;
use vsnap_artifact::quarantine::{self, Reason};
use vsnap_artifact::{ArtifactLock, Clocks, Manifest, Origin};

use crate::quarantined;
use crate::store::{self, MacStatus};
use crate::table::{row, table};
use crate::units::{human_age, size_and_bytes};
use crate::{classify, emit, emit_json, Ctx, LoadFailure, Outcome, FAILED, OK};

#[derive(Serialize)]
struct Report<'a> {
    name: &'a str,
    path: String,
    /// `verified`, `fails`, `no-host-key` or `key-unusable`.
    mac: &'static str,
    in_use: Option<bool>,
    disk_bytes: u64,
    /// Whether its pages files are sealed at rest (`manifest.sealed`).
    sealed_at_rest: bool,
    manifest: &'a Manifest,
}

pub fn run(ctx: &Ctx, name: &str, json: bool, quarantined: bool) -> Outcome {
    store::check_name(name)?;
    if quarantined {
        return run_quarantined(ctx, name, json);
    }
    let m = match Manifest::load_unverified(&ctx.root, name) {
        Ok(m) => m,
        Err(e) => {
            return match classify(&ctx.root, name, e) {
                LoadFailure::Error(e) => Err(e),
                LoadFailure::Invalid(e) => {
                    crate::warn(&format!(
                        "inspect {name}: {e} (`vsnap verify {name}` names every problem)"
                    ));
                    Ok(FAILED)
                }
            };
        }
    };
    let mac = MacStatus::of(&ctx.root, &m);
    let in_use = ArtifactLock::is_held(&ctx.root, name).ok();
    let disk_bytes = store::disk_bytes(&ctx.root, name);
    let path = ctx.root.join(name).display().to_string();
    if json {
        emit_json(&Report {
            name,
            path,
            mac: mac.as_str(),
            in_use,
            disk_bytes,
            sealed_at_rest: m.sealed.is_some(),
            manifest: &m,
        });
        return Ok(OK);
    }

    let mut out = summary(ctx, name, &path, &m, &mac, in_use, disk_bytes);
    out.push_str(&oracle_section(&m));
    out.push_str(&host_section(&m));
    out.push_str(&workload_section(&m));
    emit(&out);
    Ok(OK)
}

#[derive(Serialize)]
struct QuarantinedReport<'a> {
    name: &'a str,
    path: String,
    quarantine: &'a Reason,
    disk_bytes: u64,
    /// `verified`, `fails`, `no-host-key` or `key-unusable`; null without
    /// a readable manifest.
    mac: Option<&'static str>,
    manifest: Option<&'a Manifest>,
    /// Why the manifest could not be read, when it could not.
    manifest_error: Option<String>,
}

/// `inspect --quarantined NAME`: the reason, then the manifest as for an
/// artifact (exit 1 when it cannot be read: the reason is still shown).
fn run_quarantined(ctx: &Ctx, name: &str, json: bool) -> Outcome {
    let dir = ctx.root.join(quarantine::DIR);
    let copies = quarantine::list(&ctx.root).map_err(|e| format!("quarantine: {e}"))?;
    let Some((_, reason, copy)) = copies.into_iter().find(|(n, _, _)| n == name) else {
        return Err(format!(
            "no quarantined copy of {name} under {}",
            dir.display()
        ));
    };
    let manifest = Manifest::load_unverified(&dir, name);
    let mac = manifest.as_ref().ok().map(|m| MacStatus::of(&ctx.root, m));
    let (path, disk_bytes) = (copy.display().to_string(), bytes_under(&copy));
    let code = if manifest.is_ok() { OK } else { FAILED };
    if json {
        emit_json(&QuarantinedReport {
            name,
            path,
            quarantine: &reason,
            disk_bytes,
            mac: mac.as_ref().map(MacStatus::as_str),
            manifest: manifest.as_ref().ok(),
            manifest_error: manifest.as_ref().err().map(|e| e.to_string()),
        });
        return Ok(code);
    }
    let mut out = quarantined::reason_rows(&reason);
    out.push_str("Reason:\n");
    for line in reason.message.lines() {
        let line: String = line
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        out.push_str(&format!("  {line}\n"));
    }
    match (&manifest, &mac) {
        (Ok(m), Some(mac)) => {
            out.push('\n');
            out.push_str(&summary(ctx, name, &path, m, mac, Some(false), disk_bytes));
            out.push_str(&oracle_section(m));
            out.push_str(&host_section(m));
            out.push_str(&workload_section(m));
        }
        _ => out.push_str(&format!("\nPath: {path}\n")),
    }
    emit(&out);
    if let Err(e) = &manifest {
        crate::warn(&format!("inspect --quarantined {name}: manifest: {e}"));
    }
    Ok(code)
}

/// The table of what the artifact is, where, from where, and its state here.
fn summary(
    ctx: &Ctx,
    name: &str,
    path: &str,
    m: &Manifest,
    mac: &MacStatus,
    in_use: Option<bool>,
    disk_bytes: u64,
) -> String {
    let created = match store::created_at(m) {
        Some(t) => format!(
            "{} ({} ago)",
            m.created_at,
            human_age(store::age_since(t.into()))
        ),
        None => format!("{} (not RFC 3339)", or_dash(&m.created_at)),
    };
    let t = &m.timings_ms;
    table(&[
        row(&["Name:", name]),
        row(&["Path:", path]),
        row(&["Created:", &created]),
        row(&["Capture ID:", or_dash(&m.capture_id)]),
        row(&["Source:", or_dash(&m.source_container)]),
        row(&["Origin:", &origin(m.origin.as_ref())]),
        row(&["Clocks:", &clocks(m.clocks.as_ref())]),
        row(&["MAC:", &mac.describe(&ctx.root)]),
        row(&[
            "In use:",
            match in_use {
                Some(true) => "yes (its lock is held)",
                Some(false) => "no",
                None => "unknown (/proc/locks unreadable)",
            },
        ]),
        row(&["Image size:", &size_and_bytes(m.image_bytes)]),
        row(&["Memory:", &memory(m.memory.as_ref())]),
        row(&["Zero pages:", &zero_pages(m.zero_pages.as_ref())]),
        row(&["At rest:", &sealed(m.sealed.as_ref())]),
        row(&["On disk:", &size_and_bytes(disk_bytes)]),
        row(&[
            "Timings:",
            &format!(
                "cold start to capture-ready {} ms, inventory {} ms, checkpoint {} ms",
                t.cold_start_to_capture_ready, t.inventory, t.checkpoint
            ),
        ]),
    ])
}

fn oracle_section(m: &Manifest) -> String {
    let mut out = String::from("\nCanary oracle:\n");
    out.push_str(&indented(&[
        row(&["text:", &json_text(&m.oracle.text)]),
        row(&["token_ids:", &json_text(&m.oracle.token_ids)]),
        row(&[
            "sampled_token_logprob:",
            &m.oracle.sampled_token_logprob.to_string(),
        ]),
    ]));
    out
}

/// Every field of the host fingerprint, in the manifest's order.
fn host_section(m: &Manifest) -> String {
    let mut out = String::from("\nHost:\n");
    let host = match serde_json::to_value(&m.host) {
        Ok(Value::Object(map)) => map,
        _ => Default::default(),
    };
    let host_rows: Vec<Vec<String>> = host
        .iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => or_dash(s).to_string(),
                Value::Array(a) if a.is_empty() => "-".to_string(),
                v => json_text(v),
            };
            row(&[format!("{k}:"), text])
        })
        .collect();
    out.push_str(&indented(&host_rows));
    out
}

fn workload_section(m: &Manifest) -> String {
    let w = &m.workload;
    let mut out = String::from("\nWorkload:\n");
    let owner = w.tenant().to_string();
    out.push_str(&indented(&[
        row(&["owner:", or_dash(&owner)]),
        row(&["argv:", &json_text(&w.argv)]),
        row(&["rootfs:", or_dash(&w.rootfs)]),
        row(&["image:", or_dash(&w.image)]),
    ]));
    out.push_str(&indented(&[row(&[
        "fingerprint key:",
        &format!(
            "{} (keys env and secret flags)",
            json_text(&w.fingerprint_key)
        ),
    ])]));
    out.push_str("  env (name, fingerprint of name and value):\n");
    if w.env.is_empty() {
        out.push_str("    -\n");
    }
    let env: Vec<Vec<String>> = w.env.iter().map(|(k, v)| row(&[k, v])).collect();
    out.push_str(&indented_by(&env, 4));
    out.push_str("  security (spec field, sha256):\n");
    let security: Vec<Vec<String>> = w.security.iter().map(|(k, v)| row(&[k, v])).collect();
    out.push_str(&indented_by(&security, 4));
    out
}

/// What a restore charges to the container's memory cgroup: the tree's
/// memory at capture, which the restore's preflight holds the limit to.
fn memory(m: Option<&vsnap_artifact::Memory>) -> String {
    match m {
        Some(m) => format!(
            "{m}: what the tree held at capture; a restore under a lower memory limit is refused"
        ),
        None => {
            "- (not recorded: captured by an older vsnap; no restore is held to a limit)".into()
        }
    }
}

/// The all-zero pages the capture left out of its page images.
fn zero_pages(z: Option<&vsnap_artifact::ZeroPages>) -> String {
    match z {
        Some(z) => format!(
            "{} elided ({} pages of 4 KiB, all zero: not stored, mapped as holes at restore)",
            size_and_bytes(z.elided_bytes),
            z.elided_pages
        ),
        None => "- (none elided: elide_zero_pages off, or captured by an older vsnap)".into(),
    }
}

/// Whether the pages files are sealed at rest, and how.
fn sealed(s: Option<&vsnap_artifact::at_rest::Sealed>) -> String {
    match s {
        Some(s) => format!(
            "sealed: images/pages-*.img with {} under a key of this host's (opened as a restore reads them)",
            s.cipher
        ),
        None => "in clear (seal_at_rest off, or made before format 8)".into(),
    }
}

/// The capturing host's boot id and clocks right before the dump.
fn clocks(c: Option<&Clocks>) -> String {
    match c {
        Some(c) => format!(
            "boot id {}, CLOCK_MONOTONIC {}, CLOCK_BOOTTIME {} (the capturing host's, right before the dump)",
            json_text(&c.boot_id),
            seconds(c.monotonic_ns),
            seconds(c.boottime_ns)
        ),
        None => "- (not recorded: captured by an older vsnap)".into(),
    }
}

/// Where the artifact came from: captured here, or pulled (reference,
/// digest, signer, when), every value as JSON text.
fn origin(o: Option<&Origin>) -> String {
    let Some(o) = o else {
        return "not pulled (captured under this root)".into();
    };
    let signed = match &o.signed_by {
        Some(id) => format!("signed by {}", json_text(id)),
        None => "unsigned".into(),
    };
    format!(
        "pulled from {} (manifest {}), {signed}, at {}",
        json_text(&o.reference),
        json_text(&o.manifest_digest),
        json_text(&o.pulled_at)
    )
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// JSON text: strings quoted and escaped, so nothing in a manifest can
/// forge terminal output.
fn json_text<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn indented(rows: &[Vec<String>]) -> String {
    indented_by(rows, 2)
}

fn indented_by(rows: &[Vec<String>], n: usize) -> String {
    let pad = " ".repeat(n);
    table(rows).lines().map(|l| format!("{pad}{l}\n")).collect()
}
