//! Barrier mode: the private barrier of released vLLM. No control dir, no challenge and no
//! status: a ready file holding the canary answer, then a release file saying where to
//! listen (and, from a newer capturer, the process's identity), or an abort marker.

use std::path::Path;
use std::process;
use std::time::Duration;

use vsnap_protocol::{to_canonical_json, wait_for_path, write_atomic, ReadyFile, ReleaseFile};

use crate::cli::Options;
use crate::engine::EngineConfig;
use crate::faults::Faults;
use crate::session::Session;
use crate::{bind, log, serve};

pub fn run(
    ready_file: &Path,
    release_file: &Path,
    release_timeout: Duration,
    options: &Options,
    engine_config: EngineConfig,
    faults: Faults,
) -> ! {
    let session = Session::standalone(faults);
    let (mut engine, oracle) = crate::session::prepare_for_capture(&session, engine_config);
    session.phase("prepare", || {
        let bytes = to_canonical_json(ready_file, &ReadyFile::from(&oracle))?;
        write_atomic(ready_file, &bytes)?;
        Ok(())
    });
    log(&format!(
        "{} written; waiting for {}",
        ready_file.display(),
        release_file.display()
    ));

    let release = session.phase("capture barrier", || {
        Ok(wait_for_path::<ReleaseFile>(release_file, release_timeout)?.value)
    });
    let (host, port, identity) = match release {
        ReleaseFile::Release {
            host,
            port,
            identity,
        } => (host, port, identity),
        ReleaseFile::Abort => {
            log("release aborted; exiting without binding");
            process::exit(1);
        }
    };
    session.phase("recovery: restore memory", || engine.load());
    session.phase("recovery: connections", || {
        session.faults().check_resources()
    });
    session.phase("recovery: canary", || {
        // No donor/copy distinction here, so a drift switch applies to every release.
        let canary = session.faults().drifted(engine.canary()?);
        Ok(oracle.check_matches(&canary, "recovery canary")?)
    });
    // After the canary only: it must reproduce the donor's answer from the donor's state.
    session.phase("recovery: identity", || {
        if let Some(identity) = identity {
            engine.userspace().apply(identity);
        }
        Ok(())
    });
    let listener = session.phase("serve", || bind(host.as_deref(), port));
    serve(listener, &engine, options)
}
