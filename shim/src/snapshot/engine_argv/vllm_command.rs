//! A vLLM command line as vLLM reads it: whether it is one, the arguments
//! that follow `vllm serve`, the environment a capture needs, the API key
//! its server requires, and what vsnap refuses at create.

use std::path::Path;

use super::profile::{barrier_rest, snapshot_server_args, SNAPSHOT_SERVER};
use crate::error::{Error, Result};

/// A `vllm serve` command line (the CLI or the OpenAI server module), which
/// reads the snapshot config from its arguments rather than the environment.
pub fn is_vllm_serve(argv: &[String]) -> bool {
    let mentions_vllm = argv.iter().any(|a| {
        Path::new(a).file_name().is_some_and(|n| n == "vllm") || a.starts_with("vllm.entrypoints")
    });
    mentions_vllm
        && (argv.iter().any(|a| a == "serve")
            || argv.iter().any(|a| a.contains("openai.api_server")))
}

/// What a capturable vLLM needs in its environment: worker processes
/// spawned (not forked from a CUDA-initialized parent), no InfiniBand
/// (CRIU cannot dump its queue pairs), and no hub access (a restored copy
/// must not fetch anything).
pub const VLLM_CAPTURE_ENV: [(&str, &str); 3] = [
    ("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),
    ("NCCL_IB_DISABLE", "1"),
    ("HF_HUB_OFFLINE", "1"),
];

/// For a vLLM command line: a value that contradicts [`VLLM_CAPTURE_ENV`] is
/// an error naming the variable; a missing one is returned to be logged.
pub fn check_vllm_env(argv: &[String], env: &[String]) -> Result<Vec<String>> {
    if !is_vllm(argv) {
        return Ok(Vec::new());
    }
    let mut missing = Vec::new();
    for (name, want) in VLLM_CAPTURE_ENV {
        match env_value(env, name) {
            Some(v) if v == want => {}
            Some(v) => {
                return Err(Error::InvalidArgument(format!(
                    "create: {name}={v} prevents a capture of vLLM; set {name}={want} (or leave it unset)"
                )))
            }
            None => missing.push(format!("{name}={want}")),
        }
    }
    Ok(missing)
}

/// A vLLM command line: `vllm serve`, the OpenAI server module or the
/// barrier server.
fn is_vllm(argv: &[String]) -> bool {
    is_vllm_serve(argv) || snapshot_server_args(argv).is_some()
}

/// The value of `name` in an OCI env list (the last one given wins).
fn env_value<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find_map(|e| e.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
}

/// What vLLM's serve parser reads: for the barrier server, what its own
/// parser passed on, one leading `--` dropped; for `vllm serve`, what
/// follows `serve`; for the OpenAI server module, what follows it. `None`
/// for any other command line.
fn serve_args(argv: &[String]) -> std::result::Result<Option<Vec<String>>, String> {
    if snapshot_server_args(argv).is_some() {
        let mut rest = barrier_rest(argv)?;
        if rest.first().is_some_and(|a| a == "--") {
            rest.remove(0);
        }
        return Ok(Some(rest));
    }
    if let Some(at) = argv.iter().position(|a| a.ends_with("openai.api_server")) {
        return Ok(Some(argv[at + 1..].to_vec()));
    }
    if !is_vllm_serve(argv) {
        return Ok(None);
    }
    Ok(argv
        .iter()
        .position(|a| a == "serve")
        .map(|at| argv[at + 1..].to_vec()))
}

/// Long options of vLLM 0.33.0's serve parser that vsnap reads or refuses,
/// each with the shortest prefix that names it alone among that parser's
/// long options (argparse takes any prefix from there on). vLLM also reads
/// `_` as `-` in option names.
/// (`--headless` and `--grpc` only as spelled out.)
const SERVE_OPTIONS: [(&str, &str); 10] = [
    ("--api-key", "--api-k"),
    ("--uds", "--ud"),
    ("--ssl-keyfile", "--ssl-k"),
    ("--ssl-certfile", "--ssl-certf"),
    ("--ssl-ca-certs", "--ssl-ca"),
    ("--ssl-cert-reqs", "--ssl-cert-"),
    ("--ssl-ciphers", "--ssl-ci"),
    ("--enable-ssl-refresh", "--enable-ss"),
    ("--headless", "--headless"),
    ("--grpc", "--grpc"),
];

/// The options of [`SERVE_OPTIONS`] in `serve` (up to a `--`, after which
/// vLLM reads only positionals), in order: the index of the argument, the
/// option it names and its inline value.
fn serve_options(serve: &[String]) -> Vec<(usize, &'static str, Option<&str>)> {
    serve
        .iter()
        .enumerate()
        .take_while(|(_, a)| *a != "--")
        .filter_map(|(i, a)| {
            let (key, inline) = match a.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (a.as_str(), None),
            };
            // `--name.field` sets a field of a JSON option: none of these.
            let name = key.strip_prefix("--").filter(|n| !n.contains('.'))?;
            // vLLM reads `_` as `-` in option names.
            let key = format!("--{}", name.replace('_', "-"));
            let (option, _) = SERVE_OPTIONS.iter().find(|(option, shortest)| {
                key == *option || (option.starts_with(&key) && key.starts_with(shortest))
            })?;
            Some((i, *option, inline))
        })
        .collect()
}

/// The API key a vLLM command line makes its server require: the last
/// `--api-key K [K2 ...]` (or `--api-key=K`) of the serve arguments, its
/// first non-empty key; else `VLLM_API_KEY` from `env`. As vLLM does, the
/// command line wins over the environment, and an empty key is none.
pub fn api_key(argv: &[String], env: &[String]) -> Option<String> {
    let serve = serve_args(argv).ok().flatten().unwrap_or_default();
    let given = serve_options(&serve)
        .into_iter()
        .rev()
        .find(|(_, option, _)| *option == "--api-key");
    match given {
        Some((_, _, Some(inline))) => Some(inline.to_string()).filter(|k| !k.is_empty()),
        // nargs='+': the keys are the arguments up to the next option.
        Some((at, _, None)) => serve[at + 1..]
            .iter()
            .take_while(|a| !a.starts_with('-'))
            .find(|k| !k.is_empty())
            .cloned(),
        None => env_value(env, "VLLM_API_KEY")
            .filter(|k| !k.is_empty())
            .map(str::to_string),
    }
}

/// For a vLLM command line: refuses at create what vsnap cannot serve.
/// `--uds` and TLS: the listener check and the canary speak plain HTTP over
/// TCP. `serve` as the first word of the barrier server's serve arguments:
/// they are what follows `vllm serve`, so vLLM would take `serve` for the
/// model.
pub fn check_vllm_command(argv: &[String]) -> Result<()> {
    let invalid = |m: String| Error::InvalidArgument(format!("create: {m}"));
    let Some(serve) = serve_args(argv).map_err(invalid)? else {
        return Ok(());
    };
    if snapshot_server_args(argv).is_some() {
        // The first word that is not an option (or the word after `--`).
        if serve
            .iter()
            .find(|a| !a.starts_with('-'))
            .is_some_and(|a| a == "serve")
        {
            return Err(invalid(format!(
                "{SNAPSHOT_SERVER} ... -- serve: what follows -- is what follows 'vllm serve': the model first; drop 'serve'"
            )));
        }
    }
    for (at, option, _) in serve_options(&serve) {
        let given = serve[at].split('=').next().unwrap_or_default();
        let named = if given == option {
            option.to_string()
        } else {
            format!("{given} ({option})")
        };
        let why = match option {
            "--api-key" => continue,
            "--uds" => "vsnap's canary and listener check need TCP; serve on TCP (vsnap.io/listen) instead of a Unix socket",
            "--headless" | "--grpc" => "vsnap's canary needs vLLM's OpenAI HTTP API (/v1/completions), which this server would not run",
            _ => "vsnap's canary and listener check speak plain HTTP; terminate TLS in front of the engine instead",
        };
        return Err(invalid(format!("{named}: {why}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn server(args: &[&str]) -> Vec<String> {
        let mut a = argv(&["python3", "-m", SNAPSHOT_SERVER]);
        a.extend(argv(args));
        a
    }

    #[test]
    fn a_server_without_the_http_api_is_refused() {
        for flag in ["--headless", "--grpc"] {
            let a = argv(&[
                "python3",
                "-m",
                "vllm.snapshot.server",
                "--ready-file",
                "/run/vsnap/control/r.json",
                "--release-file",
                "/run/vsnap/control/s.json",
                "--",
                "/m",
                flag,
            ]);
            let err = check_vllm_command(&a).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("create: {flag}: ")) && err.contains("/v1/completions"),
                "{err}"
            );
        }
    }

    #[test]
    fn serve_after_the_separator_is_refused_with_a_hint() {
        let flags = [
            "--ready-file",
            "/run/vsnap/control/r",
            "--release-file",
            "/run/vsnap/control/x",
        ];
        let with = |rest: &[&str]| {
            let mut a = flags.to_vec();
            a.extend_from_slice(rest);
            server(&a)
        };
        for a in [
            with(&["--", "serve", "/models/qwen"]),
            with(&["serve", "/models/qwen"]),
            with(&["--", "--enforce-eager", "serve", "/models/qwen"]),
        ] {
            let err = check_vllm_command(&a).unwrap_err().to_string();
            assert!(
                err.contains("the model first; drop 'serve'"),
                "{a:?}: {err}"
            );
        }
        check_vllm_command(&with(&[
            "--",
            "/models/qwen",
            "--served-model-name",
            "serve",
        ]))
        .unwrap();
        // `vllm serve` itself is what has `serve`.
        check_vllm_command(&argv(&["vllm", "serve", "/models/qwen"])).unwrap();
    }

    #[test]
    fn unix_sockets_and_tls_are_refused_naming_the_option() {
        let a = server(&["--", "/m", "--uds", "/tmp/v.sock"]);
        let err = check_vllm_command(&a).unwrap_err().to_string();
        assert!(
            err.starts_with("create: --uds: vsnap's canary and listener check need TCP"),
            "{err}"
        );
        for (given, named) in [
            ("--ssl-keyfile=/k.pem", "--ssl-keyfile"),
            ("--ssl-certfile", "--ssl-certfile"),
            ("--ssl-ca-certs", "--ssl-ca-certs"),
            ("--ssl-cert-reqs", "--ssl-cert-reqs"),
            ("--ssl-ciphers", "--ssl-ciphers"),
            ("--enable-ssl-refresh", "--enable-ssl-refresh"),
            ("--ssl_keyfile", "--ssl_keyfile (--ssl-keyfile)"),
            ("--ssl-k", "--ssl-k (--ssl-keyfile)"),
            ("--enable-ss", "--enable-ss (--enable-ssl-refresh)"),
        ] {
            for a in [
                argv(&["vllm", "serve", "/m", given, "x"]),
                server(&["--", "/m", given, "x"]),
            ] {
                let err = check_vllm_command(&a).unwrap_err().to_string();
                assert!(
                    err.starts_with(&format!("create: {named}: ")) && err.contains("TLS"),
                    "{a:?}: {err}"
                );
            }
        }
        // Not a prefix that names one of them alone, or not vLLM's.
        check_vllm_command(&argv(&["vllm", "serve", "/m", "--ssl-cert", "x"])).unwrap();
        check_vllm_command(&argv(&["vllm", "serve", "/m", "--no-enable-ssl-refresh"])).unwrap();
        check_vllm_command(&argv(&["/vsnap-ref-engine", "--uds", "/s"])).unwrap();
        check_vllm_command(&server(&["--", "/m", "--", "--uds"])).unwrap();
    }

    #[test]
    fn the_api_key_comes_from_the_serve_arguments_then_the_environment() {
        let env = argv(&["VLLM_API_KEY=from-env"]);
        let key = |a: &[String], env: &[String]| api_key(a, env);
        assert_eq!(
            key(&argv(&["vllm", "serve", "/m", "--api-key", "k1"]), &env).as_deref(),
            Some("k1")
        );
        assert_eq!(
            key(&server(&["--", "/m", "--api-key=k2", "--port", "1"]), &env).as_deref(),
            Some("k2")
        );
        assert_eq!(
            key(
                &server(&["--", "/m", "--api-k", "k3", "k4", "--port", "1"]),
                &[]
            )
            .as_deref(),
            Some("k3"),
            "a unique prefix; the first of several keys"
        );
        assert_eq!(
            key(
                &argv(&["vllm", "serve", "/m", "--api_key", "a", "--api-key", "b"]),
                &[]
            )
            .as_deref(),
            Some("b"),
            "the last one given"
        );
        assert_eq!(
            key(&argv(&["vllm", "serve", "/m"]), &env).as_deref(),
            Some("from-env")
        );
        assert_eq!(
            key(&argv(&["vllm", "serve", "/m", "--api-key="]), &env),
            None,
            "an empty key on the command line wins, and is none"
        );
        assert_eq!(
            key(&argv(&["vllm", "serve", "/m"]), &argv(&["VLLM_API_KEY="])),
            None
        );
        assert_eq!(
            key(&argv(&["vllm", "serve", "/m", "--api", "x"]), &[]),
            None,
            "--api could be --api-server-count too"
        );
        assert_eq!(
            key(&argv(&["/vsnap-ref-engine", "--api-key", "x"]), &env).as_deref(),
            Some("from-env"),
            "not vLLM's serve arguments"
        );
    }

    #[test]
    fn vllm_env_defaults_are_checked() {
        let vllm = argv(&["vllm", "serve", "m"]);
        let env = argv(&["NCCL_IB_DISABLE=1"]);
        let missing = check_vllm_env(&vllm, &env).unwrap();
        assert_eq!(
            missing,
            ["VLLM_WORKER_MULTIPROC_METHOD=spawn", "HF_HUB_OFFLINE=1"]
        );
        let err = check_vllm_env(&vllm, &argv(&["VLLM_WORKER_MULTIPROC_METHOD=fork"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("VLLM_WORKER_MULTIPROC_METHOD=fork"), "{err}");
        assert!(check_vllm_env(&argv(&["/vsnap-ref-engine"]), &[])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn vllm_serve_is_recognized() {
        assert!(is_vllm_serve(&argv(&["vllm", "serve", "/models/q"])));
        assert!(is_vllm_serve(&argv(&["/usr/local/bin/vllm", "serve", "q"])));
        assert!(is_vllm_serve(&argv(&[
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server"
        ])));
        assert!(!is_vllm_serve(&argv(&["/vsnap-ref-engine"])));
    }
}
