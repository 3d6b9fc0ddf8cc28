//! Shell-style brace expansion, as bash and Python's `braceexpand` do it, with limits that
//! keep a typo from exhausting memory.

/// The most names one brace pattern may expand to; more is almost surely a typo.
const MAX_EXPANSION: usize = 1_000_000;
/// The most bytes the expanded names may take: long literal parts times many names would
/// otherwise exhaust memory before the name count is reached.
const MAX_EXPANSION_BYTES: usize = 128 << 20;

/// Expand shell-style braces: `a-{000..003}.tar` (zero-padded ranges) and `{train,val}`.
///
/// Several groups multiply out left to right. Nested braces are not supported.
pub fn expand_braces(pattern: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = vec![String::new()];
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        let close =
            rest[open..].find('}').map(|c| open + c).ok_or_else(|| format!("unclosed `{{` in pattern `{pattern}`"))?;
        let body = &rest[open + 1..close];
        if body.contains('{') {
            return Err(format!("nested braces are not supported in `{pattern}`"));
        }
        let alts = brace_alternatives(body).map_err(|e| format!("{e} in pattern `{pattern}`"))?;
        let prefix = &rest[..open];
        let names = out.len().saturating_mul(alts.len());
        if names > MAX_EXPANSION {
            return Err(format!("pattern `{pattern}` expands to more than {MAX_EXPANSION} names"));
        }
        // Every name is at most the longest so far, this literal, the longest alternative and
        // all the text after the group.
        let longest = out.iter().map(String::len).max().unwrap_or(0)
            + prefix.len()
            + alts.iter().map(String::len).max().unwrap_or(0)
            + (rest.len() - close);
        if names.saturating_mul(longest) > MAX_EXPANSION_BYTES {
            return Err(format!("pattern `{pattern}` expands to more than {} MiB of names", MAX_EXPANSION_BYTES >> 20));
        }
        out = out.iter().flat_map(|head| alts.iter().map(move |a| format!("{head}{prefix}{a}"))).collect();
        rest = &rest[close + 1..];
    }
    if rest.contains('}') {
        return Err(format!("unmatched `}}` in pattern `{pattern}`"));
    }
    for s in &mut out {
        s.push_str(rest);
    }
    Ok(out)
}

fn brace_alternatives(body: &str) -> std::result::Result<Vec<String>, String> {
    if let Some((a, b)) = body.split_once("..") {
        let parse = |s: &str| s.parse::<u64>().map_err(|_| format!("`{{{body}}}` is not a range of whole numbers"));
        let (lo, hi) = (parse(a)?, parse(b)?);
        if lo > hi {
            return Err(format!("range `{{{body}}}` runs backwards"));
        }
        if hi - lo >= MAX_EXPANSION as u64 {
            return Err(format!("range `{{{body}}}` has more than {MAX_EXPANSION} values"));
        }
        // Zero padding follows the wider endpoint when either is written with a leading zero,
        // as bash and Python's braceexpand do.
        let padded = (a.len() > 1 && a.starts_with('0')) || (b.len() > 1 && b.starts_with('0'));
        let width = if padded { a.len().max(b.len()) } else { 0 };
        return Ok((lo..=hi).map(|n| format!("{n:0width$}")).collect());
    }
    if body.contains(',') {
        return Ok(body.split(',').map(str::to_string).collect());
    }
    Err(format!("`{{{body}}}` is neither a range `{{a..b}}` nor a list `{{x,y}}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_ranges_and_lists() {
        assert_eq!(expand_braces("s-{000..002}.tar").unwrap(), ["s-000.tar", "s-001.tar", "s-002.tar"]);
        assert_eq!(expand_braces("{a,b}/{1..2}").unwrap(), ["a/1", "a/2", "b/1", "b/2"]);
        assert_eq!(expand_braces("{8..10}").unwrap(), ["8", "9", "10"]);
        assert_eq!(expand_braces("plain").unwrap(), ["plain"]);
        for bad in ["{1..", "a}", "{3..1}", "{x..y}", "{a}", "{{a,b}}", "{0..99999999999}", "{0..999}{0..9999}"] {
            assert!(expand_braces(bad).is_err(), "{bad} should fail");
        }
        // Few enough names, far too many bytes: refused before anything is built.
        let long = format!("{}{{0..999}}{{0..999}}", "x".repeat(1000));
        assert!(expand_braces(&long).unwrap_err().contains("MiB"));
    }
}
