//! The version rule, as requests carry it: what a read expects of the object it reads.
//!
//! A strong entity tag is sent as `If-Match`, so the server refuses a replaced object. A weak
//! tag (`W/"…"`) names equivalent content, not these bytes, and servers that check `If-Match`
//! strictly (nginx, Apache) refuse every request that carries one: it is never sent. Whatever
//! was sent, every answer's own size, entity tag and modification time are compared with
//! what the read expects, so a server without tags, or with weak ones, still cannot hand over
//! the bytes of another version.

use object_store::ObjectMeta;

/// The version of an object a read is pinned to (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expect {
    /// The object's size in bytes.
    pub size: u64,
    /// Its entity tag, strong or weak, when the store gives one.
    pub e_tag: Option<String>,
    /// Its modification time in microseconds since the Unix epoch (0: unknown).
    pub modified_us: i64,
}

/// Whether an entity tag is weak (`W/"…"`).
pub fn is_weak(tag: &str) -> bool {
    tag.starts_with("W/") || tag.starts_with("w/")
}

/// A tag's opaque part, for comparing: listings give some tags bare where answers quote
/// them (GCS, Azure), and weak and strong forms of one tag name one version.
fn opaque(tag: &str) -> &str {
    let t = tag.strip_prefix("W/").or_else(|| tag.strip_prefix("w/")).unwrap_or(tag);
    t.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(t)
}

impl Expect {
    /// The precondition to send: the entity tag when it is strong.
    pub fn if_match(&self) -> Option<&str> {
        self.e_tag.as_deref().filter(|t| !is_weak(t))
    }

    /// What differs between this version and an answer's `meta`, if anything. Compared:
    /// the size always; the entity tag when both have one; else the modification time when
    /// both know it (a server that gives neither tag nor time can only be held to the size).
    pub fn differs(&self, meta: &ObjectMeta) -> Option<String> {
        if meta.size != self.size {
            return Some(format!("its size is now {} bytes, not the {} it had when first read", meta.size, self.size));
        }
        match (&self.e_tag, &meta.e_tag) {
            (Some(want), Some(got)) if opaque(want) != opaque(got) => {
                return Some(format!("its entity tag is now {got}, not the {want} it had when first read"));
            }
            (Some(_), Some(_)) => return None,
            _ => {}
        }
        // HTTP dates have whole seconds; listings often carry milliseconds.
        let (got, want) = (meta.last_modified.timestamp(), self.modified_us.div_euclid(1_000_000));
        (self.modified_us != 0 && got != 0 && got != want)
            .then(|| format!("it was modified at {got} (seconds since 1970), not {want} as when first read"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(size: u64, e_tag: Option<&str>, modified_us: i64) -> ObjectMeta {
        ObjectMeta {
            location: "x".into(),
            last_modified: chrono::DateTime::from_timestamp_micros(modified_us).unwrap(),
            size,
            e_tag: e_tag.map(str::to_string),
            version: None,
        }
    }

    #[test]
    fn weak_tags_are_compared_never_sent() {
        let weak = Expect { size: 10, e_tag: Some("W/\"a-1\"".into()), modified_us: 5 };
        assert_eq!(weak.if_match(), None);
        assert_eq!(weak.differs(&meta(10, Some("W/\"a-1\""), 5)), None);
        assert!(weak.differs(&meta(10, Some("W/\"a-2\""), 5)).unwrap().contains("entity tag"));
        let strong = Expect { e_tag: Some("\"abc\"".into()), ..weak.clone() };
        assert_eq!(strong.if_match(), Some("\"abc\""));
        // A listing's bare tag is the answer's quoted one.
        let bare = Expect { e_tag: Some("abc".into()), ..weak };
        assert_eq!(bare.differs(&meta(10, Some("\"abc\""), 5)), None);
        assert!(bare.differs(&meta(10, Some("\"abd\""), 5)).is_some());
    }

    #[test]
    fn without_tags_size_and_time_decide() {
        let none = Expect { size: 10, e_tag: None, modified_us: 5_000_123 };
        assert_eq!(none.differs(&meta(10, None, 5_000_123)), None);
        assert_eq!(none.differs(&meta(10, None, 5_000_000)), None, "an HTTP date has whole seconds");
        assert!(none.differs(&meta(11, None, 5_000_123)).unwrap().contains("size"));
        assert!(none.differs(&meta(10, None, 6_000_000)).unwrap().contains("modified"));
        // A server that sends no time: only the size holds it.
        assert_eq!(none.differs(&meta(10, None, 0)), None);
        let unknown = Expect { modified_us: 0, ..none };
        assert_eq!(unknown.differs(&meta(10, None, 77)), None);
    }
}
