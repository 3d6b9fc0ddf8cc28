//! The CLI never prints credentials: failing remote opens with secrets in the URI query and
//! in a config file (also one with a secret of the wrong type), stdout and stderr grepped.

use crate::common;

const SECRET: &str = "cli-secret-7731-do-not-print";
const NUMERIC_SECRET: &str = "918273645546372819";

fn run(args: &[&str]) -> String {
    let out = common::stoker(args);
    assert!(!out.status.success(), "{args:?} should fail");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn assert_clean(what: &str, out: &str) {
    assert!(!out.contains(SECRET) && !out.contains(NUMERIC_SECRET), "{what} printed a secret:\n{out}");
    assert!(out.contains("error"), "{what} says what failed:\n{out}");
}

#[test]
fn failing_remote_opens_print_no_credentials() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/x")).unwrap();
    std::fs::write(root.path().join("data/x/a.bin"), b"a").unwrap();
    let server = rt
        .block_on(stoker_testkit::s3::serve(
            stoker_testkit::s3::S3ServerConfig::new(root.path()).with_credentials("AK", "right-secret"),
        ))
        .unwrap();
    let live = server.endpoint();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let query = format!("access_key_id=AK&secret_access_key={SECRET}&session_token={SECRET}");
    for cmd in ["inspect", "ls", "index"] {
        for uri in [
            format!("s3://data/x?endpoint={live}&{query}"),
            format!("s3://data/x?endpoint={closed}&{query}&attempts=1"),
            format!("az://c/x?endpoint={closed}&account=a&access_key={SECRET}&attempts=1"),
            format!("s3://data/x?endpoint={live}&{query}&attempts=lots"),
        ] {
            assert_clean(&format!("stoker {cmd} with the secret in the query"), &run(&[cmd, &uri]));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let configs = [
        ("c.toml", format!("endpoint = \"{live}\"\naccess_key_id = \"AK\"\nsecret_access_key = \"{SECRET}\"\n")),
        ("c.json", format!(r#"{{"endpoint": "{closed}", "secret_access_key": "{SECRET}", "attempts": 1}}"#)),
        // Wrong types: parsers quote the offending value.
        ("t.toml", format!("endpoint = \"{live}\"\nsecret_access_key = {NUMERIC_SECRET}\n")),
        ("t.json", format!(r#"{{"secret_access_key": {NUMERIC_SECRET}}}"#)),
        ("u.toml", format!("secret_access_key = \"{SECRET}\"\nbogus_option = 1\n")),
    ];
    for (name, text) in configs {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = run(&["inspect", "s3://data/x?access_key_id=AK", "--config", path.to_str().unwrap()]);
        assert_clean(&format!("stoker inspect --config {name}"), &out);
    }
}

/// The one secret the test below plants everywhere: the S3 server's real secret key, so the
/// commands that use it succeed and print what they found.
const PLANTED: &str = "cli-planted-4417-do-not-print";
const PLANTED_USER: &str = "cli-planted-user-3302";
const PLANTED_NUMBER: &str = "441712345678";

/// Run `stoker args` with `env` set; its stdout and stderr, and whether it succeeded.
fn run_with(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stoker"));
    cmd.args(args);
    for k in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("run stoker");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn files_holding_a_secret(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap_or_default();
                let holds = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
                if [PLANTED, PLANTED_USER, PLANTED_NUMBER].into_iter().any(holds) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// One secret in every place a CLI user can put it (URI query, endpoint userinfo, the
/// environment, a config file, a mix file), through commands that succeed and fail: stdout
/// and stderr never show it, nor do the files the commands write.
#[test]
fn a_secret_planted_everywhere_never_reaches_stdout_or_stderr() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    let ds = root.path().join("data/ds");
    std::fs::create_dir_all(&ds).unwrap();
    common::shards(&ds);
    let server = rt
        .block_on(stoker_testkit::s3::serve(
            stoker_testkit::s3::S3ServerConfig::new(root.path()).with_credentials("AK", PLANTED),
        ))
        .unwrap();
    let ep = server.endpoint();
    let with_userinfo = ep.replacen("http://", &format!("http://{PLANTED_USER}:{PLANTED}@"), 1);
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{PLANTED_USER}:{PLANTED}@127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let local = format!("disk_cache_dir={}", cache.display());
    let query = format!("s3://data/ds?endpoint={ep}&access_key_id=AK&secret_access_key={PLANTED}&{local}");
    let with_user =
        format!("s3://data/ds?endpoint={with_userinfo}&access_key_id=AK&secret_access_key={PLANTED}&{local}");
    let dir = |name: &str| work.path().join(name).to_string_lossy().into_owned();
    let write = |name: &str, text: String| {
        let p = work.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let cfg = |name: &str, text: String| write(name, text);
    let good_toml =
        cfg("good.toml", format!("endpoint = \"{ep}\"\naccess_key_id = \"AK\"\nsecret_access_key = \"{PLANTED}\"\n"));
    let configs = [
        cfg("inline.toml", format!("endpoint = \"{ep}\"\noptions = {{ secret_access_key = \"{PLANTED}\" junk }}\n")),
        cfg("line.toml", format!("secret_access_key = \"{PLANTED}\" junk\n")),
        cfg("number.toml", format!("secret_access_key = {PLANTED_NUMBER}\n")),
        cfg("userinfo.toml", format!("endpoint = \"{with_userinfo}\" junk\n")),
        cfg("broken.json", format!("{{\"secret_access_key\": \"{PLANTED}\", \"x\": ")),
        cfg("number.json", format!("{{\"secret_access_key\": {PLANTED_NUMBER}}}")),
    ];
    let mix_options = format!("endpoint = \"{ep}\", access_key_id = \"AK\", secret_access_key = \"{PLANTED}\"");
    let good_mix = write(
        "good.mix.toml",
        format!("[[sources]]\nuri = \"s3://data/ds?{local}\"\nweight = 1.0\noptions = {{ {mix_options} }}\n"),
    );
    let bad_mixes = [
        write(
            "inline.mix.toml",
            format!("[[sources]]\nuri = \"s3://data/ds\"\nweight = 1.0\noptions = {{ {mix_options} junk }}\n"),
        ),
        write(
            "number.mix.toml",
            format!(
                "[[sources]]\nuri = \"s3://x\"\nweight = 1.0\noptions = {{ secret_access_key = {PLANTED_NUMBER} }}\n"
            ),
        ),
        write("uri.mix.toml", format!("[[sources]]\nuri = \"s3://x?secret_access_key={PLANTED}\" junk\nweight = 1\n")),
    ];
    let env_keys = [("AWS_ACCESS_KEY_ID", "AK"), ("AWS_SECRET_ACCESS_KEY", PLANTED), ("AWS_SESSION_TOKEN", PLANTED)];
    let plain = format!("s3://data/ds?endpoint={ep}&{local}");

    type Run = (Vec<String>, Vec<(String, String)>, Option<bool>);
    let mut runs: Vec<Run> = Vec::new();
    let mut add = |args: &[&str], env: &[(&str, &str)], expect: Option<bool>| {
        let owned = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        runs.push((owned(args), env, expect))
    };
    // The URI's query, through every command that opens a source; some write files.
    for cmd in ["ls", "inspect", "index"] {
        add(&[cmd, &query], &[], Some(true));
    }
    add(&["cat", &query, "0", "--field", "txt"], &[], Some(true));
    add(&["pack", &query, &dir("packed"), "--json"], &[], Some(true));
    add(&["diagnose", &query, "--batch", "2", "--samples", "4", "--seconds", "1", "--device", "cpu"], &[], Some(true));
    add(&["cat", &query, "99"], &[], Some(false));
    // The endpoint's userinfo: a live server (object_store sends it along), a closed port.
    add(&["ls", &with_user], &[], None);
    add(&["inspect", &query.replace(&ep, &closed)], &[], Some(false));
    add(&["ls", &format!("s3://data/ds?endpoint=http://{PLANTED_USER}:pl/{PLANTED}@h:1")], &[], Some(false));
    // The environment: credentials, and an endpoint with userinfo.
    add(&["ls", &plain], &env_keys, Some(true));
    add(
        &["ls", &format!("s3://data/ds?{local}&attempts=1")],
        &[("AWS_ENDPOINT_URL", &closed), env_keys[0], env_keys[1]],
        Some(false),
    );
    let env_endpoint = format!("http://{PLANTED_USER}:pl/x{PLANTED}@h:1");
    add(&["ls", "s3://data/ds"], &[("AWS_ENDPOINT_URL", &env_endpoint)], Some(false));
    // Config files, good and broken.
    add(&["inspect", &format!("s3://data/ds?{local}"), "--config", &good_toml], &[], Some(true));
    for c in &configs {
        add(&["inspect", &format!("s3://data/ds?{local}"), "--config", c], &[], Some(false));
    }
    // Mix files, good and broken.
    for cmd in ["ls", "inspect"] {
        add(&[cmd, &good_mix], &[], Some(true));
    }
    for m in &bad_mixes {
        add(&["inspect", m], &[], Some(false));
    }

    for (args, env, expect) in &runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (ok, out) = run_with(&args, &env);
        let shown: Vec<&str> =
            args.iter().map(|a| if a.contains(PLANTED) { "<uri with the secret>" } else { a }).collect();
        if let Some(want) = expect {
            assert_eq!(ok, *want, "stoker {shown:?}: {out}");
        }
        for s in [PLANTED, PLANTED_USER, PLANTED_NUMBER] {
            assert!(!out.contains(s), "stoker {shown:?} printed `{s}`:\n{out}");
        }
        assert!(!out.trim().is_empty(), "stoker {shown:?} says something");
    }
    drop(server);
    // Manifests, indexes and the packed copy in the bucket and work dirs; the disk cache.
    for d in [root.path(), work.path().join("packed").as_path(), cache.as_path()] {
        assert!(files_holding_a_secret(d).is_empty(), "{}: {:?}", d.display(), files_holding_a_secret(d));
    }
    assert!(ds.join(".stoker-manifest.json").exists() && cache.exists());
}

/// An inline mix whose JSON holds URIs (`file://…`) is benchmarked (its `://` failed the URI
/// check before it ran), and shown with its secret options redacted.
#[test]
fn bench_takes_an_inline_mix_and_shows_it_redacted() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..20 {
        std::fs::write(dir.path().join(format!("{i:03}.bin")), vec![b'x'; 100]).unwrap();
    }
    let mix = format!(
        r#"mix:{{"sources":[{{"uri":"file://{}","weight":1,"options":{{"secret_access_key":"{SECRET}"}}}}]}}"#,
        dir.path().display()
    );
    let out = common::stoker(&["bench", &mix, "--json"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(!text.contains(SECRET) && text.contains("\"backend\":\"mix:"), "{text}");
}
