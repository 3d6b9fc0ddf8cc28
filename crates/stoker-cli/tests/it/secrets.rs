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
