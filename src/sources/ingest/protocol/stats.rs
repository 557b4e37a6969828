//! A sample's `stats`: the known `torch.cuda.memory_stats()` keys picked out, the rest skipped.
//! Every trainer line carries a dozen of them, so keys are matched without allocating and
//! counts are read straight into `u64`; only a bad value is kept whole, to be quoted back.

use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::{shorten, MAX_BYTES, MAX_QUOTE};
use crate::core::trainer::Stats;

/// The keys the daemon uses, each with the field it fills: one table, so a key cannot be
/// added without its field.
macro_rules! fields {
    ($($key:literal => $field:ident),* $(,)?) => {
        const FIELDS: &[(&str, fn(&mut Stats) -> &mut Option<u64>)] = &[$((
            $key,
            {
                fn field(s: &mut Stats) -> &mut Option<u64> {
                    &mut s.$field
                }
                field
            },
        )),*];
    };
}

fields! {
    "allocated_bytes.all.current" => allocated,
    "allocated_bytes.all.peak" => allocated_peak,
    "reserved_bytes.all.current" => reserved,
    "active_bytes.all.current" => active,
    "inactive_split_bytes.all.current" => inactive_split,
    "requested_bytes.all.current" => requested,
    "num_alloc_retries" => alloc_retries,
    "num_ooms" => ooms,
    "num_sync_all_streams" => sync_all_streams,
    "num_device_alloc" => device_alloc,
    "num_device_free" => device_free,
}

fn slot(s: &mut Stats, key: usize) -> Option<&mut Option<u64>> {
    FIELDS.get(key).map(|(_, field)| field(s))
}

/// `stats` as parsed; a known key with a bad value is remembered so the error can name it.
#[derive(Default)]
pub(super) struct RawStats {
    pub stats: Stats,
    pub bad: Option<String>,
}

impl<'de> Deserialize<'de> for RawStats {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(StatsVisitor)
    }
}

struct StatsVisitor;

impl<'de> Visitor<'de> for StatsVisitor {
    type Value = RawStats;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of torch.cuda.memory_stats() keys")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawStats, A::Error> {
        let mut out = RawStats::default();
        while let Some(Key(key)) = map.next_key::<Key>()? {
            let Some((slot, name)) =
                key.and_then(|(k, name)| Some((slot(&mut out.stats, k)?, name)))
            else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            match map.next_value::<Count>()? {
                Count::Of(v) if v <= MAX_BYTES => *slot = Some(v),
                Count::Null => {}
                Count::Of(v) => {
                    out.bad
                        .get_or_insert_with(|| format!("stats[{name:?}] = {v}"));
                }
                Count::Other(other) => {
                    out.bad.get_or_insert_with(|| {
                        let text = other.to_string();
                        format!("stats[{name:?}] = {}", shorten(&text, MAX_QUOTE))
                    });
                }
            }
        }
        Ok(out)
    }
}

/// A stats key: a known one's index in `FIELDS` and name, found without copying it.
struct Key(Option<(usize, &'static str)>);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a stats key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(Key(FIELDS
            .iter()
            .enumerate()
            .find_map(|(i, (k, _))| (*k == v).then_some((i, *k)))))
    }
}

/// A stats value: a count, null (not reported), or anything else kept as JSON to quote back.
enum Count {
    Of(u64),
    Null,
    Other(Value),
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CountVisitor)
    }
}

struct CountVisitor;

impl<'de> Visitor<'de> for CountVisitor {
    type Value = Count;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a byte count or counter")
    }

    fn visit_u64<E>(self, v: u64) -> Result<Count, E> {
        Ok(Count::Of(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Count, E> {
        Ok(Count::Other(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Count, E> {
        Ok(Count::Other(Value::from(v)))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Count, E> {
        Ok(Count::Other(Value::Bool(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Count, E> {
        Ok(Count::Other(Value::String(v.to_owned())))
    }

    fn visit_unit<E>(self) -> Result<Count, E> {
        Ok(Count::Null)
    }

    fn visit_none<E>(self) -> Result<Count, E> {
        Ok(Count::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Count, A::Error> {
        Value::deserialize(SeqAccessDeserializer::new(seq)).map(Count::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Count, A::Error> {
        Value::deserialize(MapAccessDeserializer::new(map)).map(Count::Other)
    }
}
