//! vsnap-ref-engine: a reference inference engine for vsnap. It runs a tiny deterministic
//! CPU language model behind an OpenAI-style HTTP API and speaks the snapshot protocols of
//! vLLM (startup capture through a control dir, and the released-vLLM barrier), with
//! switches to make it fail in every phase. See docs/protocol.md.

mod api;
mod barrier;
mod cli;
mod engine;
mod failure;
mod faults;
mod http;
mod identity;
mod model;
mod prng;
mod session;
mod shm;
mod startup;
mod watch;
mod weights_file;
mod words;
mod zero_block;

use std::net::TcpListener;
use std::process;
use std::sync::Arc;

use crate::api::App;
use crate::cli::{Mode, Options, USAGE};
use crate::engine::{Engine, EngineConfig, DEFAULT_SEED};
use crate::failure::Failure;
use crate::faults::Faults;
use crate::session::Session;

/// One line on stderr, prefixed with the program name.
pub(crate) fn log(message: &str) {
    eprintln!("vsnap-ref-engine: {message}");
}

fn main() {
    install_signal_handlers();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match Options::parse(
        &args,
        std::env::var(vsnap_protocol::SNAPSHOT_CONFIG_ENV).ok(),
    ) {
        Ok(options) => options,
        Err(e) => {
            log(&e);
            eprintln!("{USAGE}");
            process::exit(2);
        }
    };
    let setup = Faults::from_env().and_then(|faults| {
        EngineConfig::from_env(options.weights.clone()).map(|config| (faults, config))
    });
    let setup = setup.and_then(|setup| match std::env::var("VSNAP_ENGINE_WATCH") {
        Ok(dir) if !dir.is_empty() => watch::start(&dir).map(|()| setup),
        _ => Ok(setup),
    });
    let (faults, engine_config) = match setup {
        Ok(setup) => setup,
        Err(e) => {
            log(&e);
            process::exit(2);
        }
    };

    match &options.mode {
        Mode::Help => println!("{USAGE}"),
        Mode::WriteWeights(path) => {
            if let Err(e) = weights_file::save(path, &model::Weights::generate(DEFAULT_SEED)) {
                log(&e);
                process::exit(1);
            }
        }
        Mode::Startup(config) => startup::run(config, &options, engine_config, faults),
        Mode::Barrier {
            ready_file,
            release_file,
            release_timeout,
        } => barrier::run(
            ready_file,
            release_file,
            *release_timeout,
            &options,
            engine_config,
            faults,
        ),
        Mode::Plain { host, port } => {
            let session = Session::standalone(faults);
            let engine = session.phase("initialize engine", || {
                session.faults().hold_resources()?;
                Engine::initialize(engine_config)
            });
            let listener = session.phase("serve", || bind(Some(host), *port));
            serve(listener, &engine, &options)
        }
    }
}

/// Binds the API listener; no host means all interfaces.
pub(crate) fn bind(host: Option<&str>, port: u16) -> Result<TcpListener, Failure> {
    let host = host.unwrap_or("0.0.0.0");
    TcpListener::bind((host, port))
        .map_err(|e| Failure::new("ServeError", format!("cannot listen on {host}:{port}: {e}")))
}

/// Serves the loaded model forever.
pub(crate) fn serve(listener: TcpListener, engine: &Engine, options: &Options) -> ! {
    let model = match engine.model() {
        Ok(model) => model,
        Err(e) => {
            log(&format!("cannot serve: {e}"));
            process::exit(1);
        }
    };
    match listener.local_addr() {
        Ok(addr) => log(&format!("serving {} on http://{addr}", options.model_name)),
        Err(_) => log("serving"),
    }
    let app = App::new(model, options.model_name.clone(), engine.userspace());
    http::serve(listener, Arc::new(move |r: &http::Request| app.route(r)))
}

/// SIGTERM and SIGINT end the process cleanly (exit 0). As PID 1 of a container the
/// kernel would otherwise ignore them, since init gets no default signal actions.
fn install_signal_handlers() {
    extern "C" fn on_signal(_: libc::c_int) {
        const MESSAGE: &[u8] = b"vsnap-ref-engine: terminated by signal\n";
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
            libc::_exit(0);
        }
    }
    let handler = on_signal as extern "C" fn(libc::c_int);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: installs a handler that only calls async-signal-safe functions.
        unsafe {
            libc::signal(signal, handler as libc::sighandler_t);
        }
    }
}
