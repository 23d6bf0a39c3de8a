//! `vsnap rm NAME...`: removes artifacts, each under its exclusive lock and
//! through a `.trash-*` rename, so that a half-removed artifact is never
//! visible under its name. One in use is refused.

use serde::Serialize;
use vsnap_artifact::check_path_safe;

use crate::store::{self, RemoveError};
use crate::{emit, emit_json, warn, Ctx, Outcome, ERROR, FAILED, OK};

#[derive(Serialize)]
struct Removed {
    name: String,
    removed: bool,
    error: Option<String>,
}

pub fn run(ctx: &Ctx, names: &[String], json: bool) -> Outcome {
    for name in names {
        store::check_name(name)?;
    }
    check_path_safe(&ctx.root).map_err(|e| format!("artifact root: {e}"))?;
    let mut results = Vec::new();
    let mut code = OK;
    for name in names {
        let error = match store::remove_artifact(&ctx.root, name) {
            Ok(()) => None,
            Err(e) => {
                let failure = match e {
                    RemoveError::Failed(_) => ERROR,
                    RemoveError::NotFound | RemoveError::InUse => FAILED,
                };
                code = code.max(failure);
                Some(e.to_string())
            }
        };
        if !json {
            match &error {
                None => emit(&format!("{name}\n")),
                Some(e) => warn(&format!("rm {name}: {e}")),
            }
        }
        results.push(Removed {
            name: name.clone(),
            removed: error.is_none(),
            error,
        });
    }
    if json {
        emit_json(&results);
    }
    Ok(code)
}
