//! What the fleet tests share: `vsnap` run against a host's runtime config,
//! and two hosts with a registry between them, A signing and B trusting.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use vsnap_e2e::cmd::{run, CmdOutput};
use vsnap_e2e::containerd::{list, shim_binary};
use vsnap_e2e::registry::Registry;
use vsnap_e2e::snapshot_env::{setup, Env};

/// `vsnap --config <env's runtime config> ARGS`.
pub(super) fn vsnap(env: &Env, args: &[&str]) -> CmdOutput {
    run(vsnap_command(env, args), None, Duration::from_secs(300))
}

pub(super) fn vsnap_command(env: &Env, args: &[&str]) -> Command {
    let mut cmd = Command::new(shim_binary().with_file_name("vsnap"));
    cmd.arg("--config").arg(&env.config).args(args);
    cmd
}

/// `vsnap ... --json`, which must succeed; its report.
pub(super) fn vsnap_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = vsnap(env, &all);
    assert!(out.ok(), "vsnap {args:?}: {out:?}");
    serde_json::from_str(&out.stdout).unwrap()
}

/// Two hosts and the registry between them (dropped first: declared last).
/// A signs what it pushes with the fleet key, B trusts it; both key the
/// workload fingerprints with the fleet's shared fingerprint key.
pub(super) fn fleet(tag: &str) -> (Env, Env, Registry) {
    let (a, b, registry) = fleet_with(tag, None);
    a.allow_registry(&registry.host());
    b.allow_registry(&registry.host());
    (a, b, registry)
}

/// As [`fleet`], with a registry that wants `auth` and no registry entry
/// in the hosts' configs yet.
pub(super) fn fleet_with(tag: &str, auth: Option<(&str, &str)>) -> (Env, Env, Registry) {
    let a = setup(&format!("{tag}-a"));
    let b = setup(&format!("{tag}-b"));
    let registry = Registry::start_with(&a.c.dir, auth);
    let (private, public) = a.fleet_key_pair("fleet");
    let shared = a.c.dir.join("fleet-fingerprint.key");
    std::fs::write(&shared, [0x5au8; 32]).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let shared = format!("fleet_fingerprint_key = \"{}\"\n", shared.display());
    a.prepend_config(&format!("fleet_signing_key = \"{private}\"\n{shared}"));
    b.prepend_config(&format!("fleet_trusted_keys = [\"{public}\"]\n{shared}"));
    (a, b, registry)
}

/// The partial pulls (`.pull/partial/<name>`) `env`'s artifact root holds:
/// pulls under way, or interrupted and not resumed yet.
pub(super) fn partial_pulls(env: &Env) -> Vec<String> {
    list(&env.artifacts.join(".pull/partial"))
}

/// The chunks the partial pull of `name` records as landed (verified and
/// at their places): the distinct digests its `landed` record lists.
pub(super) fn landed(env: &Env, name: &str) -> BTreeSet<String> {
    let record = env
        .artifacts
        .join(".pull/partial")
        .join(name)
        .join("landed");
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Chunks landed by every partial pull of `env`'s artifact root.
pub(super) fn landed_chunks(env: &Env) -> usize {
    partial_pulls(env)
        .iter()
        .map(|n| landed(env, n).len())
        .sum()
}

/// A manifest's JSON without its MAC and its sealing at rest (both the
/// host's own: a pulled copy has its own).
pub(super) fn unsealed(bytes: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(bytes).unwrap();
    v.as_object_mut().unwrap().remove("mac");
    v.as_object_mut().unwrap().remove("sealed");
    v
}

/// `vsnap --config CONFIG ARGS`, CONFIG being `env`'s runtime config with
/// the top-level keys `lines` sets replaced by `lines`.
pub(super) fn vsnap_with(env: &Env, tag: &str, lines: &str, args: &[&str]) -> CmdOutput {
    let path = env.c.dir.join(format!("{tag}.toml"));
    let keys: Vec<&str> = lines
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let config: String = std::fs::read_to_string(&env.config)
        .unwrap()
        .lines()
        .filter(|l| !keys.contains(&l.split(' ').next().unwrap_or_default()))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, format!("{lines}{config}")).unwrap();
    let mut cmd = Command::new(shim_binary().with_file_name("vsnap"));
    cmd.arg("--config").arg(&path).args(args);
    run(cmd, None, Duration::from_secs(300))
}
