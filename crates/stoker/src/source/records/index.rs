//! Reading an `index.json` in bounded memory: the array of shards (MDS `shards`, LitData
//! `chunks`) is walked one element at a time, each turned into what the source keeps before
//! the next is parsed, instead of the whole document becoming a JSON tree first (8x the file
//! for a million shard entries).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Why an index could not be read.
#[derive(Debug)]
pub(super) enum IndexError {
    /// Not JSON, or not an object.
    Json(String),
    /// JSON, but not an index of this layout: what is wrong with it.
    Layout(String),
}

/// The members of the JSON object `bytes` other than `list`, and whether `list` was there;
/// each element of the `list` array goes to `each(n, element)` as it is parsed (with `None`,
/// the elements are skipped unparsed).
pub(super) fn stream(
    bytes: &[u8],
    list: &str,
    each: Option<&mut dyn FnMut(usize, Value) -> Result<(), String>>,
) -> Result<(Map<String, Value>, bool), IndexError> {
    let mut failed: Option<String> = None;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let got = de.deserialize_map(Top { list, each, failed: &mut failed });
    let got = got.and_then(|top| de.end().map(|()| top));
    match (got, failed) {
        (_, Some(why)) => Err(IndexError::Layout(why)),
        (Ok(top), None) => Ok(top),
        (Err(e), None) => Err(IndexError::Json(e.to_string())),
    }
}

/// Each element of the `list` array of the JSON object `bytes`, made into a `T` by
/// `make(n, element)` as it is parsed, and the object's other members; a missing `list` is
/// an error.
pub(super) fn collect<T>(
    bytes: &[u8],
    list: &str,
    mut make: impl FnMut(usize, Value) -> Result<T, String>,
) -> Result<(Vec<T>, Map<String, Value>), IndexError> {
    let mut out = Vec::new();
    let (rest, seen) = stream(
        bytes,
        list,
        Some(&mut |n, v| {
            out.push(make(n, v)?);
            Ok(())
        }),
    )?;
    if !seen {
        return Err(IndexError::Layout(format!("it has no `{list}` list")));
    }
    Ok((out, rest))
}

struct Top<'a, 'f> {
    list: &'a str,
    each: Option<&'a mut (dyn FnMut(usize, Value) -> Result<(), String> + 'f)>,
    failed: &'a mut Option<String>,
}

impl<'de> Visitor<'de> for Top<'_, '_> {
    type Value = (Map<String, Value>, bool);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an index.json object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut rest = Map::new();
        let mut seen = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.list && seen {
                // JSON readers (Python's, MosaicML's and LitData's) take the last copy, where
                // this streams the first: refused rather than read otherwise.
                let why = format!("its `{}` list is given twice: the index is damaged; write it again", self.list);
                *self.failed = Some(why.clone());
                return Err(serde::de::Error::custom(why));
            }
            if key == self.list {
                seen = true;
                map.next_value_seed(List { each: self.each.take(), failed: &mut *self.failed })?;
            } else {
                rest.insert(key, map.next_value::<Value>()?);
            }
        }
        Ok((rest, seen))
    }
}

struct List<'a, 'f> {
    each: Option<&'a mut (dyn FnMut(usize, Value) -> Result<(), String> + 'f)>,
    failed: &'a mut Option<String>,
}

impl<'de> DeserializeSeed<'de> for List<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for List<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<(), S::Error> {
        let Some(each) = self.each else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let mut n = 0usize;
        while let Some(v) = seq.next_element::<Value>()? {
            if let Err(why) = each(n, v) {
                // Kept aside: serde's error would wrap it in a position it does not need.
                *self.failed = Some(why.clone());
                return Err(serde::de::Error::custom(why));
            }
            n += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_handed_over_one_by_one_and_the_rest_is_kept() {
        let text = br#"{"version": 2, "shards": [{"a": 1}, {"a": 2}], "config": {"x": true}}"#;
        let mut got = Vec::new();
        let (rest, seen) = stream(
            text,
            "shards",
            Some(&mut |n, v| {
                got.push((n, v["a"].as_u64().unwrap()));
                Ok(())
            }),
        )
        .unwrap();
        assert!(seen);
        assert_eq!(got, vec![(0, 1), (1, 2)]);
        assert_eq!(rest["config"]["x"], Value::Bool(true));
        assert!(!rest.contains_key("shards"));
        let (rest, seen) = stream(text, "chunks", None).unwrap();
        assert!(!seen && rest.contains_key("shards"));
        // A layout error stops the walk and is told apart from bad JSON.
        let e = stream(text, "shards", Some(&mut |_, _| Err("no".into()))).unwrap_err();
        assert!(matches!(e, IndexError::Layout(w) if w == "no"));
        assert!(matches!(stream(b"{\"shards\": [1,", "shards", None), Err(IndexError::Json(_))));
        assert!(matches!(stream(b"[1, 2]", "shards", None), Err(IndexError::Json(_))));
        assert!(matches!(stream(b"{} trailing", "shards", None), Err(IndexError::Json(_))));
        // The list given twice: JSON readers take the second, this would stream the first.
        let twice = br#"{"shards": [{"a": 1}], "version": 2, "shards": [{"a": 2}, {"a": 3}]}"#;
        let e = stream(twice, "shards", Some(&mut |_, _| Ok(()))).unwrap_err();
        assert!(matches!(&e, IndexError::Layout(w) if w.contains("`shards` list is given twice")), "{e:?}");
    }
}
