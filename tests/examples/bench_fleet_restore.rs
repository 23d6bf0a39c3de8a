//! Benchmark: a restore from a registry reference on a host that lacks the
//! artifact, streamed (`stream_pulls = true`, the default: the restore
//! starts from the pull's head and places the pages as they land) and
//! staged (`stream_pulls = false`: the whole pull, then the restore),
//! beside `vsnap pull` alone of the same reference, in clear and encrypted
//! (`fleet_encryption_key`); and, as before, a cold start and a restore of
//! the artifact already on the host. Host A (its own private containerd
//! and artifact root) captures the reference engine (`BENCH_RESIDENT_MB`
//! resident, `BENCH_INIT_MS` of start-up work), signs and pushes it to a
//! real docker-registry on loopback twice, in clear and sealed; B trusts
//! A's fleet key and holds the fleet encryption key.
//!
//! Per round on B: a cold start (`ctr run -d` without a plan, until the
//! engine listens); then for clear and encrypted (their order alternating
//! between rounds) a streamed restore, a staged restore and a plain
//! `vsnap pull` into B's root, the artifact removed before each (order
//! S T P in even rounds, P T S in odd ones, so the round reads backwards);
//! then a restore of the artifact the last of them left. Time to serve is
//! `ctr run -d` until it returns and the engine answers (Start answers once
//! the restore placed every byte and the canary matched). From each
//! restore's `vsnap-restore.json`: when CRIU began and (streamed) when the
//! last page it waited for arrived, both after `ctr run` began; and when
//! the streamed pull published the artifact (polled every 20 ms). Every
//! copy's answers are compared with the first cold start's.
//!
//! Run by `scripts/bench.sh fleet-restore` (release builds). Environment:
//! BENCH_RUNS (rounds, default 3), BENCH_RESIDENT_MB (512), BENCH_INIT_MS
//! (5000), BENCH_LINK_MBPS: when set, B pulls through a proxy that serves
//! each connection at most that many MB/s divided by the pull's 4
//! connections (as `fleet-crypt`: a registry behind a link of that speed).

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vsnap_e2e::bench::{env_num, median, vsnap_json};
use vsnap_e2e::engine::{free_port, wait_listening};
use vsnap_e2e::registry::{Registry, SlowProxy};
use vsnap_e2e::snapshot_env::{answers, setup, Env, RT};

type Answers = Vec<(serde_json::Value, serde_json::Value, serde_json::Value)>;

const NAME: &str = "bfr";
const MODES: [&str; 2] = ["in clear", "encrypted"];

fn vsnap(config: &str, args: &[&str]) -> serde_json::Value {
    vsnap_json(Path::new(config), args)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The two hosts, the registry (and the link B pulls through), what B
/// runs with and what every copy must answer.
struct Bench {
    _a: Env,
    b: Env,
    _registry: Registry,
    _link: Option<SlowProxy>,
    /// B's runtime configs, `[mode][stream]`: mode 0 in clear, 1 with the
    /// fleet encryption key; stream 0 `stream_pulls = false`, 1 true.
    configs: [[String; 2]; 2],
    /// The references B pulls, per mode.
    refs: [String; 2],
    /// `--env` arguments of every start on B.
    extra: Vec<String>,
    expected: Option<Answers>,
    bytes: u64,
}

/// Keys on A and B: A signs (and seals with the fleet key), B trusts A's
/// key. Returns the line that names the encryption key.
fn keys(a: &Env, b: &Env) -> String {
    let (private, public) = a.fleet_key_pair("fleet");
    let (enc, _) = a.fleet_encryption_key("enc");
    let shared = a.c.dir.join("fingerprint.key");
    std::fs::write(&shared, [0x33u8; 32]).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let shared = format!("fleet_fingerprint_key = \"{}\"\n", shared.display());
    a.prepend_config(&format!("fleet_signing_key = \"{private}\"\n{shared}"));
    b.prepend_config(&format!("fleet_trusted_keys = [\"{public}\"]\n{shared}"));
    format!("fleet_encryption_key = \"{enc}\"\n")
}

/// A and B, the registry and the link; A's capture pushed in clear and
/// encrypted.
fn prepare(resident: &str, init: &str) -> Bench {
    let a = setup("bfr-a");
    let mut b = setup("bfr-b");
    b.rootfs = a.rootfs.clone();
    let registry = Registry::start(&a.c.dir);
    let link = vsnap_e2e::bench::link(&registry);
    let pull_host = link.as_ref().map_or(registry.host(), SlowProxy::host);
    let enc_line = keys(&a, &b);
    for e in [&a, &b] {
        e.allow_registry(&registry.host());
        e.allow_registry(&pull_host);
    }
    let env = [
        format!("VSNAP_ENGINE_RESIDENT_MB={resident}"),
        format!("VSNAP_ENGINE_INIT_MS={init}"),
    ];
    let env_refs: Vec<&str> = env.iter().map(String::as_str).collect();
    eprintln!("bench-fleet-restore: capturing on A ({resident} MiB resident, {init} ms init)");
    let manifest = a.create_good("bfr-donor", NAME, &env_refs);
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    let bytes = manifest["image_bytes"].as_u64().unwrap_or(0);
    let a_enc = a.config_variant("enc-config", &enc_line);
    let mut refs = [String::new(), String::new()];
    for (mode, config) in [(0, &a.config), (1, &a_enc)] {
        let r = format!("{}/fleet/{NAME}-{mode}:v1", registry.host());
        eprintln!("bench-fleet-restore: pushing {} to {r}", MODES[mode]);
        let pushed = vsnap(config, &["push", NAME, &r]);
        assert_eq!(pushed["encrypted_with"].is_string(), mode == 1, "{pushed}");
        refs[mode] = r.replace(&registry.host(), &pull_host);
    }
    let config = |tag: &str, lines: &str| b.config_variant(tag, lines);
    let configs = [
        [
            config("clear-staged", "stream_pulls = false\n"),
            config("clear-stream", "stream_pulls = true\n"),
        ],
        [
            config("enc-staged", &format!("stream_pulls = false\n{enc_line}")),
            config("enc-stream", &format!("stream_pulls = true\n{enc_line}")),
        ],
    ];
    let extra = env.iter().flat_map(|kv| ["--env".into(), kv.clone()]);
    Bench {
        _a: a,
        b,
        _registry: registry,
        _link: link,
        configs,
        refs,
        extra: extra.collect(),
        expected: None,
        bytes,
    }
}

impl Bench {
    /// The copy on `port` answers as the first cold start did.
    fn check(&mut self, id: &str, port: u16) {
        let reply = answers(port);
        let expected = self.expected.get_or_insert_with(|| reply.clone());
        assert_eq!(&reply, expected, "{id} answers as the first cold start");
    }

    /// A cold start on B: no plan, the engine's own argv listening
    /// address, until it listens (ms).
    fn cold(&mut self, i: u64) -> f64 {
        let id = format!("bfr-cold-{i}");
        let port = free_port().to_string();
        let mut args = vec!["run", "-d", "--net-host", "--runtime", RT];
        args.extend(["--runtime-config-path", &self.b.config]);
        args.extend(self.extra.iter().map(String::as_str));
        args.extend(["--rootfs", &self.b.rootfs, &id, "/vsnap-ref-engine"]);
        args.extend(["--host", "127.0.0.1", "--port", &port]);
        let t = Instant::now();
        self.b.c.ctr_ok(&args);
        wait_listening(port.parse().unwrap(), Duration::from_secs(300));
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        self.check(&id, port.parse().unwrap());
        self.b.remove(&id);
        ms
    }

    /// The artifact gone from B, and no partial pull of it left.
    fn absent(&self) {
        if self.b.artifact(NAME).exists() {
            vsnap(&self.b.config, &["rm", NAME]);
        }
        let partial = self.b.artifacts.join(".pull/partial").join(NAME);
        assert!(!partial.exists(), "{} left", partial.display());
    }

    /// Seconds until the artifact is published and no partial pull of it
    /// is left, from `since` (unix s); polled every 20 ms.
    fn published(&self, since: f64) -> f64 {
        let partial = self.b.artifacts.join(".pull/partial").join(NAME);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.b.manifest(NAME).exists() || partial.exists() {
            assert!(Instant::now() < deadline, "{NAME} not published");
            std::thread::sleep(Duration::from_millis(20));
        }
        unix_now() - since
    }
}

/// A restore from a reference: time to serve; CRIU's start, the last
/// page's arrival (streamed) and the publish, in s after `ctr run` began.
#[derive(Clone, Debug)]
struct FromRef {
    serve: f64,
    criu: f64,
    last: Option<f64>,
    published: f64,
    /// Its record's phases ([`phases`]).
    phases: String,
}

/// A restore's phases from its `vsnap-restore.json`, ms: preflight, CRIU,
/// activation, and the verification beside CRIU.
fn phases(record: &serde_json::Value) -> String {
    let ms = |k: &str| record[k].as_f64().unwrap_or(f64::NAN);
    format!(
        "{:.0} / {:.0} / {:.0} / {:.0}",
        ms("preflight_ms"),
        ms("criu_restore_ms"),
        ms("activation_ms"),
        ms("verify_ms")
    )
}

/// The `vsnap-restore.json` of container `id` on `env`.
fn record(env: &Env, id: &str) -> serde_json::Value {
    let record = std::fs::read(env.bundle(id).join("vsnap-restore.json")).unwrap();
    serde_json::from_slice(&record).unwrap()
}

impl Bench {
    /// A restore on B with `vsnap.io/artifact-ref`, the artifact absent,
    /// under the `mode`'s config with `stream_pulls` = `stream`.
    fn restore_ref(&mut self, i: u64, mode: usize, stream: usize) -> FromRef {
        self.absent();
        let id = format!("bfr-m{mode}-s{stream}-{i}");
        let port = free_port();
        let with_ref = format!("vsnap.io/artifact-ref={}", self.refs[mode]);
        let mut more: Vec<&str> = vec!["--annotation", &with_ref];
        more.extend(self.extra.iter().map(String::as_str));
        let base = std::mem::replace(&mut self.b.config, self.configs[mode][stream].clone());
        let began = unix_now();
        let t = Instant::now();
        let out = self.b.run(&id, "restore", NAME, port, &more);
        assert!(out.ok(), "{id}: {out:?}\n{}", self.b.c.log_tail());
        wait_listening(port, Duration::from_secs(60));
        let serve = t.elapsed().as_secs_f64();
        self.b.config = base;
        let published = self.published(began);
        let record = record(&self.b, &id);
        let criu = record["criu_began_unix_s"].as_f64().expect("CRIU's start") - began;
        let last = record["pages_last_arrival_unix_s"].as_f64();
        assert_eq!(last.is_some(), stream == 1, "{id}: {record}");
        self.check(&id, port);
        self.b.remove(&id);
        FromRef {
            serve,
            criu,
            last: last.map(|l| l - began),
            published,
            phases: phases(&record),
        }
    }

    /// `vsnap pull` of the `mode`'s reference into B's root, the artifact
    /// absent (s), and its phases.
    fn pull(&self, mode: usize) -> (f64, serde_json::Value) {
        self.absent();
        let t = Instant::now();
        let pulled = vsnap(&self.configs[mode][1], &["pull", &self.refs[mode], NAME]);
        let s = t.elapsed().as_secs_f64();
        assert_eq!(pulled["reused"], 0, "{pulled}");
        (s, pulled["timings_ms"].clone())
    }

    /// A restore of the artifact present on B (ms), and its phases.
    fn local(&mut self, i: u64) -> (f64, String) {
        assert!(self.b.manifest(NAME).exists());
        let id = format!("bfr-local-{i}");
        let port = free_port();
        let with_ref = format!("vsnap.io/artifact-ref={}", self.refs[0]);
        let mut more: Vec<&str> = vec!["--annotation", &with_ref];
        more.extend(self.extra.iter().map(String::as_str));
        let t = Instant::now();
        let out = self.b.run(&id, "restore", NAME, port, &more);
        assert!(out.ok(), "{id}: {out:?}\n{}", self.b.c.log_tail());
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let phases = phases(&record(&self.b, &id));
        self.check(&id, port);
        self.b.remove(&id);
        (ms, phases)
    }
}

/// Every measurement of a run.
#[derive(Default)]
struct Samples {
    cold: Vec<f64>,
    local: Vec<f64>,
    local_phases: Vec<String>,
    /// Per mode: (streamed, staged, pull alone s) per round.
    rounds: [Vec<(FromRef, FromRef, f64)>; 2],
    phases: [Vec<serde_json::Value>; 2],
}

/// One round on B (module header).
fn round(bench: &mut Bench, i: u64, s: &mut Samples) {
    s.cold.push(bench.cold(i));
    let modes = if i.is_multiple_of(2) { [0, 1] } else { [1, 0] };
    for mode in modes {
        let (mut streamed, mut staged, mut pulled) = (None, None, None);
        let steps = if i.is_multiple_of(2) {
            [0, 1, 2]
        } else {
            [2, 1, 0]
        };
        for step in steps {
            match step {
                0 => streamed = Some(bench.restore_ref(i, mode, 1)),
                1 => staged = Some(bench.restore_ref(i, mode, 0)),
                _ => pulled = Some(bench.pull(mode)),
            }
        }
        let (streamed, staged, (pull, phases)) =
            (streamed.unwrap(), staged.unwrap(), pulled.unwrap());
        eprintln!(
            "bench-fleet-restore: run {i} {}: pull {pull:.2} s {phases}; streamed {streamed:?}; staged {staged:?}",
            MODES[mode]
        );
        s.rounds[mode].push((streamed, staged, pull));
        s.phases[mode].push(phases);
    }
    let (ms, phases) = bench.local(i);
    s.local.push(ms);
    s.local_phases.push(phases);
    eprintln!(
        "bench-fleet-restore: run {i}: cold {:.0} ms, local restore {:.0} ms",
        s.cold[i as usize], s.local[i as usize]
    );
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3);
    let resident = env_num("BENCH_RESIDENT_MB", 512).to_string();
    let init = env_num("BENCH_INIT_MS", 5000).to_string();
    let mut bench = prepare(&resident, &init);
    let mut s = Samples::default();
    for i in 0..runs {
        round(&mut bench, i, &mut s);
    }
    report(&bench, &s, runs, (&resident, &init));
}

/// The starts table, as before: cold, from the reference (streamed, in
/// clear: the default), local.
fn report_starts(s: &Samples) {
    let c = median(s.cold.clone());
    let p = median(s.rounds[0].iter().map(|r| r.0.serve * 1000.0).collect());
    let l = median(s.local.clone());
    println!("| start on B | median (ms) | / cold start |");
    println!("|---|---:|---:|");
    println!("| cold start (`ctr run -d` until the engine listens) | {c:.0} | 1.000 |");
    println!(
        "| restore with `vsnap.io/artifact-ref`, artifact absent (streamed pull + restore, in clear) | {p:.0} | {:.3} |",
        p / c
    );
    println!(
        "| restore, artifact present (pulled earlier) | {l:.0} | {:.3} |",
        l / c
    );
}

/// Medians of one mode's rounds: pull alone, serve, ratios, overlap.
fn report_mode(s: &Samples, mode: usize) {
    let r = &s.rounds[mode];
    let med = |f: &dyn Fn(&(FromRef, FromRef, f64)) -> f64| median(r.iter().map(f).collect());
    let pull = med(&|x| x.2);
    let (st, sg) = (med(&|x| x.0.serve), med(&|x| x.1.serve));
    let label = MODES[mode];
    println!(
        "| {label} | {pull:.2} | {st:.2} | {sg:.2} | {:.3} | {:.3} | {:.3} | {:.2} / {:.2} / {:.2} | {:.2} |",
        med(&|x| x.0.serve / x.2),
        med(&|x| x.1.serve / x.2),
        med(&|x| x.0.serve / x.1.serve),
        med(&|x| x.0.criu),
        med(&|x| x.0.last.unwrap_or(f64::NAN)),
        med(&|x| x.0.last.unwrap_or(f64::NAN) - x.0.criu),
        med(&|x| x.1.criu),
    );
}

fn report(bench: &Bench, s: &Samples, runs: u64, (resident, init): (&str, &str)) {
    let link = std::env::var("BENCH_LINK_MBPS").map_or("none (loopback)".into(), |l| {
        format!("{l} MB/s shared by the pull's 4 connections")
    });
    println!("## Restore from a registry reference on a host without the artifact");
    println!();
    println!(
        "Artifact: {:.0} MiB of images ({resident} MiB resident, {init} ms init); registry: docker-registry on loopback; link: {link}; {runs} rounds on host B; medians.",
        bench.bytes as f64 / 1048576.0
    );
    println!();
    report_starts(s);
    println!();
    println!("| artifact absent on B | pull alone (s) | serve, streamed (s) | serve, staged (s) | streamed / pull | staged / pull | streamed / staged | streamed: CRIU began / last page arrived / overlap (s) | staged: CRIU began (s) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for mode in [0, 1] {
        report_mode(s, mode);
    }
    println!();
    println!(
        "Ratios are medians of each round's own ratio; times after `ctr run` began. Per round (s):"
    );
    println!();
    println!("| round | mode | pull alone | streamed: serve, CRIU began, last page, published | staged: serve, CRIU began | pull phases (ms) | restore phases (ms, preflight / CRIU / activation / verify): streamed; staged |");
    println!("|---|---|---:|---|---|---|---|");
    for mode in [0, 1] {
        for (i, (st, sg, pull)) in s.rounds[mode].iter().enumerate() {
            println!(
                "| {i} | {} | {pull:.2} | {:.2}, {:.2}, {:.2}, {:.2} | {:.2}, {:.2} | {} | {}; {} |",
                MODES[mode],
                st.serve,
                st.criu,
                st.last.unwrap_or(f64::NAN),
                st.published,
                sg.serve,
                sg.criu,
                s.phases[mode][i],
                st.phases,
                sg.phases
            );
        }
    }
    println!();
    println!(
        "cold (ms): {:?}; local restore (ms): {:?}, its phases (preflight / CRIU / activation / verify): {:?}",
        s.cold.iter().map(|x| x.round()).collect::<Vec<_>>(),
        s.local.iter().map(|x| x.round()).collect::<Vec<_>>(),
        s.local_phases
    );
    println!();
    println!("Every copy answered like the first cold start.");
}
