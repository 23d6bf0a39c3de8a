//! How Python's argparse reads one long option of a command line, for the
//! vLLM parsers whose reading vsnap must share (profile.rs). With
//! `allow_abbrev` (argparse's default, and vLLM's) an argument names an
//! option when it is the option, the option with `=value`, or a prefix of
//! exactly one of the parser's options; a prefix of several is an error.

/// What one argument is to a parser whose long options are given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg<'a> {
    /// Not an option: a positional (or `-` alone).
    Positional,
    /// One of the parser's options, with the value given inline (`--opt=v`).
    Option {
        name: &'static str,
        inline: Option<&'a str>,
    },
    /// A prefix of several options: argparse refuses the command line
    /// ("ambiguous option").
    Ambiguous(Vec<&'static str>),
    /// An option the parser does not know (`parse_known_args` passes it on).
    Unknown,
}

/// Reads `arg` as argparse does against the long options `options`.
/// `abbrev`: whether unique prefixes count (argparse's `allow_abbrev`).
/// Call only for arguments before a `--` separator: after it everything is
/// positional.
pub fn read<'a>(arg: &'a str, options: &[&'static str], abbrev: bool) -> Arg<'a> {
    if !arg.starts_with('-') || arg == "-" {
        return Arg::Positional;
    }
    if let Some(name) = options.iter().find(|o| **o == arg) {
        return Arg::Option { name, inline: None };
    }
    let (key, inline) = match arg.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (arg, None),
    };
    if let Some(name) = options.iter().find(|o| **o == key) {
        return Arg::Option { name, inline };
    }
    // argparse abbreviates long options only ("--" and more).
    if !abbrev || !key.starts_with("--") || key.len() <= 2 {
        return Arg::Unknown;
    }
    let matches: Vec<&'static str> = options
        .iter()
        .copied()
        .filter(|o| o.starts_with(key))
        .collect();
    match matches.as_slice() {
        [] => Arg::Unknown,
        [name] => Arg::Option { name, inline },
        _ => Arg::Ambiguous(matches),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTIONS: [&str; 3] = ["--ready-file", "--release-file", "--release-timeout-s"];

    fn option(name: &'static str, inline: Option<&'static str>) -> Arg<'static> {
        Arg::Option { name, inline }
    }

    #[test]
    fn an_option_is_named_whole_or_with_its_value() {
        assert_eq!(
            read("--ready-file", &OPTIONS, true),
            option("--ready-file", None)
        );
        assert_eq!(
            read("--release-file=/x=y", &OPTIONS, true),
            option("--release-file", Some("/x=y"))
        );
    }

    #[test]
    fn a_unique_prefix_names_its_option() {
        assert_eq!(
            read("--ready", &OPTIONS, true),
            option("--ready-file", None)
        );
        assert_eq!(
            read("--rea=/r", &OPTIONS, true),
            option("--ready-file", Some("/r"))
        );
        assert_eq!(
            read("--release-f", &OPTIONS, true),
            option("--release-file", None)
        );
        assert_eq!(
            read("--release-t=5", &OPTIONS, true),
            option("--release-timeout-s", Some("5"))
        );
        assert_eq!(read("--ready", &OPTIONS, false), Arg::Unknown, "no abbrev");
    }

    #[test]
    fn a_prefix_of_several_options_is_ambiguous() {
        assert_eq!(
            read("--release", &OPTIONS, true),
            Arg::Ambiguous(vec!["--release-file", "--release-timeout-s"])
        );
        assert_eq!(
            read("--re=x", &OPTIONS, true),
            Arg::Ambiguous(OPTIONS.to_vec())
        );
    }

    #[test]
    fn other_arguments_are_positional_or_unknown() {
        assert_eq!(read("serve", &OPTIONS, true), Arg::Positional);
        assert_eq!(read("-", &OPTIONS, true), Arg::Positional);
        assert_eq!(read("--port", &OPTIONS, true), Arg::Unknown);
        assert_eq!(read("--ready-files", &OPTIONS, true), Arg::Unknown);
        assert_eq!(read("-r", &OPTIONS, true), Arg::Unknown);
        assert_eq!(read("--=x", &OPTIONS, true), Arg::Unknown);
    }
}
