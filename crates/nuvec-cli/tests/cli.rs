//! The `nuvec` binary's answers to bad command lines: an error naming the problem, exit code
//! 1, before any model is loaded; and `launch` running its ranks.

use std::process::Command;

fn nuvec(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec")).args(args).output().expect("nuvec runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_batch_refuses_what_it_cannot_do() {
    for flag in [&["--kv-bits", "8"][..], &["--max-kv-size", "64"], &["--prompt-lookup", "2"], &["--draft-model", "d"]]
    {
        let mut args = vec!["generate", "--model", "/nonexistent", "--prompt", "a", "--prompt", "b"];
        args.extend_from_slice(flag);
        let (code, err) = nuvec(&args);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(&format!("{} works with one --prompt, not with a batch of 2", flag[0])), "{err}");
    }
}

#[test]
fn a_missing_model_is_named() {
    let (code, err) = nuvec(&["generate", "--model", "/nonexistent/model", "--prompt", "a"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/nonexistent/model"), "{err}");
}

#[test]
fn bench_refuses_caches_it_does_not_measure() {
    for flag in ["--kv-bits", "--max-kv-size"] {
        let (code, err) = nuvec(&["bench", "--model", "/nonexistent", flag, "8"]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(&format!("bench: {flag} is not measured")), "{err}");
    }
}

#[test]
fn launch_runs_ranks_with_their_group_and_names_a_failed_one() {
    let check = r#"test "$NUVEC_WORLD_SIZE" = 3 && test "$NCCL_NVLS_ENABLE" = 0 && test -n "$NUVEC_DIST_HOSTS" && test "$NUVEC_RANK" -lt 3"#;
    let (code, err) = nuvec(&["launch", "-n", "3", "--", "sh", "-c", check]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = nuvec(&["launch", "-n", "2", "--grace", "5", "--", "sh", "-c", "exit $NUVEC_RANK"]);
    assert_ne!(code, 0);
    assert!(err.contains("rank 1 of 2"), "{err}");
}

#[test]
fn tensor_parallel_ranks_decode_and_rank_0_reports() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../nuvec-lm/tests/fixtures/tiny/llama/config.json");
    let json = std::env::temp_dir().join(format!("nuvec-cli-tp-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["bench", "--random", config, "--tensor-parallel", "2", "--prompt-tokens", "8", "--context", "16"])
        .args(["--steps", "4", "--repeats", "1", "--json", json.to_str().unwrap()])
        .output()
        .expect("nuvec runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.matches("tensor parallel 2").count(), 1, "rank 0 alone reports:\n{stdout}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(doc["decode"][0]["decode_tokens_per_s"].as_f64().is_some_and(|t| t > 0.0), "{doc}");
    let _ = std::fs::remove_file(&json);
    let (code, err) = nuvec(&["chat", "--model", "/nonexistent", "--tensor-parallel", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--tensor-parallel works with generate, bench and serve, not with chat"), "{err}");
}
