//! `vsnap-hook CHECK [OPTIONS]`: see the library documentation and
//! docs/hooks.md.

use std::io::Read;

fn main() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // A terminal on stdin means no runtime started this: never wait on it.
    // SAFETY: isatty has no preconditions.
    let tty = unsafe { libc::isatty(0) } == 1;
    let mut stdin: Box<dyn Read> = if tty {
        Box::new(std::io::empty())
    } else {
        Box::new(std::io::stdin())
    };
    let outcome = vsnap_oci_hooks::run(&args, &mut *stdin);
    // Take the whole state even when the check did not need it, so that the
    // runtime's write never meets a closed pipe.
    let _ = std::io::copy(&mut stdin.take(1 << 20), &mut std::io::sink());
    if let Some(line) = outcome.line {
        eprintln!("{line}");
    }
    std::process::exit(outcome.code);
}
