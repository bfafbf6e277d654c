//! Finding a shared library that cargo built for this workspace, from a test.

use std::path::PathBuf;

/// The shared library `lib<name>.so` (with the platform's prefix and suffix) that cargo built
/// for this workspace: looked up next to the running test's executable
/// (`target/<profile>/deps`) and in the folder above it. Panics, naming the file, when it is
/// in neither (the crate that builds it must be a dependency of the test).
pub fn cdylib(name: &str) -> PathBuf {
    let file = format!(
        "{}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let exe = std::env::current_exe().expect("the test's executable");
    let deps = exe.parent().expect("the executable's folder");
    let found = [Some(deps), deps.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join(&file))
        .find(|p| p.exists());
    found.unwrap_or_else(|| panic!("{file} not found next to {}", exe.display()))
}
