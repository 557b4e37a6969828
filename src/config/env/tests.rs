use super::*;

#[test]
fn a_misspelt_variable_is_an_error_naming_the_close_ones() {
    let err = check(["PATH", "GPUMON_LISTENN"]).unwrap_err().to_string();
    assert!(
        err.contains("GPUMON_LISTENN is set") && err.contains("did you mean GPUMON_LISTEN?"),
        "{err}"
    );
    let err = check(["GPUMON_SOCKETS"]).unwrap_err().to_string();
    assert!(err.contains("GPUMON_SOCKET"), "{err}");
    let err = check(["GPUMON_ZZZZZZZZZZZZ"]).unwrap_err().to_string();
    assert!(
        err.contains("no such variable") && err.contains("GPUMON_LISTEN, GPUMON_SOCKET"),
        "{err}"
    );
    // A name gpumon does read, for a key, is not a typo: the right variable is named.
    let err = check(["GPUMON_HISTORY_GPU_POINTS"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("history.gpu_points"), "{err}");
}

#[test]
fn every_variable_gpumon_reads_is_known() {
    let all: Vec<&str> = ENV_KEYS
        .iter()
        .map(|(_, v)| *v)
        .chain(OTHER_VARS.iter().copied())
        .collect();
    let ok = check(all.iter().chain(["PATH", "HOME"].iter()));
    assert!(ok.is_ok(), "{ok:?}");
    // Every variable a flag reads, in any subcommand.
    use clap::CommandFactory;
    fn walk(c: &clap::Command, out: &mut Vec<String>) {
        out.extend(
            c.get_arguments()
                .filter_map(|a| a.get_env()?.to_str().map(str::to_string)),
        );
        c.get_subcommands().for_each(|s| walk(s, out));
    }
    let mut flags = Vec::new();
    walk(&crate::cli::Cli::command(), &mut flags);
    assert!(flags.len() > ENV_KEYS.len(), "{flags:?}");
    for v in flags {
        assert!(
            known(&v),
            "{v} is read by a flag but not known to env::check"
        );
    }
    assert!(known(crate::daemon_client::BASIC_AUTH_ENV));
}

#[test]
fn distances() {
    assert_eq!(distance("GPUMON_LISTENN", "GPUMON_LISTEN"), 1);
    assert_eq!(distance("GPUMON_LSITEN", "GPUMON_LISTEN"), 2);
    assert_eq!(distance("", "abc"), 3);
    assert_eq!(distance("kitten", "sitting"), 3);
}
