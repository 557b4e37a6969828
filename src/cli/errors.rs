//! Command-line errors as a user needs them: a bad value that came from a `GPUMON_*` variable is
//! named as that variable (clap names the flag, which the user never typed), and a mistyped
//! subcommand is never answered with a hidden one (the demo's internal `demo-trainer`).

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Command, Error};

/// Rewrites `err` from parsing `args` against `cmd`; `env` reads a variable.
pub fn explain(
    mut err: Error,
    cmd: &Command,
    args: &[String],
    env: impl Fn(&str) -> Option<String>,
) -> Error {
    match err.kind() {
        ErrorKind::InvalidSubcommand => {
            if let Some(ContextValue::Strings(names)) =
                err.get(ContextKind::SuggestedSubcommand).cloned()
            {
                let visible: Vec<String> = names
                    .into_iter()
                    .filter(|n| cmd.find_subcommand(n).is_some_and(|s| !s.is_hide_set()))
                    .collect();
                err.insert(
                    ContextKind::SuggestedSubcommand,
                    ContextValue::Strings(visible),
                );
            }
            err
        }
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg).cloned() else {
                return err;
            };
            // "--listen <ADDR>" → "listen"
            let long = arg
                .trim_start_matches('-')
                .split([' ', '='])
                .next()
                .unwrap_or("")
                .to_owned();
            let typed = args
                .iter()
                .any(|a| a == &format!("--{long}") || a.starts_with(&format!("--{long}=")));
            if typed {
                return err;
            }
            let Some(var) = env_of(cmd, &long) else {
                return err;
            };
            let Some(value) = env(&var) else { return err };
            let why = first_reason(&err);
            Error::raw(
                ErrorKind::ValueValidation,
                format!("{var}={value:?} is not valid ({why}); fix or unset the variable (it sets --{long})\n"),
            )
        }
        _ => err,
    }
}

/// The environment variable behind `--long`, in `cmd` or any subcommand.
fn env_of(cmd: &Command, long: &str) -> Option<String> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .and_then(|e| e.to_str())
        .map(str::to_owned)
        .or_else(|| cmd.get_subcommands().find_map(|s| env_of(s, long)))
}

/// clap's own reason, from its rendered message ("invalid socket address syntax").
fn first_reason(err: &Error) -> String {
    let text = err.render().to_string();
    let line = text.lines().next().unwrap_or("");
    line.rsplit(": ").next().unwrap_or(line).trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> String {
        let cmd = crate::cli::Cli::command();
        let argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        // clap reads the process environment itself; the test passes values through `env`
        // and the flag, which is how clap reports an env value too (as the flag).
        let err = cmd
            .clone()
            .try_get_matches_from(&argv)
            .expect_err("a bad command line");
        let vars: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        explain(err, &cmd, &argv, |k| {
            vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
        .render()
        .to_string()
    }

    #[test]
    fn hidden_subcommands_are_not_suggested() {
        let out = parse(&["gpumon", "demo-trainr"], &[]);
        assert!(
            out.contains("demo-trainr") && !out.contains("demo-trainer'"),
            "{out}"
        );
        assert!(out.contains("'demo'"), "{out}");
    }

    #[test]
    fn a_bad_value_from_a_variable_names_the_variable() {
        // As clap sees it when GPUMON_LISTEN=xx is set: the value arrives as --listen's.
        let out = parse(
            &["gpumon", "status", "--listen=xx"],
            &[("GPUMON_LISTEN", "xx")],
        );
        // Typed on the command line: the flag is named.
        assert!(out.contains("--listen"), "{out}");
        let cmd = crate::cli::Cli::command();
        let err = cmd
            .clone()
            .try_get_matches_from(["gpumon", "status", "--listen", "xx"])
            .unwrap_err();
        let argv = vec!["gpumon".to_string(), "status".to_string()];
        let out = explain(err, &cmd, &argv, |k| {
            (k == "GPUMON_LISTEN").then(|| "xx".into())
        })
        .render()
        .to_string();
        assert!(
            out.contains("GPUMON_LISTEN=\"xx\"")
                && out.contains("socket address")
                && out.contains("unset"),
            "{out}"
        );
    }
}
