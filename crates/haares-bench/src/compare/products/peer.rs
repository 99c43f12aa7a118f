//! PyTorch's `torch.matmul` at a family's products (`peer/torch_products.py`): the script written
//! to a private folder, the cases on its stdin, its timings merged into ours by product name.

use std::io::Write as _;
use std::process::{Command, Stdio};

use super::{CaseResult, Kernels, ProductCase, Timing};
use crate::error::{BenchError, Result};

/// The script, embedded so that the published binary carries it.
pub const SCRIPT: &str = include_str!("../../../peer/torch_products.py");
/// The marker before the script's answer on stdout.
const RESULT_PREFIX: &str = "HAARES-PRODUCTS-RESULT ";

/// What the peer measured: its PyTorch and device, and a timing per product and precision.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerTimings {
    /// PyTorch's version and the card it named.
    pub version: String,
    /// `(product name, timing)`.
    pub timings: Vec<(String, Timing)>,
}

/// Runs the script under `python` on `cases`; `Err` gives the interpreter's last line of stderr
/// and how to get a PyTorch with CUDA.
pub fn torch_timings(python: &str, cases: &[ProductCase], repeats: usize) -> Result<PeerTimings> {
    // The folder lives until the script has run.
    let (_folder, script) = crate::peer::write_script("torch_products.py", SCRIPT)?;
    let mut child = Command::new(python)
        .arg(&script)
        .arg(format!("--repeats={repeats}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| BenchError::Peer(format!("cannot start `{python}`: {e}")))?;
    let cases_json = serde_json::to_vec(cases)
        .map_err(|e| BenchError::Peer(format!("cannot write the cases as JSON: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A peer that exits before reading says why on stderr, read below.
        let _ = stdin.write_all(&cases_json);
    }
    let output = child
        .wait_with_output()
        .map_err(|e| BenchError::Peer(format!("`{python}`: {e}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let answer = stdout
        .lines()
        .find_map(|line| line.strip_prefix(RESULT_PREFIX));
    let Some(answer) = answer.filter(|_| output.status.success()) else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(BenchError::Peer(format!(
            "`{python}` with torch_products.py failed, {}: {}. It needs a \
             PyTorch with CUDA (`{python} -c \"import torch; assert torch.cuda.is_available()\"`)",
            output.status,
            stderr.lines().last().unwrap_or("no message")
        )));
    };
    parse_answer(answer)
}

/// The script's JSON answer.
fn parse_answer(answer: &str) -> Result<PeerTimings> {
    let value: serde_json::Value = serde_json::from_str(answer)
        .map_err(|e| BenchError::Peer(format!("its answer is not JSON ({e}): {answer}")))?;
    let text = |key: &str| value[key].as_str().unwrap_or("?").to_string();
    let timings = value["timings"]
        .as_array()
        .ok_or_else(|| BenchError::Peer(format!("its answer has no timings: {answer}")))?
        .iter()
        .map(|timing| {
            let kernels = match timing["kernels"].as_str() {
                Some("TorchTf32") => Kernels::TorchTf32,
                Some("TorchFp32") => Kernels::TorchFp32,
                other => {
                    return Err(BenchError::Peer(format!("it named kernels {other:?}")));
                }
            };
            let device_s = timing["device_s"]
                .as_f64()
                .filter(|seconds| *seconds > 0.0)
                .ok_or_else(|| {
                    BenchError::Peer(format!("its time is not a positive number: {timing}"))
                })?;
            let name = timing["name"].as_str().unwrap_or_default().to_string();
            Ok((
                name,
                Timing {
                    kernels,
                    device_s,
                    wall_s: None,
                    error: None,
                },
            ))
        })
        .collect::<Result<_>>()?;
    Ok(PeerTimings {
        version: format!("PyTorch {} on {}", text("torch"), text("device")),
        timings,
    })
}

/// Adds the peer's timings to the cases of the same name.
pub fn merge(cases: &mut [CaseResult], peer: PeerTimings) {
    for (name, timing) in peer.timings {
        if let Some(case) = cases.iter_mut().find(|case| case.case.name == name) {
            case.timings.push(timing);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in interpreter that answers as the script does, and checks what it was handed.
    fn stand_in(dir: &std::path::Path, body: &str) -> String {
        let path = dir.join("python");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    fn case(name: &str) -> ProductCase {
        ProductCase {
            name: name.into(),
            m: 8,
            k: 4,
            n: 2,
            lhs_transposed: false,
            rhs_transposed: true,
            per_step: 3,
        }
    }

    #[test]
    fn the_peers_timings_join_the_products_of_their_name() {
        let dir = tempfile::tempdir().unwrap();
        // It reads the cases on stdin (their names must be there) and answers after the marker.
        let python = stand_in(
            dir.path(),
            r#"grep -q '"name":"down ∂x"' || exit 3
echo 'a line before the answer'
echo 'HAARES-PRODUCTS-RESULT {"torch": "0.0", "device": "stand-in", "timings": [{"name": "down ∂x", "kernels": "TorchTf32", "device_s": 0.002}, {"name": "down ∂x", "kernels": "TorchFp32", "device_s": 0.004}]}'"#,
        );
        let peer = torch_timings(&python, &[case("down ∂x"), case("head ∂E")], 5).unwrap();
        assert_eq!(peer.version, "PyTorch 0.0 on stand-in");
        let mut cases: Vec<CaseResult> = [case("down ∂x"), case("head ∂E")]
            .into_iter()
            .map(|case| CaseResult {
                case,
                timings: Vec::new(),
            })
            .collect();
        merge(&mut cases, peer);
        let timed = &cases[0];
        assert_eq!(
            timed.timing(Kernels::TorchTf32).map(|t| t.device_s),
            Some(0.002)
        );
        assert_eq!(
            timed.timing(Kernels::TorchFp32).map(|t| t.device_s),
            Some(0.004)
        );
        assert!(
            cases[1].timings.is_empty(),
            "no timing of another product's name"
        );
    }

    #[test]
    fn a_failing_or_garbled_peer_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let peer_error = |python: &str| {
            let error = torch_timings(python, &[case("x")], 5).unwrap_err();
            assert!(matches!(error, BenchError::Peer(_)), "{error:?}");
            error.to_string()
        };
        let python = stand_in(
            dir.path(),
            "echo 'RuntimeError: no CUDA GPUs are available' >&2; exit 1",
        );
        let error = peer_error(&python);
        assert!(
            error.contains("no CUDA GPUs are available") && error.contains("PyTorch with CUDA"),
            "{error}"
        );
        let python = stand_in(
            dir.path(),
            r#"echo 'HAARES-PRODUCTS-RESULT {"timings": [{"name": "x", "kernels": "TorchTf32", "device_s": -1}]}'"#,
        );
        let error = peer_error(&python);
        assert!(error.contains("not a positive number"), "{error}");
        let missing = dir.path().join("no-such-python").display().to_string();
        let error = peer_error(&missing);
        assert!(error.contains("cannot start"), "{error}");
    }
}
