//! A mix's one set of fields: settled from each source's first sample at open, and every
//! sample read conformed to it, so every batch lines up.

use std::sync::Arc;

use bytes::Bytes;

use super::{FillMissing, MixSource, SOURCE_FIELD};
use crate::error::{Error, Result};
use crate::sample::{Field, Sample};

impl MixSource {
    /// The schema from each source's first sample, and the fills; fails on a field one
    /// source lacks that no fill covers.
    pub(super) async fn settle_schema(&mut self, fill: Option<&FillMissing>) -> Result<()> {
        let mut firsts = Vec::with_capacity(self.parts.len());
        for p in &self.parts {
            let meta = p.source.meta(0).await?;
            if let Some((name, _)) = meta.fields.iter().find(|(n, _)| &**n == SOURCE_FIELD) {
                return Err(Error::MixSchema {
                    source_name: p.name.clone(),
                    field: name.to_string(),
                    reason: format!(
                        "its samples have a field named `{SOURCE_FIELD}`, which a mix uses for source names"
                    ),
                });
            }
            for (name, _) in &meta.fields {
                if !self.schema.iter().any(|f| **f == **name) {
                    self.schema.push(name.clone());
                }
            }
            firsts.push(meta);
        }
        self.fills = self
            .schema
            .iter()
            .map(|f| match fill {
                Some(FillMissing::All(true)) => Some(Bytes::new()),
                Some(FillMissing::Fields(map)) => map.get(&**f).map(|v| Bytes::from(v.clone().into_bytes())),
                _ => None,
            })
            .collect();
        for (p, meta) in self.parts.iter().zip(&firsts) {
            for (j, field) in self.schema.iter().enumerate() {
                if self.fills[j].is_some() || meta.fields.iter().any(|(n, _)| n == field) {
                    continue;
                }
                let other = self.parts.iter().zip(&firsts).find(|(_, m)| m.fields.iter().any(|(n, _)| n == field));
                let other = other.map_or(String::new(), |(o, _)| format!(" but `{}` has", o.name));
                let own: Vec<&str> = meta.fields.iter().map(|(n, _)| &**n).collect();
                return Err(Error::MixSchema {
                    source_name: p.name.clone(),
                    field: field.to_string(),
                    reason: format!(
                        "its samples have no field `{field}`{other} (its first sample `{}` has: {}); give \
                         fill_missing (true for empty bytes, or {{\"{field}\": \"VALUE\"}}) to fill it, or make the \
                         fields match (an LMDB's one field is named by its `field` option)",
                        meta.key,
                        own.join(", ")
                    ),
                });
            }
        }
        Ok(())
    }

    pub(super) fn schema_error(&self, s: usize, key: &str, field: &str, reason: String) -> Error {
        Error::MixSchema {
            source_name: self.parts[s].name.clone(),
            field: field.to_string(),
            reason: format!("sample `{key}` {reason}"),
        }
    }

    pub(super) fn schema_list(&self) -> String {
        self.schema.iter().map(|f| &**f).collect::<Vec<_>>().join(", ")
    }

    /// `fields` (name, payload) of a sample of source `s` in schema order, filled, with the
    /// source's name last; or the error for a field the schema does not agree with.
    pub(super) fn conform<T: Clone>(
        &self,
        s: usize,
        key: &str,
        fields: &[(Arc<str>, T)],
        fill: impl Fn(&Bytes) -> T,
        label: T,
    ) -> Result<Vec<(Arc<str>, T)>> {
        if let Some((extra, _)) = fields.iter().find(|(n, _)| !self.schema.iter().any(|f| f == n)) {
            let reason = format!(
                "has field `{extra}`, which the mix's fields ({}; from each source's first sample) do not \
                 include; a mix keeps one set of fields so every batch lines up",
                self.schema_list()
            );
            return Err(self.schema_error(s, key, extra, reason));
        }
        let mut out = Vec::with_capacity(self.schema.len() + 1);
        for (name, filler) in self.schema.iter().zip(&self.fills) {
            match (fields.iter().find(|(n, _)| n == name), filler) {
                // The schema's own name: batches then match columns by pointer.
                (Some((_, v)), _) => out.push((name.clone(), v.clone())),
                (None, Some(b)) => out.push((name.clone(), fill(b))),
                (None, None) => {
                    let have: Vec<&str> = fields.iter().map(|(n, _)| &**n).collect();
                    let reason = format!(
                        "has no field `{name}` (it has: {}), which the mix's other sources have; give fill_missing \
                         to fill it",
                        have.join(", ")
                    );
                    return Err(self.schema_error(s, key, name, reason));
                }
            }
        }
        out.push((self.source_field.clone(), label));
        Ok(out)
    }

    pub(super) fn conform_sample(&self, s: usize, sample: Sample) -> Result<Sample> {
        let fields: Vec<(Arc<str>, Bytes)> = sample.fields.into_iter().map(|f| (f.name, f.data)).collect();
        let label = self.parts[s].label.clone();
        let out = self.conform(s, &sample.key, &fields, Bytes::clone, label)?;
        Ok(Sample { key: sample.key, fields: out.into_iter().map(|(name, data)| Field { name, data }).collect() })
    }
}
