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
