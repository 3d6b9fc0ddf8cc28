//! Keeping credentials out of what a user sees: URIs, `Debug` output and error messages.

use std::borrow::Cow;

/// Options whose values are credentials: masked in `Debug`, redacted in URIs.
pub(super) const SECRET_OPTIONS: &[&str] =
    &["access_key_id", "secret_access_key", "session_token", "service_account", "access_key"];

/// `message` with every occurrence of each of `secrets` replaced by `***`.
pub fn scrub(message: &str, secrets: &[String]) -> String {
    let mut out = message.to_string();
    // Longest first: a secret that contains another is replaced whole.
    let mut secrets: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for s in secrets {
        out = out.replace(s.as_str(), "***");
    }
    out
}
/// Query keys whose values are secrets.
const SECRET_HINTS: &[&str] = &[
    "secret",
    "password",
    "token",
    "key_id",
    "access_key",
    "account_key",
    "private_key",
    "signature",
    "credential",
    "sas",
    "sig",
    "service_account",
];

/// Remove credentials from a URI: the userinfo (`user:password@`) of its authority and of any
/// URL in its query (an `endpoint=` option), secret-looking query values, and the credentials
/// inside an inline mix (`mix:{JSON}`).
pub fn redact(uri: &str) -> String {
    if let Some(json) = uri.strip_prefix("mix:").filter(|j| j.trim_start().starts_with('{')) {
        return format!("mix:{}", redact_mix_json(json));
    }
    let (base, query) = match uri.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (uri, None),
    };
    // A `#` before the query is no fragment to the URI parser (it stays in the path), but a
    // secret pasted after it instead of after `?` is still a secret: its pairs are masked as
    // the query's are. (In the query, `#` is part of a key or value, as the parser reads it.)
    let (base, fragment) = match base.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (base, None),
    };
    let mut out = String::with_capacity(uri.len());
    match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            out.push_str(scheme);
            out.push_str("://");
            // A password holding a `/` (`user:pa/ss@host`) ends the authority early for a URL
            // parser, but is still a password: a `user:` part whose "port" is not a number,
            // with an `@` further on, is taken as userinfo up to that `@`.
            let port_is_text = authority.rsplit_once(':').is_some_and(|(_, p)| !p.bytes().all(|b| b.is_ascii_digit()));
            match (authority.rsplit_once('@'), base[scheme.len() + 3..].rfind('@')) {
                // The user name is often the access key id: it goes too.
                (Some((_, host)), _) => {
                    out.push_str("***@");
                    out.push_str(host);
                    out.push_str(path);
                }
                (None, Some(at)) if port_is_text => {
                    out.push_str("***");
                    out.push_str(&rest[at..]);
                }
                (None, _) => {
                    out.push_str(authority);
                    out.push_str(path);
                }
            }
        }
        None => out.push_str(base),
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(&masked_pairs(f, &['&', '#', ';']));
    }
    if let Some(q) = query {
        out.push('?');
        out.push_str(&masked_pairs(q, &['&']));
    }
    out
}

/// `key=value` pairs between any of `seps` (kept as they are), each secret key's value masked
/// and each value holding a URL's credentials redacted.
fn masked_pairs(s: &str, seps: &[char]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut start = 0;
    let ends = s.char_indices().filter(|(_, c)| seps.contains(c)).map(|(i, c)| (i, Some(c)));
    for (end, sep) in ends.chain(std::iter::once((s.len(), None))) {
        let kv = &s[start..end];
        match kv.split_once('=') {
            Some((k, _)) if is_secret_key(k) => {
                out.push_str(k);
                out.push_str("=***");
            }
            Some((k, v)) => match redact_value(v) {
                Some(v) => {
                    out.push_str(k);
                    out.push('=');
                    out.push_str(&v);
                }
                None => out.push_str(kv),
            },
            None => out.push_str(kv),
        }
        if let Some(c) = sep {
            out.push(c);
            start = end + c.len_utf8();
        }
    }
    out
}

/// A query value that holds credentials of a URL (`endpoint=http://user:pw@host`, also
/// percent-encoded), redacted; `None` when it holds none.
fn redact_value(v: &str) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(&v.replace('+', " ")).decode_utf8_lossy().into_owned();
    (decoded.contains('@') && decoded.contains("://")).then(|| redact_endpoint(&decoded))
}

/// An endpoint URL with any userinfo removed. An endpoint has no path that may hold an `@`,
/// so everything up to the last `@` goes, also when the text is not a valid URL
/// (`http://user:pa/ss@host`, which a URL parser reads another way).
pub(crate) fn redact_endpoint(endpoint: &str) -> String {
    let (scheme, rest) = match endpoint.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, endpoint),
    };
    let stop = rest.find(['?', '#']).unwrap_or(rest.len());
    match rest[..stop].rfind('@') {
        Some(at) => format!("{}***{}", scheme.map_or(String::new(), |s| format!("{s}://")), &rest[at..]),
        None => endpoint.to_string(),
    }
}

/// Free text (an error from a store or HTTP client) with every URL in it redacted as
/// [`redact`] does: no userinfo, no secret query values.
pub fn redact_text(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(sep) = rest.find("://") {
        // The scheme starts after the last character that cannot be in one (which may be
        // several bytes long: the next one starts after all of them).
        let start = rest[..sep]
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let len =
            rest[sep..].find(|c: char| c.is_whitespace() || "\"'`<>()[]{},".contains(c)).unwrap_or(rest.len() - sep);
        let end = sep + len;
        out.push_str(&rest[..start]);
        out.push_str(&redact(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// A mix's `uri` or `endpoint` value with its credentials masked, also without a scheme: a
/// local path's options (`/data?session_token=...`), an endpoint's user info (`user:pw@host`).
fn bare_redacted(s: &str) -> String {
    let userinfo = (!s.contains("://")).then(|| s.split_once('@')).flatten();
    match userinfo.filter(|(user, _)| !user.contains('/')) {
        Some((_, host)) => redact(&format!("***@{host}")),
        None => redact(s),
    }
}

/// An inline mix's JSON with its credentials masked: secret option values, and the userinfo
/// and secret query values of every URI and endpoint in it. Text that is not JSON is not
/// shown at all: where its secrets are cannot be told.
fn redact_mix_json(json: &str) -> String {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    if is_secret_key(k) {
                        *v = serde_json::Value::String("***".into());
                    } else if let (true, serde_json::Value::String(s)) = (k == "uri" || k == "endpoint", &mut *v) {
                        *s = bare_redacted(s);
                    } else {
                        walk(v);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            serde_json::Value::String(s) if s.contains("://") => *s = redact(s),
            _ => {}
        }
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(mut v) => {
            walk(&mut v);
            v.to_string()
        }
        Err(_) => "{…} (inline mix JSON that does not parse; not shown, it may hold credentials)".into(),
    }
}

/// Whether an option or query key holds a credential (its value is redacted everywhere).
pub fn is_secret_option(key: &str) -> bool {
    is_secret_key(key)
}

pub(crate) fn is_secret_key(k: &str) -> bool {
    // Judged as the query parser will read it: `%73ecret_access_key` is `secret_access_key`.
    let k = percent_encoding::percent_decode_str(&k.replace('+', " ")).decode_utf8_lossy().to_ascii_lowercase();
    SECRET_OPTIONS.contains(&k.as_str()) || SECRET_HINTS.iter().any(|h| k.contains(h))
}

/// The values given to secret keys in config text (TOML or JSON, a mix file or an options
/// file), also text that does not parse: every `key = value` or `"key": value` whose key
/// holds a credential, inline tables (`options = { secret_access_key = "..." }`) included.
/// Each value is listed as written and without its quotes. `None` when no secret key is
/// there at all.
pub(crate) fn secret_values(text: &str) -> Option<Vec<String>> {
    let b = text.as_bytes();
    let is_word = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'%');
    let mut out = Vec::new();
    let mut any = false;
    let mut i = 0;
    while i < b.len() {
        // A key is a quoted string or a word; words inside strings count too, so a URI's
        // `?secret_access_key=...` in a mix file is found.
        let (key, after) = match b[i] {
            // No key is triple-quoted; stepping over the quotes (and not looking for the
            // string's end from each of them) keeps a text of many quotes linear.
            q @ (b'"' | b'\'') if b[i..].starts_with(&[q, q, q]) => {
                i += 3;
                continue;
            }
            q @ (b'"' | b'\'') => {
                let end = quoted_end(b, i, q);
                (text[i + 1..end].trim_end_matches(q as char), end)
            }
            c if is_word(&c) => {
                let end = i + b[i..].iter().take_while(|c| is_word(c)).count();
                (&text[i..end], end)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        let mut j = after;
        while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
            j += 1;
        }
        if j >= b.len() || !matches!(b[j], b'=' | b':') || !is_secret_key(key) {
            // Not a secret key: look inside a string, go past a word.
            i = if matches!(b[i], b'"' | b'\'') { i + 1 } else { after };
            continue;
        }
        any = true;
        j += 1;
        while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
            j += 1;
        }
        let end = value_end(b, j);
        collect_value(&text[j..end], &mut out);
        i = end.max(i + 1);
    }
    any.then_some(out)
}

/// The end (exclusive) of a string that opens with quote `q` at `i`: after its closing
/// quote, or at the end of the line when it has none. A `"` string has `\` escapes; tripled
/// quotes (`"""`, `'''`) run over lines.
fn quoted_end(b: &[u8], i: usize, q: u8) -> usize {
    if b[i..].starts_with(&[q, q, q]) {
        let close = b[i + 3..].windows(3).position(|w| w == [q, q, q]);
        return close.map_or(b.len(), |p| i + 3 + p + 3);
    }
    let mut j = i + 1;
    while j < b.len() && b[j] != b'\n' {
        if q == b'"' && b[j] == b'\\' {
            j += 2;
            continue;
        }
        if b[j] == q {
            return j + 1;
        }
        j += 1;
    }
    j.min(b.len())
}

/// The end (exclusive) of the value starting at `j`: a string, a bracketed structure (its
/// brackets balanced, strings in it skipped), or a bare token.
fn value_end(b: &[u8], j: usize) -> usize {
    match b.get(j) {
        None => j,
        Some(&q @ (b'"' | b'\'')) => quoted_end(b, j, q),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut k = j;
            while k < b.len() {
                match b[k] {
                    q @ (b'"' | b'\'') => {
                        k = quoted_end(b, k, q);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return k + 1;
                        }
                    }
                    _ => {}
                }
                k += 1;
            }
            b.len()
        }
        Some(_) => {
            let stop = |c: &u8| matches!(c, b',' | b'}' | b']' | b'#' | b'&' | b'"' | b'\'') || c.is_ascii_whitespace();
            j + b[j..].iter().take_while(|c| !stop(c)).count()
        }
    }
}

/// A value's text as written, and what is inside it: its unquoted (and unescaped) form, and
/// for a structure every string and token in it.
fn collect_value(v: &str, out: &mut Vec<String>) {
    let v = v.trim();
    if v.is_empty() {
        return;
    }
    out.push(v.to_string());
    let b = v.as_bytes();
    match b[0] {
        b'{' | b'[' => {
            let mut k = 1;
            while k < b.len() {
                match b[k] {
                    q @ (b'"' | b'\'') => {
                        let end = quoted_end(b, k, q);
                        collect_value(&v[k..end], out);
                        k = end;
                    }
                    c if !matches!(
                        c,
                        b'{' | b'}' | b'[' | b']' | b',' | b':' | b'=' | b' ' | b'\t' | b'\n' | b'\r'
                    ) =>
                    {
                        let end = k + b[k..]
                            .iter()
                            .take_while(|c| !matches!(c, b'{' | b'}' | b'[' | b']' | b',' | b':' | b'=' | b' ' | b'\n'))
                            .count();
                        out.push(v[k..end].to_string());
                        k = end;
                    }
                    _ => k += 1,
                }
            }
        }
        q @ (b'"' | b'\'') => {
            let inner = v.trim_start_matches(q as char).trim_end_matches(q as char);
            if !inner.is_empty() {
                out.push(inner.to_string());
            }
            // As a parser quotes it back: escapes resolved (`\"`, `\u0041`).
            if q == b'"' {
                if let Ok(s) = serde_json::from_str::<String>(v) {
                    out.push(s);
                }
            }
        }
        _ => {}
    }
}

/// A TOML parse error as one line: where (line and column) and why. When the text holds a
/// credential key, toml's quote of the offending line is left out (it may be the secret's
/// line) and the secret values are masked in the reason; otherwise the line is quoted.
pub(crate) fn toml_error(e: &toml::de::Error, text: &str) -> String {
    let secrets = secret_values(text);
    let reason = match &secrets {
        Some(values) => scrub(e.message(), values),
        None => e.message().to_string(),
    };
    let reason = reason.trim_end().replace('\n', "; ");
    let Some(span) = e.span() else { return format!("TOML parse error: {reason}") };
    let at = span.start.min(text.len());
    let at = (0..=at).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..line_start].matches('\n').count() + 1;
    let column = text[line_start..at].chars().count() + 1;
    let near = match secrets {
        Some(_) => String::new(),
        None => {
            let content = text[line_start..].lines().next().unwrap_or("").trim();
            let short: String = redact_text(content).chars().take(120).collect();
            format!(" (near `{short}`)")
        }
    };
    format!("TOML parse error at line {line}, column {column}: {reason}{near}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_with_a_url_after_a_multibyte_character_is_redacted_not_cut_inside_it() {
        // Found by the `uri` fuzz target: a scheme right after a 3-byte character.
        let text = "unknown field `concurrency=layo\u{fffd}s3://user:hunter2@t`, expected one of";
        let r = redact_text(text);
        assert!(r.contains("layo\u{fffd}s3://***@t"), "{r}");
        assert!(!r.contains("hunter2"), "{r}");
        assert_eq!(redact_text("é://x é"), "é://x é");
    }

    #[test]
    fn a_secret_pasted_after_a_hash_is_masked_as_in_the_query() {
        for uri in [
            "s3://b/p/train-{0..1}.tar#secret_access_key=hunter2",
            "s3://b/p#x?session_token=hunter2&region=x",
            "s3://b/p#a=1;secret_access_key=hunter2?region=x",
            "s3://b/p#endpoint=http://user:hunter2@host:9000",
            // In the query `#` belongs to the key, as the query parser reads it.
            "s3://b/p?x=1&secret_ac#ess_key=hunter2",
        ] {
            let r = redact(uri);
            assert!(!r.contains("hunter2"), "{uri} -> {r}");
            assert!(r.starts_with("s3://b/p"), "{r}");
        }
        // Nothing else of a fragment changes.
        assert_eq!(redact("/data/a#b?c=1&d"), "/data/a#b?c=1&d");
        assert!(redact_text("bad uri `s3://b/p#secret_access_key=hunter2`").contains("secret_access_key=***"));
    }

    #[test]
    fn redaction_hides_secrets() {
        let r = redact("s3://AKIA:hunter2@bucket/p?secret_access_key=hunter2&region=x");
        assert!(!r.contains("hunter2") && !r.contains("AKIA"), "{r}");
        assert!(r.contains("bucket/p") && r.contains("region=x"), "{r}");
        assert_eq!(redact("/plain/path"), "/plain/path");
        for uri in [
            "s3://b/p?endpoint=http://user:hunter2@host:9000&region=x",
            "s3://b/p?endpoint=http%3A%2F%2Fuser%3Ahunter2%40host%3A9000",
            "s3://b/p?endpoint=http://user:hun/ter2@host:9000",
        ] {
            let r = redact(uri);
            assert!(!r.contains("hunter2") && !r.contains("ter2") && !r.contains("user"), "{r}");
            assert!(r.contains("host:9000"), "{r}");
        }
        assert_eq!(redact_endpoint("http://u:p/w@h:1"), "http://***@h:1");
        assert_eq!(redact_endpoint("http://h:1"), "http://h:1");
        let text = "error sending request for url (http://ak:hunter2@127.0.0.1:9/b/k?X-Amz-Signature=abc123): x";
        let r = redact_text(text);
        assert!(!r.contains("hunter2") && !r.contains("abc123"), "{r}");
        assert!(
            r.starts_with("error sending request for url (http://***@127.0.0.1:9/b/k?") && r.ends_with("): x"),
            "{r}"
        );
        let mix = r#"mix:{"sources":[{"uri":"s3://b/x?secret_access_key=hunter2","weight":1,
            "options":{"endpoint":"http://u:hunter3@h","session_token":"hunter4"}}]}"#;
        let r = redact(mix);
        assert!(!["hunter2", "hunter3", "hunter4"].iter().any(|s| r.contains(s)), "{r}");
        assert!(r.starts_with("mix:{") && r.contains("s3://b/x"), "{r}");
        assert!(!redact("mix:{\"secret_access_key\": \"hunter2").contains("hunter2"));
        // Without a scheme too: a local path's options, an endpoint's user info.
        let mix = r#"mix:{"sources":[{"uri":"/data/x.tar?session_token=hunter5","weight":1,
            "options":{"endpoint":"u:hunter6@h:9000"}}]}"#;
        let r = redact(mix);
        assert!(!r.contains("hunter5") && !r.contains("hunter6") && r.contains("/data/x.tar"), "{r}");
    }

    #[test]
    fn secret_values_are_found_in_broken_config_text() {
        let text = "[[sources]]\nuri = \"s3://b\"\noptions = { secret_access_key = \"hunter2\", region = \"x\" \n\
                    session_token='tok-1'\n\"access_key_id\": [\"AKID\", 5]\nservice_account = \"\"\"multi\nline\"\"\"\n\
                    secret_access_key = 918273645";
        let v = secret_values(text).unwrap();
        for s in ["hunter2", "tok-1", "AKID", "multi\nline", "918273645"] {
            assert!(v.iter().any(|x| x == s), "{s} in {v:?}");
        }
        assert!(!v.iter().any(|x| x == "x"), "{v:?}");
        assert_eq!(secret_values("layout = \"tar\"\nregion = \"us\""), None);
        let v = secret_values("uri = \"s3://b/x?region=y&secret_access_key=hunter2&a=b\"").unwrap();
        assert!(v.iter().any(|x| x == "hunter2"), "{v:?}");
    }

    #[test]
    fn toml_errors_are_one_line_and_never_quote_a_secret_line() {
        let text = "layout = \"tar\"\nsecret_access_key = \"hunter2\" junk\n";
        let e = toml::from_str::<toml::Value>(text).unwrap_err();
        let m = toml_error(&e, text);
        assert!(!m.contains("hunter2") && !m.contains('\n'), "{m}");
        assert!(m.contains("line 2"), "{m}");
        let text = "layout = \"tar\"\nregion = \"x\" junk\n";
        let e = toml::from_str::<toml::Value>(text).unwrap_err();
        let m = toml_error(&e, text);
        assert!(m.contains("line 2") && m.contains("near `region = \"x\" junk`") && !m.contains('\n'), "{m}");
    }
}
