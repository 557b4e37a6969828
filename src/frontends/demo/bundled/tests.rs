use super::*;

#[test]
fn candidates_cover_beside_the_binary_and_the_package_layout() {
    let c = candidates(Path::new("/opt/x/bin/gpumon"));
    assert_eq!(
        c,
        [
            PathBuf::from("/opt/x/bin/libfake_nvml.so"),
            PathBuf::from("/opt/x/lib/gpumon/libfake_nvml.so"),
            PathBuf::from("/usr/lib/gpumon/libfake_nvml.so"),
        ]
    );
    // Installed by the package, the relative and absolute paths are one.
    assert_eq!(candidates(Path::new("/usr/bin/gpumon")).len(), 2);
}

#[cfg(feature = "bundled-fake-nvml")]
#[test]
fn the_built_in_copy_is_a_shared_object_loadable_from_memory() {
    assert_eq!(&BUNDLED[..4], b"\x7fELF");
    let dir = tempfile::tempdir().unwrap();
    let lib = load_bundled(dir.path()).unwrap();
    assert_eq!(lib.origin, "built into the binary");
    assert_eq!(std::fs::read(&lib.path).unwrap(), BUNDLED);
    // No file was written.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
