//! Runs the real `haares-bench` binary.

use std::process::Command;

/// `(success, stdout, stderr)` of `haares-bench args…`.
pub fn bench(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_haares-bench"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
