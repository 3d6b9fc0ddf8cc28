//! The header of an `.npy` file: its magic and length, and its Python dict literal read
//! strictly (both the flat token files and the `.npy` fields of samples are read through it).

/// The header text of `.npy` file bytes `b` (format versions 1, 2 and 3) and where the data
/// starts after it.
pub(crate) fn header_text(b: &[u8]) -> std::result::Result<(&str, usize), String> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (len, start): (usize, usize) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(format!(".npy format version {v} is not supported (1, 2 and 3 are)")),
    };
    let end = start.checked_add(len).filter(|&e| e <= b.len()).ok_or("truncated .npy header")?;
    let text = std::str::from_utf8(&b[start..end]).map_err(|_| ".npy header is not text")?;
    Ok((text, end))
}

/// What an `.npy` header says.
pub(crate) struct NpyDict {
    /// The dtype string (`'<u2'`).
    pub(crate) descr: String,
    /// Whether the array is stored column-major.
    pub(crate) fortran_order: bool,
    /// The array's shape.
    pub(crate) shape: Vec<u64>,
}

/// The header's Python dict literal, read strictly: exactly the keys numpy writes and reads
/// (`descr`, `fortran_order`, `shape`), each once, as plain quoted strings; `descr` a plain
/// string, `fortran_order` `True` or `False`, `shape` a tuple of lengths; nothing but
/// whitespace after it. Python would also take escapes (`'d\x65scr'`), adjacent literals joined
/// (`'desc' 'r'`) and a key given twice (the last wins): each could make numpy read the header
/// otherwise than a looser reader does, so they are refused.
pub(crate) fn parse_dict(text: &str) -> std::result::Result<NpyDict, String> {
    #[derive(PartialEq)]
    enum Tok<'a> {
        Punct(char),
        Str(&'a str),
        Word(&'a str),
    }
    let mut toks = Vec::new();
    let mut rest = text.trim_end_matches([' ', '\n', '\0']);
    loop {
        rest = rest.trim_start_matches([' ', '\n', '\t']);
        let Some(c) = rest.chars().next() else { break };
        if "{}:,()[]".contains(c) {
            toks.push(Tok::Punct(c));
            rest = &rest[1..];
        } else if c == '\'' || c == '"' {
            let close = rest[1..].find(c).ok_or("its header has an unterminated string")? + 1;
            let body = &rest[1..close];
            if body.contains('\\') || body.contains('\n') {
                return Err("its header has a string with an escape".into());
            }
            if matches!(toks.last(), Some(Tok::Str(_))) {
                return Err("its header joins two strings (Python would read them as one)".into());
            }
            toks.push(Tok::Str(body));
            rest = &rest[close + 1..];
        } else if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            let n = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).unwrap_or(rest.len());
            toks.push(Tok::Word(&rest[..n]));
            rest = &rest[n..];
        } else {
            return Err(format!("its header holds {c:?}, which numpy does not write"));
        }
    }
    let bad = || "its header is not the dict numpy writes".to_string();
    let mut it = toks.into_iter();
    if it.next() != Some(Tok::Punct('{')) {
        return Err(bad());
    }
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        let key = match it.next() {
            Some(Tok::Punct('}')) => break,
            Some(Tok::Str(k)) => k,
            _ => return Err(bad()),
        };
        if it.next() != Some(Tok::Punct(':')) {
            return Err(bad());
        }
        let twice = || format!("its header gives {key} more than once");
        match key {
            "descr" => match it.next() {
                Some(Tok::Str(d)) if descr.is_none() => descr = Some(d.to_string()),
                Some(Tok::Str(_)) => return Err(twice()),
                _ => return Err("its descr is not a plain dtype string".into()),
            },
            "fortran_order" => match it.next() {
                _ if fortran.is_some() => return Err(twice()),
                Some(Tok::Word("True")) => fortran = Some(true),
                Some(Tok::Word("False")) => fortran = Some(false),
                _ => return Err("its fortran_order is not True or False".into()),
            },
            "shape" => {
                if shape.is_some() {
                    return Err(twice());
                }
                if it.next() != Some(Tok::Punct('(')) {
                    return Err("its shape is not a tuple".into());
                }
                let mut dims = Vec::new();
                loop {
                    match it.next() {
                        Some(Tok::Punct(')')) => break,
                        Some(Tok::Word(w)) => {
                            dims.push(
                                w.trim_end_matches('L')
                                    .parse::<u64>()
                                    .map_err(|_| format!("its shape holds {w}, not a length"))?,
                            );
                            match it.next() {
                                Some(Tok::Punct(',')) => {}
                                Some(Tok::Punct(')')) => break,
                                _ => return Err("its shape is not a tuple".into()),
                            }
                        }
                        _ => return Err("its shape is not a tuple".into()),
                    }
                }
                shape = Some(dims);
            }
            other => return Err(format!("its header has a key {other:?} numpy does not write")),
        }
        match it.next() {
            Some(Tok::Punct(',')) => {}
            Some(Tok::Punct('}')) => break,
            _ => return Err(bad()),
        }
    }
    if it.next().is_some() {
        return Err("its header has more after the dict".into());
    }
    Ok(NpyDict {
        descr: descr.ok_or("its header has no descr")?,
        fortran_order: fortran.ok_or("its header has no fortran_order")?,
        shape: shape.ok_or("its header has no shape")?,
    })
}
