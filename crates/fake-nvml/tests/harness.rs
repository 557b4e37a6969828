//! The public harness and the shipped scenarios.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fake_nvml::harness;

#[test]
fn library_and_soname_dir() {
    let lib = harness::library_path();
    assert!(lib.is_file(), "{}", lib.display());
    assert_eq!(lib.file_name().unwrap(), harness::LIB_FILE);
    let link = harness::soname_dir().join(harness::SONAME);
    assert_eq!(link.canonicalize().unwrap(), lib.canonicalize().unwrap());
    // Calling again reuses the first build.
    assert_eq!(harness::library_path(), lib);
}

#[test]
fn every_shipped_scenario_parses() {
    let mut names = vec![];
    for entry in std::fs::read_dir(harness::scenarios_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            fake_nvml::Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            names.push(path.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    names.sort();
    let expected = [
        "churn",
        "eight_gpus",
        "eight_gpus_128",
        "gb10",
        "gpu_lost",
        "mig",
        "not_available",
        "orphaned",
        "ramp",
        "two_gpus",
    ];
    assert_eq!(names, expected);
    assert_eq!(
        harness::scenario_path("mig"),
        harness::scenario_path("mig.toml")
    );
}

#[test]
#[should_panic(expected = "available")]
fn unknown_scenario_names_the_choices() {
    harness::scenario_path("nine_gpus");
}
