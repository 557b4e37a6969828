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
mod tests;
